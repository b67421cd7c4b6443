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

from __future__ import annotations

import keras
import numpy as np

from refimpl import _compat, backend
from refimpl.masks import (
    _check_pairs,
    _describe,
    _mask_constant,
    _matching_paths,
    _pair_masks,
    _variable_pairs,
    _variable_path,
)
from refimpl.ops import _initializer as _constant

__all__ = ["MaskedOptimizer", "apply_masked_gradients", "mask_gradients"]


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
                    f"{option}={_describe(value)} on the MaskedOptimizer"
                )
        if "learning_rate" in kwargs:
            raise ValueError(
                "`learning_rate` belongs to the inner optimizer: set it there, "
                "for example keras.optimizers.Adam(learning_rate=...); the "
                "wrapper's learning_rate reads and sets the inner one. "
                f"Received: learning_rate={_describe(kwargs['learning_rate'])} on the "
                "MaskedOptimizer"
            )
        saved = kwargs.pop("masked_variables", None)
        if kwargs:
            name = sorted(kwargs)[0]
            raise TypeError(
                f"`{name}` is not an argument of MaskedOptimizer, which takes "
                "`optimizer`, `masks`, `restore_frozen` and `name`. "
                f"Received: {name}={_describe(kwargs[name])}"
            )
        if isinstance(optimizer, str):
            try:
                optimizer = keras.optimizers.get(optimizer)
            except ValueError as err:
                raise ValueError(
                    "`optimizer` must be a Keras optimizer or the name of one "
                    f"(such as 'adam'). Received: optimizer={_describe(optimizer)}"
                ) from err
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise TypeError(
                "`optimizer` must be a Keras optimizer, such as "
                "keras.optimizers.Adam(1e-3). Received: "
                f"optimizer={_describe(optimizer)}"
            )
        if not isinstance(restore_frozen, bool):
            raise TypeError(
                "`restore_frozen` must be True or False. "
                f"Received: restore_frozen={_describe(restore_frozen)}"
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
        self._given = _Untracked(None if masks is None else _check_pairs(masks))
        if self._pairs is not None:
            # Validate every mask now, against its own variable.
            _pair_masks(self._pairs, [v for v, _ in self._pairs], scales=True)
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
            self._mask_of[_compat.variable_key(self, variable)] = mask
            if ((array > 0) & (array < 1)).any():
                self._scaled.add(_compat.variable_key(self, variable))
        self.inner_optimizer.build(var_list)
        super().build(var_list)

    def _masks_for(self, var_list):
        if self._pairs is not None:
            return _pair_masks(self._pairs, var_list, scales=True)
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
            out[index] = np.full(shape, _compat.SHELL_FLOAT, np.float32)
        return out

    def load_own_variables(self, store):
        super().load_own_variables(store)
        self._check_masks_loaded()

    def _check_masks_loaded(self) -> None:
        """Refuse masks rebuilt from a config whose values were never loaded."""
        for variable, mask in zip(
            _compat.optimizer_variables(self), self._ordered_masks(), strict=True
        ):
            if mask is None:
                continue
            key = _compat.variable_key(self, variable)
            values = backend.read_now(mask)
            if _compat.is_shell(values):
                raise _compat.require_loaded(
                    f"The MaskedOptimizer's mask of '{_variable_path(variable)}'"
                )
            if ((values > 0) & (values < 1)).any():
                self._scaled.add(key)
            else:
                self._scaled.discard(key)
        self._masks_loaded = True

    def _ordered_masks(self):
        return [
            self._mask_of.get(_compat.variable_key(self, v))
            for v in _compat.optimizer_variables(self)
        ]

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
            trainable_variables = _compat.optimizer_variables(self)
        trainable_variables = list(trainable_variables)
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
            self.built = True
        if not self._masks_loaded:
            self._check_masks_loaded()
        masks, scaled = [], []
        for variable in trainable_variables:
            key = _compat.variable_key(self, variable)
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
                mask = self._mask_of.get(_compat.variable_key(self, variable))
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
                    "path": _variable_path(_compat.optimizer_variables(self)[i]),
                    "shape": list(_compat.optimizer_variables(self)[i].shape),
                    "scaled": _compat.variable_key(
                        self, _compat.optimizer_variables(self)[i]
                    )
                    in self._scaled,
                }
                for i in self._masked_indices
            ]
        elif self._pairs is not None:
            arrays = _pair_masks(self._pairs, [v for v, _ in self._pairs], scales=True)
            entries = [
                {
                    "index": None,
                    "path": _variable_path(v),
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


# -- the masked step, for a custom loop ------------------------------------------
def mask_gradients(grads_and_vars, masks) -> list[tuple]:
    """Zero the gradient of every frozen entry.

    Args:
        grads_and_vars: ``(gradient, variable)`` pairs, as passed to
            ``optimizer.apply_gradients``.
        masks: a list of ``(variable, mask)`` pairs (``True`` = trainable);
            variables that no pair names keep their gradient.

    Returns:
        A new list of ``(gradient, variable)`` pairs, each gradient equal to
        the original at trainable entries and exactly ``0.0`` at frozen ones
        (even where it was NaN).

    Raises:
        TypeError: for pairs that are not pairs, or a non-variable.
        ValueError: for a ``None`` gradient of a masked variable, a mask that
            does not fit, or a masked variable that is not in
            ``grads_and_vars``.

    >>> from refimpl.optimizers import mask_gradients
    >>> w = keras.Variable([1.0, 2.0])
    >>> grad = keras.ops.array([3.0, 4.0])
    >>> [(g, _)] = mask_gradients([(grad, w)], [(w, [True, False])])
    >>> keras.ops.convert_to_numpy(g)
    array([3., 0.], dtype=float32)
    """
    grads, variables = _split(grads_and_vars)
    arrays = _pair_masks(masks, variables)
    _check_gradients(grads, variables, arrays)
    return [
        (grad if mask is None else _mask_one(grad, _mask_constant(mask)), variable)
        for grad, variable, mask in zip(grads, variables, arrays, strict=True)
    ]


def _check_gradients(grads, variables, arrays) -> None:
    """Refuse a ``None`` gradient for a masked variable (it would not train)."""
    for i, (grad, variable, mask) in enumerate(
        zip(grads, variables, arrays, strict=True)
    ):
        if mask is not None and grad is None:
            raise ValueError(
                f"The gradient of the masked variable '{_variable_path(variable)}' "
                f"(`grads_and_vars[{i}]`) is None: the loss does not depend on "
                "it. Compute the loss from the variable inside the tape. "
                f"Received: grads_and_vars[{i}]=(None, {_variable_path(variable)!r})"
            )


def apply_masked_gradients(
    optimizer, grads_and_vars, masks, *, restore_frozen: bool = False
) -> None:
    """Mask the gradients, apply them, and optionally restore frozen entries.

    One step of :class:`MaskedOptimizer`, for a custom loop with an optimizer
    you already have. Works eagerly on every backend, and on TensorFlow
    also in ``tf.function`` and under
    `tf.distribute <https://www.tensorflow.org/api_docs/python/tf/distribute>`__
    (in :term:`replica context`).

    Args:
        optimizer: a Keras optimizer.
        grads_and_vars: ``(gradient, variable)`` pairs.
        masks: a list of ``(variable, mask)`` pairs; a floating-point mask in
            [0, 1] scales each entry's update.
        restore_frozen: write the frozen entries back after the update, which
            keeps them exact under every optimizer. Under Adafactor, where a
            fully frozen row meets a fully frozen column, the free entries
            still become NaN: the update is already NaN at every entry, and
            writing the frozen values back cannot repair the free ones
            (:doc:`/chapters/03_mask_the_gradient`).

    Returns:
        ``None``; the variables change in place.

    Raises:
        TypeError: for an optimizer that is not a Keras optimizer, pairs that
            are not pairs, a non-variable, or a non-bool ``restore_frozen``.
        ValueError: for a ``None`` gradient of a masked variable, or a mask
            that does not fit.

    >>> from refimpl.optimizers import apply_masked_gradients
    >>> x = keras.Variable([3.0, 2.0])
    >>> apply_masked_gradients(
    ...     keras.optimizers.SGD(0.1), [(keras.ops.array([2.0, 10.0]), x)],
    ...     [(x, [True, False])])
    >>> keras.ops.convert_to_numpy(x)
    array([2.8, 2. ], dtype=float32)
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "`optimizer` must be a Keras optimizer, such as "
            f"keras.optimizers.SGD(0.1). Received: optimizer={_describe(optimizer)}"
        )
    if not isinstance(restore_frozen, bool):
        raise TypeError(
            "`restore_frozen` must be True or False. "
            f"Received: restore_frozen={_describe(restore_frozen)}"
        )
    grads, variables = _split(grads_and_vars)
    if not variables:
        return
    arrays = _pair_masks(masks, variables, scales=True)
    _check_gradients(grads, variables, arrays)
    tensors = [None if a is None else keras.ops.convert_to_tensor(a) for a in arrays]
    scaled = [a is not None and bool(((a > 0) & (a < 1)).any()) for a in arrays]
    _masked_step(optimizer, grads, variables, tensors, scaled, restore_frozen)


def _masked_step(optimizer, grads, variables, masks, scaled, restore) -> None:
    """Mask, apply with ``optimizer``, then restore or scale: the shared step."""
    grads = [
        g if m is None or g is None else _mask_one(g, m > 0)
        for g, m in zip(grads, masks, strict=True)
    ]
    saved = [
        keras.ops.copy(keras.ops.convert_to_tensor(v))
        if m is not None and (restore or s)
        else None
        for v, m, s in zip(variables, masks, scaled, strict=True)
    ]
    optimizer.apply(grads, variables)
    for variable, mask, old, scale in zip(variables, masks, saved, scaled, strict=True):
        if old is None:
            continue
        new = keras.ops.convert_to_tensor(variable)
        if scale:
            fraction = keras.ops.cast(mask, new.dtype)
            partial = old + fraction * (new - old)
            value = keras.ops.where(mask >= 1, new, partial)
            value = keras.ops.where(mask > 0, value, old)
        else:
            value = keras.ops.where(mask > 0, new, old)
        backend.assign_on_every_replica(variable, value)


def _mask_one(grad, keep):
    """Zero ``grad`` where ``keep`` is False, with a ``where`` (NaN-safe)."""
    sparse = backend.mask_sparse_gradient(grad, keep)
    if sparse is not None:
        return sparse
    grad = keras.ops.convert_to_tensor(grad)
    return keras.ops.where(keep, grad, keras.ops.zeros_like(grad))


def _split(grads_and_vars) -> tuple[list, list]:
    if not isinstance(grads_and_vars, (list, tuple)) and hasattr(
        grads_and_vars, "__iter__"
    ):
        grads_and_vars = list(grads_and_vars)  # zip(grads, vars) is fine
    pairs = _variable_pairs(
        grads_and_vars, name="grads_and_vars", slot=1, kind="(gradient, variable)"
    )
    variables = []
    for i, (grad, variable) in enumerate(pairs):
        if any(variable is v for v in variables):
            raise ValueError(
                f"`grads_and_vars[{i}]` gives a second gradient for the variable "
                f"{_variable_path(variable)!r}: give each variable once (add its "
                f"gradients first). Received: grads_and_vars[{i}]="
                f"({type(grad).__name__}, {_variable_path(variable)!r})"
            )
        variables.append(variable)
    return [grad for grad, _ in pairs], variables


# -- what a saved MaskedOptimizer needs to find its masks again ---------------
#: The base-optimizer options the wrapper refuses (the inner optimizer has
#: them), with their defaults.
_BASE_OPTIONS = {
    "weight_decay": None,
    "clipnorm": None,
    "global_clipnorm": None,
    "clipvalue": None,
    "use_ema": False,
    "ema_momentum": 0.99,
    "ema_overwrite_frequency": None,
    "loss_scale_factor": None,
    "gradient_accumulation_steps": None,
}


def _find_path(path: str, var_list) -> int:
    """The index of the one variable whose path is ``path``.

    The full path decides; only where no path equals it is a path that ends
    in it (or that it ends in) accepted, and then it must be one. (A saved
    index is never trusted: variables may come in another order.)
    """
    paths = [_variable_path(v) for v in var_list]
    found = _matching_paths(path, paths)
    if len(found) > 1:
        raise ValueError(
            f"The saved MaskedOptimizer masks the variable '{path}', and "
            f"{len(found)} variables of the model being trained match it: "
            f"{[paths[i] for i in found][:8]}. Pass the masks again: "
            "MaskedOptimizer(optimizer, masks)."
        )
    if not found:
        raise ValueError(
            f"The saved MaskedOptimizer masks the variable '{path}', which the "
            f"model being trained does not have. Its variables: {paths[:8]}"
        )
    return found[0]


class _Untracked:
    """Holds a value out of sight of Keras' attribute tracking."""

    def __init__(self, value):
        self.value = value
