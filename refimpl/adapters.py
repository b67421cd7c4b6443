"""Many sparse fine-tunes on one base: named adapters, switched and mixed.

Each fine-tune of one pretrained model saved by
:func:`refimpl.save_partial_weights <refimpl.trained_entries.save_partial_weights>`
becomes a named **adapter** of one in-memory model (as PEFT's
``load_adapter``/``set_adapter`` do for LoRA):

* :func:`load` attaches a file under a name, without touching the base or the
  other adapters;
* :func:`use` makes one active in place (``None``: the pretrained base); the
  model predicts what the fine-tuned model did, bit for bit;
* :func:`names`, :func:`active` and :func:`remove`;
* :func:`combine` makes a new adapter of several: the weighted sum of their
  changes from the base, with a report of where they overlap;
* :func:`predict` runs one batch whose rows use different adapters, in one
  pass.

>>> import os, tempfile
>>> import keras, numpy as np, refimpl
>>> from refimpl import adapters
>>> def pretrained():
...     keras.utils.set_random_seed(0)
...     return keras.Sequential(
...         [keras.Input((4,)), keras.layers.Dense(3, name="d")], name="net")
>>> folder = tempfile.mkdtemp()
>>> for task, entry in (("a", [[0, 0]]), ("b", [[3, 2]])):
...     tuned = refimpl.partialize(pretrained(), {"d": entry})
...     _ = tuned.get_layer("d").partial_weight.free.assign([5.0])  # as if trained
...     _ = refimpl.save_partial_weights(tuned, os.path.join(folder, task + ".npz"))
>>> model = pretrained()
>>> adapters.load(model, os.path.join(folder, "a.npz"), "a")
>>> adapters.load(model, os.path.join(folder, "b.npz"), "b")
>>> adapters.names(model), adapters.active(model)
(['a', 'b'], None)
>>> adapters.use(model, "b")
>>> float(keras.ops.convert_to_numpy(model.get_layer("d").kernel)[3, 2])
5.0
>>> x = np.ones((3, 4), "float32")
>>> y = adapters.predict(model, x, adapters=["a", None, "b"])  # a row each
>>> y.shape
(3, 3)

How it works. Every layer an adapter touches becomes a partial layer
(:func:`refimpl.enable_partial <refimpl.layers.partial.enable_partial>`) that
keeps a table of adapters: each adapter's positions and fine-tuned values, as
two non-trainable weights. The layer's partial weight holds the union of the
adapters' positions; its free values are the active adapter's values there,
the base's where it has none. So :func:`use` assigns the ``k`` free values
(no new model, no new trace), and the forward pass is the partial layer's
own. The adapters' weights are the layer's weights: a model saved as
``.keras`` reloads with every adapter and the active one.

The rest of refimpl sees the active adapter: :func:`refimpl.merge
<refimpl.convert.merge>` gives the plain model of the active adapter (the
others are dropped), and :func:`refimpl.save_partial_weights
<refimpl.trained_entries.save_partial_weights>` saves it (at the union of the
adapters' positions, the base's values where it has none).
:func:`refimpl.load_partial_weights
<refimpl.trained_entries.load_partial_weights>` refuses a model with adapters.
"""

from __future__ import annotations

import numbers

import keras
import numpy as np

from refimpl import _adapter_table, _compat
from refimpl.convert import _uncompile
from refimpl.layers.partial import (
    PartialWeightMixin,
    _mark_hosts,
    _target_weight,
    _weight_names,
    enable_partial,
    partial_class,
)
from refimpl.masks import _describe
from refimpl.partial import partial_weights
from refimpl.trained_entries import (
    _check_model,
    _check_path,
    _find,
    _fingerprint,
    _moved,
    _numpy,
    _open,
    _positions,
    _read,
    _weights,
)

__all__ = ["active", "combine", "load", "names", "predict", "remove", "use"]

