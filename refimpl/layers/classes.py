"""The partial class of each weight layer: which weight, and how it is read.

Each supported Keras class gets its partial class here when refimpl is
imported (``PartialDense`` is written out in :mod:`refimpl.layers.dense`):

* a weight behind a property (``Dense``, ``EinsumDense``, ``Conv1D``-``3D``,
  ``Embedding``, ``ReversibleEmbedding``): the partial class overrides the
  property;
* a weight kept as a plain attribute (``Conv1DTranspose``-``3DTranspose``,
  ``DepthwiseConv1D``/``2D``): the partial class adds a property of that name,
  which shadows the attribute and composes it;
* a layer with two weights of that kind (``SeparableConv1D``/``2D``: the
  depthwise and the pointwise kernel; ``SimpleRNNCell``, ``LSTMCell`` and
  ``GRUCell``: ``kernel`` and ``recurrent_kernel``): one of them is partial, the
  first (``depthwise_kernel``, ``kernel``) unless ``weight=`` names the other
  (:func:`target_weight`).

A subclass of one of them from Keras or keras-hub (keras-hub's
``ReversibleEmbedding``), and keras-hub's ``PositionEmbedding``, get theirs on
first use, without refimpl importing keras-hub. Those share one registered
name, ``refimpl>PartialLayer``, whose loader rebuilds them from the plain class
their config names, so a fresh process loads them too.
"""

from __future__ import annotations

import importlib
import types

import keras

from refimpl import _compat
from refimpl._checks import describe
from refimpl.layers import _products
from refimpl.layers._pieces import _composing
from refimpl.layers.dense import PartialDense
from refimpl.layers.partial import _PLAIN_TO_PARTIAL, PartialWeightMixin

__all__ = [
    "PARTIAL_CLASSES",
    "is_supported",
    "partial_class",
    "supported_classes",
    "target_weight",
    "weight_names",
]

# plain class: its weights that can be partial, the default first, each with
# whether it is a plain attribute
_SPECS: dict[type, tuple[tuple[str, bool], ...]] = {
    keras.layers.Dense: (("kernel", False),)
}
# Classes of other packages, known by module and name (never imported here).
_BY_NAME = {
    ("keras_hub.src.layers.modeling.position_embedding", "PositionEmbedding"): (
        ("position_embeddings", True),
    ),
}
_ON_DEMAND_NAME = "refimpl>PartialLayer"


def _make(plain_class, targets=(("kernel", False),), on_demand=False):
    name = f"Partial{plain_class.__name__}"
    names = " or ".join(f"``{target}``" for target, _ in targets)
    namespace = {
        "_partial_target": targets[0][0],
        "_partial_attributes": dict(targets),
        "_partial_on_demand": on_demand,
        "__module__": __name__,
        "__qualname__": name,
        "__doc__": (
            f"A ``{plain_class.__module__.split('.')[0]}`` "
            f"``{plain_class.__name__}`` whose {names} is trainable only "
            "at some entries: made by "
            ":func:`refimpl.partialize <refimpl.convert.partialize>` or "
            ":func:`refimpl.enable_partial "
            "<refimpl.layers.enable.enable_partial>`."
        ),
    }
    for target, attribute in targets:
        namespace[target] = _composing(plain_class, target, attribute)
    call = _products.product_call(plain_class)
    if call is not None:
        namespace["call"] = call
    cls = type(name, (PartialWeightMixin, plain_class), namespace)
    _SPECS[plain_class] = tuple(targets)
    if on_demand:
        _compat.register_under(cls, _ON_DEMAND_NAME, _Loader)
    else:
        keras.saving.register_keras_serializable(package="refimpl", name=name)(cls)
    _PLAIN_TO_PARTIAL[plain_class] = cls
    return cls


class _Loader:
    """Rebuilds an on-demand partial class from the plain class its config names."""

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        ref = config.pop("plain_class")
        plain = keras.saving.get_registered_object(ref["registered_name"])
        if plain is None:
            plain = vars(importlib.import_module(ref["module"]))[ref["class_name"]]
        return partial_class(plain).from_config(config)


# The one name of the on-demand classes loads in a fresh process, before any
# of them is made there.
keras.saving.get_custom_objects()[_ON_DEMAND_NAME] = _Loader


def plain_class_config(plain) -> dict:
    """What :class:`_Loader` needs to find ``plain`` again."""
    return {
        "module": plain.__module__,
        "class_name": plain.__name__,
        "registered_name": keras.saving.get_registered_name(plain),
    }


