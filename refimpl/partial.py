"""The one holder of a partially trainable weight: :class:`PartialWeight`.

A weight trainable only at some entries is three variables on a Keras layer:

* the frozen **base** (non-trainable): the layer's own weight (a partial
  layer's ``kernel`` or ``embeddings``) or a weight of its own (a
  :class:`~refimpl.variable.PartialVariable`);
* the **free** values (trainable): ``k`` values in the order of the
  positions, or, in the ``"select"`` form, a weight of the base's shape;
* the **positions** (non-trainable, int32, int64 above 2**31 entries): the
  free entries' flat row-major positions.

Every partial weight refimpl makes holds one :class:`PartialWeight` with
those members: the partial layers (made by
:func:`~refimpl.convert.partialize`,
:func:`~refimpl.layers.partial.enable_partial` or
:class:`~refimpl.layers.partial.PartialDense`) as ``layer.partial_weight``,
and a :class:`~refimpl.variable.PartialVariable` as ``pv.partial_weight``
(whose own members are the same). So the trained-entries file,
``DropAndGrow``, :func:`~refimpl.convert.trainable_summary`,
:func:`~refimpl.convert.merge` and ``keras.distribution`` layouts see every
partial weight of a model, through :func:`partial_weights`.
"""

from __future__ import annotations

import keras
import numpy as np

from refimpl import _compat, _layouts, backend
from refimpl.masks import _describe
from refimpl.ops import (
    _index_dtype,
    _initializer,
    _mode_for,
    _rectangle,
    _SelectMask,
    compose,
    xla_enabled,
)

__all__ = ["PartialWeight", "partial_weights"]


class _FreeEntries(keras.regularizers.Regularizer):
    """The base's elementwise regularizer, on the free entries alone.

    The one definition of a partial weight's penalty in every form: the
    regularizer of the ``k`` free values. (The frozen entries are constants:
    their penalty would not change the gradient.) In the ``"select"`` form the
    free weight has the base's shape; its entries outside the positions are
    not used, and are left out of the penalty.
    """

    def __init__(self, regularizer, holder):
        self.regularizer = regularizer
        self.holder = holder

    def __call__(self, x):
        holder = self.holder
        if holder.mode == "select":
            x = x.value if isinstance(x, keras.Variable) else x
            x = keras.ops.where(holder._select(holder.positions), x, 0)
        return self.regularizer(x)

    def get_config(self):  # never serialized: the layer's config holds the base's
        return self.regularizer.get_config()


