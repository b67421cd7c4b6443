"""Collection rules shared by the tests and the doctests of both packages.

``refimpl/backend`` holds one module per Keras backend; only the active
backend's module is imported (and doctested). Under a backend other than
TensorFlow, the TensorFlow-level modules are not collected either.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402

_BACKEND = keras.backend.backend()
_BACKENDS = ("tensorflow", "jax", "torch")

collect_ignore = [f"refimpl/backend/_{b}.py" for b in _BACKENDS if b != _BACKEND]
if _BACKEND != "tensorflow":
    collect_ignore += [
        "refimpl/stop_gradient.py",
        "refimpl/scipy_optimize.py",
        "evidence",
    ]