_CACHE = "_adapter_predict_functions"


# -- what the model holds ------------------------------------------------------


def _tables(model) -> list:
    """Every adapter table of ``model``, in layer order."""
    found = []
    for layer in [model, *_compat.sub_layers(model)]:
        table = _adapter_table.table(layer)
        if table is not None:
            found.append(table)
    return found


def names(model) -> list[str]:
    """The adapters of ``model``, in the order they were added.

    Returns:
        A list of names (empty for a model without adapters).

    >>> import keras
    >>> from refimpl import adapters
    >>> adapters.names(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))
    []
    """
    _check_model(model)
    tables = _tables(model)
    return list(tables[0].names) if tables else []


def active(model):
    """The active adapter's name, or ``None`` (the pretrained base).

    >>> import keras
    >>> from refimpl import adapters
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> print(adapters.active(model))
    None
    """
    _check_model(model)
    tables = _tables(model)
    return tables[0].active if tables else None


def _check_name(name, *, what: str = "name") -> str:
    if not isinstance(name, str):
        raise TypeError(
            f"`{what}` must be a string, the adapter's name. "
            f"Received: {what}={_describe(name)}"
        )
    if not name:
        raise ValueError(f"`{what}` must not be empty. Received: {what}=''")
    return name


def _check_known(model, name, *, what: str = "name", allow_none: bool = False):
    if name is None and allow_none:
        return None
    _check_name(name, what=what)
    known = names(model)
    if name not in known:
        raise ValueError(
            f"`{what}` must name an adapter of `model`, one of {known}"
            + (" (or None, the base)" if allow_none else "")
            + f". Received: {what}={name!r}"
        )
    return name


def _changed(model) -> None:
    """The model's variables changed: its compiled functions are stale."""
    _uncompile(model)
    model.predict_function = model.test_function = model.train_function = None
    model.__dict__.pop(_CACHE, None)
    model.__dict__.pop(_CACHE + "_off", None)


# -- load ----------------------------------------------------------------------


