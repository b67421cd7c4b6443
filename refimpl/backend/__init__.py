"""The Keras backend refimpl runs on, and the pieces that differ between backends.

Everything in refimpl's Keras-level API is written in ``keras.ops`` and runs
unchanged under ``KERAS_BACKEND=tensorflow``, ``jax`` and ``torch``. Of this
module, a user needs two names: :data:`name`, the backend of this process, and
:func:`require_tensorflow`, which TensorFlow-level code calls first. The other
functions here (``read_now``, ``bool_constant``, ``batch_gradients`` and the
like) are the backend-specific parts of refimpl's own code, picked once at
import from ``refimpl.backend._tensorflow``, ``_jax`` or ``_torch``; they are
not in ``__all__``, not public API, and may change.

>>> from refimpl import backend
>>> backend.name in ("tensorflow", "jax", "torch")
True
"""

from __future__ import annotations

import importlib

import keras

# The public names; the backend-specific functions below are refimpl's own.
__all__ = ["name", "require_tensorflow"]

#: The Keras backend this process runs on.
name = keras.backend.backend()

if name not in ("tensorflow", "jax", "torch"):
    raise ImportError(
        "refimpl runs on the Keras backends 'tensorflow', 'jax' and 'torch'. "
        f"Received: KERAS_BACKEND={name!r}"
    )

_impl = importlib.import_module(f"refimpl.backend._{name}")

read_now = _impl.read_now
try_read_now = _impl.try_read_now
bool_constant = _impl.bool_constant
mask_sparse_gradient = _impl.mask_sparse_gradient
assign_on_every_replica = _impl.assign_on_every_replica
batch_gradients = _impl.batch_gradients
variable_gradients = _impl.variable_gradients
is_variable = _impl.is_variable
is_symbolic = _impl.is_symbolic
in_xla_context = _impl.in_xla_context


def require_tensorflow(what: str) -> None:
    """Raise a clear ``ImportError`` unless Keras runs on TensorFlow.

    Call it first in code that needs TensorFlow tensors, as :mod:`refimpl.tf`
    does at import (``tf.Variable`` objects, `tf.distribute
    <https://www.tensorflow.org/api_docs/python/tf/distribute>`__, the SciPy
    minimizer).

    Args:
        what: the name of what needs TensorFlow, as the user knows it (a
            function, ``"to_tf_variable"``, or a module, ``"refimpl.tf"``).
            The message starts with it: ``"to_tf_variable works on TensorFlow
            tensors and needs the TensorFlow backend of Keras"``, then names
            the backend in use and says to set ``KERAS_BACKEND=tensorflow``.

    Returns:
        ``None``, on the TensorFlow backend.

    Raises:
        ImportError: on any other backend (JAX, PyTorch).

    >>> from refimpl.backend import require_tensorflow
    >>> def to_tf_variable(value):
    ...     require_tensorflow("to_tf_variable")
    ...     import tensorflow as tf
    ...
    ...     return tf.Variable(value)
    >>> try:
    ...     v = to_tf_variable([1.0, 2.0])
    ... except ImportError:  # JAX or PyTorch: "to_tf_variable works on ..."
    ...     v = keras.Variable([1.0, 2.0])  # the Keras-level path
    >>> tuple(v.shape)
    (2,)
    """
    if name != "tensorflow":
        raise ImportError(
            f"{what} works on TensorFlow tensors and needs the TensorFlow "
            f"backend of Keras. This process runs Keras on {name!r}: set "
            "KERAS_BACKEND=tensorflow before importing keras, or use the "
            "Keras-level API (PartialVariable, the partial layers, "
            "MaskedOptimizer, FreezeEntries), which runs on every backend."
        )
