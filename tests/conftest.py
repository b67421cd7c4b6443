import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from hypothesis import settings  # noqa: E402

# A small, fixed set of examples in CI; `HYPOTHESIS_PROFILE=thorough` for more.
settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True)
settings.register_profile("thorough", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

import keras  # noqa: E402

BACKEND = keras.backend.backend()

if BACKEND == "tensorflow":
    import tensorflow as tf

    # On recent NVIDIA GPUs TensorFlow multiplies float32 matrices in TF32
    # (10-bit mantissa) by default; the tests compare products at float32
    # tolerances.
    tf.config.experimental.enable_tensor_float_32_execution(False)
elif BACKEND == "jax":
    import jax

    # The same for JAX on a GPU: full float32 products.
    jax.config.update("jax_default_matmul_precision", "highest")