def load(model, path, name: str) -> None:
    """Attach a file of trained entries to ``model`` as the adapter ``name``.

    The file is one of :func:`refimpl.save_partial_weights
    <refimpl.trained_entries.save_partial_weights>`, saved from a fine-tune
    of this pretrained model. Neither the base nor the other adapters change,
    nor which one is active (:func:`use` switches). ``model`` may be plain:
    each layer the file touches is made partial in place, with the file's
    positions; or converted (by :func:`refimpl.partialize
    <refimpl.convert.partialize>`), with no trained entries of its own yet.
    A converted layer's partial weight then holds the union of the adapters'
    positions, in the ``"delta"`` form (``"sparse"`` and ``"select"`` are
    kept; ``"slices"`` becomes ``"delta"``, since a union of masks is not one
    rectangle). The model is no longer compiled (its variables changed):
    compile it again before ``fit`` or ``evaluate``.

    Args:
        model: the built pretrained Keras model (plain or converted).
        path: the ``.npz`` file.
        name: the adapter's name, a new non-empty string.

    Returns:
        ``None``; ``model`` changes in place.

    Raises:
        TypeError: for a ``model`` that is not a Keras model, a ``name`` that is
            not a string, a bad ``path`` type.
        ValueError: for a name already used, a file whose base differs from
            ``model``'s (its fingerprint), a file with weights trained whole
            (``train=``: adapters hold entries only), a weight that this
            mechanism cannot hold (a quantized layer), or a converted layer
            that holds trained entries of its own.

    >>> import os, tempfile, keras, refimpl
    >>> from refimpl import adapters
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="d")])
    >>> path = os.path.join(tempfile.mkdtemp(), "a.npz")
    >>> tuned = refimpl.partialize(model, {"d": [[0, 0]]})
    >>> _ = refimpl.save_partial_weights(tuned, path)
    >>> adapters.load(model, path, "a")
    >>> type(model.get_layer("d")).__name__, adapters.names(model)
    ('PartialDense', ['a'])
    """
    _check_model(model)
    _check_name(name)
    path = _check_path(path, "refimpl.adapters.load")
    if name in names(model):
        raise ValueError(
            f"`name` {name!r} is already an adapter of `model` "
            f"({names(model)}): remove it first "
            "(`refimpl.adapters.remove(model, name)`) or choose another name."
        )
    header, arrays, version = _open(path)
    if header["full"]:
        raise ValueError(
            f"The file at `path` holds weights trained whole ({header['full'][:5]}"
            "), which adapters do not hold (only trained entries): fine-tune "
            "those layers with a mask too (a mask of every entry), or load this "
            f"file alone with `refimpl.load_partial_weights`. Received: path={path!r}"
        )
    records = header["partial"]
    found = _find(model, [r["path"] for r in records], version, path)
    bases = {id(pw.base): pw for pw in partial_weights(model)}
    plan = []  # (layer, weight, positions, values), every check first
    for i, record in enumerate(records):
        variable, layer = found[record["path"]]
        pw = bases.get(id(variable))
        if pw is not None:
            layer = pw.owner
        layer, weight = _adapted_layer(layer, variable, pw, record["path"])
        base = _numpy(variable)
        if _fingerprint(base) != record["base"]:
            raise ValueError(
                f"The base of {record['path']!r} in `model` is not the one the "
                "file's entries were trained on (its shape, dtype or checksum "
                "differs): load adapters onto the pretrained model they were "
                "fine-tuned from, with no file loaded into it "
                f"(`refimpl.load_partial_weights` writes into the base). "
                f"Received: path={path!r}"
            )
        if pw is not None and _adapter_table.table(layer) is None and _moved(pw):
            raise ValueError(
                f"Layer {layer.name!r} holds trained entries of its own (its "
                "free values differ from the base), which would be lost: save "
                "them as a file (`refimpl.save_partial_weights`) and load that "
                "as an adapter too, onto the pretrained model. "
                f"Received: path={path!r}"
            )
        values = _read(arrays, header, f"values_{i}", base.dtype.name)
        positions = _positions(arrays, record, i, version)
        plan.append((layer, weight, positions, values))
    # Every check passed: convert, then add the adapter to every table.
    before = names(model)
    chosen = _active_of(model)
    touched = {}
    for layer, weight, positions, values in plan:
        if not isinstance(layer, PartialWeightMixin):
            shape = tuple(_target_weight(layer, weight).shape)
            mask = np.zeros(int(np.prod(shape)), bool)
            mask[positions] = True
            enable_partial(layer, mask.reshape(shape), weight=weight)
            converted = True
        else:
            converted = False
        table = _adapter_table.table(layer)
        if table is None:
            table = _adapter_table.AdapterTable(
                layer, active=chosen, converted=converted
            )
            table.names = list(before)
            layer.__dict__["adapter_table"] = table
        touched[id(layer)] = (table, positions, values)
    for table in _tables(model):
        entries = _entries(table)
        if id(table.layer) in touched:
            entries[name] = touched[id(table.layer)][1:]
        table.names.append(name)
        if id(table.layer) in touched:
            _rebuild(table, entries)
    _mark_hosts(model)
    _changed(model)


def _active_of(model):
    tables = _tables(model)
    return tables[0].active if tables else None


