"""A model in and out: :func:`partialize` converts, :func:`merge` folds back."""

from __future__ import annotations

import keras
import numpy as np

from refimpl import _compat
from refimpl._checks import describe
from refimpl.layers.enable import enable_partial, supported_classes, target_weight
from refimpl.layers.partial import PartialWeightMixin
from refimpl.masks import to_mask
from refimpl.ops import check_mode

__all__ = ["merge", "partial_layers", "partialize"]


def partialize(model, layer_masks, *, in_place: bool = False, mode: str = "delta"):
    """Return a model whose chosen weights are trainable only at some entries.

    Every chosen layer (``Dense``, ``EinsumDense``, the convolutions and
    ``Embedding``) gets a partially trainable weight (see
    :mod:`refimpl.layers.partial`); every other layer is left exactly as it
    was: its weights, its ``trainable`` status, BatchNorm's inference mode,
    its regularizers. Before any training the new model's outputs equal the
    original's bit for bit.

    Args:
        model: a built Keras model: ``Sequential`` or functional (copied), or
            any model with ``in_place=True`` (subclassed models included).
        layer_masks: a dict from a layer name, or the path of its weight
            (``"dense/kernel"``), to the trainable entries of that layer's
            kernel (embeddings for ``Embedding``): a boolean mask or index
            list, or a policy, a callable that takes the weight's current
            values (a NumPy array) and returns the mask, such as
            ``lambda w: refimpl.selection.magnitude_mask(w, fraction=0.01)``.
        in_place: convert ``model``'s own layers (as Keras' ``enable_lora``
            does) instead of a copy. A model compiled before is marked as not
            compiled: its optimizer and traced step were built for the old
            variables, and ``fit`` asks for a new ``compile``.
        mode: the form of every partial weight (see
            :func:`refimpl.enable_partial`).

    A key matches a layer by its name or its weight's path, or by the end of
    the path (``"query/kernel"``, ``"query"``), at any depth. A key that
    matches several layers converts every one, as keras-hub's
    ``enable_lora(target_layer_names=...)`` does; :func:`partial_layers` lists
    what was converted.

    Returns:
        The converted model (``model`` itself with ``in_place=True``). Compile
        it before training.

    Raises:
        TypeError: for a model that is not a Keras model, a subclassed model
            without ``in_place=True``, ``layer_masks`` that is not a dict, or a
            chosen layer of a type this cannot convert (the message names the
            layer and its type).
        ValueError: for a model that is not built, or a key that names no
            layer or weight of the model, or a mask that does not fit.
    """
    _check_model(model, "partialize", allow_subclassed=in_place)
    if not isinstance(layer_masks, dict):
        raise TypeError(
            "`layer_masks` must be a dict from a layer name or weight path to a mask "
            f"or a policy. Received: layer_masks={describe(layer_masks)}"
        )
    if not isinstance(in_place, bool):
        raise TypeError(
            f"`in_place` must be True or False. Received: {describe(in_place)}"
        )
    check_mode(mode)
    # Every mask is computed and checked before anything is converted.
    chosen = [
        (layer, _policy(layer, mask, f"layer_masks[{key!r}]"))
        for key, layer, mask in _resolve(model, layer_masks)
    ]
    if in_place:
        for layer, mask in chosen:
            enable_partial(layer, mask, mode=mode)
        if getattr(model, "compiled", False):
            # The optimizer and the traced train step know the old variables:
            # training on them would move the frozen base and no free value.
            model.compiled = False
            model.optimizer = None
            model.train_function = model.test_function = None
            model.predict_function = None
        return model
    copy = _clone(model)
    # Nested layers (the projections inside MultiHeadAttention) line up by
    # their place in the flattened layer list.
    before, after = _compat.sub_layers(model), _compat.sub_layers(copy)
    place = {id(layer): i for i, layer in enumerate(before)}
    for layer, mask in chosen:
        enable_partial(after[place[id(layer)]], mask, mode=mode)
    return copy


