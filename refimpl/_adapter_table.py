"""Named adapters of one partial layer: the table :mod:`refimpl.adapters` keeps.

A layer that holds adapters keeps, for each adapter, its positions (int) and
its values (the fine-tuned entries themselves, not their change) as two
non-trainable weights, ``adapter_<i>_positions`` and ``adapter_<i>_values``.
Its partial weight (:class:`~refimpl.partial.PartialWeight`) holds the union
of every adapter's positions, and its free values are the active adapter's
values there, the base's where it has none. So switching adapters is an
in-place ``assign`` of the ``k`` free values, and the layer's forward is the
partial weight's own: the composed kernel equals the fine-tuned model's, bit
for bit, in the ``"delta"`` form.

A *mixed pass* (:func:`mixed_pass`, set by :func:`refimpl.adapters.predict`)
runs one batch whose rows use different adapters: the rows are sorted by
adapter, so each adapter's rows are one contiguous slice known when the step
is traced, and an adapted ``Dense``, ``EinsumDense`` or ``Embedding``
computes the base product for the whole batch and adds each adapter's
correction on its own rows (:func:`mixed_output`).

This module sits below :mod:`refimpl.layers.partial` (which calls
:func:`mixed` and :func:`mixed_output` at the top of a partial layer's
``call``) and imports nothing of it.
"""

from __future__ import annotations

import contextlib

import keras
import numpy as np

from refimpl import _compat, backend
from refimpl.ops import _index_dtype

#: The layout of the mixed pass being traced: ``((name or None, start, stop), ...)``
#: over the rows of the batch, or ``None`` when no mixed pass is on.
_PASS = None


@contextlib.contextmanager
def mixed_pass(layout):
    """Run the code inside as a mixed pass over ``layout`` (see the module)."""
    global _PASS
    before, _PASS = _PASS, tuple(layout)
    try:
        yield
    finally:
        _PASS = before


def table(layer):
    """The :class:`AdapterTable` of ``layer``, or ``None``."""
    return layer.__dict__.get("adapter_table")


class NotRowMajor(ValueError):
    """A layer of the mixed pass got inputs whose first axis is not the
    batch's rows (a ``TimeDistributed`` layer folds time into it): the
    caller switches adapters group by group instead."""


def mixed(layer) -> bool:
    """Whether ``layer``'s ``call`` belongs to :func:`mixed_output` now."""
    return _PASS is not None and "adapter_table" in layer.__dict__


