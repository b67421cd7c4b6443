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
elif BACKEND == "torch":
    import functools

    import numpy as np

    # NumPy cannot read a torch tensor that requires grad (a composed kernel):
    # the assertions the tests use read every tensor argument through Keras.
    def _readable(function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            args = [
                keras.ops.convert_to_numpy(a)
                if keras.ops.is_tensor(a) or isinstance(a, keras.Variable)
                else a
                for a in args
            ]
            return function(*args, **kwargs)

        return wrapper

    for _name in (
        "assert_allclose",
        "assert_array_equal",
        "assert_equal",
        "assert_array_almost_equal",
    ):
        setattr(np.testing, _name, _readable(getattr(np.testing, _name)))
elif BACKEND == "jax":
    import jax

    # The same for JAX on a GPU: full float32 products.
    jax.config.update("jax_default_matmul_precision", "highest")