def _adapted_layer(layer, variable, pw, path):
    """``(layer, weight)``: the layer that holds the file's weight ``variable``
    as an adapter, and the weight's name there; refuses what cannot."""
    if getattr(layer, "quantization_mode", None) or getattr(
        layer, "lora_enabled", False
    ):
        raise ValueError(
            f"The file's weight {path!r} is in layer {layer.name!r}, which is "
            "quantized or uses LoRA: adapters need a float base. Load the "
            "adapters onto the float model."
        )
    if pw is not None:
        if not isinstance(layer, PartialWeightMixin):
            raise ValueError(
                f"The file's weight {path!r} is a `PartialVariable` of layer "
                f"{layer.name!r}; adapters are held by partial layers "
                "(`refimpl.partialize`, `refimpl.enable_partial`). Load it with "
                "`refimpl.load_partial_weights` instead."
            )
        return layer, layer._partial_target
    try:
        partial_class(type(layer))
        weights = _weight_names(layer)
    except TypeError:
        weights = ()
    for weight in weights:
        if _target_weight(layer, weight) is variable:
            if isinstance(layer, PartialWeightMixin):
                break  # another weight of the layer is the partial one
            return layer, weight
    raise ValueError(
        f"The file's weight {path!r} (layer {layer.name!r}, "
        f"{type(layer).__name__}) is not one an adapter can hold: a layer's "
        "kernel or embeddings (one weight per layer). Load it with "
        "`refimpl.load_partial_weights` instead."
    )


def _entries(table) -> dict:
    """``{name: (positions, values)}`` of a table's adapters with entries."""
    return {name: table.arrays(name) for name in table.variables}


def _rebuild(table, entries) -> None:
    """Re-create a layer's partial weight on the union of ``entries``'
    positions and the adapters' weights, in the order a reloaded layer makes
    them (free values, positions, then each adapter's two weights), with the
    active adapter's values as the free values."""
    layer = table.layer
    holder = layer.partial_weight
    mode = holder.mode if holder.mode in ("delta", "sparse", "select") else "delta"
    auto = holder.auto and mode == "sparse"
    for pair in table.variables.values():
        for variable in pair:
            _compat.untrack_variable(layer, variable)
    for variable in (holder.free, holder.positions):
        _compat.untrack_variable(layer, variable)
    for attribute in ("_partial_free", "_partial_positions"):
        super(keras.layers.Layer, layer).__delattr__(attribute)
    layer.__dict__.pop("partial_weight", None)
    union = (
        np.unique(np.concatenate([positions for positions, _ in entries.values()]))
        if entries
        else np.zeros(0, np.int64)
    )
    layer._partial_add_weights(len(union), union, mode, auto)
    if getattr(layer, "_partial_rest_frozen", False):
        layer.freeze_rest()
    table.variables = {}
    table.forget()
    base = layer.partial_weight.base
    for name in table.names:
        if name in entries:
            positions, values = entries[name]
            table._add(name, len(positions), positions, values, base)
    table.use(table.active if table.active in table.names else None)


# -- use, remove ---------------------------------------------------------------


def use(model, name) -> None:
    """Make the adapter ``name`` active, in place (``None``: the pretrained base).

    O(k) per layer: each adapted layer's free values are assigned (no new
    model, variables or trace; a compiled ``predict`` reads the new values).
    In the ``"delta"`` form (the default) and ``"select"``, the model then
    predicts what the model fine-tuned and saved to that file predicted, bit
    for bit, whatever was active before; in the ``"sparse"`` form (a layer
    converted with it), to rounding, as ``merge`` does.

    Raises:
        TypeError: for a ``name`` that is neither a string nor ``None``.
        ValueError: for a name that is not an adapter of ``model``.

    >>> import keras
    >>> from refimpl import adapters
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> adapters.use(model, None)  # the base: nothing to do
    """
    _check_model(model)
    _check_known(model, name, allow_none=True)
    for table in _tables(model):
        table.use(name)


