"""Mask the gradients of full variables: :class:`MaskedOptimizer` and its helpers.

The gradient of a full variable's frozen entries is replaced by zero (a
``where``, never a product: ``0 * inf`` is NaN) before the optimizer sees it:
the plainest way to restrict the update (:ref:`the two families
<api-families>`).

* :class:`MaskedOptimizer` wraps any Keras optimizer, the way
  ``keras.optimizers.LossScaleOptimizer`` does: it changes what reaches the
  inner optimizer and leaves everything else to it (clipping, EMA, gradient
  accumulation, loss scaling, schedules). Use it in ``compile``/``fit`` or in a
  custom loop.
* :func:`apply_masked_gradients` is one such step for a custom loop, on the
  same code; :func:`mask_gradients` only masks.

With plain SGD, momentum SGD, Adam, Lion and the other optimizers that
:doc:`/appendices/exactness` finds exact, a gradient that has always been zero
means no update. Optimizers that move such an entry break that: any with
:term:`decoupled weight decay`, Ftrl, Muon, ScheduleFreeAdamW (by a few
:term:`ULP`, units in the last place: rounding) and Adafactor (where a fully
frozen row meets a fully frozen column). With ``restore_frozen=True`` the
wrapper writes the frozen values back after every
update, which keeps the frozen entries bit-exact under any optimizer, for one
copy of each masked variable and one ``where`` per step.

A floating-point mask with values in [0, 1] scales each entry's *update* (new
value minus old), not its gradient: a per-entry learning-rate multiplier that
adaptive optimizers respect too (Adam would undo a scaled gradient). An entry
at 0.0 keeps its exact bits, one at 1.0 gets the inner optimizer's update.

Every ``masks`` argument is a list of ``(variable, mask)`` pairs; a variable
that no pair names trains in full.
"""

from refimpl.optimizers.masked import MaskedOptimizer
from refimpl.optimizers.steps import apply_masked_gradients, mask_gradients

__all__ = ["MaskedOptimizer", "apply_masked_gradients", "mask_gradients"]