class PartialWeight:
    """A weight trainable only at some entries: the base, free values and positions.

    You do not build one yourself: a partial layer and a
    :class:`~refimpl.variable.PartialVariable` each hold one, as ``.partial_weight``.

    Attributes:
        owner: the Keras layer whose variables these are.
        base: the frozen variable (``trainable=False``), of the full shape;
            its entries at ``positions`` are not used.
        free: the trainable variable: the ``k`` free values in the order of
            ``positions`` (of the full shape in the ``"select"`` form).
        positions: the free entries' flat row-major positions.
        shape: the full shape, a tuple.
        num_free: ``k``, the number of trainable entries.
        mode: the form in use, ``"delta"``, ``"sparse"``, ``"select"`` or
            ``"slices"`` (``mode="auto"`` resolved when built).
        auto: whether the form was chosen by ``mode="auto"`` as ``"sparse"``
            or ``"delta"``, so the product may choose again when traced
            (:meth:`product_mode`).
        quantized: for a kernel Keras quantized (``layer.quantize("int8")``
            or ``"int4"``), its :class:`~refimpl.quantized.QuantizedBase`
            (``base`` is then the integer codes, ``shape`` the float kernel's,
            and the free values are floats); ``None`` otherwise; and
            :attr:`scales`, its scale variables.

    >>> import refimpl
    >>> layer = keras.layers.Dense(2, name="d")
    >>> layer.build((None, 3))
    >>> refimpl.enable_partial(layer, [[0, 1], [2, 0]])
    >>> pw = layer.partial_weight
    >>> pw.path, pw.num_free, pw.mode, pw.mask.astype(int).tolist()
    ('d/kernel', 2, 'delta', [[0, 1], [0, 0], [1, 0]])
    """

    def __init__(
        self, owner, base, free, positions, *, num_free, mode, auto, quantized=None
    ):
        self.owner = owner
        self.base = base
        self.free = free
        self.positions = positions
        # A base Keras quantized (refimpl.quantized.QuantizedBase), or None.
        self.quantized = quantized
        self.shape = tuple(base.shape) if quantized is None else quantized.shape
        self.num_free = int(num_free)
        self.mode = mode
        self.auto = bool(auto)
        self.sets = None  # the "slices" form: the free index set of each axis
        self._select = _SelectMask(self.shape)
        self._loaded = not _compat.is_shell(backend.try_read_now(positions))

    @classmethod
    def create(
        cls,
        owner,
        base,
        positions,
        *,
        num_free: int,
        mode: str,
        auto: bool,
        names=("free", "positions"),
        positions_first: bool = False,
        quantized=None,
    ) -> PartialWeight:
        """Add the free values and positions to ``owner`` around the variable ``base``.

        ``positions`` (sorted flat positions) is ``None`` for a :term:`shell`,
        whose positions and free values come with the saved weights. The base
        is made non-trainable; its regularizer applies to the free entries
        alone, and its (elementwise) constraint to the free values. For a
        base Keras quantized (``quantized``, a
        :class:`~refimpl.quantized.QuantizedBase`; ``base`` is its codes) the
        free values are floats of the layer's variable dtype, starting at the
        dequantized entries.
        """
        base.trainable = False
        shape = tuple(base.shape) if quantized is None else quantized.shape
        select = mode == "select"
        holder = cls.__new__(cls)
        if positions is None:
            start_positions = _compat.shell_initializer()
            start_free = "zeros"
        elif quantized is not None:
            start_positions = _initializer(positions)
            at = keras.ops.convert_to_tensor(np.asarray(positions, _index_dtype(shape)))
            start_free = _initializer(keras.ops.convert_to_numpy(quantized.entries(at)))
        else:
            value = keras.ops.convert_to_numpy(base)
            start_positions = _initializer(positions)
            start_free = _initializer(value if select else value.ravel()[positions])
        regularizer = base.regularizer
        free_names, position_name = names
        with (
            _compat.unlocked(owner),
            _layouts.partial_weights(owner, base, select=select, free_name=free_names),
        ):

            def add_positions():
                return owner.add_weight(
                    name=position_name,
                    shape=(int(num_free),),
                    initializer=start_positions,
                    dtype=_index_dtype(shape),
                    trainable=False,
                )

            positions_variable = add_positions() if positions_first else None
            free = owner.add_weight(
                name=free_names,
                shape=shape if select else (int(num_free),),
                initializer=start_free,
                dtype=base.dtype if quantized is None else quantized.dtype,
                regularizer=None
                if regularizer is None
                else _FreeEntries(regularizer, holder),
                constraint=base.constraint,
            )
            if not positions_first:
                positions_variable = add_positions()
        holder.__init__(
            owner,
            base,
            free,
            positions_variable,
            num_free=num_free,
            mode=mode,
            auto=auto,
            quantized=quantized,
        )
        return holder

    # -- what it is ----------------------------------------------------------
    @property
    def scales(self) -> tuple:
        """The quantized base's scale variables; ``()`` for a float base."""
        return () if self.quantized is None else self.quantized.scales

    @property
    def path(self) -> str:
        """The base variable's path (``"dense/kernel"``).

        >>> import refimpl
        >>> layer = keras.layers.Dense(2, name="dense")
        >>> layer.build((None, 3))
        >>> refimpl.enable_partial(layer, [[0, 1]])
        >>> layer.partial_weight.path
        'dense/kernel'
        """
        return self.base.path

    @property
    def mask(self) -> np.ndarray:
        """The boolean mask of the full shape (``True`` = trainable).

        >>> import refimpl
        >>> pv = refimpl.PartialVariable(np.zeros((2, 2), "float32"), [[1, 0]])
        >>> pv.partial_weight.mask.astype(int)
        array([[0, 0],
               [1, 0]])
        """
        self.check_loaded()
        mask = np.zeros(int(np.prod(self.shape)), bool)
        mask[backend.read_now(self.positions)] = True
        return mask.reshape(self.shape)

    @property
    def indices(self) -> np.ndarray:
        """The ``[k, rank]`` int64 positions of the free values, in their order.

        >>> import refimpl
        >>> w = np.zeros((2, 3), "float32")
        >>> pv = refimpl.PartialVariable(w, [[1, 2], [0, 1]])
        >>> pv.partial_weight.indices
        array([[0, 1],
               [1, 2]])
        """
        self.check_loaded()
        flat = backend.read_now(self.positions).astype(np.int64)
        return np.stack(np.unravel_index(flat, self.shape), axis=-1)

    def record(self) -> dict:
        """What a shell of this weight needs: its free count and its form."""
        return {"num_free": self.num_free, "mode": self.mode, "auto": self.auto}

    # -- the one "not loaded" check -------------------------------------------
    def check_loaded(self, *, again: bool = False) -> None:
        """Refuse a :term:`shell` whose weights were never loaded.

        Reads the positions once, eagerly (inside a JAX step, where they are
        traced state, a weight never checked eagerly is refused too), and
        again after ``again=True`` (new weights were set).
        """
        if again:
            self._loaded = False
        if self._loaded:
            return
        positions = backend.try_read_now(self.positions)
        if positions is None or _compat.is_shell(positions):
            kind = getattr(self.owner, "_holder_kind", "Layer")
            raise _compat.require_loaded(f"{kind} '{self.owner.name}'")
        self._loaded = True
        if self.mode == "slices":
            self.sets = _rectangle(positions, self.shape)

    # -- the tensor --------------------------------------------------------
    def value(self, base=None):
        """The full tensor: the free values at their positions, the base elsewhere.

        Args:
            base: the base's value as the caller reads it (a layer passes its
                own variable, autocast inside its ``call``); by default
                ``self.base.value``. A quantized base is read as the float
                kernel its codes and scales stand for (``base`` unused).

        >>> import refimpl
        >>> pv = refimpl.PartialVariable(np.ones((2, 2), "float32"), [[0, 1]])
        >>> _ = pv.free.assign([5.0])
        >>> keras.ops.convert_to_numpy(pv.partial_weight.value())
        array([[1., 5.],
               [1., 1.]], dtype=float32)
        """
        self.check_loaded()
        if self.quantized is not None:  # the dequantized kernel, in float
            dequantized = self.quantized.dequantized()
            value = compose(dequantized, self.positions.value, self.free.value)
            return _layouts.constrained(value, self.base)
        base = self.base.value if base is None else base
        free = self.free.value
        if self.mode == "select":
            mask = self._select(self.positions)
            value = compose(base, self.positions.value, free, mode="select", mask=mask)
        else:
            value = compose(base, self.positions.value, free)
        return _layouts.constrained(value, self.base)

    def product_mode(self) -> str:
        """The form the product uses in the code being traced.

        Returns:
            :attr:`mode`, with one exception: built in the ``"sparse"`` form
            by ``mode="auto"`` (:attr:`auto`), it gives ``"delta"`` when XLA
            compiles the code being traced and at least
            :data:`~refimpl.ops.SPARSE_BELOW_DENSITY_XLA` of the entries are
            free (the two forms hold the same weights).

        >>> import refimpl
        >>> pv = refimpl.PartialVariable(np.ones((2, 2), "float32"), [[0, 1]])
        >>> pv.partial_weight.product_mode()
        'delta'
        """
        if not self.auto or not xla_enabled():
            return self.mode
        return _mode_for(self.num_free, self.shape, jit_compile=True)

    def folded(self) -> np.ndarray:
        """The full trained tensor as a new NumPy array (what ``merge`` writes).

        >>> import refimpl
        >>> pv = refimpl.PartialVariable(np.ones((1, 3), "float32"), [[0, 0]])
        >>> _ = pv.free.assign([3.0])
        >>> pv.partial_weight.folded()
        array([[3., 1., 1.]], dtype=float32)
        """
        return np.array(keras.ops.convert_to_numpy(self.value()))

    def __repr__(self) -> str:
        return (
            f"<PartialWeight {self.path!r} shape={self.shape} "
            f"num_free={self.num_free} mode={self.mode!r}>"
        )


def partial_weights(model) -> list[PartialWeight]:
    """Every partial weight of ``model`` (or a layer), at any depth, in layer order.

    The partial layers' and each :class:`~refimpl.variable.PartialVariable`'s, in a
    layer of your own included.

    >>> import refimpl
    >>> from refimpl.partial import partial_weights
    >>> layers = [keras.Input((3,)), keras.layers.Dense(2, name="d")]
    >>> model = keras.Sequential(layers, name="net")
    >>> converted = refimpl.partialize(model, {"d": [[0, 0]]})
    >>> [(pw.path, pw.num_free) for pw in partial_weights(converted)]
    [('net/d/kernel', 1)]
    """
    if not isinstance(model, keras.layers.Layer):
        raise TypeError(
            "`model` must be a Keras model or layer. Received: "
            f"model={_describe(model)}"
        )
    layers = [model, *_compat.sub_layers(model)]
    found = []
    for layer in layers:
        holder = layer.__dict__.get("partial_weight")
        if isinstance(holder, PartialWeight):
            found.append(holder)
    return found
