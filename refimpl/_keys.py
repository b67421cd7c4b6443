"""How a key of :func:`refimpl.partialize <refimpl.convert.partialize>` names the layers
and weights it means.

A key is a layer's name, its path, or the end of a path (``"query"``,
``"query/kernel"``), matched at any depth; a key that names an RNN layer or a
``Bidirectional`` wrapper means the cells inside; a weight's path picks which
weight of a layer with two (``"lstm/recurrent_kernel"``).
"""

from __future__ import annotations

import keras
import numpy as np

from refimpl import _compat
from refimpl.layers.classes import (
    is_supported,
    supported_names,
    target_weight,
    weight_names,
)
from refimpl.layers.partial import PartialWeightMixin
from refimpl.masks import to_mask


def resolve(model, masks):
    """The (layer, mask) pairs that ``masks`` names, each layer checked."""
    layers = _compat.sub_layers(model)
    seen: set = set()
    for key, mask in masks.items():
        if not isinstance(key, str):
            raise TypeError(
                "`layer_masks` keys must be layer names or weight paths. "
                f"Received: {key!r}"
            )
        found = [layer for _, layer in match_keys(model, [key], "layer_masks", layers)]
        found = list(
            {id(x): x for layer in found for x in weight_layers(layer)}.values()
        )
        for layer in found:
            if id(layer) in seen:
                raise ValueError(
                    f"`layer_masks[{key!r}]` names layer {where(layer)}, which "
                    "another key names too: give each layer one mask"
                )
            seen.add(id(layer))
            if isinstance(layer, PartialWeightMixin):
                raise ValueError(
                    f"`layer_masks[{key!r}]` names layer {where(layer)}, which "
                    "is already partially trainable"
                )
            if not is_supported(type(layer)):
                raise TypeError(
                    f"`layer_masks[{key!r}]` names layer {where(layer)} "
                    "of type "
                    f"{type(layer).__name__}, which partialize cannot convert; it "
                    f"converts {supported_names()}"
                )
            yield key, layer, weight_of(layer, key), mask


def match_keys(model, keys, name: str, layers=None):
    """The (key, layer) pairs that each key names; a key that names none raises."""
    layers = _compat.sub_layers(model) if layers is None else layers
    for key in keys:
        found = [layer for layer in layers if names(layer, key)]
        if not found:
            raise ValueError(
                f"`{name}[{key!r}]` names no layer or weight of the model. Its "
                f"layers: {[layer.name for layer in layers][:12]}"
            )
        yield from ((key, layer) for layer in found)


def where(layer) -> str:
    return repr(layer.path or layer.name)


def names(layer, key: str) -> bool:
    path = layer.path or layer.name
    if layer.name == key or path == key or path.endswith("/" + key):
        return True
    return weight_of(layer, key) is not None


def weight_layers(layer) -> list:
    """The layers that hold the weights a key naming ``layer`` means: an RNN's
    cell, both directions of a ``Bidirectional``; else ``layer`` itself."""
    if isinstance(layer, keras.layers.Bidirectional):
        return [
            *weight_layers(layer.forward_layer),
            *weight_layers(layer.backward_layer),
        ]
    if isinstance(layer, keras.layers.RNN) and is_supported(type(layer.cell)):
        return [layer.cell]
    return [layer]


def weight_of(layer, key: str) -> str | None:
    """The weight of ``layer`` that ``key`` names by its path, if any.

    An RNN cell's weights are also named through the RNN layer
    (``"lstm/recurrent_kernel"`` for ``"lstm/lstm_cell/recurrent_kernel"``).
    """
    if not is_supported(type(layer)):
        return None
    for weight in weight_names(layer):
        path = target_weight(layer, weight).path
        short = None
        if hasattr(layer, "state_size") and "/" in (layer.path or ""):  # a cell
            parent = (layer.path or "").rsplit("/", 1)[0]
            short = f"{parent}/{weight}"
        for candidate in (path, short):
            if candidate and (candidate == key or candidate.endswith("/" + key)):
                return weight
    return None


def policy_mask(layer, mask, name: str, weight: str | None = None) -> np.ndarray:
    weight = target_weight(layer, weight)
    if callable(mask):
        mask = mask(np.array(keras.ops.convert_to_numpy(weight)))
    return to_mask(mask, tuple(weight.shape), name=name)
