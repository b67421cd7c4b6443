"""A file of the trained entries only: save and load a sparse fine-tune.

keras-hub saves a LoRA fine-tune as its adapters alone
(``save_lora_weights``); this is the same for a sparse fine-tune. The file
(NumPy's ``.npz``, no pickles) holds, for each partial weight, its path, its
free positions and values, and a fingerprint of the frozen base (its shape,
dtype and a SHA-256 checksum of its bytes; for a base Keras quantized, of its
codes and every scale, whose shapes it lists too); and each layer that trained whole
(a head or a norm kept with ``train=``), whole: every weight it has, trainable
or not (a ``BatchNormalization``'s moving mean and variance too), as PEFT's
``modules_to_save`` keeps the whole module. The positions are stored as the
gaps between them, in the smallest unsigned integer type that holds the
largest gap: one byte per position when no gap exceeds 255 entries, two when
none exceeds 65,535, four otherwise. A float32 value thus costs 5 to 8 bytes,
plus a small header per weight. Values of a type NumPy's format does not know
(``bfloat16``) are stored as their bits, with the type's name in the header.

A weight's path in the file is the names of the layers that hold it, from the
model down, and its own name (``"encoder/d_in/kernel"``): the same in the
model a fine-tune started from and in the copy that
:func:`refimpl.partialize <refimpl.convert.partialize>` converts, whatever
paths Keras gave their variables. A path that two weights of the model share
(two layers of one name inside one layer) is refused, at saving and at
loading. Loaded onto the pretrained model it came from (plain or converted),
the file gives the fine-tuned model bit for bit; onto any other base it
raises, because the entries would land on the wrong values. Files of versions
1 and 2 (weights keyed by their variables' paths; version 1 stored int32
positions) still load.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections import Counter

import keras
import ml_dtypes  # noqa: F401  (Keras' own dependency: names bfloat16 for NumPy)
import numpy as np

from refimpl import _compat
from refimpl.layers.partial import _is_quantized_kernel, _mark_hosts, enable_partial
from refimpl.masks import _describe, _matching_paths, _variable_path
from refimpl.partial import partial_weights

__all__ = ["load_partial_weights", "save_partial_weights"]

_FORMAT = "refimpl.partial_weights"
_VERSION = 3


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
    """A variable's values, in its own dtype (a backend may widen bfloat16)."""
    array = np.array(keras.ops.convert_to_numpy(variable))
    dtype = keras.backend.standardize_dtype(variable.dtype)
    return array if array.dtype.name == dtype else array.astype(dtype)


def _store(arrays: dict, header: dict, key: str, array: np.ndarray) -> None:
    """Put ``array`` in the file; a dtype NumPy's format cannot name goes as bits."""
    if np.dtype(array.dtype.str) != array.dtype:  # bfloat16 would read back as |V2
        header.setdefault("dtypes", {})[key] = array.dtype.name
        array = array.view(f"u{array.dtype.itemsize}")
    arrays[key] = array


def _read(arrays: dict, header: dict, key: str, dtype: str) -> np.ndarray:
    """An array of the file, in the dtype it was saved in (``dtype`` for a file
    of version 1 or 2, which held a bfloat16 array as raw bytes)."""
    array = arrays[key]
    name = header.get("dtypes", {}).get(key)
    if name is None and array.dtype.kind == "V":
        name = dtype
    return array if name is None else array.view(np.dtype(name))


def _fingerprint(array: np.ndarray, scales=()) -> dict:
    """The base's shape, dtype and checksum; for a base Keras quantized, the
    checksum covers its codes (``array``) and every scale (``scales``), whose
    shapes and dtypes the fingerprint lists too."""
    hasher = hashlib.sha256(np.ascontiguousarray(array).tobytes())
    for scale in scales:
        hasher.update(np.ascontiguousarray(scale).tobytes())
    found = {"shape": list(array.shape), "dtype": array.dtype.name}
    if len(scales):
        found["scales"] = [[list(a.shape), a.dtype.name] for a in scales]
    return {**found, "sha256": hasher.hexdigest()}


def _scales(variable, layer) -> list:
    """The scales of ``variable`` if it is the codes of a kernel Keras
    quantized (:mod:`refimpl.quantized`), as NumPy arrays; else ``[]``."""
    if not _is_quantized_kernel(layer, variable):
        return []
    return [_numpy(v) for v in _compat.quantization_variables(layer)]


