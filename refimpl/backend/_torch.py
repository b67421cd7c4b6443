"""The PyTorch backend's pieces (see :mod:`refimpl.backend`)."""

from __future__ import annotations

import keras
import numpy as np
import torch


def read_now(variable) -> np.ndarray:
    return keras.ops.convert_to_numpy(variable.value)


def try_read_now(variable) -> np.ndarray | None:
    return read_now(variable)


def bool_constant(array):
    return keras.ops.convert_to_tensor(np.asarray(array, dtype=bool))


def mask_sparse_gradient(grad, keep):
    return None  # Keras' torch backend passes dense gradients


def assign_on_every_replica(var, value) -> None:
    var.assign(value)


def batch_gradients(model, loss_of_outputs, x) -> list:
    variables = [v.value for v in model.trainable_variables]
    value = loss_of_outputs(model(x, training=False))
    grads = torch.autograd.grad(value, variables, allow_unused=True)
    return [None if g is None else g.detach().cpu().numpy() for g in grads]


def variable_gradients(model, loss_of_outputs, x, variables) -> list:
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
    return isinstance(value, keras.Variable)


def is_symbolic(value) -> bool:
    return False
