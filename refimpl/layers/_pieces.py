"""The pieces of a partial class besides its methods: the composing property
and the checks of what a partial weight can carry over from the plain one."""

from __future__ import annotations

import keras
import numpy as np

_ELEMENTWISE_REGULARIZERS = (
    keras.regularizers.L1,
    keras.regularizers.L2,
    keras.regularizers.L1L2,
)


# A constraint that acts entry by entry gives the free values exactly what it
# would give the composed weight's free entries.
_ELEMENTWISE_CONSTRAINTS = (keras.constraints.NonNeg,)


def _count(mask) -> int:
    """The number of free entries of a mask or index list, before any shape."""
    array = np.asarray(keras.ops.convert_to_numpy(mask))
    if array.dtype == bool or np.issubdtype(array.dtype, np.floating):
        return int((array != 0).sum())
    return int(array.shape[0]) if array.size else 0


def _is_partial_weight(variable) -> bool:
    return variable.path.split("/")[-1] in ("partial_free", "partial_positions")


def _composing(plain_class, target, attribute: bool = False):
    """The property that returns the composed weight, where the layer reads it."""
    doc = f"The {target}, the frozen base with the free values."
    if attribute:
        # The plain class sets the variable as an attribute; it is kept in the
        # instance's dict, which this property (a data descriptor) shadows.
        def fget_attribute(self):
            try:
                value = self.__dict__[target]
            except KeyError:
                raise AttributeError(target) from None
            if self._partial_target != target:
                return value  # another weight of the layer is the partial one
            return self._partial_value(value)

        def fset(self, value):
            self.__dict__[target] = value

        return property(fget_attribute, fset, doc=doc)
    inherited = getattr(plain_class, target)

    def fget(self):
        value = inherited.fget(self)
        return value if self._partial_target != target else self._partial_value(value)

    return property(fget, doc=doc)


def _splittable_regularizer(regularizer) -> bool:
    """Whether a kernel regularizer can act on the free entries alone."""
    return regularizer is None or isinstance(regularizer, _ELEMENTWISE_REGULARIZERS)


def _check_constraint(constraint, name) -> None:
    if constraint is not None and not isinstance(constraint, _ELEMENTWISE_CONSTRAINTS):
        raise ValueError(
            f"Layer {name!r} has a kernel constraint, "
            f"{type(constraint).__name__}, that is not elementwise, so it "
            "cannot act on the free entries alone (Keras' `enable_lora` refuses "
            "kernel constraints too). Remove it, or keep it as a full-variable "
            "technique (`refimpl.FreezeEntries`, `refimpl.MaskedOptimizer`). "
            f"Received: kernel_constraint={type(constraint).__name__}"
        )
