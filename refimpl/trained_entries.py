"""A file of the trained entries only: save and load a sparse fine-tune.

keras-hub saves a LoRA fine-tune as its adapters alone
(``save_lora_weights``); this is the same for a sparse fine-tune. The file
(NumPy's ``.npz``, no pickles) holds, for each partial weight, its path, its
free positions and values, and a fingerprint of the frozen base (its shape,
dtype and a SHA-256 checksum of its bytes); and each weight that trained in
full (a head kept with ``train=``), whole. The positions are stored as the
gaps between them, in the smallest unsigned integer type that holds the
largest gap: one byte per position when no gap exceeds 255 entries, two when
none exceeds 65,535, four otherwise. A float32 value thus costs 5 to 8 bytes,
plus a small header per weight (files of version 1 stored int32 positions,
8 bytes a value, and still load). Weights are matched by their path
in the model (its layers' names). Loaded onto the pretrained model it
came from (plain or converted), it gives the fine-tuned model bit for bit;
onto any other base it raises, because the entries would land on the wrong
values.
"""

from __future__ import annotations

import hashlib
import json
import os

import keras
import numpy as np

from refimpl import _compat
from refimpl.convert import fully_trainable
from refimpl.layers.partial import PartialWeightMixin, is_supported, target_weight
from refimpl.masks import describe, variable_path

__all__ = ["load_partial_weights", "save_partial_weights"]

_FORMAT = "refimpl.partial_weights"
_VERSION = 2


def _gaps(positions: np.ndarray) -> tuple[int, np.ndarray]:
    """Sorted ``positions`` as their first one and the gaps after it."""
    if len(positions) == 0:
        return 0, np.zeros(0, np.uint8)
    gaps = np.diff(positions)
    for dtype in (np.uint8, np.uint16, np.uint32):
        if gaps.size == 0 or gaps.max() <= np.iinfo(dtype).max:
            return int(positions[0]), gaps.astype(dtype)
    raise AssertionError("a gap larger than 2**32 - 1")  # int32 positions


def _positions(arrays: dict, record: dict, i: int, version: int) -> np.ndarray:
    if version == 1:
        return arrays[f"positions_{i}"].astype(np.int64)
    gaps = arrays[f"gaps_{i}"].astype(np.int64)
    if record["num_free"] == 0:
        return gaps
    return record["first"] + np.concatenate([[0], np.cumsum(gaps)])


def _numpy(variable) -> np.ndarray:
    return np.array(keras.ops.convert_to_numpy(variable))


def _fingerprint(array: np.ndarray) -> dict:
    digest = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
    return {"shape": list(array.shape), "dtype": array.dtype.name, "sha256": digest}


def _path(model, variable) -> str:
    """A weight's path inside ``model`` (a ``Sequential`` adds its own name)."""
    path = variable_path(variable)
    prefix = model.name + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


def _check_path(path, what: str) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            "`path` must be a file path (str or os.PathLike). "
            f"Received: path={describe(path)}"
        )
    path = os.fspath(path)
    if not path.endswith(".npz"):
        raise ValueError(
            f"`path` must end in '.npz', the format {what} uses. Received: {path!r}"
        )
    return path


def _check_model(model) -> None:
    if not isinstance(model, keras.Model) or not model.built:
        raise TypeError(
            f"`model` must be a built Keras model. Received: model={describe(model)}"
        )


def save_partial_weights(model, path) -> dict:
    """Save the trained entries of a converted ``model`` to ``path`` (``.npz``).

    Args:
        model: a model with partial layers
            (:func:`refimpl.partialize <refimpl.convert.partialize>`).
        path: the file to write, ending in ``.npz``.

    Returns:
        What the file holds, ``{"partial": {path: k}, "full": {path: size}}``.

    Raises:
        TypeError: for a ``model`` that is not a built Keras model, or a bad
            ``path`` type.
        ValueError: for a ``path`` not ending in ``.npz``, or a model with no
            partial layer.

    >>> from refimpl import save_partial_weights
    >>> import os, tempfile, refimpl
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")])
    >>> model = refimpl.partialize(model, {"d": [[0, 0], [2, 1]]})
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     save_partial_weights(model, os.path.join(folder, "tuned.npz"))
    {'partial': {'d/kernel': 2}, 'full': {}}
    """
    _check_model(model)
    path = _check_path(path, "save_partial_weights")
    partial = [
        layer
        for layer in _compat.sub_layers(model)
        if isinstance(layer, PartialWeightMixin)
    ]
    if not partial:
        raise ValueError(
            "`model` has no partial layer: convert it with `refimpl.partialize` "
            f"first. Received: model={describe(model.name)}"
        )
    arrays, header = {}, {"format": _FORMAT, "version": _VERSION, "partial": []}
    header["full"] = []
    for i, layer in enumerate(partial):
        base = _numpy(layer.partial_weight.base)
        positions = np.sort(_numpy(layer.partial_weight.positions).astype(np.int64))
        values = _numpy(getattr(layer, layer._partial_target)).reshape(-1)[positions]
        first, arrays[f"gaps_{i}"] = _gaps(positions)
        arrays[f"values_{i}"] = values
        header["partial"].append(
            {
                "path": _path(model, layer.partial_weight.base),
                "base": _fingerprint(base),
                "num_free": len(positions),
                "first": first,
            }
        )
    for i, variable in enumerate(fully_trainable(model)):
        arrays[f"full_{i}"] = _numpy(variable)
        header["full"].append(_path(model, variable))
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    with open(path, "wb") as file:
        np.savez(file, **arrays)
    return {
        "partial": {r["path"]: r["num_free"] for r in header["partial"]},
        "full": {
            p: int(arrays[f"full_{i}"].size) for i, p in enumerate(header["full"])
        },
    }


