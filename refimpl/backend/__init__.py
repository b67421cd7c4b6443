"""The few pieces that differ between Keras backends, behind one function each.

Everything else in refimpl's Keras-level API is written in ``keras.ops`` and
runs unchanged under ``KERAS_BACKEND=tensorflow``, ``jax`` and ``torch``. This
package picks the module of the active backend once, at import:

* :func:`read_now`: a variable's current value as NumPy, also while a
  function is being traced; :func:`try_read_now`: the same, or ``None``
  where the backend does not know it (JAX, inside ``fit``'s traced step);
* :func:`bool_constant`: a large boolean NumPy mask as a backend tensor, fast;
* :func:`mask_sparse_gradient`: zero the frozen rows of a sparse (row-slice)
  gradient, for the backends that have one (TensorFlow's ``IndexedSlices``);
* :func:`assign_on_every_replica`: an assign that is also correct inside a
  ``tf.distribute`` replica function;
* :func:`batch_gradients`: the gradients of a model's batch loss with
  respect to its trainable weights, as NumPy arrays;
  :func:`variable_gradients`: the same with respect to chosen variables,
  frozen ones included (a partial layer's base);
* :func:`is_variable` and :func:`is_symbolic`: what kind of value an
  argument is (a variable; a tensor whose value is not known yet).

>>> from refimpl import backend
>>> backend.name in ("tensorflow", "jax", "torch")
True
"""

from __future__ import annotations

import importlib

import keras

from refimpl._checks import describe

__all__ = [
    "assign_on_every_replica",
    "batch_gradients",
    "bool_constant",
    "is_symbolic",
    "is_variable",
    "mask_sparse_gradient",
    "name",
    "read_now",
    "require_tensorflow",
    "try_read_now",
    "variable_gradients",
]

#: The Keras backend this process runs on.
name = keras.backend.backend()

if name not in ("tensorflow", "jax", "torch"):
    raise ImportError(
        "refimpl runs on the Keras backends 'tensorflow', 'jax' and 'torch'. "
        f"Received: KERAS_BACKEND={describe(name)}"
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


def require_tensorflow(what: str) -> None:
    """Raise a clear ``ImportError`` unless Keras runs on TensorFlow.

    The TensorFlow-level teaching code (``tf`` tensors, ``tf.distribute``,
    the SciPy minimizer on ``tf.Variable`` s) calls this first.

    >>> try:
    ...     require_tensorflow("my TensorFlow-level code")
    ...     runs = True
    ... except ImportError:
    ...     runs = False
    >>> runs == (name == "tensorflow")
    True
    """
    if name != "tensorflow":
        raise ImportError(
            f"{what} works on TensorFlow tensors and needs the TensorFlow "
            f"backend of Keras. This process runs Keras on {name!r}: set "
            "KERAS_BACKEND=tensorflow before importing keras, or use the "
            "Keras-level API (PartialVariable, the partial layers, "
            "MaskedOptimizer, FreezeEntries), which runs on every backend."
        )
