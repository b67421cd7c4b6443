"""Make a built Keras layer partially trainable: :func:`enable_partial`.

The partial classes are made in :mod:`refimpl.layers.classes`;
:func:`~refimpl.layers.classes.partial_class` finds the one of a class.
``PARTIAL_CLASSES``, ``partial_class``, ``supported_classes``,
``target_weight`` (:mod:`refimpl.layers.classes`) and ``PartialDense``
(:mod:`refimpl.layers.dense`) also import from here, and are documented where
they are defined.
"""

from __future__ import annotations

import keras
import numpy as np

from refimpl import _layouts, _slices
from refimpl._checks import describe
from refimpl.layers._pieces import _check_constraint, _splittable_regularizer
from refimpl.layers.classes import (
    PARTIAL_CLASSES,
    is_supported,
    partial_class,
    supported_classes,
    supported_names,
    target_weight,
    weight_names,
)
from refimpl.layers.dense import PartialDense
from refimpl.layers.partial import PartialWeightMixin
from refimpl.masks import to_mask
from refimpl.ops import LAYER_MODES, check_mode, mode_for

__all__ = [
    "PARTIAL_CLASSES",
    "PartialDense",
    "enable_partial",
    "make_shell",
    "partial_class",
    "supported_classes",
    "target_weight",
]


def enable_partial(
    layer, mask, *, mode: str = "delta", weight: str | None = None
) -> None:
    """Make a built layer's kernel (or embeddings) trainable only in ``mask``.

    In place, like Keras' ``enable_lora``: the layer becomes an instance of
    its :func:`~refimpl.layers.classes.partial_class`, its weight becomes the frozen
    base, and its
    outputs do not change. Unlike :func:`~refimpl.convert.partialize`, this
    freezes nothing else: the layer's bias and other weights keep training
    (:meth:`layer.freeze_rest() <refimpl.layers.partial.PartialWeightMixin.freeze_rest>`
    freezes them). Compile the model again after converting. On a sub-layer
    of a layer that builds its own sub-layers (a ``MultiHeadAttention``
    projection, a keras-hub block), call
    :func:`~refimpl.layers.hosts.mark_hosts` on the model before saving, so
    that it reloads; :func:`~refimpl.convert.partialize` does this itself.

    Args:
        layer: a built layer of a supported class (not already partial).
        mask: the trainable entries of its ``kernel`` (``embeddings`` for an
            ``Embedding``): a boolean mask of the weight's shape or an index
            list (see :func:`refimpl.masks.to_mask`).
        mode: the form (see :ref:`the forms <api-forms>`): ``"delta"``,
            ``"select"`` or ``"auto"`` for every layer, ``"sparse"`` for a
            ``Dense`` layer, and ``"slices"`` for a weight free in whole
            slices:

            * a ``Dense`` or ``EinsumDense`` kernel: rows, columns, blocks,
              heads;
            * a convolution kernel: whole filters or input channels;
            * an ``Embedding`` table: whole rows.
        weight: which weight, for a layer with two that can be partial: a
            ``SeparableConv``'s ``"depthwise_kernel"`` (the default) or
            ``"pointwise_kernel"``, an RNN cell's ``"kernel"`` (the default)
            or ``"recurrent_kernel"``. One weight per layer is partial.

    Returns:
        ``None``; ``layer`` changes in place.

    Raises:
        TypeError: for a layer of another class.
        ValueError: for a layer that is not built, is already partial, uses
            LoRA or quantization, has a regularizer or constraint that is not
            elementwise, or a mask that does not fit.

    >>> from refimpl import enable_partial
    >>> layer = keras.layers.Dense(2)
    >>> layer.build((None, 3))
    >>> enable_partial(layer, [[0, 0], [2, 1]])
    >>> type(layer).__name__, layer.num_free, layer.base_weight.trainable
    ('PartialDense', 2, False)
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
    if not is_supported(plain):
        raise TypeError(
            f"`layer` must be one of {supported_names()}, "
            f"whose weight this mechanism knows. Received: layer {layer.name!r} "
            f"of type {plain.__name__}"
        )
    check_mode(mode, allowed=LAYER_MODES)
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
    names = weight_names(layer)
    if weight is not None and weight not in names:
        raise ValueError(
            f"`weight` must be one of {list(names)} for layer {layer.name!r} of "
            f"type {plain.__name__}. Received: weight={describe(weight)}"
        )
    weight = weight or names[0]
    base = target_weight(layer, weight)
    target = base.path.split("/")[-1]
    if not _splittable_regularizer(base.regularizer):
        raise ValueError(
            f"`layer` {layer.name!r} has a regularizer on its {target} that is "
            "not elementwise (L1, L2 or L1L2), so it cannot be split between "
            f"free and frozen entries. Received: {target}_regularizer="
            f"{type(base.regularizer).__name__}"
        )
    _check_constraint(base.constraint, layer.name)
    bool_mask = to_mask(mask, tuple(base.shape), name="mask")
    check_layout(layer, base, bool_mask, mode, weight)
    positions = np.flatnonzero(bool_mask)
    layer.__class__ = partial_class(plain)
    layer._partial_target = weight
    try:
        layer._partial_add_weights(len(positions), positions, mode, False)
    except Exception:
        # Refused before any weight was added: the layer stays as it was.
        layer.__dict__.pop("_partial_target", None)
        layer.__class__ = plain
        raise


def check_layout(layer, base, mask, mode, weight=None) -> None:
    """Refuse, before converting, what the weights of ``mode`` cannot take:
    a ``LayoutMap`` entry named for a partial weight that does not fit it,
    or a mask of other than whole slices for ``"slices"``."""
    num_free = int(np.count_nonzero(mask))
    if mode == "slices":
        positions = np.flatnonzero(to_mask(mask, tuple(base.shape), name="mask"))
        name = weight or weight_names(layer)[0]
        _slices.check(layer, positions, tuple(base.shape), name)
    if mode == "auto":
        mode = mode_for(num_free, tuple(base.shape), jit_compile=False)
    _layouts.check_named(layer, base, num_free, select=mode == "select")


def make_shell(
    layer,
    *,
    num_free: int,
    mode: str,
    auto: bool,
    rest_trainable: bool = True,
    target: str | None = None,
) -> None:
    """Turn a built plain ``layer`` into a partial shell, in place.

    Called by loaders (a user does not need it): a shell's free values and
    positions come with the saved weights; :mod:`refimpl.layers.hosts` says what
    a rebuilt host does to its sub-layers.

    >>> from refimpl.layers.enable import make_shell
    >>> layer = keras.layers.Dense(2)
    >>> layer.build((None, 3))
    >>> make_shell(layer, num_free=2, mode="delta", auto=False)
    >>> type(layer).__name__, tuple(layer.partial_free.shape)
    ('PartialDense', (2,))
    """
    layer.__class__ = partial_class(type(layer))
    layer._partial_target = target or layer._partial_target
    layer._partial_add_weights(num_free, None, mode, auto)
    if not rest_trainable:
        layer.freeze_rest()