def remove(model, name: str) -> None:
    """Remove the adapter ``name`` from ``model``.

    If it was active, the base becomes active. A layer that no adapter
    touches any more gets its plain class back (with the base's values).

    Raises:
        TypeError: for a ``name`` that is not a string.
        ValueError: for a name that is not an adapter of ``model``.

    >>> import keras
    >>> from refimpl import adapters
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> try:
    ...     adapters.remove(model, "a")
    ... except ValueError as err:
    ...     print(str(err)[:38])
    `name` must name an adapter of `model`
    """
    _check_model(model)
    _check_known(model, name)
    for table in _tables(model):
        entries = _entries(table)
        had = entries.pop(name, None) is not None
        table.names.remove(name)
        if table.active == name:
            table.active = None
        if not entries:
            table.use(None)
            table.layer.fold()  # the base's values: a plain layer again
            continue
        if had:
            _rebuild(table, entries)
        elif table.active is None:
            table.use(None)
    _changed(model)


# -- combine -------------------------------------------------------------------


def combine(model, weights: dict, *, name: str) -> dict:
    """Add an adapter made of others: ``base + Σ w·(value - base)`` at the union.

    Each entry of the new adapter is the base plus the weighted sum of the
    listed adapters' changes from the base there (an adapter without that
    position adds nothing), computed in float64 and rounded once to the
    weight's dtype. Sparse fine-tunes that touch different entries merge
    well: with weights of 1, the new adapter applies both, exactly. Where
    they share entries, their changes add up, which neither fine-tune
    trained for: the report says how many and by how much they disagree.

    Args:
        model: a model with adapters.
        weights: ``{adapter name: weight}``, at least one, weights real numbers.
        name: the new adapter's name.

    Returns:
        The report of the overlap, a dict:

        * ``"overlap"``: ``{weight path: positions in two or more of them}``,
          each weight the new adapter has entries in, by its path in the
          file (``"hidden/kernel"``);
        * ``"total"``: the sum of those;
        * ``"positions"``: the new adapter's number of entries;
        * ``"disagreement"``: ``{weight path: the largest difference between
          two adapters' changes at a shared position}`` (``0.0`` with none);
        * ``"max_disagreement"``: the largest of those.

    Raises:
        TypeError: for ``weights`` that is not a dict of names to numbers, or
            a ``name`` that is not a string.
        ValueError: for an unknown or repeated adapter, no adapters, or a
            ``name`` already used.

    >>> import keras
    >>> from refimpl import adapters
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> try:
    ...     adapters.combine(model, {}, name="ab")
    ... except ValueError as err:
    ...     print(str(err)[:43])
    `weights` must name at least one adapter of
    """
    _check_model(model)
    _check_name(name)
    if not isinstance(weights, dict):
        raise TypeError(
            "`weights` must be a dict from adapter names to weights "
            f"({{'a': 1.0, 'b': 0.5}}). Received: weights={_describe(weights)}"
        )
    if not weights:
        raise ValueError(
            f"`weights` must name at least one adapter of `model` ({names(model)}). "
            "Received: weights={}"
        )
    for key, weight in weights.items():
        _check_known(model, key, what="weights key")
        if not isinstance(weight, numbers.Real) or isinstance(weight, bool):
            raise TypeError(
                f"`weights` must map each adapter to a real number. Received: "
                f"weights[{key!r}]={_describe(weight)}"
            )
    if name in names(model):
        raise ValueError(
            f"`name` {name!r} is already an adapter of `model` ({names(model)})."
        )
    report = {
        "overlap": {},
        "total": 0,
        "positions": 0,
        "disagreement": {},
        "max_disagreement": 0.0,
    }
    paths = {id(variable): path for path, variable, _ in _weights(model)}
    for table in _tables(model):
        entries = _entries(table)
        parts = [(entries[key], w) for key, w in weights.items() if key in entries]
        table.names.append(name)
        if not parts:
            continue
        union = np.unique(np.concatenate([p for (p, _), _ in parts]))
        base = table.base_values()[np.searchsorted(table.union(), union)]
        total = base.astype(np.float64)
        count = np.zeros(len(union), np.int64)
        low = np.full(len(union), np.inf)
        high = np.full(len(union), -np.inf)
        for (positions, values), weight in parts:
            at = np.searchsorted(union, positions)
            change = values.astype(np.float64) - base[at].astype(np.float64)
            total[at] += float(weight) * change
            count[at] += 1
            low[at] = np.minimum(low[at], change)
            high[at] = np.maximum(high[at], change)
        shared = count > 1
        path = paths[id(table.layer.partial_weight.base)]
        report["overlap"][path] = int(shared.sum())
        report["total"] += int(shared.sum())
        report["positions"] += len(union)
        spread = float((high - low)[shared].max()) if shared.any() else 0.0
        report["disagreement"][path] = spread
        report["max_disagreement"] = max(report["max_disagreement"], spread)
        entries[name] = (union, total.astype(base.dtype))
        _rebuild(table, entries)
    _changed(model)
    return report


