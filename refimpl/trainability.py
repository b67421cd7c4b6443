"""What trains in a converted model: the rest frozen, and a summary of it.

:func:`refimpl.partialize <refimpl.convert.partialize>` freezes every weight it did not
make partial, as
PEFT's ``get_peft_model`` and keras-hub's ``enable_lora`` do, so "1 % of the
kernel entries" means what it says: a layer that was not named does not
train, nor does a converted layer's bias. Layers named in ``train`` stay as
they were (a new head, the norms). :func:`trainable_summary` lists what
trains: the free entries of each partial weight, and every weight that still
trains in full.
"""

from __future__ import annotations

import numpy as np

from refimpl import _compat
from refimpl._checks import describe, variable_path
from refimpl.layers.partial import PartialWeightMixin

__all__ = ["trainable_summary"]


def check_train(train) -> tuple | str:
    """The ``train`` argument of
    :func:`refimpl.partialize <refimpl.convert.partialize>`, checked."""
    if train is None:
        return ()
    if train == "all":
        return "all"
    if isinstance(train, str):
        train = (train,)
    if not isinstance(train, (list, tuple)) or not all(
        isinstance(key, str) for key in train
    ):
        raise TypeError(
            "`train` must be a list of layer names or paths that stay trainable, "
            f"or 'all'. Received: train={describe(train)}"
        )
    return tuple(train)


def freeze_rest(model, keep: list) -> None:
    """Freeze every layer of ``model`` but the partial ones and ``keep``.

    A layer is frozen with ``layer.trainable = False``, which Keras saves in
    its config (a host records the frozen sub-layers it rebuilds); as Keras'
    fine-tuning guide says, a frozen ``BatchNormalization`` runs in inference
    mode. A partial layer keeps its free values trainable and freezes its
    other weights (:meth:`~refimpl.layers.partial.PartialWeightMixin.freeze_rest`).
    """
    kept = {id(layer) for layer in keep}
    for layer in keep:
        kept.update(id(sub) for sub in _compat.sub_layers(layer))
    for layer in _compat.sub_layers(model):
        if id(layer) in kept:
            continue
        if isinstance(layer, PartialWeightMixin):
            layer.freeze_rest()
            continue
        children = layer._flatten_layers(include_self=False, recursive=False)
        if not list(children):
            # A leaf: its own weights. (A parent is frozen through its leaves,
            # so that a partial layer inside it keeps training.)
            layer.trainable = False


def fully_trainable(model) -> list:
    """The weights of ``model`` that train whole: every trainable weight but
    the free values of its partial layers."""
    free = {
        id(layer.partial_free)
        for layer in _compat.sub_layers(model)
        if isinstance(layer, PartialWeightMixin)
    }
    return [v for v in model.trainable_weights if id(v) not in free]


def trainable_summary(model, *, print_fn=None) -> list[dict]:
    """What trains in ``model``: one row per weight that has a trainable entry.

    With ``print_fn`` (``print``, say), it also prints the rows as a table
    with the totals.

    Returns:
        A list of dicts, one per weight, with ``"path"`` (str), ``"kind"``
        (str, ``"partial"`` for a partial weight, its free values over its
        base, or ``"full"`` for a weight that trains whole), ``"trainable"``
        (int, its trainable entries) and ``"size"`` (int, all its entries).

    >>> import keras
    >>> import refimpl
    >>> from refimpl.trainability import trainable_summary
    >>> layers = [keras.Input((3,)), keras.layers.Dense(2, name="d")]
    >>> model = keras.Sequential(layers, name="net")
    >>> converted = refimpl.partialize(model, {"d": [[0, 0]]})
    >>> trainable_summary(converted)
    [{'path': 'net/d/kernel', 'kind': 'partial', 'trainable': 1, 'size': 6}]
    """
    if print_fn is not None and not callable(print_fn):
        raise TypeError(
            "`print_fn` must be callable, such as print. "
            f"Received: print_fn={describe(print_fn)}"
        )
    rows = []
    for layer in _compat.sub_layers(model):
        if isinstance(layer, PartialWeightMixin) and layer.trainable:
            rows.append(
                {
                    "path": variable_path(layer.base_weight),
                    "kind": "partial",
                    "trainable": layer.num_free,
                    "size": int(np.prod(layer.base_weight.shape)),
                }
            )
    for variable in fully_trainable(model):
        size = int(np.prod(variable.shape))
        path = variable_path(variable)
        rows.append({"path": path, "kind": "full", "trainable": size, "size": size})
    if print_fn is not None:
        width = max([len(row["path"]) for row in rows] + [6])
        print_fn(f"{'weight':<{width}}  {'kind':<7}  {'trainable':>10}  {'of':>10}")
        for row in rows:
            print_fn(
                f"{row['path']:<{width}}  {row['kind']:<7}  "
                f"{row['trainable']:>10,}  {row['size']:>10,}"
            )
        extra = {
            id(v)
            for layer in _compat.sub_layers(model)
            if isinstance(layer, PartialWeightMixin)
            for v in (layer.partial_free, layer.partial_positions)
        }
        # The model's own values: a partial weight counts once, as its base.
        total = sum(int(np.prod(v.shape)) for v in model.weights if id(v) not in extra)
        trained = sum(row["trainable"] for row in rows)
        print_fn(f"trainable values: {trained:,} of {total:,} ({trained / total:.4%})")
    return rows