_KERNEL = (("kernel", False),)
_EMBEDDINGS = (("embeddings", False),)
_ATTRIBUTE = (("kernel", True),)
for _plain, _targets in (
    (keras.layers.EinsumDense, _KERNEL),
    (keras.layers.Conv1D, _KERNEL),
    (keras.layers.Conv2D, _KERNEL),
    (keras.layers.Conv3D, _KERNEL),
    (keras.layers.Embedding, _EMBEDDINGS),
    (keras.layers.ReversibleEmbedding, _EMBEDDINGS),
    (keras.layers.Conv1DTranspose, _ATTRIBUTE),
    (keras.layers.Conv2DTranspose, _ATTRIBUTE),
    (keras.layers.Conv3DTranspose, _ATTRIBUTE),
    (keras.layers.DepthwiseConv1D, _ATTRIBUTE),
    (keras.layers.DepthwiseConv2D, _ATTRIBUTE),
    (
        keras.layers.SeparableConv1D,
        (("depthwise_kernel", True), ("pointwise_kernel", True)),
    ),
    (
        keras.layers.SeparableConv2D,
        (("depthwise_kernel", True), ("pointwise_kernel", True)),
    ),
    (keras.layers.SimpleRNNCell, (("kernel", True), ("recurrent_kernel", True))),
    (keras.layers.LSTMCell, (("kernel", True), ("recurrent_kernel", True))),
    (keras.layers.GRUCell, (("kernel", True), ("recurrent_kernel", True))),
):
    _make(_plain, _targets)
assert _PLAIN_TO_PARTIAL[keras.layers.Dense] is PartialDense

#: The partial class of each supported Keras layer class, a read-only mapping
#: (``PARTIAL_CLASSES[keras.layers.Dense]`` is ``PartialDense``): every class
#: supported from the start, and a class made on first use (keras-hub's) once
#: :func:`partial_class` has made it.
PARTIAL_CLASSES = types.MappingProxyType(_PLAIN_TO_PARTIAL)


def supported_classes() -> tuple[type, ...]:
    """The Keras layer classes that have a partial class (and keras-hub's, once
    made: its ``ReversibleEmbedding`` and ``PositionEmbedding``).

    Returns:
        A tuple of Keras layer classes.

    >>> from refimpl.layers.classes import supported_classes
    >>> keras.layers.Conv2D in supported_classes()
    True
    """
    return tuple(_PLAIN_TO_PARTIAL)


def _spec(layer_class):
    if layer_class in _SPECS:
        return _SPECS[layer_class]
    key = (layer_class.__module__, layer_class.__name__)
    if key in _BY_NAME:
        return _BY_NAME[key]
    if layer_class.__module__.split(".")[0] in ("keras", "keras_hub"):
        for base in layer_class.__mro__[1:]:
            if base in _SPECS:
                return _SPECS[base]
    return None


def is_supported(layer_class) -> bool:
    """Whether a layer class has (or can be given) a partial class.

    Returns:
        A Python ``bool``.

    >>> from refimpl.layers.classes import is_supported
    >>> is_supported(keras.layers.Embedding), is_supported(keras.layers.Dropout)
    (True, False)
    """
    return isinstance(layer_class, type) and (
        layer_class in _PLAIN_TO_PARTIAL.values() or _spec(layer_class) is not None
    )


def supported_names() -> list[str]:
    """The names an error message lists."""
    names = [c.__name__ for c in _PLAIN_TO_PARTIAL]
    return sorted(set(names) | {"PositionEmbedding"}, key=names.__contains__)


def partial_class(layer_class: type) -> type:
    """The partial class of a Keras layer class (``PartialDense`` for ``Dense``).

    Returns:
        The partial class (a ``type``), a subclass of ``layer_class``.

    Raises:
        TypeError: for a class this mechanism does not support.

    >>> from refimpl.layers.classes import partial_class
    >>> partial_class(keras.layers.Conv2D).__name__
    'PartialConv2D'
    """
    if layer_class in _PLAIN_TO_PARTIAL.values():
        return layer_class
    if layer_class in _PLAIN_TO_PARTIAL:
        return _PLAIN_TO_PARTIAL[layer_class]
    spec = _spec(layer_class) if isinstance(layer_class, type) else None
    if spec is None:
        raise TypeError(
            "`layer_class` must be one of the layers with a kernel or an "
            f"embedding table: {supported_names()}. Received: "
            f"{getattr(layer_class, '__name__', describe(layer_class))}"
        )
    return _make(layer_class, spec, on_demand=True)


def weight_names(layer) -> tuple[str, ...]:
    """The weights of ``layer`` that can be partial, the default first.

    >>> from refimpl.layers.classes import weight_names
    >>> weight_names(keras.layers.LSTMCell(2))
    ('kernel', 'recurrent_kernel')
    """
    if isinstance(layer, PartialWeightMixin):
        return tuple(layer._partial_attributes)
    return tuple(name for name, _ in _spec(type(layer)))


def target_weight(layer, weight: str | None = None):
    """The variable a partial form of ``layer`` freezes: its kernel (or
    embeddings), or the weight named ``weight`` (``"recurrent_kernel"``).

    Returns:
        The ``keras.Variable`` (the base, once ``layer`` is partial).

    >>> from refimpl.layers.classes import target_weight
    >>> layer = keras.layers.Embedding(3, 2, name="emb")
    >>> layer.build((None,))
    >>> target_weight(layer).path
    'emb/embeddings'
    """
    if isinstance(layer, PartialWeightMixin) and weight in (
        None,
        layer._partial_target,
    ):
        return layer._partial_base()
    specs = dict(
        layer._partial_attributes
        if isinstance(layer, PartialWeightMixin)
        else _spec(type(layer))
    )
    weight = weight or next(iter(specs))
    if specs[weight]:
        return layer.__dict__[weight]
    return getattr(layer, "_" + weight)