# -- mixed batches -------------------------------------------------------------


def predict(model, x, adapters, *, batch_size: int | None = None):
    """Predict a batch whose row ``i`` uses the adapter ``adapters[i]``.

    One pass per batch (S-LoRA and Punica's way, for sparse adapters): the
    rows are sorted by adapter, so each adapter's rows are one contiguous
    slice; an adapted ``Dense`` or ``EinsumDense`` (whose equation is a
    matrix product after a reshape) computes the base product once for the
    whole batch and adds each adapter's correction ``x_rows @ D`` on its own
    rows only (O(rows·k) each, a gather and a ``segment_sum``, no
    kernel-sized delta); an adapted ``Embedding`` looks the base table up
    and writes each adapter's entries into its rows' tokens. The outputs
    come back in the rows' order. Any other adapted layer (a convolution, a
    keras-hub ``ReversibleEmbedding``, ...), or one whose inputs' first axis
    is not the batch's rows (inside a ``TimeDistributed``), makes the whole
    call switch adapters group by group (:func:`use`, then ``model.predict``
    on the group's rows): the same result, a pass per group.

    Each row's output equals ``use(model, adapters[i])`` then
    ``model.predict``: to float32 rounding through an adapted ``Dense`` or
    ``EinsumDense`` (``x @ base + x @ D`` is summed in another order than
    the composed kernel's product ``x @ (base + D)``, and XLA may round a
    row in a batch of another size otherwise), bit for bit through an
    adapted ``Embedding`` (a lookup). Each batch's layout (the adapters and
    their row counts) is compiled once, by ``model.predict``, and reused.

    Cost: the corrections gather ``k`` inputs per row, so 8 adapters of 1 %
    over a batch cost about what one adapter of 1 % does over it. A CPU
    pays that at about a dense product of the same rows: the book's
    Performance page (``evidence.benchmarks.adapters``) measures a mixed
    batch at about half the base's throughput there, and switching with
    :func:`use` group by group faster.

    Args:
        model: a model with adapters.
        x: the inputs: an array, or a dict or list of arrays (a keras-hub
            model's ``{"token_ids": ..., "padding_mask": ...}``), rows first.
        adapters: one adapter name (or ``None``, the base) per row.
        batch_size: rows per pass (the rows sorted by adapter first); by
            default 32, as ``model.predict``.

    Returns:
        What ``model.predict`` returns, rows in the order of ``x``. The
        active adapter is unchanged.

    Raises:
        TypeError: for ``x`` that is not arrays, ``adapters`` that is not a
            list or tuple, or a ``batch_size`` that is not an int.
        ValueError: for a number of names that is not the number of rows, or
            a name that is not an adapter of ``model``.

    >>> import keras, numpy as np
    >>> from refimpl import adapters
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> adapters.predict(model, np.ones((2, 2), "float32"), [None, None]).shape
    (2, 1)
    """
    _check_model(model)
    flat = keras.tree.flatten(x)
    if not flat or not all(
        isinstance(a, np.ndarray) or keras.ops.is_tensor(a) for a in flat
    ):
        raise TypeError(
            "`x` must be an array, or a dict or list of arrays, rows first. "
            f"Received: x={_describe(x)}"
        )
    x = keras.tree.map_structure(lambda a: np.asarray(keras.ops.convert_to_numpy(a)), x)
    rows = len(keras.tree.flatten(x)[0])
    if not isinstance(adapters, (list, tuple)):
        raise TypeError(
            "`adapters` must be a list with one adapter name (or None) per row. "
            f"Received: adapters={_describe(adapters)}"
        )
    if len(adapters) != rows:
        raise ValueError(
            f"`adapters` must have one name per row of `x`, {rows}. "
            f"Received: {len(adapters)} names"
        )
    if batch_size is None:
        batch_size = 32
    if not isinstance(batch_size, int) or isinstance(batch_size, bool):
        raise TypeError(
            f"`batch_size` must be an int. Received: batch_size={_describe(batch_size)}"
        )
    if batch_size < 1:
        raise ValueError(
            f"`batch_size` must be at least 1. Received: batch_size={batch_size}"
        )
    order = [None, *names(model)]
    for i, adapter in enumerate(adapters):
        if adapter not in order:
            _check_known(model, adapter, what=f"adapters[{i}]", allow_none=True)
    rank = {n: i for i, n in enumerate(order)}
    sort = np.argsort([rank[a] for a in adapters], kind="stable")
    sorted_names = [adapters[i] for i in sort]
    tables = _tables(model)
    outputs = None
    mixable = not model.__dict__.get(_CACHE + "_off", False)
    if mixable and all(_adapter_table.supports_mixed(t.layer) for t in tables):
        try:
            outputs = _mixed(model, x, sort, sorted_names, batch_size, tables)
        except _adapter_table.NotRowMajor:
            model.__dict__[_CACHE] = {}  # never mixed: group by group
            model.__dict__[_CACHE + "_off"] = True
    if outputs is None:
        outputs = _group_by_group(model, x, sort, sorted_names, batch_size)
    inverse = np.empty_like(sort)
    inverse[sort] = np.arange(len(sort))
    return keras.tree.map_structure(lambda out: out[inverse], outputs)


