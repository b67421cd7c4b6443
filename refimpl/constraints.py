"""Re-impose frozen values after every optimizer update: :class:`FreezeEntries`.

This is the *restrict the update* family in its most robust form. The weight
stays one full variable, the optimizer updates every entry of it (weight decay
included), and then Keras applies the variable's constraint, which writes the
frozen values back. Keras 3 applies constraints after the whole update, so the
frozen entries end every step with their exact bits, under any optimizer.

What it does not save: the gradient, the update and the optimizer state (Adam's
two moments, for one) are still computed and stored for every entry of the
variable. When only a few entries are free, a reparametrized layer such as
:class:`refimpl.PartialDense` keeps only those few as state.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from refimpl.masks import to_mask

__all__ = ["FreezeEntries"]


@keras.saving.register_keras_serializable(package="refimpl")
class FreezeEntries(keras.constraints.Constraint):
    """Keep the entries outside ``mask`` at fixed ``values`` after each update.

    ``constraint(w)`` returns ``where(mask, w, values)``: the trainable entries
    as the optimizer left them, every other entry set back to its frozen value,
    bit for bit (``values`` are cast to the variable's dtype).

    Args:
        mask: the trainable positions (``True`` = may change): a boolean mask
            of the variable's shape, or an index list of shape ``[k, rank]``
            when ``values`` is a full array that gives the shape.
        values: the frozen values: an array of the variable's shape (usually
            its current value), or a scalar for every frozen entry.

    Raises:
        ValueError, TypeError: for a mask that does not fit ``values``, a
            non-numeric ``values``, or (when applied) a variable of another
            shape.

    >>> w = keras.Variable([[1.0, 2.0], [3.0, 4.0]])
    >>> freeze = FreezeEntries([[True, False], [False, True]], w.numpy())
    >>> _ = w.assign(w - 0.5)  # an optimizer step moves every entry
    >>> _ = w.assign(freeze(w))  # what Keras does after each update
    >>> w.numpy()
    array([[0.5, 2. ],
           [3. , 3.5]], dtype=float32)
    """

    def __init__(self, mask, values):
        values_array = _values(values)
        if values_array.ndim > 0:
            shape = values_array.shape
        else:
            shape = _mask_shape(mask)
        self._mask = to_mask(mask, shape, name="mask")
        self._values = values_array
        self._given_mask = mask
        self._given_values = values

    @classmethod
    def from_variable(cls, variable, mask) -> FreezeEntries:
        """Freeze the entries outside ``mask`` at the variable's current values.

        >>> w = keras.Variable([1.0, 2.0])
        >>> FreezeEntries.from_variable(w, [True, False]).values.tolist()
        [1.0, 2.0]
        """
        return cls(mask, np.array(ops.convert_to_numpy(variable)))

    @property
    def mask(self) -> np.ndarray:
        """The boolean mask, ``True`` where the entry may change."""
        return self._mask.copy()

    @property
    def values(self) -> np.ndarray:
        """The frozen values, as given (scalar or full array)."""
        return self._values.copy()

    def __call__(self, w):
        if tuple(w.shape) != self._mask.shape:
            raise ValueError(
                f"FreezeEntries was built for a variable of shape "
                f"{self._mask.shape}. Received a variable of shape {tuple(w.shape)}"
            )
        frozen = ops.cast(self._values, w.dtype)
        return ops.where(self._mask, w, frozen)

    def get_config(self) -> dict:
        config = {
            "mask": _listed(self._given_mask),
            "values": _listed(self._given_values),
        }
        return {**super().get_config(), **config}


def _values(values) -> np.ndarray:
    if hasattr(values, "numpy"):
        values = values.numpy()
    try:
        array = np.asarray(values)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"`values` must be a number or a rectangular numeric array. "
            f"Received: values={values!r}"
        ) from err
    if array.dtype.kind in "OSUmM":  # bfloat16 (kind 'V') is numeric
        raise TypeError(
            f"`values` must be a number or a rectangular numeric array. "
            f"Received dtype {array.dtype}: values={values!r}"
        )
    return array


def _mask_shape(mask) -> tuple[int, ...]:
    array = np.asarray(mask.numpy() if hasattr(mask, "numpy") else mask)
    if array.dtype != bool and not np.issubdtype(array.dtype, np.floating):
        raise ValueError(
            "With a scalar `values`, `mask` must be a boolean mask of the "
            "variable's shape (an index list does not say the shape). "
            f"Received: mask={mask!r}"
        )
    return array.shape


def _listed(value):
    if hasattr(value, "numpy"):
        value = value.numpy()
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    return value