def _weights(model, *, counted=False) -> list[tuple[str, object, object]]:
    """Every weight of ``model``, once, as ``(path, variable, layer)``.

    The path is the names of the layers that hold the weight, from ``model``
    down (without ``model``'s own name), then the weight's name; ``layer`` is
    the layer whose own weight it is (``model`` for a weight of its own). The
    config copy that ``partialize`` makes has the same layers with the same
    names, so the same paths, even where Keras gives its variables shorter
    ones (those of a wrapped or nested layer lose the parent's name). A
    sub-layer that a layer holds as an attribute under a name Keras made up
    (``partial_variable_1``, ``dense_3``: an unnamed ``PartialVariable`` or
    ``Dense`` in a layer of your own, or a keras-hub task model's backbone,
    ``gpt2_backbone_1``, held as ``_backbone``) is named by that attribute
    instead (:func:`_child_name`), since a copy of the model, or the same
    model built in another process, makes up other names. ``counted=True``
    gives the paths refimpl 3.0.0 wrote, where a made-up name held only by a
    private attribute stayed in the path.
    """
    below = {}

    def sub_layers(layer):
        if id(layer) not in below:
            below[id(layer)] = _compat.sub_layers(layer)
        return below[id(layer)]

    found, seen = [], set()

    def visit(layer, prefix):
        inner = sub_layers(layer)
        deeper = {id(sub) for child in inner for sub in sub_layers(child)}
        children = [child for child in inner if id(child) not in deeper]
        held = {id(v) for child in children for v in child.weights}
        for variable in layer.weights:
            if id(variable) not in held and id(variable) not in seen:
                seen.add(id(variable))
                found.append((prefix + variable.name, variable, layer))
        for child in children:
            visit(child, f"{prefix}{_child_name(layer, child, counted)}/")

    visit(model, "")
    return found


def _child_name(parent, child, counted=False) -> str:
    """``child``'s name in a path: its own, or, where Keras made that name up,
    the attribute of ``parent`` that holds it.

    A public attribute first; else a private one, without its leading
    underscores (a keras-hub task model holds its backbone as ``_backbone``,
    behind the property ``backbone``: the path says ``backbone``). Only the
    instance's own attributes are read, never a property, which would run
    code of the layer's class. A made-up name that no attribute holds (a
    layer in a functional model's list) stays. ``counted=True`` skips the
    private attributes, as refimpl 3.0.0 did, whose paths then held the
    counted name (``gpt2_backbone_1``), which depends on how many layers of
    that class the process had built.
    """
    # Keras' default name: the class name in snake case, then "_1", "_2"...
    # (of the plain class too: a partial layer keeps the name it had).
    made_up = False
    for cls in type(child).__mro__:
        snake = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", cls.__name__)
        snake = re.sub(r"([a-z])([A-Z])", r"\1_\2", snake).lower()
        made_up = made_up or re.fullmatch(re.escape(snake) + r"(_\d+)?", child.name)
    if made_up:
        # A torch backend's layer keeps its sub-layers in `_modules`.
        held = {**vars(parent), **vars(parent).get("_modules", {})}
        holders = [attribute for attribute, value in held.items() if value is child]
        for attribute in holders:
            if not attribute.startswith("_"):
                return attribute
        for attribute in holders:
            if not counted and attribute.strip("_"):
                return attribute.lstrip("_")
    return child.name


def _counted(model, weights) -> dict:
    """``{path: [(variable, layer)]}``: the paths that refimpl 3.0.0 gave
    ``model``'s weights where they differ from ``weights``' (a made-up name
    held by a private attribute, such as a keras-hub task model's backbone,
    went in as the name: ``gpt2_backbone_1/...``)."""
    old = {}
    for (own, variable, layer), (then, _, _) in zip(
        weights, _weights(model, counted=True), strict=True
    ):
        if then != own:
            old.setdefault(then, []).append((variable, layer))
    return old


def _legacy_path(model, variable) -> str:
    """A weight's key in files of versions 1 and 2: its variable's path,
    without ``model``'s name in front."""
    path = _variable_path(variable)
    prefix = model.name + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


