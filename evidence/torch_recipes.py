"""How a PyTorch user trains only some entries of a weight, and what each costs.

The book's backend chapter shows these functions as listings; the tests run
them whenever PyTorch is installed (``tests/test_torch_recipes.py``). Each
trains the 4 x 6 (out x in) weight of an ``nn.Linear(6, 4)`` for three AdamW
steps and returns how many of its frozen entries moved, and how many free ones
did.
"""

from __future__ import annotations

import torch
from torch.nn.utils import parametrize


def _setup():
    torch.manual_seed(0)
    layer = torch.nn.Linear(6, 4, bias=False)
    mask = torch.zeros_like(layer.weight, dtype=torch.bool)
    mask[:, :2] = True  # the trainable entries: the weights of two inputs
    x, y = torch.randn(24, 6), torch.randn(24, 4)
    return layer, mask, x, y


def _train(layer, optimizer, x, y) -> None:
    for step in range(3):
        xb, yb = x[8 * step : 8 * step + 8], y[8 * step : 8 * step + 8]
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(layer(xb), yb).backward()
        optimizer.step()


def _moved(before, after, mask) -> dict:
    changed = before != after
    return {
        "frozen_moved": int((changed & ~mask).sum()),
        "free_moved": int((changed & mask).sum()),
    }


def gradient_hook(weight_decay: float) -> dict:
    """Zero the frozen entries' gradient with a hook (restrict the update)."""
    layer, mask, x, y = _setup()
    layer.weight.register_hook(lambda grad: grad * mask)
    before = layer.weight.detach().clone()
    optimizer = torch.optim.AdamW(
        layer.parameters(), lr=0.05, weight_decay=weight_decay
    )
    _train(layer, optimizer, x, y)
    return _moved(before, layer.weight.detach(), mask)


class FrozenEntries(torch.nn.Module):
    """A parametrization: the trained tensor where ``mask``, fixed values elsewhere."""

    def __init__(self, frozen: torch.Tensor, mask: torch.Tensor):
        super().__init__()
        self.register_buffer("frozen", frozen.detach().clone())
        self.register_buffer("mask", mask)

    def forward(self, weight):
        return torch.where(self.mask, weight, self.frozen)


def parametrization(weight_decay: float) -> dict:
    """Compose the weight from a trained tensor and fixed values (reparametrize)."""
    layer, mask, x, y = _setup()
    parametrize.register_parametrization(
        layer, "weight", FrozenEntries(layer.weight, mask)
    )
    before = layer.weight.detach().clone()  # the composed weight
    optimizer = torch.optim.AdamW(
        layer.parameters(), lr=0.05, weight_decay=weight_decay
    )
    _train(layer, optimizer, x, y)
    return {
        **_moved(before, layer.weight.detach(), mask),
        "optimizer_state": _state_size(optimizer),
    }


def _state_size(optimizer) -> int:
    return sum(t.numel() for s in optimizer.state.values() for t in s.values())


class PartialLinear(torch.nn.Module):
    """The delta form: k free values in a Parameter, the rest in a buffer."""

    def __init__(self, weight: torch.Tensor, mask: torch.Tensor):
        super().__init__()
        self.register_buffer("base", weight.detach().clone())
        self.register_buffer("positions", mask.flatten().nonzero().squeeze(1))
        self.free = torch.nn.Parameter(weight.detach().flatten()[self.positions])

    @property
    def weight(self):
        flat = self.base.flatten().index_put((self.positions,), self.free)
        return flat.view_as(self.base)

    def forward(self, x):
        return x @ self.weight.T


def param_groups(weight_decay: float) -> dict:
    """The delta form in its own parameter group, with its own weight decay."""
    layer, mask, x, y = _setup()
    partial = PartialLinear(layer.weight, mask)
    before = partial.weight.detach().clone()
    optimizer = torch.optim.AdamW(
        [{"params": [partial.free], "weight_decay": weight_decay}], lr=0.05
    )
    _train(partial, optimizer, x, y)
    return {
        **_moved(before, partial.weight.detach(), mask),
        "optimizer_state": _state_size(optimizer),
    }
