"""Re-impose frozen values after every optimizer update: :class:`FreezeEntries`.

The most robust way to restrict the update (:ref:`the two families
<api-families>`): the optimizer updates every entry of the full variable
(weight decay included), and then Keras applies the variable's constraint (a
`keras.constraints.Constraint <https://keras.io/api/layers/constraints/>`__),
which writes the frozen values back. Keras 3 applies constraints after the
whole update, so the frozen entries end every step with their exact bits, under
any optimizer, on one device and across replicas with any :term:`aggregation`
but ``SUM`` (which adds the replicas' writes: keep the default aggregation under
`tf.distribute <https://www.tensorflow.org/api_docs/python/tf/distribute>`__).
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from refimpl import _compat
from refimpl.masks import _as_array, _describe, _mask_shape, _normalize_shape, to_mask

__all__ = ["FreezeEntries"]


@keras.saving.register_keras_serializable(package="refimpl")
# Keras walks KerasSaveable attributes of a layer when it saves and loads
# weights; a constraint that is one stores its arrays in the weights file.
class FreezeEntries(keras.constraints.Constraint, _compat.KerasSaveable):
    """Keep the entries outside ``mask`` at fixed ``values`` after each update.

    ``constraint(w)`` returns ``where(mask, w, values)``: the trainable entries
    as the optimizer left them, every other entry set back to its frozen value,
    bit for bit (``values`` are cast to the variable's dtype).

    The mask and the frozen values are saved in the weights file (``.keras``
    or ``.weights.h5``) with the layer that holds the constraint; the config
    holds only the shape.

    Args:
        values: the frozen values: an array of the variable's shape (usually
            its current value, see :meth:`from_variable`), or a scalar for
            every frozen entry.
        mask: the trainable positions (``True`` = may change): a boolean mask
            of the variable's shape, or an index list of shape ``[k, rank]``
            when ``values`` is a full array that gives the shape.

    Raises:
        TypeError: for a non-numeric ``values`` or a bad mask type.
        ValueError: for a mask that does not fit ``values``, an index list
            with a scalar ``values``, or (when applied) a variable of another
            shape.

    Set it on a built layer's kernel (what the optimizer applies) and as the
    layer's ``kernel_constraint`` (what its config saves), then train as usual,
    with `fit <https://keras.io/api/models/model_training_apis/#fit-method>`__
    or a custom loop:

    >>> from refimpl import FreezeEntries
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, name="d")])
    >>> layer, mask = model.get_layer("d"), [[True, False], [False, True]]
    >>> layer.kernel.constraint = FreezeEntries.from_variable(layer.kernel, mask)
    >>> layer.kernel_constraint = layer.kernel.constraint
    >>> before = keras.ops.convert_to_numpy(layer.kernel)
    >>> model.compile(optimizer="adam", loss="mse")
    >>> rng = np.random.default_rng(0)
    >>> _ = model.fit(rng.normal(size=(8, 2)), rng.normal(size=(8, 2)), verbose=0)
    >>> from refimpl.testing import assert_frozen
    >>> assert_frozen(before, layer.kernel, mask)  # the off-diagonal kept its bits
    >>> np.diagonal(keras.ops.convert_to_numpy(layer.kernel)) != np.diagonal(before)
    array([ True,  True])
    """

    def __init__(self, values, mask):
        values_array = _values(values)
        if values_array.ndim > 0:
            shape = values_array.shape
        else:
            shape = _mask_shape(mask)
            if shape is None:
                raise ValueError(
                    "`mask` must be a boolean mask of the variable's shape when "
                    "`values` is a scalar (an index list does not say the "
                    f"shape). Received: mask={_describe(mask)}"
                )
        self._mask = to_mask(mask, shape, name="mask")
        self._values = values_array

    @classmethod
    def from_variable(cls, variable, mask) -> FreezeEntries:
        """Freeze the entries outside ``mask`` at the variable's current values.

        Returns:
            A ``FreezeEntries`` for ``variable``'s shape.

        >>> from refimpl import FreezeEntries
        >>> w = keras.Variable([1.0, 2.0])
        >>> FreezeEntries.from_variable(w, [True, False]).values.tolist()
        [1.0, 2.0]
        """
        return cls(_values(variable, name="variable"), mask)

    @property
    def mask(self) -> np.ndarray:
        """The boolean mask, ``True`` where the entry may change.

        >>> from refimpl import FreezeEntries
        >>> FreezeEntries(np.array([1.0, 2.0, 3.0], "float32"), [[1]]).mask
        array([False,  True, False])
        """
        self._check_loaded()
        return self._mask.copy()

    @property
    def values(self) -> np.ndarray:
        """The frozen values, a NumPy array (0-d for a scalar, else full size).

        >>> from refimpl import FreezeEntries
        >>> FreezeEntries(0.0, [True, False]).values
        array(0.)
        >>> FreezeEntries(np.array([1.0, 2.0], "float32"), [True, False]).values
        array([1., 2.], dtype=float32)
        """
        self._check_loaded()
        return self._values.copy()

    def __call__(self, w):
        self._check_loaded()
        if tuple(w.shape) != self._mask.shape:
            raise ValueError(
                f"`w` must have the shape FreezeEntries was built for, "
                f"{self._mask.shape}: apply it to the variable it freezes. "
                f"Received a variable of shape {tuple(w.shape)}"
            )
        if isinstance(w, keras.Variable):
            w = w.value  # (under JAX, the value of the current scope)
        frozen = ops.cast(self._values, w.dtype)
        return ops.where(self._mask, w, frozen)

    def get_config(self) -> dict:
        return {"shape": list(self._mask.shape)}

    @classmethod
    def from_config(cls, config):
        """A constraint of ``config["shape"]`` whose arrays come with the weights.

        Returns:
            A ``FreezeEntries`` that is usable once the layer's weights load.
        """
        shape = _normalize_shape(tuple(config["shape"]), name="shape")
        shell = cls.__new__(cls)
        shell._mask = np.zeros(shape, bool)
        shell._values = np.full((), _compat.SHELL_FLOAT, np.float32)  # the mark
        return shell

    def _obj_type(self) -> str:
        return _compat.SAVEABLE_KIND

    def save_own_variables(self, store) -> None:
        self._check_loaded()
        store["mask"] = self._mask
        store["values"] = self._values

    def load_own_variables(self, store) -> None:
        mask = np.asarray(store["mask"], dtype=bool)
        if mask.shape != self._mask.shape:
            raise ValueError(
                f"The saved FreezeEntries mask has shape {mask.shape}; this "
                f"constraint was built for shape {self._mask.shape}"
            )
        self._mask = mask
        self._values = np.asarray(store["values"])

    def _check_loaded(self) -> None:
        if _compat.is_shell(self._values):
            raise _compat.require_loaded("This FreezeEntries")


def _values(values, name: str = "values") -> np.ndarray:
    what = "a number or a rectangular numeric array"
    return _as_array(values, name, kind="numeric", what=what)