class AdapterTable:
    """The adapters of one partial layer (see the module).

    Attributes:
        layer: the partial layer.
        names: the adapters' names, in the order they were added (an adapter
            without entries in this layer is listed, with no weights).
        variables: ``{name: (positions, values)}``, the two weights of each
            adapter with entries here.
        active: the active adapter's name, or ``None`` (the base).
        converted: whether :func:`refimpl.adapters.load` made the layer partial
            (it gets its plain class back when its last adapter goes).
    """

    def __init__(self, layer, *, active=None, converted=False):
        self.layer = layer
        self.names: list = []
        self.variables: dict = {}
        self.active = active
        self.converted = bool(converted)
        self._cache: dict = {}

    # -- what a config records ---------------------------------------------
    def record(self) -> dict:
        sizes = [
            [name, int(self.variables[name][0].shape[0])]
            if name in self.variables
            else [name, 0]
            for name in self.names
        ]
        return {"names": sizes, "active": self.active, "converted": self.converted}

    @classmethod
    def shell(cls, layer, record) -> AdapterTable:
        """A table whose weights the saved weights fill (a reloaded layer)."""
        table = cls(layer, active=record["active"], converted=record["converted"])
        base = layer.partial_weight.base
        for name, size in record["names"]:
            table.names.append(name)
            if size:
                table._add(name, size, None, None, base)
        layer.__dict__["adapter_table"] = table
        return table

    def _add(self, name, size, positions, values, base) -> None:
        layer = self.layer
        i = len(self.variables)
        if positions is None:
            start_positions = _compat.shell_initializer(_index_dtype(base.shape))
            start_values = _compat.shell_initializer(str(base.dtype))
        else:
            start_positions = _constant(positions)
            start_values = _constant(values)
        with _compat.unlocked(layer):
            p = layer.add_weight(
                name=f"adapter_{i}_positions",
                shape=(int(size),),
                initializer=start_positions,
                dtype=_index_dtype(base.shape),
                trainable=False,
            )
            v = layer.add_weight(
                name=f"adapter_{i}_values",
                shape=(int(size),),
                initializer=start_values,
                dtype=base.dtype,
                trainable=False,
                autocast=False,
            )
        self.variables[name] = (p, v)

    # -- the arrays, read once ---------------------------------------------
    def arrays(self, name):
        """``(positions, values)`` of adapter ``name`` here, as NumPy
        (empty if it has no entries here)."""
        key = ("arrays", name)
        if key not in self._cache:
            if name not in self.variables:
                dtype = keras.backend.standardize_dtype(self.base.dtype)
                found = (np.zeros(0, np.int64), np.zeros(0, dtype))
            else:
                p, v = self.variables[name]
                positions = backend.read_now(p).astype(np.int64)
                if _compat.is_shell(positions):
                    raise _compat.require_loaded(f"Layer '{self.layer.name}'")
                found = (positions, _numpy(v))
            self._cache[key] = found
        return self._cache[key]

    @property
    def base(self):
        return self.layer.partial_weight.base

    def union(self) -> np.ndarray:
        key = ("union",)
        if key not in self._cache:
            parts = [self.arrays(name)[0] for name in self.variables]
            self._cache[key] = np.unique(np.concatenate(parts)) if parts else None
        return self._cache[key]

    def base_values(self) -> np.ndarray:
        """The base's values at the union (read once, O(k) after)."""
        key = ("base",)
        if key not in self._cache:
            base = _numpy(self.base).reshape(-1)
            self._cache[key] = base[self.union()]
        return self._cache[key]

    def free_values(self, name) -> np.ndarray:
        """The free values that make adapter ``name`` active (``None``: the base)."""
        key = ("free", name)
        if key not in self._cache:
            free = self.base_values().copy()
            if name is not None:
                positions, values = self.arrays(name)
                free[np.searchsorted(self.union(), positions)] = values
            self._cache[key] = free
        return self._cache[key]

    def forget(self) -> None:
        self._cache.clear()

    # -- switching ----------------------------------------------------------
    def use(self, name) -> None:
        """Make ``name`` (or ``None``, the base) active: O(k), in place."""
        holder = self.layer.partial_weight
        free = self.free_values(name)
        if holder.mode == "select":
            whole = _numpy(holder.base).reshape(-1)
            whole[self.union()] = free
            free = whole.reshape(holder.shape)
        holder.free.assign(free)
        self.active = name

    # -- the mixed pass -------------------------------------------------------
    def static(self, name):
        """Adapter ``name``'s constants of the mixed pass: positions and their
        row and column in the matrix product (row and column of the table for
        an ``Embedding``)."""
        key = ("static", name)
        if key not in self._cache:
            positions = self.arrays(name)[0]
            width = _matrix(self.layer)[1]
            rows, cols = positions // width, positions % width
            self._cache[key] = {
                "positions": positions.astype("int32"),
                "rows": rows.astype("int32"),
                "cols": cols.astype("int32"),
                **_by_column(rows, cols, width),
            }
        return self._cache[key]


def _by_column(rows, cols, width) -> dict:
    """The entries in column order (stable): ``by_column`` (their indices in
    the positions' order), ``rows_sorted``, ``cols_sorted``, and ``width``."""
    order = np.argsort(cols, kind="stable").astype("int32")
    return {
        "by_column": order,
        "rows_sorted": rows[order].astype("int32"),
        "cols_sorted": cols[order].astype("int32"),
        "width": int(width),
    }


def _constant(array):
    array = np.asarray(array)
    return lambda shape, dtype=None: keras.ops.cast(array, dtype)


def _numpy(variable) -> np.ndarray:
    array = np.array(keras.ops.convert_to_numpy(variable))
    dtype = keras.backend.standardize_dtype(variable.dtype)
    return array if array.dtype.name == dtype else array.astype(dtype)


# -- the mixed pass: one batch, each row with its adapter ----------------------


def _split(equation: str):
    """``(inputs, outputs)``: how many trailing axes of an ``EinsumDense``'s
    input its kernel contracts and how many of the output it gives, when the
    product is ``x[..., I] @ W[I, O]`` reshaped; ``None`` otherwise.

    >>> _split("abc,cde->abde"), _split("abcd,cde->abe"), _split("abc,ce->abe")
    ((1, 2), (2, 1), (1, 1))
    >>> _split("abc,cd->abd"), _split("bc,cab->ab") is None
    ((1, 1), True)
    """
    inputs, _, output = equation.replace(" ", "").partition("->")
    x, _, kernel = inputs.partition(",")
    contracted = [c for c in kernel if c in x and c not in output]
    given = [c for c in kernel if c in output and c not in x]
    if len(contracted) + len(given) != len(kernel) or not contracted or not given:
        return None
    n_in, n_out = len(contracted), len(given)
    if kernel != "".join(contracted + given):
        return None
    if x[-n_in:] != "".join(contracted) or output[-n_out:] != "".join(given):
        return None
    if x[:-n_in] != output[:-n_out]:
        return None
    return n_in, n_out