def load_partial_weights(model, path) -> None:
    """Load a file of :func:`save_partial_weights` onto ``model``, in place.

    ``model`` is the pretrained model the fine-tune started from: plain (the
    entries are written into its weights, which then equal the fine-tuned
    model's merged weights) or converted with the same numbers of free
    entries (the positions and free values are set, and training can go on).

    Returns:
        ``None``; ``model``'s weights change in place.

    Raises:
        TypeError: for a ``model`` that is not a built Keras model.
        ValueError: for a file that is not one of these, a weight it names that
            ``model`` does not have, or a base whose shape, dtype or values
            differ from the one the entries were trained on.

    >>> from refimpl import load_partial_weights, save_partial_weights
    >>> import os, tempfile, refimpl
    >>> plain = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")])
    >>> tuned = refimpl.partialize(plain, {"d": [[0, 0]]})
    >>> _ = tuned.get_layer("d").partial_weight.free.assign([5.0])  # as if trained
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = os.path.join(folder, "tuned.npz")
    ...     _ = save_partial_weights(tuned, path)
    ...     load_partial_weights(plain, path)
    >>> float(plain.get_weights()[0][0, 0])  # the plain kernel has the entry
    5.0
    """
    _check_model(model)
    path = _check_path(path, "load_partial_weights")
    with np.load(path, allow_pickle=False) as data:
        arrays = {key: data[key] for key in data.files}
    try:
        header = json.loads(arrays.pop("header").tobytes().decode())
        assert header["format"] == _FORMAT
        version = header["version"]
    except (KeyError, ValueError, AssertionError):
        raise ValueError(
            f"`path` is not a file of `save_partial_weights`. Received: {path!r}"
        ) from None
    if version not in (1, 2):
        raise ValueError(
            f"The file at `path` has format version {version!r}, and this refimpl "
            f"reads versions 1 and 2: upgrade refimpl. Received: path={path!r}"
        )
    layers = {}
    for layer in _compat.sub_layers(model):
        if isinstance(layer, PartialWeightMixin) or is_supported(type(layer)):
            layers[_path(model, target_weight(layer))] = layer
    variables = {_path(model, v): v for v in model.weights}
    missing = [r["path"] for r in header["partial"] if r["path"] not in layers]
    missing += [p for p in header["full"] if p not in variables]
    if missing:
        raise ValueError(
            f"The file at `path` has weights that `model` does not: {missing[:5]}. "
            f"Load it onto the model it was trained from. Received: path={path!r}"
        )
    writes = []
    for i, record in enumerate(header["partial"]):
        layer = layers[record["path"]]
        base = _numpy(target_weight(layer))
        if _fingerprint(base) != record["base"]:
            raise ValueError(
                f"The base of {record['path']!r} in `model` (shape {base.shape}, "
                f"dtype {base.dtype.name}) is not the one its entries were trained "
                f"on (shape {tuple(record['base']['shape'])}, dtype "
                f"{record['base']['dtype']}, another checksum): the entries would "
                f"land on other values. Received: path={path!r}"
            )
        values = arrays[f"values_{i}"]
        positions = _positions(arrays, record, i, version)
        num_free = (
            layer.partial_weight.num_free
            if isinstance(layer, PartialWeightMixin)
            else len(positions)
        )
        if num_free != len(positions):
            raise ValueError(
                f"Layer {layer.name!r} has {num_free} free entries and the "
                f"file has {len(positions)} for {record['path']!r}: convert the "
                "model with the same numbers, or load onto the plain model."
            )
        writes.append((layer, base, positions, values))
    for layer, base, positions, values in writes:
        if isinstance(layer, PartialWeightMixin):
            pw = layer.partial_weight
            pw.positions.assign(positions.astype(pw.positions.dtype))
            free = values
            if pw.mode == "select":
                free = base.reshape(-1).copy()
                free[positions] = values
                free = free.reshape(base.shape)
            pw.free.assign(free)
            pw.check_loaded(again=True)
        else:
            merged = base.reshape(-1).copy()
            merged[positions] = values
            target_weight(layer).assign(merged.reshape(base.shape))
    for i, name in enumerate(header["full"]):
        variables[name].assign(arrays[f"full_{i}"])