def _take(x, index):
    return keras.tree.map_structure(lambda a: a[index], x)


def _mixed(model, x, sort, sorted_names, batch_size, tables):
    """The sorted rows, a pass per batch of ``batch_size``."""
    for table in tables:  # read the constants now, not inside a trace
        for adapter in table.variables:
            table.static(adapter)
    cache = model.__dict__.setdefault(_CACHE, {})
    outputs = []
    for start in range(0, len(sort), batch_size):
        index = sort[start : start + batch_size]
        chunk = sorted_names[start : start + batch_size]
        layout, first = [], 0
        for i in range(1, len(chunk) + 1):
            if i == len(chunk) or chunk[i] != chunk[first]:
                layout.append((chunk[first], first, i))
                first = i
        layout = tuple(layout)
        own = model.predict_function
        model.predict_function = cache.get(layout)
        try:
            with _adapter_table.mixed_pass(layout):
                out = model.predict(_take(x, index), batch_size=len(index), verbose=0)
            cache[layout] = model.predict_function
        finally:
            model.predict_function = own
        outputs.append(out)
    return keras.tree.map_structure(lambda *parts: np.concatenate(parts), *outputs)


def _group_by_group(model, x, sort, sorted_names, batch_size):
    """The sorted rows, each adapter's group with :func:`use`."""
    was = active(model)
    outputs = []
    try:
        first = 0
        for i in range(1, len(sorted_names) + 1):
            if i == len(sorted_names) or sorted_names[i] != sorted_names[first]:
                use(model, sorted_names[first])
                index = sort[first:i]
                outputs.append(
                    model.predict(_take(x, index), batch_size=batch_size, verbose=0)
                )
                first = i
    finally:
        use(model, was)
    return keras.tree.map_structure(lambda *parts: np.concatenate(parts), *outputs)