def _matrix(layer):
    """``(rows, columns)`` of ``layer``'s weight as the matrix of its product
    (an ``Embedding``: its table), or ``None`` for a layer without one."""
    shape = tuple(int(d) for d in layer.partial_weight.shape)
    if supports_mixed(layer) == "embedding":
        return shape
    if isinstance(layer, keras.layers.EinsumDense):
        n_in, _ = _split(layer.equation)
        return int(np.prod(shape[:n_in])), int(np.prod(shape[n_in:]))
    return shape


def supports_mixed(layer):
    """How ``layer`` computes its rows in a mixed pass: ``"dense"``,
    ``"einsum"`` or ``"embedding"``; ``None`` where it cannot (the caller
    then switches adapters group by group)."""
    plain = layer._partial_plain_class()
    if getattr(layer, "quantization_mode", None) or getattr(
        layer, "lora_enabled", False
    ):
        return None
    if layer._partial_target == "kernel":
        if plain.call is keras.layers.Dense.call:
            return "dense"
        if plain.call is keras.layers.EinsumDense.call:
            return "einsum" if _split(layer.equation) else None
    if layer._partial_target == "embeddings":
        if plain.call is keras.layers.Embedding.call:
            return "embedding"
    return None


def mixed_output(layer, inputs):
    """``layer``'s output in the mixed pass: the base product for every row,
    plus each adapter's correction on its own rows.

    A ``Dense`` or ``EinsumDense`` adds ``x_rows @ D`` for each adapter (``D``
    its change from the base, ``k`` entries): a gather of the ``k`` needed
    input features and a ``segment_sum`` into the output columns, as
    :func:`refimpl.ops.sparse_matmul` does, O(rows·k) per adapter, with no
    kernel-sized delta. An ``Embedding`` looks every token up in the base
    table, then writes each adapter's entries of the tokens' rows in.
    """
    kind = supports_mixed(layer)
    if kind is None:
        raise ValueError(
            f"Layer {layer.name!r} ({type(layer).__name__}) cannot compute a "
            "mixed batch; `refimpl.adapters.predict` switches adapters group by "
            "group for such a model."
        )
    adapters = layer.__dict__["adapter_table"]
    holder = layer.partial_weight
    dtype = layer.compute_dtype
    rows_in_pass = _PASS[-1][2] if _PASS else 0
    if inputs.shape[0] is not None and int(inputs.shape[0]) != rows_in_pass:
        raise NotRowMajor(
            f"Layer {layer.name!r} got {inputs.shape[0]} rows in a batch of "
            f"{rows_in_pass}: its inputs' first axis is not the batch's rows."
        )
    if kind == "embedding":
        return _embedding_rows(layer, adapters, holder, inputs, dtype)
    base = keras.ops.cast(holder.base.value, dtype)
    if kind == "dense":
        y = keras.ops.matmul(inputs, base)
    else:
        y = keras.ops.einsum(layer.equation, inputs, base)
    rows, cols = _matrix(layer)
    flat_base = keras.ops.reshape(base, (-1,))
    pieces = []
    for name, start, stop in _PASS:
        if stop == start:
            continue
        y_rows = y[start:stop]
        if name is None or name not in adapters.variables:
            pieces.append(y_rows)
            continue
        static = adapters.static(name)
        values = keras.ops.cast(adapters.variables[name][1].value, dtype)
        positions = keras.ops.convert_to_tensor(static["positions"])
        delta = values - keras.ops.take(flat_base, positions)
        x = keras.ops.reshape(inputs[start:stop], (-1, rows))
        correction = keras.ops.reshape(
            _sparse_product(x, delta, static), keras.ops.shape(y_rows)
        )
        pieces.append(y_rows + correction)
    y = pieces[0] if len(pieces) == 1 else keras.ops.concatenate(pieces, axis=0)
    if layer.bias is not None:
        y = keras.ops.add(y, keras.ops.cast(layer.bias, dtype))
    return layer.activation(y) if layer.activation is not None else y


def _sparse_product(x, delta, static):
    """``x @ D`` for ``D`` with ``delta`` at the static positions, O(rows·k):
    the rows of ``xᵀ`` the entries need (each a contiguous copy), times
    their entries, summed into their columns by a ``segment_sum`` over
    column-sorted entries."""
    order = keras.ops.convert_to_tensor(static["by_column"])
    picked = keras.ops.take(
        keras.ops.transpose(x),
        keras.ops.convert_to_tensor(static["rows_sorted"]),
        axis=0,
    )
    delta = keras.ops.take(delta, order)
    added = keras.ops.segment_sum(
        picked * keras.ops.expand_dims(delta, -1),
        keras.ops.convert_to_tensor(static["cols_sorted"]),
        num_segments=static["width"],
        # JAX's scatter is faster on sorted indices; TensorFlow's sorted
        # segment sum takes no `num_segments`.
        sorted=keras.backend.backend() == "jax",
    )
    return keras.ops.transpose(added)