def partial_layers(model) -> list[dict]:
    """What is partially trainable in ``model``: one record per partial layer.

    Each record has the layer's ``path``, its ``class``, ``num_free`` and
    ``size`` (entries of its partial weight).
    """
    return [
        {
            "path": layer.path or layer.name,
            "class": type(layer).__name__,
            "num_free": layer.num_free,
            "size": int(np.prod(layer.base_weight.shape)),
        }
        for layer in _compat.sub_layers(model)
        if isinstance(layer, PartialWeightMixin)
    ]


def _resolve(model, masks):
    """The (layer, mask) pairs that ``masks`` names, each layer checked."""
    layers = _compat.sub_layers(model)
    seen: set = set()
    for key, mask in masks.items():
        if not isinstance(key, str):
            raise TypeError(
                "`layer_masks` keys must be layer names or weight paths. "
                f"Received: {key!r}"
            )
        found = [layer for layer in layers if _names(layer, key)]
        if not found:
            raise ValueError(
                f"`layer_masks[{key!r}]` names no layer or weight of the model. Its "
                f"layers: {[layer.name for layer in layers][:12]}"
            )
        for layer in found:
            if id(layer) in seen:
                raise ValueError(
                    f"`layer_masks[{key!r}]` names layer {_where(layer)}, which "
                    "another key names too: give each layer one mask"
                )
            seen.add(id(layer))
            if isinstance(layer, PartialWeightMixin):
                raise ValueError(
                    f"`layer_masks[{key!r}]` names layer {_where(layer)}, which "
                    "is already partially trainable"
                )
            if type(layer) not in supported_classes():
                raise TypeError(
                    f"`layer_masks[{key!r}]` names layer {_where(layer)} "
                    "of type "
                    f"{type(layer).__name__}, which partialize cannot convert; it "
                    f"converts {[c.__name__ for c in supported_classes()]}"
                )
            yield key, layer, mask


def _where(layer) -> str:
    return repr(layer.path or layer.name)


def _names(layer, key: str) -> bool:
    path = layer.path or layer.name
    if layer.name == key or path == key or path.endswith("/" + key):
        return True
    if type(layer) not in supported_classes():
        return False
    path = target_weight(layer).path
    return path == key or path.endswith("/" + key)


def _policy(layer, mask, name: str) -> np.ndarray:
    weight = target_weight(layer)
    if callable(mask):
        mask = mask(np.array(keras.ops.convert_to_numpy(weight)))
    return to_mask(mask, tuple(weight.shape), name=name)


def _check_model(model, what: str, *, allow_subclassed: bool = False) -> None:
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"`model` must be a Keras model. Received: model={describe(model)}"
        )
    if (
        not allow_subclassed
        and not isinstance(model, keras.Sequential)
        and not _compat.is_functional(model)
    ):
        extra = (
            " Pass `in_place=True` to convert its layers themselves."
            if what == "partialize"
            else " Call `layer.to_dense()` on its refimpl layers instead."
        )
        raise TypeError(
            "`model` must be a Sequential or functional model; a subclassed "
            f"model's structure is Python code that {what} cannot copy.{extra} "
            f"Received: {type(model).__name__}"
        )
    if not model.built:
        raise ValueError(
            f"`model` must be built. Received: model={describe(model.name)}"
        )


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
    _check_model(model, "merge")
    return _clone(model, replace=lambda layer: getattr(layer, "to_dense", None))


def _clone(model, replace=lambda layer: None):
    """A copy of ``model`` with its weights; ``replace(layer)`` may give a
    function that returns the layer to use instead of a copy."""
    originals = {}

    def clone(layer):
        make = replace(layer)
        if make is not None:
            return make()
        new = layer.__class__.from_config(layer.get_config())
        originals[id(new)] = layer
        return new

    copy = keras.models.clone_model(model, clone_function=clone)
    for layer in copy.layers:
        source = originals.get(id(layer))
        if source is not None:
            layer.set_weights([np.array(w) for w in source.get_weights()])
    return copy
