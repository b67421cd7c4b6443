"""Make a built Keras layer partially trainable: :func:`enable_partial`.

The partial classes of ``EinsumDense``, the convolutions and ``Embedding``
are made here, one per plain class (``PartialDense`` is written out in
:mod:`refimpl.layers.dense`); :func:`partial_class` finds the one of a class.
"""

from __future__ import annotations

import types

import keras
import numpy as np

from refimpl._checks import describe
from refimpl.layers.dense import PartialDense
from refimpl.layers.partial import (
    _ELEMENTWISE_REGULARIZERS,
    _PLAIN_TO_PARTIAL,
    PartialWeightMixin,
    _check_constraint,
    _composing,
)
from refimpl.masks import to_mask
from refimpl.ops import check_mode

__all__ = [
    "PARTIAL_CLASSES",
    "PartialDense",
    "enable_partial",
    "make_shell",
    "partial_class",
    "supported_classes",
]


def _make(plain_class, target="kernel"):
    name = f"Partial{plain_class.__name__}"
    cls = type(
        name,
        (PartialWeightMixin, plain_class),
        {
            "_partial_target": target,
            target: _composing(plain_class, target),
            "__module__": __name__,
            "__qualname__": name,
            "__doc__": (
                f"A ``keras.layers.{plain_class.__name__}`` whose ``{target}`` is "
                "trainable only at some entries: made by :func:`refimpl.partialize` "
                "or :func:`refimpl.enable_partial`."
            ),
        },
    )
    _PLAIN_TO_PARTIAL[plain_class] = keras.saving.register_keras_serializable(
        package="refimpl", name=name
    )(cls)


for _plain in (
    keras.layers.EinsumDense,
    keras.layers.Conv1D,
    keras.layers.Conv2D,
    keras.layers.Conv3D,
):
    _make(_plain)
_make(keras.layers.Embedding, "embeddings")

#: The partial class of every supported Keras layer class (read-only).
PARTIAL_CLASSES = types.MappingProxyType(_PLAIN_TO_PARTIAL)


def supported_classes() -> tuple[type, ...]:
    """The Keras layer classes that have a partial class."""
    return tuple(_PLAIN_TO_PARTIAL)


def partial_class(layer_class: type) -> type:
    """The partial class of a Keras layer class (``PartialDense`` for ``Dense``).

    Raises:
        TypeError: for a class this mechanism does not support.
    """
    if layer_class in _PLAIN_TO_PARTIAL.values():
        return layer_class
    if layer_class not in _PLAIN_TO_PARTIAL:
        raise TypeError(
            "`layer_class` must be one of the Keras layers with a kernel or an "
            f"embedding table: {[c.__name__ for c in _PLAIN_TO_PARTIAL]}. "
            f"Received: {getattr(layer_class, '__name__', describe(layer_class))}"
        )
    return _PLAIN_TO_PARTIAL[layer_class]


def target_weight(layer):
    """The variable a partial form of ``layer`` freezes (its kernel, embeddings)."""
    target = "embeddings" if isinstance(layer, keras.layers.Embedding) else "kernel"
    return getattr(layer, "_" + target)


def enable_partial(layer, mask, *, mode: str = "delta") -> None:
    """Make a built layer's kernel (or embeddings) trainable only in ``mask``.

    In place, like Keras' ``enable_lora``: the layer becomes an instance of
    its :func:`partial_class`, its weight becomes the frozen base, and its
    outputs do not change. Compile the model again after converting.

    Args:
        layer: a built layer of a supported class (not already partial).
        mask: the trainable entries of its ``kernel`` (``embeddings`` for an
            ``Embedding``): a boolean mask of the weight's shape or an index
            list (see :func:`refimpl.masks.to_mask`).
        mode: ``"delta"``, ``"select"``, ``"auto"``; ``"sparse"`` for ``Dense``.

    Raises:
        TypeError: for a layer of another class.
        ValueError: for a layer that is not built, is already partial, uses
            LoRA or quantization, has a regularizer or constraint that is not
            elementwise, or a mask that does not fit.
    """
    if not isinstance(layer, keras.layers.Layer):
        raise TypeError(
            f"`layer` must be a Keras layer. Received: layer={describe(layer)}"
        )
    if isinstance(layer, PartialWeightMixin):
        raise ValueError(
            f"`layer` is already partially trainable. Received: layer={layer.name!r}"
        )
    plain = type(layer)
    if plain not in _PLAIN_TO_PARTIAL:
        raise TypeError(
            f"`layer` must be one of {[c.__name__ for c in _PLAIN_TO_PARTIAL]}, "
            f"whose weight this mechanism knows. Received: layer {layer.name!r} "
            f"of type {plain.__name__}"
        )
    check_mode(mode)
    if not layer.built:
        raise ValueError(
            f"`layer` must be built (call the model once). Received: {layer.name!r}"
        )
    if getattr(layer, "lora_enabled", False) or getattr(
        layer, "quantization_mode", None
    ):
        raise ValueError(
            f"`layer` uses LoRA or quantization, which a partial weight does "
            f"not combine with. Received: {layer.name!r}"
        )
    base = target_weight(layer)
    target = base.path.split("/")[-1]
    if base.regularizer is not None and not isinstance(
        base.regularizer, _ELEMENTWISE_REGULARIZERS
    ):
        raise ValueError(
            f"`layer` {layer.name!r} has a regularizer on its {target} that is "
            "not elementwise (L1, L2 or L1L2), so it cannot be split between "
            f"free and frozen entries. Received: {target}_regularizer="
            f"{type(base.regularizer).__name__}"
        )
    _check_constraint(base.constraint, layer.name)
    bool_mask = to_mask(mask, tuple(base.shape), name="mask")
    layer.__class__ = partial_class(plain)
    positions = np.flatnonzero(bool_mask)
    layer._partial_add_weights(len(positions), positions, mode, False)


def make_shell(
    layer, *, num_free: int, mode: str, auto: bool, rest_trainable: bool = True
) -> None:
    """Turn a built plain ``layer`` into a partial shell, in place.

    Its free values and positions come with the saved weights (the shell
    protocol of :mod:`refimpl._compat`); what a rebuilt host does to its
    sub-layers (:mod:`refimpl.layers.hosts`).
    """
    layer.__class__ = partial_class(type(layer))
    layer._partial_add_weights(num_free, None, mode, auto)
    if not rest_trainable:
        layer.freeze_rest()
