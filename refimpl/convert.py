"""Fold refimpl layers back into plain Keras layers: :func:`merge`."""

from __future__ import annotations

import keras

__all__ = ["merge"]


def merge(model):
    """Return a plain Keras model with every refimpl layer folded into a Dense.

    Each layer that has a ``to_dense()`` method (every layer of
    :mod:`refimpl.layers`) is replaced by the ``keras.layers.Dense`` it
    returns; every other layer is cloned with its weights. The result uses
    only Keras' own classes, so it serves, exports and loads without
    ``refimpl``.

    Args:
        model: a built ``keras.Sequential`` or functional ``keras.Model``.

    Returns:
        A new model of the same structure and the same weights.

    Raises:
        TypeError: for a subclassed model (its structure is code, which
            cannot be rewritten), or an object that is not a Keras model.
        ValueError: for a model that is not built.
    """
    if not isinstance(model, keras.Model):
        raise TypeError(f"`model` must be a Keras model. Received: model={model!r}")
    if not isinstance(model, keras.Sequential) and not _is_functional(model):
        raise TypeError(
            "`model` must be a Sequential or functional model; a subclassed "
            "model's structure is Python code that merge cannot rewrite. Call "
            f"`layer.to_dense()` on its refimpl layers instead. Received: "
            f"{type(model).__name__}"
        )
    if not model.built:
        raise ValueError(f"`model` must be built. Received: model={model.name!r}")
    originals = {}

    def clone(layer):
        if hasattr(layer, "to_dense"):
            return layer.to_dense()
        new = layer.__class__.from_config(layer.get_config())
        originals[id(new)] = layer
        return new

    merged = keras.models.clone_model(model, clone_function=clone)
    for layer in merged.layers:
        source = originals.get(id(layer))
        if source is not None:
            layer.set_weights(source.get_weights())
    return merged


def _is_functional(model) -> bool:
    return type(model).__name__ == "Functional" or (
        hasattr(model, "_is_graph_network") and model._is_graph_network
    )
