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
