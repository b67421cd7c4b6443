"""The :class:`MaskedOptimizer` wrapper (see :mod:`refimpl.optimizers`)."""

from __future__ import annotations

import keras
import numpy as np

from refimpl import _compat, backend
from refimpl._checks import describe, variable_path
from refimpl._pairs import check_pairs, pair_masks
from refimpl.ops import initializer as _constant
from refimpl.optimizers._saved import _BASE_OPTIONS, _NOT_LOADED, _find_path, _Untracked
from refimpl.optimizers.steps import _masked_step

__all__ = ["MaskedOptimizer"]


@keras.saving.register_keras_serializable(package="refimpl")
class MaskedOptimizer(keras.optimizers.Optimizer):
    """Wrap a Keras optimizer so that only the entries in each mask are updated.

    Every option of the update (learning rate and its schedule, clipping,
    ``weight_decay``, EMA (``use_ema``), ``gradient_accumulation_steps``,
    ``loss_scale_factor``) belongs to the inner optimizer; the wrapper refuses
    them, as ``LossScaleOptimizer`` does. ``learning_rate`` and
    ``iterations`` are the inner optimizer's, so callbacks such as
    ``ReduceLROnPlateau`` work. The masks are saved with the optimizer's
    variables (in ``.keras`` and checkpoint files), never in its config.

    Args:
        optimizer: the inner Keras optimizer, or its name (``"adam"``).
        masks: a list of ``(variable, mask)`` pairs, required (the default
            ``None`` is for ``from_config`` alone, whose masks load with the
            optimizer's variables). A boolean mask (or index list) marks the
            trainable entries; a floating-point mask in [0, 1] scales each
            entry's update. Variables not listed train in full.
        restore_frozen: write the frozen entries (mask ``False`` or 0.0) back
            after every update, so that they are exact under every optimizer,
            at the cost of one extra copy of each masked variable and one
            ``where`` per step. With ``use_ema=True`` (on the inner optimizer)
            it also restores them after Keras writes the `moving average
            <https://keras.io/api/optimizers/>`__ over the weights at the end
            of ``fit``. Under Adafactor, where a fully frozen row meets a fully
            frozen column, the free entries still become NaN: the update is
            already NaN at every entry, and writing the frozen values back
            cannot repair the free ones
            (:doc:`/chapters/03_mask_the_gradient`).
        name: the optimizer's name.

    Raises:
        TypeError: for an inner object that is not a Keras optimizer, masks
            that are not ``(variable, mask)`` pairs, or a non-bool
            ``restore_frozen``.
        ValueError: for an unknown optimizer name, an option that belongs to
            the inner optimizer, a mask that does not fit its variable, or
            (when built) a masked variable that is not being trained; and at
            the first update, for masks rebuilt from a config whose values
            were never loaded.

    >>> from refimpl import MaskedOptimizer
    >>> from refimpl.testing import assert_frozen
    >>> w = keras.Variable([1.0, 1.0, 1.0])
    >>> before = keras.ops.convert_to_numpy(w)
    >>> mask = [True, False, True]
    >>> opt = MaskedOptimizer(keras.optimizers.AdamW(0.1), [(w, mask)],
    ...                       restore_frozen=True)
    >>> opt.apply([keras.ops.ones(3)], [w])
    >>> keras.ops.convert_to_numpy(w).round(3)
    array([0.9, 1. , 0.9], dtype=float32)
    >>> assert_frozen(before, w, mask)  # the middle entry kept its bits

    In a model, wrap the optimizer given to ``compile``:

    >>> from refimpl import MaskedOptimizer
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> kernel = model.layers[0].kernel
    >>> masked = MaskedOptimizer("adam", [(kernel, [[True], [False]])])
    >>> model.compile(optimizer=masked, loss="mse")
    >>> before = keras.ops.convert_to_numpy(kernel)
    >>> _ = model.fit(np.ones((4, 2)), np.zeros((4, 1)), epochs=2, verbose=0)
    >>> after = keras.ops.convert_to_numpy(kernel)
    >>> bool(after[1, 0] == before[1, 0]), bool(after[0, 0] != before[0, 0])
    (True, True)
    """

    def __init__(
        self,
        optimizer,
        masks=None,
        *,
        restore_frozen: bool = False,
        name: str | None = None,
        **kwargs,
    ):
        for option, default in _BASE_OPTIONS.items():
            value = kwargs.pop(option, default)
            if value != default:
                raise ValueError(
                    f"`{option}` belongs to the inner optimizer: set it there, "
                    f"for example keras.optimizers.AdamW(..., {option}=...). "
                    f"MaskedOptimizer only filters the update. Received: "
                    f"{option}={describe(value)} on the MaskedOptimizer"
                )
        if "learning_rate" in kwargs:
            raise ValueError(
                "`learning_rate` belongs to the inner optimizer: set it there, "
                "for example keras.optimizers.Adam(learning_rate=...); the "
                "wrapper's learning_rate reads and sets the inner one. "
                f"Received: learning_rate={describe(kwargs['learning_rate'])} on the "
                "MaskedOptimizer"
            )
        saved = kwargs.pop("masked_variables", None)
        if kwargs:
            name = sorted(kwargs)[0]
            raise TypeError(
                f"`{name}` is not an argument of MaskedOptimizer, which takes "
                "`optimizer`, `masks`, `restore_frozen` and `name`. "
                f"Received: {name}={describe(kwargs[name])}"
            )
        if isinstance(optimizer, str):
            try:
                optimizer = keras.optimizers.get(optimizer)
            except ValueError as err:
                raise ValueError(
                    "`optimizer` must be a Keras optimizer or the name of one "
                    f"(such as 'adam'). Received: optimizer={describe(optimizer)}"
                ) from err
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise TypeError(
                "`optimizer` must be a Keras optimizer, such as "
                "keras.optimizers.Adam(1e-3). Received: "
                f"optimizer={describe(optimizer)}"
            )
        if not isinstance(restore_frozen, bool):
            raise TypeError(
                "`restore_frozen` must be True or False. "
                f"Received: restore_frozen={describe(restore_frozen)}"
            )
        if masks is None and saved is None:
            raise TypeError(
                "`masks` must be a list of (variable, mask) pairs. Received: masks=None"
            )
        super().__init__(learning_rate=0.0, name=name)
        self.inner_optimizer = optimizer
        self.restore_frozen = restore_frozen
        # A plain holder: a list attribute holding variables would be tracked,
        # and the model's variables would become the optimizer's own.
        self._given = _Untracked(None if masks is None else check_pairs(masks))
        if self._pairs is not None:
            # Validate every mask now, against its own variable.
            pair_masks(self._pairs, [v for v, _ in self._pairs], scales=True)
        self._saved = saved
        self._mask_of: dict[str, keras.Variable] = {}
        self._scaled: set[str] = set()
        self._masks_loaded = self._pairs is not None

    @property
    def _pairs(self):
        return self._given.value

    @property
    def inner(self):
        """The wrapped optimizer (an alias of ``inner_optimizer``).

        >>> from refimpl import MaskedOptimizer
        >>> opt = MaskedOptimizer("adam", [(keras.Variable([1.0, 2.0]), [True, False])])
        >>> type(opt.inner).__name__, opt.inner is opt.inner_optimizer
        ('Adam', True)
        """
        return self.inner_optimizer

    def build(self, var_list):
        if self.built:
            return
        var_list = list(var_list)
        arrays = self._masks_for(var_list)
        self._mask_variables = []
        self._masked_indices = []
        for index, (variable, array) in enumerate(zip(var_list, arrays, strict=True)):
            if array is None:
                continue
            mask = self.add_variable(
                shape=array.shape,
                dtype="float32",
                initializer=_constant(array),
                aggregation="none",
                name=f"mask_{len(self._mask_variables)}",
            )
            self._mask_variables.append(mask)
            self._masked_indices.append(index)
            self._mask_of[self._var_key(variable)] = mask
            if ((array > 0) & (array < 1)).any():
                self._scaled.add(self._var_key(variable))
        self.inner_optimizer.build(var_list)
        super().build(var_list)

    def _masks_for(self, var_list):
        if self._pairs is not None:
            return pair_masks(self._pairs, var_list, scales=True)
        out = [None] * len(var_list)
        for entry in self._saved:
            index = _find_path(entry["path"], var_list)
            shape = tuple(entry["shape"])
            if tuple(var_list[index].shape) != shape:
                raise ValueError(
                    f"The saved mask for '{entry['path']}' has shape {shape}, but "
                    f"the variable it is matched to has shape "
                    f"{tuple(var_list[index].shape)}"
                )
            # A mark no mask holds: the values come with the optimizer's
            # weights, and apply refuses to run until they have.
            out[index] = np.full(shape, _NOT_LOADED, np.float32)
        return out

    def load_own_variables(self, store):
        super().load_own_variables(store)
        self._check_masks_loaded()

    def _check_masks_loaded(self) -> None:
        """Refuse masks rebuilt from a config whose values were never loaded."""
        for variable, mask in zip(
            self._trainable_variables, self._ordered_masks(), strict=True
        ):
            if mask is None:
                continue
            key = self._var_key(variable)
            values = backend.read_now(mask)
            if (values == _NOT_LOADED).any():
                raise _compat.require_loaded(
                    f"The MaskedOptimizer's mask of '{variable_path(variable)}'"
                )
            if ((values > 0) & (values < 1)).any():
                self._scaled.add(key)
            else:
                self._scaled.discard(key)
        self._masks_loaded = True

    def _ordered_masks(self):
        return [self._mask_of.get(self._var_key(v)) for v in self._trainable_variables]

    @property
    def variables(self):
        return self._variables + self.inner_optimizer.variables

    def apply(self, grads, trainable_variables=None):
        if trainable_variables is None:
            if not self.built:
                raise ValueError(
                    "Pass the variables with the first gradients, or call "
                    "`optimizer.build(variables)` first"
                )
            trainable_variables = self._trainable_variables
        trainable_variables = list(trainable_variables)
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
            self.built = True
        if not self._masks_loaded:
            self._check_masks_loaded()
        masks, scaled = [], []
        for variable in trainable_variables:
            key = self._var_key(variable)
            mask = self._mask_of.get(key)
            masks.append(None if mask is None else mask.value)
            scaled.append(key in self._scaled)
        _masked_step(
            self.inner_optimizer,
            list(grads),
            trainable_variables,
            masks,
            scaled,
            self.restore_frozen,
        )

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        if hasattr(self, "inner_optimizer"):
            self.inner_optimizer.learning_rate = learning_rate

    @property
    def iterations(self):
        return self.inner_optimizer.iterations

    def scale_loss(self, loss):
        return self.inner_optimizer.scale_loss(loss)

    def finalize_variable_values(self, var_list):
        var_list = list(var_list)
        keep = []
        if self.restore_frozen:
            for variable in var_list:
                mask = self._mask_of.get(self._var_key(variable))
                if mask is not None:
                    keep.append((variable, mask, keras.ops.copy(variable.value)))
        self.inner_optimizer.finalize_variable_values(var_list)
        for variable, mask, saved in keep:
            value = keras.ops.convert_to_tensor(variable)
            variable.assign(
                keras.ops.where(
                    mask.value > 0, value, keras.ops.cast(saved, value.dtype)
                )
            )

    def get_config(self) -> dict:
        if self.built:
            entries = [
                {
                    "index": i,
                    "path": variable_path(self._trainable_variables[i]),
                    "shape": list(self._trainable_variables[i].shape),
                    "scaled": self._var_key(self._trainable_variables[i])
                    in self._scaled,
                }
                for i in self._masked_indices
            ]
        elif self._pairs is not None:
            arrays = pair_masks(self._pairs, [v for v, _ in self._pairs], scales=True)
            entries = [
                {
                    "index": None,
                    "path": variable_path(v),
                    "shape": list(v.shape),
                    "scaled": bool(((a > 0) & (a < 1)).any()),
                }
                for (v, _), a in zip(self._pairs, arrays, strict=True)
            ]
        else:
            entries = list(self._saved)
        return {
            "name": self.name,
            "optimizer": keras.optimizers.serialize(self.inner_optimizer),
            "restore_frozen": self.restore_frozen,
            "masked_variables": entries,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = keras.optimizers.deserialize(
            config.pop("optimizer"), custom_objects=custom_objects
        )
        return cls(inner, **config)
