"""The PyTorch backend's pieces (see :mod:`refimpl.backend`)."""

from __future__ import annotations

import keras
import numpy as np
import torch


def read_now(variable) -> np.ndarray:
    """The current value of ``variable`` as NumPy.

    >>> read_now(keras.Variable([1.0, 2.0]))
    array([1., 2.], dtype=float32)
    """
    return keras.ops.convert_to_numpy(variable.value)


def try_read_now(variable) -> np.ndarray | None:
    """:func:`read_now`: PyTorch knows the value everywhere, so never ``None``.

    >>> try_read_now(keras.Variable([3.0]))
    array([3.], dtype=float32)
    """
    return read_now(variable)


def bool_constant(array):
    """A boolean NumPy mask as a tensor of this backend.

    >>> keras.ops.convert_to_numpy(bool_constant([[True, False]]))
    array([[ True, False]])
    """
    return keras.ops.convert_to_tensor(np.asarray(array, dtype=bool))


def mask_sparse_gradient(grad, keep):
    """``None``: Keras' torch backend passes dense gradients, which the caller masks.

    >>> print(mask_sparse_gradient(keras.ops.ones(2), np.ones(2, bool)))
    None
    """
    return None  # Keras' torch backend passes dense gradients


def assign_on_every_replica(var, value) -> None:
    """``var.assign(value)`` (no replica functions on this backend).

    >>> v = keras.Variable([1.0, 2.0])
    >>> assign_on_every_replica(v, [3.0, 4.0])
    >>> keras.ops.convert_to_numpy(v)
    array([3., 4.], dtype=float32)
    """
    var.assign(value)


def batch_gradients(model, loss_of_outputs, x) -> list:
    """The gradients of ``loss_of_outputs(model(x))`` for the trainable weights.

    One NumPy array per ``model.trainable_variables`` entry (``None`` where the
    loss does not depend on it).

    >>> dense = keras.layers.Dense(1, kernel_initializer="ones")
    >>> model = keras.Sequential([keras.Input((2,)), dense])
    >>> grads = batch_gradients(model, keras.ops.sum, np.ones((3, 2), "float32"))
    >>> [g.tolist() for g in grads]  # the kernel's, then the bias'
    [[[3.0], [3.0]], [3.0]]
    """
    variables = [v.value for v in model.trainable_variables]
    value = loss_of_outputs(model(x, training=False))
    grads = torch.autograd.grad(value, variables, allow_unused=True)
    return [None if g is None else g.detach().cpu().numpy() for g in grads]


def variable_gradients(model, loss_of_outputs, x, variables) -> list:
    """The same for the chosen ``variables`` of ``model``, frozen ones included.

    >>> dense = keras.layers.Dense(1, kernel_initializer="ones", trainable=False)
    >>> model = keras.Sequential([keras.Input((2,)), dense])
    >>> x = np.ones((3, 2), "float32")
    >>> [grad] = variable_gradients(model, keras.ops.sum, x, [dense.kernel])
    >>> grad.tolist()  # of a frozen kernel
    [[3.0], [3.0]]
    """
    tensors = [v.value for v in variables]
    before = [t.requires_grad for t in tensors]
    try:
        for t in tensors:
            t.requires_grad_(True)
        value = loss_of_outputs(model(x, training=False))
        grads = torch.autograd.grad(value, tensors, allow_unused=True)
    finally:
        for t, flag in zip(tensors, before, strict=True):
            t.requires_grad_(flag)
    return [None if g is None else g.detach().cpu().numpy() for g in grads]


def is_variable(value) -> bool:
    """Whether ``value`` is a ``keras.Variable``.

    >>> is_variable(keras.Variable(1.0)), is_variable(np.ones(2))
    (True, False)
    """
    return isinstance(value, keras.Variable)


def is_symbolic(value) -> bool:
    """Always ``False``: PyTorch runs eagerly, every tensor has its value.

    >>> is_symbolic(keras.ops.ones(2))
    False
    """
    return False


def in_xla_context() -> bool:
    """Never: PyTorch runs without XLA."""
    return False
