import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from hypothesis import settings  # noqa: E402

# A small, fixed set of examples in CI; `HYPOTHESIS_PROFILE=thorough` for more.
settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True)
settings.register_profile("thorough", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

import tensorflow as tf  # noqa: E402

# On recent NVIDIA GPUs TensorFlow multiplies float32 matrices in TF32 (10-bit
# mantissa) by default; the tests compare products at float32 tolerances.
tf.config.experimental.enable_tensor_float_32_execution(False)
