"""refimpl: train only some positions of a TensorFlow/Keras tensor.

TensorFlow decides trainability per *variable*. This package implements every
way around that, in two families:

* **reparametrize**: build the tensor from free values and fixed values, so the
  optimizer only ever sees the free values (exact under every optimizer);
* **restrict the update**: keep one full variable and filter its gradient or
  its update (cheap to add to existing code, but not exact under every
  optimizer).

See the book for when to use which.
"""

__version__ = "0.1.0"

# Re-impose frozen values after every update (a Keras constraint).
from refimpl.constraints import FreezeEntries

# Measure which frozen entries a technique and an optimizer move.
from refimpl.exactness import TECHNIQUES, Drift, frozen_drift, keras_optimizers

# Mask the gradients of a full variable, in a custom loop or in fit.
from refimpl.gradients import (
    MaskedGradientModel,
    apply_masked_gradients,
    mask_gradients,
)

# Keras layers whose kernel is built from its free values.
from refimpl.layers import BandedDense, BlockDense, DiagonalDense, PartialDense

# Masks and index lists.
from refimpl.masks import indices_to_mask, mask_to_indices, to_mask

# Different optimizers for different groups of variables.
from refimpl.optimizers import MultiOptimizer

# Pictures.
from refimpl.plotting import plot_mask

# SciPy over the free entries only (replaces TF 1's ScipyOptimizerInterface).
from refimpl.scipy_optimize import minimize

# Block the gradient of frozen positions.
from refimpl.stop_gradient import one_hot_trainable, partially_trainable

# Structured matrices built from their free values, and their cheap products.
from refimpl.structured import (
    banded,
    banded_matmul,
    block,
    block_matmul,
    diagonal,
    diagonal_matmul,
    scatter_free,
)

# Checks used by the book and the tests.
from refimpl.testing import assert_frozen, count_free_parameters, moved

# Free values plus a frozen base.
from refimpl.variables import PartialVariable, choose_mode, compose

__all__ = [
    "BandedDense",
    "BlockDense",
    "DiagonalDense",
    "Drift",
    "FreezeEntries",
    "MaskedGradientModel",
    "MultiOptimizer",
    "PartialDense",
    "PartialVariable",
    "TECHNIQUES",
    "__version__",
    "apply_masked_gradients",
    "assert_frozen",
    "banded",
    "banded_matmul",
    "block",
    "block_matmul",
    "choose_mode",
    "compose",
    "count_free_parameters",
    "diagonal",
    "diagonal_matmul",
    "frozen_drift",
    "indices_to_mask",
    "keras_optimizers",
    "mask_gradients",
    "mask_to_indices",
    "minimize",
    "moved",
    "one_hot_trainable",
    "partially_trainable",
    "plot_mask",
    "scatter_free",
    "to_mask",
]
