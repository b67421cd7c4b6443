"""Small models and helpers that several test modules share."""

from __future__ import annotations

import keras
import numpy as np

from refimpl import _compat
from refimpl.layers.partial import PartialWeightMixin

_RNG = np.random.default_rng(0)
#: A batch and targets for :func:`attention_model`.
X = _RNG.normal(size=(6, 8, 16)).astype("float32")
Y = _RNG.normal(size=(6, 8, 4)).astype("float32")


def attention_model():
    """``Dense`` (``d1``), ``MultiHeadAttention`` (``mha``), ``Dense`` (``d2``)."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 16))
    h = keras.layers.Dense(32, activation="relu", name="d1")(inputs)
    h = keras.layers.MultiHeadAttention(4, 8, name="mha")(h, h)
    return keras.Model(inputs, keras.layers.Dense(4, name="d2")(h))


def partial_layers(model) -> list:
    """Every partial layer of ``model``, at any depth, in order."""
    return [
        layer
        for layer in _compat.sub_layers(model)
        if isinstance(layer, PartialWeightMixin)
    ]
