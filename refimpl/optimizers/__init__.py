"""Mask the gradients of full variables: :class:`MaskedOptimizer` and its helpers.

The "restrict the update" family in its plainest form: the weight stays one
full variable; the gradient of its frozen entries is replaced by zero (a
select, never a product: ``0 * inf`` is NaN) before the optimizer sees it.
:class:`MaskedOptimizer` wraps any Keras optimizer the way
``keras.optimizers.LossScaleOptimizer`` does; :func:`apply_masked_gradients`
is one such step for a custom loop, and :func:`mask_gradients` only masks.
"""

from refimpl.optimizers.masked import MaskedOptimizer
from refimpl.optimizers.steps import apply_masked_gradients, mask_gradients

__all__ = ["MaskedOptimizer", "apply_masked_gradients", "mask_gradients"]
