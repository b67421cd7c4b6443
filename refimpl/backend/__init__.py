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
import numpy as np

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


# -- the default of each piece: what a backend that does not differ uses --------
def _read_now(variable) -> np.ndarray:
    """The current value of ``variable`` as NumPy.

    >>> read_now(keras.Variable([1.0, 2.0]))
    array([1., 2.], dtype=float32)
    """
    return keras.ops.convert_to_numpy(variable.value)


def _try_read_now(variable) -> np.ndarray | None:
    """:func:`read_now`, or ``None`` where the value is not known now (a JAX step).

    >>> try_read_now(keras.Variable([3.0]))
    array([3.], dtype=float32)
    """
    return read_now(variable)


def _bool_constant(array):
    """A boolean NumPy mask as a tensor of this backend.

    >>> keras.ops.convert_to_numpy(bool_constant([[True, False]]))
    array([[ True, False]])
    """
    return keras.ops.convert_to_tensor(np.asarray(array, dtype=bool))


def _mask_sparse_gradient(grad, keep):
    """A sparse gradient masked by ``keep``; ``None`` for a dense gradient,
    which the caller masks itself (every gradient but TensorFlow's
    ``IndexedSlices``).

    >>> print(mask_sparse_gradient(keras.ops.ones(2), np.ones(2, bool)))
    None
    """
    return None


def _assign_on_every_replica(var, value) -> None:
    """``var.assign(value)``, also inside a replica function where one exists.

    >>> v = keras.Variable([1.0, 2.0])
    >>> assign_on_every_replica(v, [3.0, 4.0])
    >>> keras.ops.convert_to_numpy(v)
    array([3., 4.], dtype=float32)
    """
    var.assign(value)


def _is_variable(value) -> bool:
    """Whether ``value`` is a variable (a ``keras.Variable``; a ``tf.Variable`` too
    on TensorFlow).

    >>> is_variable(keras.Variable(1.0)), is_variable(np.ones(2))
    (True, False)
    """
    return isinstance(value, keras.Variable)


def _is_symbolic(value) -> bool:
    """Whether ``value`` has no value now (traced); ``False`` where every
    tensor has its value (PyTorch).

    >>> is_symbolic(keras.ops.ones(2))
    False
    """
    return False


def _read_as_trained(value, like=None):
    """``value`` as the backend multiplies a weight that trains; ``value``
    itself where the product does not depend on that (TensorFlow, JAX: see
    the PyTorch backend's).

    >>> v = keras.Variable([1.0])
    >>> _read_as_trained(v) is v
    True
    """
    return value


def _in_xla_context() -> bool:
    """Whether the code being traced is compiled by XLA; never where no XLA runs
    (eagerly, XLA compiles nothing under TensorFlow or PyTorch; JAX always).

    >>> in_xla_context() == (name == "jax")
    True
    """
    return False


read_now = getattr(_impl, "read_now", _read_now)
try_read_now = getattr(_impl, "try_read_now", _try_read_now)
bool_constant = getattr(_impl, "bool_constant", _bool_constant)
mask_sparse_gradient = getattr(_impl, "mask_sparse_gradient", _mask_sparse_gradient)
assign_on_every_replica = getattr(
    _impl, "assign_on_every_replica", _assign_on_every_replica
)


def batch_gradients(model, loss_of_outputs, x) -> list:
    """The gradients of ``loss_of_outputs(model(x))`` for the trainable weights.

    One NumPy array per ``model.trainable_variables`` entry (``None`` or
    zeros where the loss does not depend on it).

    >>> dense = keras.layers.Dense(1, kernel_initializer="ones")
    >>> model = keras.Sequential([keras.Input((2,)), dense])
    >>> grads = batch_gradients(model, keras.ops.sum, np.ones((3, 2), "float32"))
    >>> [g.tolist() for g in grads]  # the kernel's, then the bias'
    [[[3.0], [3.0]], [3.0]]
    """
    return _impl.batch_gradients(model, loss_of_outputs, x)


def variable_gradients(model, loss_of_outputs, x, variables) -> list:
    """The same for the chosen ``variables`` of ``model``, frozen ones included.

    >>> dense = keras.layers.Dense(1, kernel_initializer="ones", trainable=False)
    >>> model = keras.Sequential([keras.Input((2,)), dense])
    >>> x = np.ones((3, 2), "float32")
    >>> [grad] = variable_gradients(model, keras.ops.sum, x, [dense.kernel])
    >>> grad.tolist()  # of a frozen kernel
    [[3.0], [3.0]]
    """
    return _impl.variable_gradients(model, loss_of_outputs, x, variables)


is_variable = getattr(_impl, "is_variable", _is_variable)
is_symbolic = getattr(_impl, "is_symbolic", _is_symbolic)
in_xla_context = getattr(_impl, "in_xla_context", _in_xla_context)
read_as_trained = getattr(_impl, "read_as_trained", _read_as_trained)


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
