"""Partial layers inside layers that build their own sub-layers.

A ``MultiHeadAttention`` builds its projections in its own ``build``; a
keras-hub ``TransformerDecoder`` builds its attention and feed-forward layers
there; a keras-hub backbone builds every layer in its constructor. Their
configs hold their own arguments, not their sub-layers' configs, so a model
rebuilt from its config has *plain* sub-layers where the saved model had
partial ones, and their saved weights do not fit.

A **host** is a layer whose config does not record its sub-layers (any layer
except a plain functional or ``Sequential`` model and the wrappers
``TimeDistributed`` and ``Bidirectional``; a subclass of a model, such as a
keras-hub backbone, is a host: :func:`is_container`). A partial layer's host
is the outermost such layer above it, if any. :func:`mark_hosts`
gives each host a subclass of its own class (``PartialMultiHeadAttention``,
``PartialGPT2Backbone``) whose config adds what its partial sub-layers need:
their paths, free counts and modes, and which sub-layers are frozen. Loading
rebuilds the plain host from its own config, then turns those sub-layers into
shells that the saved weights fill. :func:`unmark_hosts` gives the plain class
back, as :func:`refimpl.merge <refimpl.convert.merge>` does.
"""

from __future__ import annotations

import keras

from refimpl import _compat
from refimpl.layers.partial import PartialWeightMixin

__all__ = ["host_class", "is_container", "mark_hosts", "unmark_hosts"]

#: The one registered name of every host class; its loader is :class:`_Loader`.
HOST_NAME = "refimpl>PartialHost"

_HOST_CLASSES: dict[type, type] = {}


def is_container(layer) -> bool:
    """Whether ``layer``'s config holds its sub-layers' configs (and classes).

    Returns:
        A Python ``bool``.

    >>> from refimpl.layers.hosts import is_container
    >>> is_container(keras.Sequential()), is_container(keras.layers.Dense(1))
    (True, False)
    """
    return type(layer) in (
        _compat.Functional,
        keras.Sequential,
        keras.layers.TimeDistributed,
        keras.layers.Bidirectional,
    )


class HostMixin:
    """What a host class adds to its plain class: the partial sub-layers' record."""

    def get_config(self) -> dict:
        plain = self._host_plain
        return {
            "layer": {
                "module": plain.__module__,
                "class_name": plain.__name__,
                "registered_name": keras.saving.get_registered_name(plain),
                "config": plain.get_config(self),
                "build_config": self.get_build_config(),
            },
            "partial": [
                {"path": _relative(self, sub), **sub._partial_record()}
                for sub in _compat.sub_layers(self)
                if isinstance(sub, PartialWeightMixin)
            ],
            "frozen": [
                _relative(self, sub)
                for sub in _compat.sub_layers(self)
                if not sub.trainable and sub.path
            ],
        }

    @classmethod
    def from_config(cls, config):
        return _Loader.from_config(config)


class _Loader:
    """Rebuilds a host from its config: the plain layer, then its shells."""

    @classmethod
    def from_config(cls, config):
        layer = keras.saving.deserialize_keras_object(config["layer"])
        install(layer, config["partial"], config.get("frozen", ()))
        return layer


# The one name of every host class loads in a fresh process, before any host
# class is made there.
keras.saving.get_custom_objects()[HOST_NAME] = _Loader


def host_class(plain: type) -> type:
    """The host class of a layer class, made once.

    Every host class is registered under one name, ``refimpl>PartialHost``
    (its loader rebuilds the plain layer, then its partial sub-layers).

    >>> from refimpl.layers.hosts import host_class
    >>> host = host_class(keras.layers.MultiHeadAttention)
    >>> host.__name__, host is host_class(keras.layers.MultiHeadAttention)
    ('PartialMultiHeadAttention', True)
    """
    if issubclass(plain, HostMixin):
        return plain
    if plain not in _HOST_CLASSES:
        name = f"Partial{plain.__name__}"
        cls = type(
            name,
            (HostMixin, plain),
            {
                "_host_plain": plain,
                "__module__": __name__,
                "__qualname__": name,
                "__doc__": (
                    f"A ``{plain.__name__}`` that holds partial sub-layers: "
                    "made by :func:`refimpl.partialize <refimpl.convert.partialize>`."
                ),
            },
        )
        _compat.register_under(cls, HOST_NAME, _Loader)
        _HOST_CLASSES[plain] = cls
    return _HOST_CLASSES[plain]


def install(layer, records, frozen=()) -> None:
    """Make a rebuilt plain ``layer`` a host again: its sub-layers become shells."""
    from refimpl.layers.enable import make_shell  # enable imports this module

    by_path = {_relative(layer, sub): sub for sub in _compat.sub_layers(layer)}
    for record in records:
        record = dict(record)
        path = record.pop("path")
        sub = by_path.get(path)
        if sub is None:
            raise ValueError(
                f"Layer {layer.name!r} ({type(layer).__name__}) was rebuilt "
                f"without a sub-layer at {path!r}, where the saved model has a "
                "partial layer: the layer's code builds different sub-layers "
                "than when it was saved."
            )
        if not isinstance(sub, PartialWeightMixin):
            make_shell(sub, **record)
    for path in frozen:
        if path in by_path:
            by_path[path].trainable = False
    layer.__class__ = host_class(type(layer))


def mark_hosts(model) -> list:
    """Give every host of a partial layer in ``model`` its host class.

    ``model`` is a Keras model or layer.

    :func:`refimpl.partialize <refimpl.convert.partialize>` calls it; call it
    yourself after
    :func:`refimpl.enable_partial <refimpl.layers.enable.enable_partial>` on a
    sub-layer of a host (an attention layer's projection, say), before saving.

    Returns:
        The hosts it marked, outermost first.

    >>> from refimpl.layers.hosts import mark_hosts
    >>> from refimpl import enable_partial
    >>> attention = keras.layers.MultiHeadAttention(2, 4, kernel_initializer="zeros")
    >>> attention.build((None, 3, 8), (None, 3, 8))
    >>> enable_partial(attention.query_dense, [[0, 0, 0]])
    >>> [type(host).__name__ for host in mark_hosts(attention)]
    ['PartialMultiHeadAttention']
    """
    hosts: dict[int, object] = {}

    def walk(layer, host):
        for child in layer._flatten_layers(include_self=False, recursive=False):
            if isinstance(child, PartialWeightMixin):
                if host is not None:
                    hosts[id(host)] = host
                continue
            walk(child, host if host is not None or is_container(child) else child)

    walk(model, None if is_container(model) else model)
    for host in hosts.values():
        if not isinstance(host, HostMixin):
            host.__class__ = host_class(type(host))
    return list(hosts.values())


def unmark_hosts(model) -> None:
    """Give every host in ``model`` (and ``model`` itself) its plain class back.

    Returns:
        ``None``; the hosts change class in place.

    >>> from refimpl.layers.hosts import mark_hosts, unmark_hosts
    >>> from refimpl import enable_partial
    >>> attention = keras.layers.MultiHeadAttention(2, 4, kernel_initializer="zeros")
    >>> attention.build((None, 3, 8), (None, 3, 8))
    >>> enable_partial(attention.query_dense, [[0, 0, 0]])
    >>> _ = mark_hosts(attention)
    >>> unmark_hosts(attention)
    >>> type(attention).__name__
    'MultiHeadAttention'
    """
    for layer in [model, *_compat.sub_layers(model)]:
        if isinstance(layer, HostMixin):
            layer.__class__ = layer._host_plain


def _relative(host, sub) -> str:
    path = sub.path or sub.name
    prefix = (host.path or host.name) + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path