def _where(variable, layer) -> str:
    return f"{layer.name!r} ({type(layer).__name__}, Keras path {variable.path!r})"


def _check_unique(weights, paths) -> None:
    """Refuse a path of ``paths`` that more than one weight of ``weights`` has."""
    held = {}
    for path, variable, layer in weights:
        if path in paths:
            held.setdefault(path, []).append((variable, layer))
    for path, pairs in held.items():
        if len(pairs) > 1:
            raise ValueError(
                f"`model` has {len(pairs)} weights at the path {path!r}, in the "
                f"layers {', '.join(_where(v, layer) for v, layer in pairs)}: the "
                "file names a weight by the names of the layers that hold it, and "
                "could not tell these apart. Give those layers different names."
            )


def _find(model, names: list, version: int, path: str) -> dict:
    """``{name: (variable, layer)}``: the weight of ``model`` that each path of
    the file names.

    The path that equals it decides (in a file of version 1 or 2, the
    variable's path); where none does, the path refimpl 3.0.0 gave a weight,
    where it differs (:func:`_counted`); only where none does either, the one
    path, of either kind, that ends with it, or that it ends with, as a file
    saved from a keras-hub backbone and loaded onto its task model, or the
    other way. ``ValueError`` for a path that the file has twice, that no
    weight or two weights have, or two paths that name one weight.
    """
    repeated = sorted(name for name, n in Counter(names).items() if n > 1)
    if repeated:
        raise ValueError(
            f"The file at `path` has {repeated[:5]} more than once: it was saved "
            "from a model with two weights at one path (format versions 1 and 2 "
            "allowed it), and cannot say which values are whose. Save it again "
            f"from the fine-tuned model. Received: path={path!r}"
        )
    weights = _weights(model)
    exact = {}
    for name, variable, layer in weights:
        key = name if version >= 3 else _legacy_path(model, variable)
        exact.setdefault(key, []).append((variable, layer))
    counted = None  # made only for a path that matches no weight's
    found, missing = {}, []
    for name in names:
        pairs = exact.get(name, [])
        _check_unique([(name, v, layer) for v, layer in pairs], {name})
        if not pairs and counted is None:
            counted = _counted(model, weights) if version >= 3 else {}
        if not pairs:  # a file of refimpl 3.0.0: the path it gave the weight
            pairs = counted.get(name, [])
            _check_unique([(name, v, layer) for v, layer in pairs], {name})
        if not pairs:
            near = _matching_paths(name, [own for own, _, _ in weights])
            pairs = [weights[i][1:] for i in near]
            old = list(counted)
            pairs += [p for i in _matching_paths(name, old) for p in counted[old[i]]]
            pairs = list({id(v): (v, layer) for v, layer in pairs}.values())
        if len(pairs) > 1:
            raise ValueError(
                f"The file at `path` has {name!r}, and `model` has no weight at "
                f"that path but {len(pairs)} at a path that ends with it or that it "
                f"ends with, in the layers "
                f"{', '.join(_where(v, layer) for v, layer in pairs)}: load it onto "
                f"the model it was trained from. Received: path={path!r}"
            )
        if pairs:
            found[name] = pairs[0]
        else:
            missing.append(name)
    if missing:
        raise ValueError(
            f"The file at `path` has weights that `model` does not: {missing[:5]}. "
            f"Load it onto the model it was trained from. Received: path={path!r}"
        )
    named = {}
    for name, (variable, _) in found.items():
        named.setdefault(id(variable), []).append(name)
    twice = [both for both in named.values() if len(both) > 1]
    if twice:
        variable = found[twice[0][0]][0]
        raise ValueError(
            f"The file at `path` has {twice[0]}, which all name the one weight "
            f"{variable.path!r} of `model`: load it onto the model it was trained "
            f"from. Received: path={path!r}"
        )
    return found


def _check_path(path, what: str) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            "`path` must be a file path (str or os.PathLike). "
            f"Received: path={_describe(path)}"
        )
    path = os.fspath(path)
    if not path.endswith(".npz"):
        raise ValueError(
            f"`path` must end in '.npz', the format {what} uses. Received: {path!r}"
        )
    return path


