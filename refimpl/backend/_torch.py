"""The PyTorch backend's pieces (see :mod:`refimpl.backend`)."""

from __future__ import annotations

import keras  # noqa: F401  (the doctests use it)
import numpy as np  # noqa: F401  (the doctests use it)
import torch


def batch_gradients(model, loss_of_outputs, x) -> list:
    """:func:`refimpl.backend.batch_gradients` on PyTorch: torch.autograd.grad."""
    variables = [v.value for v in model.trainable_variables]
    value = loss_of_outputs(model(x, training=False))
    grads = torch.autograd.grad(value, variables, allow_unused=True)
    return [None if g is None else g.detach().cpu().numpy() for g in grads]


def variable_gradients(model, loss_of_outputs, x, variables) -> list:
    """:func:`refimpl.backend.variable_gradients` on PyTorch: torch.autograd.grad."""
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


def read_as_trained(value, like=None):
    """``value`` as PyTorch multiplies a weight that trains: a tensor that
    requires a gradient, laid out in memory as ``like`` (a variable) is.

    PyTorch picks its product by both. ``torch.matmul`` multiplies a 3-D
    tensor by a weight that requires a gradient in one folded product, and by
    one that does not (a frozen weight, or any weight under ``torch.no_grad``,
    as in ``predict``) in a batched one; a weight stored by columns (Keras'
    orthogonal initializer stores a square kernel so) is multiplied by a
    transposed product. Each pair rounds differently, by a float32 ulp. Read
    this way, a composed or a frozen weight is multiplied as the plain layer's
    own variable is: a frozen one becomes a new leaf on the same storage,
    whose gradient is dropped. ``value`` is returned unchanged when it already
    is such a tensor.

    >>> frozen = keras.Variable(np.ones((2, 2), "float32"), trainable=False)
    >>> read_as_trained(frozen).requires_grad, frozen.value.requires_grad
    (True, False)
    >>> by_columns = torch.ones(3, 2).t()  # strides (1, 2)
    >>> read_as_trained(torch.zeros(2, 3), like=by_columns).stride()
    (1, 2)
    """
    given = value.value if isinstance(value, keras.Variable) else value
    tensor = given
    if like is not None:
        like = like.value if isinstance(like, keras.Variable) else like
        if tensor.stride() != like.stride():
            tensor = torch.empty_like(like).copy_(tensor)
    if not tensor.requires_grad:
        tensor = tensor.detach().requires_grad_()
    return value if tensor is given else tensor
