"""What a saved :class:`refimpl.MaskedOptimizer <refimpl.optimizers.MaskedOptimizer>`
needs to find its masks again."""

from __future__ import annotations

from refimpl._checks import variable_path

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
    paths = [variable_path(v) for v in var_list]
    found = [i for i, own in enumerate(paths) if own == path]
    if not found:
        found = [
            i
            for i, own in enumerate(paths)
            if own.endswith("/" + path) or path.endswith("/" + own)
        ]
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


_NOT_LOADED = -1.0


class _Untracked:
    """Holds a value out of sight of Keras' attribute tracking."""

    def __init__(self, value):
        self.value = value