def _check_model(model) -> None:
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"`model` must be a Keras model. Received: model={_describe(model)}"
        )
    if not model.built:
        raise ValueError(
            f"`model` must be built. Received: model={_describe(model.name)}"
        )


def _trains_whole(variable, layer, model, free) -> bool:
    """Whether the file keeps ``variable`` whole: a weight of a layer that
    trains (all of its weights, its state too), or another trainable weight of
    a layer that holds a partial weight (its bias, kept with ``train=``).
    ``free`` maps each such layer to its partial weight's free values."""
    if id(layer) in free:
        return variable.trainable and variable is not free[id(layer)]
    if layer is model:
        return variable.trainable
    return layer.trainable


def save_partial_weights(model, path) -> dict:
    """Save the trained entries of a converted ``model`` to ``path`` (``.npz``).

    The file holds each partial weight's free entries, and every weight of
    the layers that train whole (those kept with ``train=``), their
    non-trainable state too (a ``BatchNormalization``'s moving statistics).

    Args:
        model: a model with partial layers
            (:func:`refimpl.partialize <refimpl.convert.partialize>`).
        path: the file to write, ending in ``.npz``.

    Returns:
        What the file holds, ``{"partial": {path: k}, "full": {path: size}}``.

    Raises:
        TypeError: for a ``model`` that is not a Keras model, or a bad
            ``path`` type.
        ValueError: for a ``model`` that is not built, a ``path`` not ending in
            ``.npz``, a model with no partial layer, or two weights the file
            would save at one path (named in the message).

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
    weights = _weights(model)
    paths = {id(variable): name for name, variable, _ in weights}
    partial = [(paths[id(pw.base)], pw) for pw in partial_weights(model)]
    if not partial:
        raise ValueError(
            "`model` has no partial weight: convert it with `refimpl.partialize`, "
            "or give a layer of your own a `refimpl.PartialVariable`. "
            f"Received: model={_describe(model.name)}"
        )
    free = {id(pw.owner): pw.free for _, pw in partial}
    whole = [
        (name, variable)
        for name, variable, layer in weights
        if _trains_whole(variable, layer, model, free)
    ]
    _check_unique(weights, {name for name, _ in partial + whole})
    arrays, header = {}, {"format": _FORMAT, "version": _VERSION, "partial": []}
    header["full"] = []
    for i, (name, pw) in enumerate(partial):
        base = _numpy(pw.base)
        positions = np.sort(_numpy(pw.positions).astype(np.int64))
        composed = np.asarray(keras.ops.convert_to_numpy(pw.value()))
        # A quantized base's free values are floats, its codes integers.
        dtype = base.dtype if pw.quantized is None else _numpy(pw.free).dtype
        values = composed.astype(dtype).reshape(-1)[positions]
        first, arrays[f"gaps_{i}"] = _gaps(positions)
        _store(arrays, header, f"values_{i}", values)
        scales = [] if pw.quantized is None else [_numpy(v) for v in pw.scales]
        header["partial"].append(
            {
                "path": name,
                "base": _fingerprint(base, scales),
                "num_free": len(positions),
                "first": first,
                # A quantized base's form: a plain quantized layer is made
                # partial in it on loading, so that it computes as trained.
                **({} if pw.quantized is None else {"mode": pw.mode}),
            }
        )
    for i, (name, variable) in enumerate(whole):
        _store(arrays, header, f"full_{i}", _numpy(variable))
        header["full"].append(name)
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
    The weights of the layers that trained whole are set whole. A plain
    layer whose kernel Keras quantized (int8, int4) cannot take float
    entries into its integer codes: it becomes a partial layer in place
    in the form the fine-tuned layer had, with the file's positions and
    values over its unchanged codes and scales, and predicts what the
    fine-tuned model does, bit for bit.

    Returns:
        ``None``; ``model``'s weights change in place.

    Raises:
        TypeError: for a ``model`` that is not a Keras model.
        ValueError: for a ``model`` that is not built, a file that is not one
            of these, a weight it names that ``model`` does not have (or has
            twice), or a base whose shape, dtype or values (for a quantized
            base, codes or scales) differ from the one the entries were
            trained on.

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
    header, arrays, version = _open(path)
    names = [r["path"] for r in header["partial"]] + list(header["full"])
    found = _find(model, names, version, path)
    bases = {id(pw.base): pw for pw in partial_weights(model)}
    _refuse_combining(model, header, found, bases, path)
    writes = []
    for i, record in enumerate(header["partial"]):
        variable, layer = found[record["path"]]
        base = _numpy(variable)
        scales = _scales(variable, layer)
        if _fingerprint(base, scales) != record["base"]:
            raise ValueError(
                f"The base of {record['path']!r} in `model` (shape {base.shape}, "
                f"dtype {base.dtype.name}{_scales_text(scales)}) is not the one "
                f"its entries were trained on (shape "
                f"{tuple(record['base']['shape'])}, dtype "
                f"{record['base']['dtype']}"
                f"{_scales_text(record['base'].get('scales', []))}, another "
                f"checksum{_checksum_of(record['base'])}): the entries would land on "
                f"other values. Received: path={path!r}"
            )
        values = _read(arrays, header, f"values_{i}", base.dtype.name)
        positions = _positions(arrays, record, i, version)
        pw = bases.get(id(variable))  # None: a plain weight takes them merged
        if pw is None and scales:
            # Integer codes cannot take the float values: the layer becomes
            # partial, with the file's positions (its codes and scales stay).
            pw = (layer, record.get("mode", "delta"))
        if (
            pw is not None
            and not isinstance(pw, tuple)
            and pw.num_free != len(positions)
        ):
            raise ValueError(
                f"{pw.owner.name!r} has {pw.num_free} free entries and the "
                f"file has {len(positions)} for {record['path']!r}: convert the "
                "model with the same numbers, or load onto the plain model."
            )
        writes.append((variable, pw, base, positions, values))
    for i, name in enumerate(header["full"]):
        variable, _ = found[name]
        dtype = keras.backend.standardize_dtype(variable.dtype)
        value = _read(arrays, header, f"full_{i}", dtype)
        if value.shape != tuple(variable.shape) or value.dtype.name != dtype:
            raise ValueError(
                f"The file at `path` has {name!r} of shape {value.shape} and dtype "
                f"{value.dtype.name}, and `model` of shape {tuple(variable.shape)} "
                f"and dtype {dtype}: load it onto the model it was trained from. "
                f"Received: path={path!r}"
            )
        if id(variable) in bases:
            owner = bases[id(variable)].owner
            raise ValueError(
                f"The file at `path` has {name!r} trained whole, and `model` holds "
                f"it as a partial weight ({_where(variable, owner)}): "
                "load it onto the plain model, or convert the model without that "
                "weight. "
                f"Received: path={path!r}"
            )
        writes.append((variable, None, None, None, value))
    converted = False
    for i, (variable, pw, base, positions, values) in enumerate(writes):
        if isinstance(pw, tuple):  # a quantized plain layer: made partial
            layer, mode = pw
            shape = _compat.quantized_kernel_shape(layer)
            mask = np.zeros(int(np.prod(shape)), bool)
            mask[positions] = True
            enable_partial(layer, mask.reshape(shape), mode=mode)
            writes[i] = (variable, layer.partial_weight, base, positions, values)
            converted = True
    _remember(model, header, found, writes)
    for variable, pw, base, positions, values in writes:
        if positions is None:
            variable.assign(values)
        elif pw is not None:
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
            variable.assign(merged.reshape(base.shape))
    if converted:
        _mark_hosts(model)


def _checksum_of(fingerprint) -> str:
    """What a quantized base's checksum covers (nothing said for a float base)."""
    return " of its codes and scales" if fingerprint.get("scales") else ""


