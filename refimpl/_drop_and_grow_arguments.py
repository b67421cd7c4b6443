"""The argument checks of :mod:`refimpl.drop_and_grow`."""

from __future__ import annotations

import keras
import numpy as np

from refimpl._checks import describe, input_arrays


def check_fraction(fraction) -> float:
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise TypeError(
            "`fraction` must be a number in (0, 1). "
            f"Received: fraction={describe(fraction)}"
        )
    if not 0 < fraction < 1:
        raise ValueError(
            "`fraction` must be in (0, 1): the share of each layer's free entries "
            f"that is dropped and grown. Received: fraction={fraction!r}"
        )
    return float(fraction)


def check_count(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(
            f"`{name}` must be an int of at least 1. Received: {name}={describe(value)}"
        )
    if value < 1:
        raise ValueError(
            f"`{name}` must be an int of at least 1. Received: {name}={describe(value)}"
        )
    return int(value)


def check_data(data):
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise TypeError(
            "`data` must be a tuple (x, y) of probe inputs and targets, from which "
            f"the growth score is computed. Received: data={describe(data)}"
        )
    return input_arrays(
        *data, "data", "`data` must hold as many rows of x as of y, at least one."
    )


def loss_of(model, loss):
    loss = loss if loss is not None else getattr(model, "loss", None)
    if loss is None:
        raise ValueError(
            "`loss` is needed for the growth score: pass it, or compile the model "
            "with a loss. Received: loss=None"
        )
    if isinstance(loss, (dict, list, tuple)):
        raise ValueError(
            "`loss` must be one loss for the model's output: pass it explicitly "
            f"for a model with several outputs. Received: loss={describe(loss)}"
        )
    return keras.losses.get(loss)
