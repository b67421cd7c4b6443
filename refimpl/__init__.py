"""refimpl: train only some positions of a Keras/TensorFlow tensor, exactly.

TensorFlow and Keras decide trainability per *variable*. This package
implements every way around that, in two families:

* **reparametrize**: build the tensor from free values and fixed values, so the
  optimizer only ever sees the free values (exact under every optimizer, and
  the optimizer state is one value per free entry): :class:`PartialVariable`,
  the layers, the structured builders;
* **restrict the update**: keep one full variable and filter its gradient or
  its update (:class:`MaskedOptimizer`, :class:`FreezeEntries`,
  :func:`partially_trainable`): cheap to add to existing code, exact only with
  ``restore_frozen=True`` or a constraint.

Every ``masks`` argument is a list of ``(variable, mask)`` pairs; in a mask,
``True`` (or 1.0) means trainable. See the book for when to use which.

The Keras-level API (the layers, :func:`partialize`, :class:`PartialVariable`,
:class:`FreezeEntries`, :class:`MaskedOptimizer`, :mod:`refimpl.selection`,
the checks) runs on every Keras backend: TensorFlow, JAX and PyTorch. The
TensorFlow-level teaching code (:func:`partially_trainable`,
:func:`one_hot_trainable`, :func:`minimize`) needs ``KERAS_BACKEND=tensorflow``
and says so when used under another backend.
"""

__version__ = "1.0.0"

# Re-impose frozen values after every update (a Keras constraint).
# Choosing the entries to train: random, by magnitude, by Fisher score, structured.
# The few pieces that differ between Keras backends.
from refimpl import backend, selection
from refimpl.constraints import FreezeEntries

# Convert a model's layers to partially trainable ones, and fold them back.
from refimpl.convert import merge, partialize

# Keras layers whose kernel is built from its free values.
from refimpl.layers import BandedDense, BlockDense, DiagonalDense, PartialDense

# Mask the gradients of full variables: an optimizer wrapper and a custom-loop step.
from refimpl.masked_optimizer import (
    MaskedOptimizer,
    apply_masked_gradients,
    mask_gradients,
)

# Masks and index lists.
from refimpl.masks import indices_to_mask, mask_to_indices, to_mask

# Any Keras layer with a kernel or an embedding table, made partially trainable.
from refimpl.partial_layers import enable_partial

# Pictures.
from refimpl.plotting import plot_mask

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

# Checks: bit-exact frozen entries, and the values an optimizer can change.
from refimpl.testing import (
    assert_frozen,
    count_free_parameters,
    count_optimizer_state,
    moved,
)

# Free values plus a frozen base.
from refimpl.variables import PartialVariable, choose_mode, compose

# TensorFlow-level teaching code: block the gradient of frozen positions, and
# SciPy over the free entries only (replaces TF 1's ScipyOptimizerInterface).
_TENSORFLOW_LEVEL = {
    "minimize": "refimpl.scipy_optimize",
    "one_hot_trainable": "refimpl.stop_gradient",
    "partially_trainable": "refimpl.stop_gradient",
}

if backend.name == "tensorflow":
    from refimpl.scipy_optimize import minimize
    from refimpl.stop_gradient import one_hot_trainable, partially_trainable


def __getattr__(name: str):
    # Reached only for names not set above: under JAX or PyTorch, the
    # TensorFlow-level functions raise a clear ImportError when first used.
    if name in _TENSORFLOW_LEVEL:
        backend.require_tensorflow(f"refimpl.{name}")
    raise AttributeError(f"module 'refimpl' has no attribute {name!r}")


__all__ = [
    "BandedDense",
    "BlockDense",
    "DiagonalDense",
    "FreezeEntries",
    "MaskedOptimizer",
    "PartialDense",
    "PartialVariable",
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
    "count_optimizer_state",
    "diagonal",
    "diagonal_matmul",
    "enable_partial",
    "indices_to_mask",
    "mask_gradients",
    "mask_to_indices",
    "merge",
    "minimize",
    "moved",
    "one_hot_trainable",
    "partialize",
    "partially_trainable",
    "plot_mask",
    "scatter_free",
    "selection",
    "to_mask",
]