def _scales_text(scales) -> str:
    """How a message names a quantized base's scales (nothing for a float base)."""
    if not len(scales):
        return ""
    shapes = [tuple(s.shape) if hasattr(s, "shape") else tuple(s[0]) for s in scales]
    return f", quantized, scales of shapes {shapes}"


def _open(path: str) -> tuple[dict, dict, int]:
    """``(header, arrays, version)`` of a file of :func:`save_partial_weights`."""
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
    if version not in (1, 2, 3):
        raise ValueError(
            f"The file at `path` has format version {version!r}, and this refimpl "
            f"reads versions 1 to 3: upgrade refimpl. Received: path={path!r}"
        )
    return header, arrays, version


# -- One file on one model: entries already applied are not combined -----------
# A model that a file was loaded onto remembers what the file wrote: each
# layer written to keeps, in its ``__dict__`` (not a Keras-tracked attribute),
# each weight written and a fingerprint of what it held before, so a model
# that holds the layer (a task model around a backbone) sees it too. Another
# file that would leave some of those entries in place (a weight it does not
# write, still holding the first file's values) is refused: the model would
# be neither fine-tune. So is a file that leaves in place the trained entries
# of a partial weight it does not name (free values that differ from the
# base). Restoring the base by hand
# (``set_weights``) makes the model plain again, and any file loads.

