"""The PyTorch recipes of the backend chapter, run when PyTorch is installed.

``make backends`` installs PyTorch and runs this module with
``REFIMPL_TORCH_TESTS=required``, where a missing PyTorch fails instead of
skipping.
"""

import os

import pytest

if os.environ.get("REFIMPL_TORCH_TESTS") == "required":
    import torch  # noqa: F401
else:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")

from evidence import torch_recipes  # noqa: E402

FROZEN, FREE = 16, 8  # of the 4 x 6 (out x in) weight, two inputs' are trainable


def test_a_gradient_hook_is_exact_without_weight_decay():
    result = torch_recipes.gradient_hook(weight_decay=0.0)
    assert result == {"frozen_moved": 0, "free_moved": FREE}


def test_adamw_decay_moves_the_frozen_entries_past_a_gradient_hook():
    assert torch_recipes.gradient_hook(weight_decay=0.1)["frozen_moved"] == FROZEN


def test_a_parametrization_keeps_the_frozen_entries_under_decay():
    result = torch_recipes.parametrization(weight_decay=0.1)
    assert result["frozen_moved"] == 0 and result["free_moved"] == FREE


def test_a_parametrization_keeps_full_size_optimizer_state():
    # AdamW: exp_avg and exp_avg_sq of all 24 entries, and a step count.
    assert torch_recipes.parametrization(weight_decay=0.1)["optimizer_state"] == 49


def test_the_delta_form_in_a_param_group_keeps_k_values_of_state_per_slot():
    result = torch_recipes.param_groups(weight_decay=0.1)
    assert result["frozen_moved"] == 0 and result["free_moved"] == FREE
    # AdamW: exp_avg and exp_avg_sq of the 8 free values, and a step count.
    assert result["optimizer_state"] == 2 * FREE + 1