def _embedding_rows(layer, adapters, holder, ids, dtype):
    """An ``Embedding``'s mixed pass: the base lookup, each adapter's entries
    written into its rows' tokens (the composed table's lookup, bit for bit)."""
    if keras.backend.standardize_dtype(ids.dtype) not in ("int32", "int64"):
        ids = keras.ops.cast(ids, "int32")
    base = holder.base.value
    vocabulary, dim = (int(d) for d in holder.shape)
    y = keras.ops.take(base, ids, axis=0)
    pieces = []
    for name, start, stop in _PASS:
        if stop == start:
            continue
        y_rows = y[start:stop]
        if name is None or name not in adapters.variables:
            pieces.append(y_rows)
            continue
        static = adapters.static(name)
        first, count = _row_spans(static["rows"], vocabulary)
        widest = max(int(count.max()), 1)
        token = keras.ops.reshape(ids[start:stop], (-1,))
        tokens = keras.ops.shape(token)[0]
        begin = keras.ops.take(keras.ops.convert_to_tensor(first), token)
        have = keras.ops.take(keras.ops.convert_to_tensor(count), token)
        step = keras.ops.arange(widest, dtype="int32")
        entry = keras.ops.expand_dims(begin, -1) + step  # [tokens, widest]
        valid = keras.ops.expand_dims(step, 0) < keras.ops.expand_dims(have, -1)
        entry = keras.ops.where(valid, entry, 0)
        cols = keras.ops.take(keras.ops.convert_to_tensor(static["cols"]), entry)
        values = keras.ops.take(adapters.variables[name][1].value, entry)
        where = keras.ops.expand_dims(keras.ops.arange(tokens, dtype="int32"), -1)
        where = where * dim + cols
        # Entries that are padding go to one slot past the end, dropped after.
        where = keras.ops.where(valid, where, tokens * dim)
        flat = keras.ops.concatenate(
            [keras.ops.reshape(y_rows, (-1,)), keras.ops.zeros((1,), base.dtype)]
        )
        flat = keras.ops.scatter_update(
            flat,
            keras.ops.reshape(where, (-1, 1)),
            keras.ops.cast(keras.ops.reshape(values, (-1,)), base.dtype),
        )
        pieces.append(keras.ops.reshape(flat[:-1], keras.ops.shape(y_rows)))
    y = pieces[0] if len(pieces) == 1 else keras.ops.concatenate(pieces, axis=0)
    return keras.ops.cast(y, dtype)


def _row_spans(rows, vocabulary):
    """Where each table row's entries start in the sorted positions, and how many."""
    first = np.searchsorted(rows, np.arange(vocabulary)).astype("int32")
    count = (np.searchsorted(rows, np.arange(vocabulary), side="right") - first).astype(
        "int32"
    )
    return first, count


# -- what the partial layers call ----------------------------------------------


def build_shell(layer) -> None:
    """Re-create a reloaded layer's adapter weights (after its partial weight)."""
    record = layer.__dict__.pop("_adapter_shell", None)
    if record is not None:
        AdapterTable.shell(layer, record)


def pop_record(config: dict) -> dict | None:
    """Take the adapters' record out of a partial layer's config."""
    return config.pop("adapters", None)


def add_record(layer, config: dict) -> None:
    """Put ``layer``'s adapters' record in its config (none: nothing)."""
    found = table(layer)
    if found is not None:
        config["adapters"] = found.record()
    elif layer.__dict__.get("_adapter_shell") is not None:
        config["adapters"] = layer.__dict__["_adapter_shell"]


def owned(layer) -> set:
    """The ids of ``layer``'s adapter weights."""
    found = table(layer)
    if found is None:
        return set()
    return {id(v) for pair in found.variables.values() for v in pair}


def drop(layer) -> None:
    """Remove ``layer``'s adapters, weights and table (the layer keeps the
    active adapter's values as its partial weight's)."""
    found = layer.__dict__.pop("adapter_table", None)
    if found is None:
        return
    for pair in found.variables.values():
        for variable in pair:
            _compat.untrack_variable(layer, variable)


def forget(layer) -> None:
    """Drop what ``layer``'s table read from its weights (new weights were set)."""
    found = table(layer)
    if found is not None:
        found.forget()
