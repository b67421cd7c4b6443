"""A Keras optimizer's state for one variable, entry by entry (for drop and grow).

Which attributes of each Keras optimizer hold one value per entry of a
variable, and what a fresh entry's value is; the wrappers (loss scaling,
``MultiOptimizer``) are looked through.
"""

from __future__ import annotations

import keras

from refimpl.masks import describe

# Per-entry optimizer state, by optimizer class: each attribute's fresh value
# ("zero", "initial": the optimizer's initial_accumulator_value).
_STATE = {
    "Adam": {"_momentums": "zero", "_velocities": "zero", "_velocity_hats": "zero"},
    "AdamW": {"_momentums": "zero", "_velocities": "zero", "_velocity_hats": "zero"},
    "Nadam": {"_momentums": "zero", "_velocities": "zero"},
    "Adamax": {"_m": "zero", "_u": "zero"},
    "Lamb": {"_momentums": "zero", "_velocities": "zero"},
    "Lion": {"_momentums": "zero"},
    "SGD": {"momentums": "zero"},
    "RMSprop": {
        "_velocities": "zero",
        "_momentums": "zero",
        "_average_gradients": "zero",
    },
    "Adadelta": {"_accumulated_grads": "zero", "_accumulated_delta_vars": "zero"},
    "Adagrad": {"_accumulators": "initial"},
    "Ftrl": {"_accumulators": "initial", "_linears": "zero"},
}
# Every optimizer may also keep these, one per variable.
_COMMON = {"_accumulated_gradients": "zero", "_model_variables_moving_average": "value"}


def updater(optimizer, variable):
    """The optimizer that updates ``variable`` (through Keras' wrappers)."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return updater(optimizer.inner_optimizer, variable)
    multi = getattr(keras.optimizers, "MultiOptimizer", None)
    if multi is not None and isinstance(optimizer, multi):
        return updater(optimizer._optimizer_map(variable), variable)
    return optimizer


def check_optimizer(optimizer, variable) -> None:
    inner = updater(optimizer, variable)
    if type(inner).__name__ not in _STATE:
        raise ValueError(
            "`optimizer` must keep one state value per entry, which drop and grow "
            "resets for a grown entry: one of "
            f"{', '.join(sorted(_STATE))}. Received: optimizer={describe(inner)}"
        )


def slots(optimizer, variable):
    """``(state variable, fresh kind)`` for each per-entry state of ``variable``."""
    inner = updater(optimizer, variable)
    check_optimizer(optimizer, variable)
    if not inner.built:
        return []
    index = inner._get_variable_index(variable)
    found = []
    for attribute, fresh in {**_STATE[type(inner).__name__], **_COMMON}.items():
        states = getattr(inner, attribute, None)
        if not states or states[index] is None:
            continue
        state = states[index]
        if tuple(state.shape) != tuple(variable.shape):  # pragma: no cover
            raise ValueError(
                f"{type(inner).__name__}'s state {attribute!r} of '{variable.path}' "
                f"has shape {tuple(state.shape)}, not one value per entry"
            )
        if fresh == "initial":
            fresh = float(inner.initial_accumulator_value)
        found.append((state, fresh))
    return found