_APPLIED = "_refimpl_applied_entries"


def _applied(model, header, found, bases) -> list[str]:
    """Paths of ``model``'s weights that hold entries a file wrote or training
    moved, and that the file of ``header`` (whose weights are ``found``) would
    leave in place."""
    written = {id(variable) for variable, _ in found.values()}
    named_partial = {id(found[r["path"]][0]) for r in header["partial"]}
    named_whole = {id(found[name][0]) for name in header["full"]}
    left = []
    memory = _memory(model)
    for path, variable, kind, before in memory:
        if kind == "partial" and id(variable) in named_partial:
            continue  # its positions and free values are all replaced
        if kind == "whole" and id(variable) in named_whole:
            continue  # replaced whole
        if kind == "partial":
            pw = bases.get(id(variable))
            if pw is not None and _moved(pw):
                left.append(path)
        elif _fingerprint(_numpy(variable)) != before:
            left.append(path)
    remembered = {id(entry[1]) for entry in memory}
    for pw in bases.values():
        key = id(pw.base)
        if key in written or key in remembered:
            continue
        if _moved(pw):
            left.append(pw.path)
    return left


def _moved(pw) -> bool:
    """Whether a partial weight's free values differ from its base."""
    pw.check_loaded()
    base = _numpy(pw.base).reshape(-1)
    positions = _numpy(pw.positions).astype(np.int64)
    free = _numpy(pw.free).reshape(-1)
    if pw.mode == "select":
        free = free[positions]
    return not np.array_equal(free, base[positions])


def _refuse_combining(model, header, found, bases, path) -> None:
    """Refuse a file that would silently combine with entries already applied."""
    if any(
        "adapter_table" in layer.__dict__
        for layer in [model, *_compat.sub_layers(model)]
    ):
        raise ValueError(
            "`model` holds named adapters (`refimpl.adapters`): add this file "
            "with `refimpl.adapters.load(model, path, name)` and switch with "
            f"`refimpl.adapters.use`. Received: path={path!r}"
        )
    left = _applied(model, header, found, bases)
    if left:
        raise ValueError(
            f"`model` already holds trained entries that the file at `path` "
            f"would leave in place, in {left[:5]}"
            + (f" and {len(left) - 5} more" if len(left) > 5 else "")
            + ": loading it would silently combine the two fine-tunes, giving "
            "neither. To serve several fine-tunes of one base, load each as a "
            "named adapter with `refimpl.adapters.load(model, path, name)` "
            "and switch with `refimpl.adapters.use(model, name)`; to apply "
            "this one alone, load it onto the pretrained model (restore the "
            f"base first, or load it afresh). Received: path={path!r}"
        )


def _memory(model) -> list:
    """What earlier files wrote into ``model``'s layers (:func:`_remember`)."""
    found = []
    for layer in [model, *_compat.sub_layers(model)]:
        found.extend(layer.__dict__.get(_APPLIED, ()))
    return found


def _remember(model, header, found, writes) -> None:
    """Record in ``model``'s layers what the file is about to write."""
    for layer in [model, *_compat.sub_layers(model)]:
        layer.__dict__.pop(_APPLIED, None)
    paths = [r["path"] for r in header["partial"]] + list(header["full"])
    for name, (variable, pw, base, positions, _) in zip(paths, writes):
        if positions is None:
            entry = (name, variable, "whole", _fingerprint(_numpy(variable)))
        elif pw is not None:
            entry = (name, pw.base, "partial", None)
        else:
            entry = (name, variable, "merged", _fingerprint(base))
        layer = found[name][1]
        layer.__dict__.setdefault(_APPLIED, []).append(entry)
