"""refimpl: train only some positions of a Keras tensor, exactly.

Keras decides trainability per *variable*. This package implements every way
around that. The whole workflow on a model: convert it so that a quarter of
one kernel trains (the entries of largest magnitude) with the head, train it
with ``fit``, save the trained entries alone, and fold the model back into
plain Keras layers.

>>> import os, tempfile
>>> import keras, numpy as np, refimpl
>>> hidden = keras.layers.Dense(8, name="hidden")
>>> head = keras.layers.Dense(1, name="head")
>>> model = keras.Sequential([keras.Input((16,)), hidden, head])
>>> # a policy: weight -> mask
>>> top_quarter = lambda w: refimpl.selection.magnitude_mask(w, fraction=0.25)
>>> tuned = refimpl.partialize(model, {"hidden": top_quarter}, train=["head"])
>>> [tuple(w.shape) for w in tuned.trainable_weights]  # 32 of 128, and the head
[(32,), (8, 1), (1,)]
>>> tuned.compile(optimizer="adam", loss="mse")
>>> x, y = np.ones((32, 16), "float32"), np.zeros((32, 1), "float32")
>>> _ = tuned.fit(x, y, epochs=2, verbose=0)
>>> path = os.path.join(tempfile.mkdtemp(), "tuned.npz")
>>> saved = refimpl.save_partial_weights(tuned, path)
>>> saved["partial"]  # weight path -> entries saved
{'hidden/kernel': 32}
>>> plain = refimpl.merge(tuned)
>>> [type(layer).__name__ for layer in plain.layers]
['Dense', 'Dense']

.. _api-families:

The ways fall in two families:

* **reparametrize**: build the tensor from free values and fixed values, so
  the optimizer only ever sees the free values (exact under every optimizer,
  and, in the default delta form, the optimizer state is one value per free
  entry and slot): the partial layers
  (:class:`PartialDense <refimpl.layers.partial.PartialDense>`,
  :func:`partialize <refimpl.convert.partialize>`,
  :func:`enable_partial <refimpl.layers.partial.enable_partial>`),
  :class:`PartialVariable <refimpl.variable.PartialVariable>` in your own layer,
  and the structured layers
  (:class:`DiagonalDense <refimpl.layers.structured_dense.DiagonalDense>`,
  :class:`BandedDense <refimpl.layers.structured_dense.BandedDense>`,
  :class:`BlockDense <refimpl.layers.structured_dense.BlockDense>`). Use these by
  default;
* **restrict the update**: keep one full variable and filter its update
  (:class:`MaskedOptimizer <refimpl.optimizers.MaskedOptimizer>`,
  :class:`FreezeEntries <refimpl.constraints.FreezeEntries>`), for a weight
  that must stay one full-size variable of the model. The gradient, the update
  and the optimizer state stay full-size, frozen entries included, and the
  frozen entries are exact under every optimizer only with
  ``MaskedOptimizer(..., restore_frozen=True)`` or ``FreezeEntries``: a masked
  gradient alone lets an optimizer with :term:`decoupled weight decay` (AdamW)
  move them.

The top level holds what a model needs, each name also in the submodule it
comes from; everything else lives in the submodules, and all of it but
:mod:`refimpl.tf`, the TensorFlow-level teaching code, runs on every Keras
backend (TensorFlow, JAX and PyTorch).
"""

__version__ = "3.1.0"

from refimpl import _compat  # noqa: F401  (the Keras version check, first)
from refimpl.callbacks import DropAndGrow
from refimpl.constraints import FreezeEntries
from refimpl.convert import merge, partialize, trainable_summary
from refimpl.layers import (
    BandedDense,
    BlockDense,
    DiagonalDense,
    PartialDense,
    enable_partial,
)
from refimpl.optimizers import MaskedOptimizer
from refimpl.partial import PartialWeight
from refimpl.trained_entries import load_partial_weights, save_partial_weights
from refimpl.variable import PartialVariable

# Names that moved, the release they moved in, and where they are now
# (CHANGELOG.md has the same tables).
_MOVED_IN_2 = {
    "apply_masked_gradients": "refimpl.optimizers.apply_masked_gradients",
    "mask_gradients": "refimpl.optimizers.mask_gradients",
    "assert_frozen": "refimpl.testing.assert_frozen",
    "count_free_parameters": "refimpl.testing.count_free_parameters",
    "count_optimizer_state": "refimpl.testing.count_optimizer_state",
    "moved": "refimpl.testing.moved",
    "banded": "refimpl.structured.banded",
    "banded_matmul": "refimpl.structured.banded_matmul",
    "block": "refimpl.structured.block",
    "block_matmul": "refimpl.structured.block_matmul",
    "diagonal": "refimpl.structured.diagonal",
    "diagonal_matmul": "refimpl.structured.diagonal_matmul",
    "scatter_free": "refimpl.ops.compose",
    "compose": "refimpl.ops.compose",
    "choose_mode": "refimpl.ops.choose_mode",
    "indices_to_mask": "refimpl.masks.indices_to_mask",
    "mask_to_indices": "refimpl.masks.mask_to_indices",
    "to_mask": "refimpl.masks.to_mask",
    "plot_mask": "refimpl.plotting.plot_mask",
    "minimize": "refimpl.tf.minimize",
    "one_hot_trainable": "refimpl.tf.one_hot_trainable",
    "partially_trainable": "refimpl.tf.partially_trainable",
    # Modules of 1.x.
    "variables": "refimpl.variable (PartialVariable) and refimpl.ops (the rest)",
    "sparse": "refimpl.ops",
    "partial_dense": "refimpl.layers.partial",
    "partial_layers": "refimpl.layers.partial (or refimpl.partial.partial_weights)",
    "masked_optimizer": "refimpl.optimizers",
    "stop_gradient": "refimpl.tf.stop_gradient",
    "scipy_optimize": "refimpl.tf.scipy_optimize",
}
_MOVED_IN_3 = {
    "trainability": "refimpl.convert (trainable_summary)",
    "drop_and_grow": "refimpl.callbacks",
    "files": "refimpl.trained_entries",
}
_MOVED = {
    **{name: ("2.0", new) for name, new in _MOVED_IN_2.items()},
    **{name: ("3.0", new) for name, new in _MOVED_IN_3.items()},
}

# Submodules a user imports, loaded with the package.
from refimpl import (  # noqa: E402, F401
    adapters,
    backend,
    masks,
    ops,
    plotting,
    selection,
    structured,
    testing,
)


def __getattr__(name: str):
    # Reached only for names not set above.
    if name == "tf":  # imports TensorFlow: only when asked for
        import importlib

        return importlib.import_module("refimpl.tf")
    if name in _MOVED:
        release, new = _MOVED[name]
        raise AttributeError(
            f"refimpl.{name} moved in refimpl {release}: use {new} "
            "(the CHANGELOG lists every move)."
        )
    raise AttributeError(f"module 'refimpl' has no attribute {name!r}")


__all__ = [
    "BandedDense",
    "BlockDense",
    "DiagonalDense",
    "DropAndGrow",
    "FreezeEntries",
    "MaskedOptimizer",
    "PartialDense",
    "PartialVariable",
    "PartialWeight",
    "enable_partial",
    "load_partial_weights",
    "merge",
    "partialize",
    "save_partial_weights",
    "trainable_summary",
]
