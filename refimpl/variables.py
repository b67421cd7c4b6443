"""A tensor of which only some entries are trainable: free values over a frozen base.

:class:`PartialVariable` keeps the trainable entries in their own weight and
the fixed entries in a second, non-trainable one, and builds the dense tensor
in the forward pass (:meth:`~PartialVariable.value`). An optimizer only ever
sees the free values, so the frozen entries keep their exact bits under any
optimizer, weight decay included, and the optimizer state is one value per
free entry and slot. This is the frozen-base-plus-delta idea of Keras'
``enable_lora``, with the delta restricted to a mask. It is a Keras layer that
holds weights, so Keras tracks, trains and saves it inside any layer.

:func:`compose` is the same forward pass on plain tensors, and
:func:`choose_mode` the density rule of the opt-in ``mode="auto"``. For a
matrix, :meth:`PartialVariable.matmul` gives ``x @ value()`` in the fastest
exact form of its mode; with ``mode="sparse"`` that is the sparse product of
:mod:`refimpl.sparse`, which never composes the matrix.
"""

from __future__ import annotations

import keras
import numpy as np

from refimpl import backend
from refimpl.masks import normalize_shape, to_mask
from refimpl.sparse import sparse_matmul, xla_enabled
from refimpl.structured import _index_list

__all__ = [
    "PartialVariable",
    "SELECT_ABOVE_DENSITY",
    "SPARSE_BELOW_DENSITY",
    "SPARSE_BELOW_DENSITY_XLA",
    "choose_mode",
    "compose",
]

#: Density (fraction of free entries) from which ``"select"`` is chosen.
#: Measured for one training step (forward, gradient, Adam update) with a batch
#: of 64 on a 2-core CPU, at n = 4096, without XLA: the delta step grows with
#: the number of free values (about 0.9x the dense step at 10% free, 1.1x to
#: 1.3x at 15%, about 2x at 30%) and overtakes the select step (1.1x to 1.4x the
#: dense step, whatever the density) between 10% and 15% free: the delta was
#: ahead at 10% in every run, and the runs disagreed at 15%. The switch sits
#: between the two. The benchmark's ``partial_delta`` and ``partial_select``
#: rows (``cpu.csv``, ``cpu_crossover.csv``) are the committed evidence. Under
#: XLA the delta stayed ahead of the select up to 50%. Above it, "select"
#: trades memory for time: n values and n per optimizer slot instead of k.
SELECT_ABOVE_DENSITY = 0.125

#: Density below which the sparse product (``"sparse"``) is chosen for a
#: matrix, without XLA. Measured in the same step at n = 4096 (first and hidden
#: layer, ``partial_sparse`` and ``partial_delta`` rows): at 0.1% free the
#: sparse product costs about 0.3x the dense step against the delta's 0.57x;
#: at 1% the two are even (about 0.82x, and 0.95x for a hidden layer). Its
#: ``[k, batch]`` temporaries reach one n x n matrix at about 0.5% with a batch
#: of 64, so the switch is there, not at the time crossing.
SPARSE_BELOW_DENSITY = 0.005

#: The same threshold when XLA compiles the step (``jit_compile=True``, and
#: always under JAX): XLA's scatter-add on the CPU is slower, so the sparse
#: product stops paying sooner: at n = 4096 it costs 0.55x the dense step at
#: 0.1% free (the delta 0.83x) but 1.9x at 1% (the delta 0.85x); the lines
#: cross near 0.3%.
SPARSE_BELOW_DENSITY_XLA = 0.003

_MODES = ("delta", "select")
_ALL_MODES = ("delta", "select", "sparse")


def compose(base, indices, free, *, mode: str = "delta", mask=None):
    """Return the dense tensor made of a frozen ``base`` and the ``free`` values.

    Args:
        base: the dense tensor of fixed values.
        indices: the free positions, an index list of shape ``[k, rank]`` or
            anything else :func:`refimpl.masks.to_mask` accepts.
        free: for ``mode="delta"``, a 1-D tensor of the ``k`` free values, in
            the order of ``indices``; for ``mode="select"``, a tensor of the
            base's shape, of which only the entries at ``indices`` are used.
        mode: ``"delta"`` (a scatter of the free values into the base) or
            ``"select"`` (``where`` against the base).
        mask: the boolean mask of ``indices``; optional, computed when
            ``None``, and checked against ``indices`` otherwise.

    Returns:
        A tensor of the base's shape and dtype: the free values at
        ``indices``, the base's values everywhere else, bit for bit.

    Raises:
        ValueError: for an unknown mode, bad indices, a mask that disagrees
            with them, or a ``free`` of the wrong shape.
        TypeError: if ``free`` and ``base`` have different dtypes.

    >>> base = np.array([[1.0, 2.0], [3.0, 4.0]], "float32")
    >>> keras.ops.convert_to_numpy(compose(base, [[0, 1]], np.float32([9.0])))
    array([[1., 9.],
           [3., 4.]], dtype=float32)
    >>> zeros = np.zeros((2, 2), "float32")
    >>> keras.ops.convert_to_numpy(compose(base, [[0, 1]], zeros, mode="select"))
    array([[1., 0.],
           [3., 4.]], dtype=float32)
    """
    if mode not in _MODES:
        raise ValueError(f"`mode` must be one of {_MODES}. Received: mode={mode!r}")
    base = keras.ops.convert_to_tensor(base)
    shape = normalize_shape(tuple(base.shape), name="base.shape")
    index_list = _index_list(indices, shape, "indices")
    bool_mask = to_mask(index_list, shape, name="indices", indices_expected=True)
    if mask is not None and not np.array_equal(
        to_mask(mask, shape, name="mask"), bool_mask
    ):
        raise ValueError(
            "`mask` must mark exactly the positions in `indices`. Received a "
            f"mask with {int(to_mask(mask, shape).sum())} True entries for "
            f"{len(index_list)} indices"
        )
    free = keras.ops.convert_to_tensor(free)
    base_dtype = keras.backend.standardize_dtype(base.dtype)
    free_dtype = keras.backend.standardize_dtype(free.dtype)
    if free_dtype != base_dtype:
        raise TypeError(
            f"`free` must have the base's dtype {base_dtype}. "
            f"Received: free.dtype={free_dtype}"
        )
    expected = (len(index_list),) if mode == "delta" else shape
    if tuple(free.shape) != expected:
        raise ValueError(
            f'With mode="{mode}", `free` must have shape {expected}. '
            f"Received: free.shape={tuple(free.shape)}"
        )
    return _compose(base, index_list, free, mode, bool_mask)


def choose_mode(mask, *, jit_compile: bool = False) -> str:
    """Return the fastest exact mode for ``mask``: sparse, delta or select.

    By the fraction of free entries (the density), with thresholds measured
    for one training step on a 2-core CPU (the constants' notes give the
    measurements):

    * below :data:`SPARSE_BELOW_DENSITY` (:data:`SPARSE_BELOW_DENSITY_XLA`
      with ``jit_compile=True``), and only for a matrix: ``"sparse"``, the
      product that never composes the matrix;
    * from :data:`SELECT_ABOVE_DENSITY` on: ``"select"``, a full-size
      variable with a filtered update;
    * in between: ``"delta"``, the scatter of the free values into the base.

    Args:
        mask: a boolean or 0.0/1.0 mask (``True`` = free). Index lists are
            not accepted here: the density needs the tensor's shape.
        jit_compile: whether the step is compiled by XLA.

    Returns:
        ``"sparse"``, ``"delta"`` or ``"select"``.

    >>> choose_mode(np.eye(10, dtype=bool))  # 10% free
    'delta'
    >>> choose_mode(np.eye(1000, dtype=bool))  # 0.1% free
    'sparse'
    >>> choose_mode(np.ones((4, 4), dtype=bool))
    'select'
    """
    if not isinstance(jit_compile, (bool, np.bool_)):
        raise TypeError(
            f"`jit_compile` must be a bool. Received: jit_compile={jit_compile!r}"
        )
    array = np.asarray(mask.numpy() if hasattr(mask, "numpy") else mask)
    if array.dtype != bool and not np.issubdtype(array.dtype, np.floating):
        raise TypeError(
            "`mask` must be a boolean (or 0.0/1.0) mask, so that its density is "
            f"known. Received dtype {array.dtype}"
        )
    array = to_mask(array, array.shape)
    return _mode_for(int(array.sum()), array.shape, jit_compile=bool(jit_compile))


def _mode_for(num_free: int, shape, *, jit_compile: bool) -> str:
    size = int(np.prod(shape))
    density = num_free / size if size else 0.0
    if density >= SELECT_ABOVE_DENSITY:
        return "select"
    below = SPARSE_BELOW_DENSITY_XLA if jit_compile else SPARSE_BELOW_DENSITY
    return "sparse" if len(shape) == 2 and density < below else "delta"


@keras.saving.register_keras_serializable(package="refimpl")
class PartialVariable(keras.layers.Layer):
    """A dense tensor of which only the entries in ``mask`` are trainable.

    The free values live in ``.free``, the only trainable weight; the fixed
    ones in ``.base``, a non-trainable weight; the free positions in
    ``.positions``, a non-trainable integer weight. Read the tensor with
    :meth:`value` in the forward pass.

    It is a Keras layer that holds weights and is never called on inputs, so
    it works wherever Keras tracks layers. Create it in your layer's
    ``build`` and keep it as an attribute; Keras then trains ``.free`` in
    ``fit``, counts it in ``summary()`` and
    :func:`refimpl.count_free_parameters`, and saves all three weights in
    ``.keras`` and ``.weights.h5`` files. In a custom loop, pass
    ``pv.trainable_variables`` to the optimizer; ``tf.train.Checkpoint``
    saves it too.

    Modes (both exact; the default is the one to use unless measured):

    * ``"delta"`` (default): ``.free`` holds exactly the ``k`` free values, so
      the optimizer state is ``k`` values per slot and no optimizer can
      touch a frozen entry.
    * ``"select"``: ``.free`` is a **full-size** variable and the forward pass
      is ``where(mask, free, base)``: a full variable with a filtered update.
      Its optimizer state is the full size per slot, whatever the density;
      optimizers whose update is not elementwise (Adafactor) see every entry
      of it. Faster than ``"delta"`` only when many entries are free.
    * ``"sparse"`` (a matrix only): the weights of ``"delta"``, and
      :meth:`matmul` computes ``x @ base + x @ S`` with ``S`` the sparse
      matrix of the free values' differences from the base
      (:func:`refimpl.sparse.sparse_matmul`): no composed matrix, and the
      free values' gradient is a sampled product, O(batch·k). Fastest when a
      few percent or fewer of the entries are free. :meth:`value` composes
      the matrix as ``"delta"`` does.
    * ``"auto"``: :func:`choose_mode` picks one of the three by density. When
      it picks ``"sparse"`` or ``"delta"`` (the same weights), :meth:`matmul`
      chooses again between the two when it is traced, by whether XLA
      compiles it (:data:`SPARSE_BELOW_DENSITY_XLA`); :attr:`auto` is then
      ``True``.

    Args:
        initial_value: the dense starting tensor (floating point). Its
            entries outside ``mask`` become the frozen values.
        mask: the trainable positions, anything
            :func:`refimpl.masks.to_mask` accepts for this shape.
        mode: ``"delta"``, ``"select"``, ``"sparse"`` or ``"auto"``.
        auto: only with a resolved ``"sparse"`` or ``"delta"`` mode: choose
            between the two at trace time, as ``mode="auto"`` does (what
            ``from_config`` passes back).
        shape: with ``num_free``, and no ``initial_value`` or ``mask``: an
            empty shell whose values and positions are loaded with the
            weights of a saved model (what ``from_config`` builds).
        num_free: the number of free entries of such a shell.
        **kwargs: base ``Layer`` arguments (``name``, ``dtype``).

    Raises:
        TypeError: for a non-floating ``initial_value`` or a bad mask type.
        ValueError: for an unknown mode or a mask that does not fit.

    >>> v = PartialVariable(np.zeros((2, 2), "float32"), np.eye(2, dtype=bool))
    >>> [tuple(w.shape) for w in v.trainable_variables]
    [(2,)]
    >>> _ = v.free.assign([1.0, 2.0])
    >>> keras.ops.convert_to_numpy(v.value())
    array([[1., 0.],
           [0., 2.]], dtype=float32)
    """

    def __init__(
        self,
        initial_value=None,
        mask=None,
        *,
        mode: str = "delta",
        shape=None,
        num_free: int | None = None,
        auto: bool = False,
        **kwargs,
    ):
        if mode not in _ALL_MODES + ("auto",):
            raise ValueError(
                f"`mode` must be one of {_ALL_MODES + ('auto',)}. "
                f"Received: mode={mode!r}"
            )
        if not isinstance(auto, (bool, np.bool_)):
            raise TypeError(f"`auto` must be a bool. Received: auto={auto!r}")
        if auto and mode not in ("sparse", "delta"):
            raise ValueError(
                "`auto` goes with a resolved mode 'sparse' or 'delta' (what "
                f"mode='auto' resolves to). Received: auto=True, mode={mode!r}"
            )
        shell = initial_value is None and mask is None
        if shell:
            if shape is None or num_free is None:
                raise ValueError(
                    "`initial_value` and `mask` are required. (Only a shell "
                    "rebuilt from a saved config gives `shape` and `num_free` "
                    "instead.) Received: initial_value=None, mask=None"
                )
            if mode == "auto":
                raise ValueError("A shell needs its resolved `mode`. Received: 'auto'")
            shape = normalize_shape(shape, name="shape")
            num_free = _count(num_free, int(np.prod(shape)))
            value = None
            _check_sparse_rank(mode, shape)
        else:
            if initial_value is None or mask is None:
                missing, given = (
                    ("initial_value", "mask")
                    if initial_value is None
                    else ("mask", "initial_value")
                )
                raise ValueError(
                    f"`{missing}` is required with `{given}`. Received: {missing}=None"
                )
            if shape is not None or num_free is not None:
                extra = "shape" if shape is not None else "num_free"
                raise ValueError(
                    f"`{extra}` is only for a shell rebuilt from a config, "
                    "which has no `initial_value` or `mask`: give one or the "
                    f"other. Received: shape={shape!r}, num_free={num_free!r}"
                )
            value = _float_array(initial_value)
            shape = tuple(value.shape)
            kwargs.setdefault("dtype", value.dtype.name)
        super().__init__(**kwargs)
        if value is not None:
            bool_mask = to_mask(mask, shape, name="mask")
            if mode == "auto":
                mode = choose_mode(bool_mask)
                auto = mode != "select"
            _check_sparse_rank(mode, shape)
            flat = np.flatnonzero(bool_mask)
            num_free = len(flat)
        self.mode = mode
        self.auto = bool(auto)
        self._mask_cache = None
        self._shape = shape
        self._num_free = num_free
        self._loaded = value is not None
        index_dtype = "int32" if int(np.prod(shape)) < 2**31 else "int64"
        free_shape = shape if mode == "select" else (num_free,)
        # A shell starts with marks that no loaded model holds: positions
        # out of range and a NaN base. `_check_loaded` looks for them once.
        size = int(np.prod(shape))
        self.base = self.add_weight(
            name="base",
            shape=shape,
            initializer=_constant(value, fill=np.nan),
            trainable=False,
        )
        self.positions = self.add_weight(
            name="positions",
            shape=(num_free,),
            dtype=index_dtype,
            initializer=_constant(None if value is None else flat, fill=size),
            trainable=False,
        )
        if value is None:
            start = None
        elif mode != "select":
            start = value.reshape(-1)[flat]
        else:
            start = value
        self.free = self.add_weight(
            name="free", shape=free_shape, initializer=_constant(start)
        )
        self.built = True

    @classmethod
    def from_dense(cls, w, mask, **kwargs) -> PartialVariable:
        """Build one from an existing dense tensor: the right inverse of ``value``.

        ``PartialVariable.from_dense(w, mask).value()`` equals ``w`` bit for bit.

        Args:
            w: a dense tensor, array, ``tf.Variable`` or Keras variable.
            mask: the trainable positions.
            **kwargs: ``mode``, ``name`` and ``dtype``, as for the constructor.

        >>> w = np.array([[1.0, 2.0], [3.0, 4.0]], "float32")
        >>> v = PartialVariable.from_dense(w, [[1, 0]])
        >>> keras.ops.convert_to_numpy(v.free)
        array([3.], dtype=float32)
        """
        return cls(_float_array(w, name="w"), mask, **kwargs)

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the dense tensor."""
        return self._shape

    @property
    def num_free(self) -> int:
        """The number of trainable entries."""
        return self._num_free

    @property
    def mask(self) -> np.ndarray:
        """The boolean mask, a NumPy array of :attr:`shape` (``True`` = free)."""
        self._check_loaded()
        mask = np.zeros(int(np.prod(self._shape)), bool)
        mask[_read_now(self.positions)] = True
        return mask.reshape(self._shape)

    @property
    def indices(self) -> np.ndarray:
        """The ``[k, rank]`` int64 positions of the free values, in their order."""
        self._check_loaded()
        flat = _read_now(self.positions).astype(np.int64)
        return np.stack(np.unravel_index(flat, self._shape), axis=-1)

    def value(self):
        """Return the dense tensor: free values at their positions, base elsewhere.

        Inside a layer's ``call`` the weights are read in the layer's compute
        dtype (mixed precision); elsewhere in their own dtype.
        """
        self._check_loaded()
        base, free = self.base.value, self.free.value  # autocast in a call
        if self.mode == "select":
            return keras.ops.where(self._select_mask(), free, base)
        return scatter_into(base, self.positions.value, free)

    def matmul(self, x):
        """Return ``x @ value()`` in the fastest exact form of the mode.

        For a matrix only. With ``mode="sparse"`` this is the sparse product
        (:func:`refimpl.sparse.sparse_matmul`): the matrix is never composed,
        and the result equals ``x @ value()`` up to rounding. Otherwise it is
        ``x @ value()``. Inside a layer's ``call`` the weights are read in the
        layer's compute dtype, and ``x`` is cast to it.

        Raises:
            ValueError: if the tensor is not a matrix, or ``x``'s last axis
                is not the matrix's first.
        """
        if len(self._shape) != 2:
            raise ValueError(
                "`matmul` needs a matrix: this PartialVariable has shape "
                f"{self._shape}. Use `x @ value()` for other ranks"
            )
        x = keras.ops.convert_to_tensor(x)
        if not x.shape or x.shape[-1] not in (None, self._shape[0]):
            raise ValueError(
                f"`x` must end in an axis of size {self._shape[0]} (the "
                f"matrix's rows). Received: x.shape={tuple(x.shape)}"
            )
        self._check_loaded()
        if self.product_mode() == "sparse":
            base, free = self.base.value, self.free.value  # autocast in a call
            x = keras.ops.cast(x, base.dtype)
            return sparse_matmul(x, base, self.positions.value, free)
        value = self.value()
        return keras.ops.matmul(keras.ops.cast(x, value.dtype), value)

    def product_mode(self) -> str:
        """The form :meth:`matmul` uses here: ``"sparse"``, ``"delta"`` or ``"select"``.

        :attr:`mode`, except with :attr:`auto`, where it also depends on
        whether XLA compiles the code being traced.
        """
        if not self.auto or not xla_enabled():
            return self.mode
        return _mode_for(self._num_free, self._shape, jit_compile=True)

    def call(self, *args, **kwargs):
        raise TypeError(
            "A PartialVariable is a tensor, not a layer to call on inputs: "
            "read it with `.value()` inside your layer's `call`."
        )

    def _select_mask(self):
        # The mask of the positions the weights hold when the step is traced,
        # as a constant, and a check in every step that they still hold them
        # (O(k)); only if they do not (weights reloaded into a traced step)
        # is the mask scattered again from the positions, in the graph. A
        # scatter of k entries into n² costs more than the rest of the select.
        positions = self.positions.value
        known = backend.try_read_now(self.positions)
        if known is None:  # JAX inside `fit`: the positions are traced state
            if self._mask_cache is None:
                return self._scattered_mask(positions)
            known = self._mask_cache[0]  # still checked against them below
        if self._mask_cache is None or not np.array_equal(self._mask_cache[0], known):
            mask = np.zeros(int(np.prod(self._shape)), bool)
            mask[known] = True
            self._mask_cache = (known, mask.reshape(self._shape))
        known, mask = self._mask_cache
        same = keras.ops.all(
            keras.ops.equal(positions, keras.ops.convert_to_tensor(known))
        )
        return keras.ops.cond(
            same,
            lambda: backend.bool_constant(mask),
            lambda: self._scattered_mask(positions),
        )

    def _scattered_mask(self, positions):
        size = int(np.prod(self._shape))
        ones = keras.ops.ones((self._num_free,), "int32")
        flat = keras.ops.scatter(keras.ops.expand_dims(positions, -1), ones, (size,))
        return keras.ops.reshape(keras.ops.greater(flat, 0), self._shape)

    def _check_loaded(self) -> None:
        # A shell is filled by load_model, load_weights, set_weights or an
        # assign: whichever it was, its marks are gone. Read once, eagerly.
        if self._loaded:
            return
        size = int(np.prod(self._shape))
        positions = _read_now(self.positions)
        base = _read_now(self.base)
        self._loaded = not (
            np.any(positions >= size) or (size > 0 and np.all(np.isnan(base)))
        )
        if not self._loaded:
            raise ValueError(
                f"PartialVariable '{self.name}' was rebuilt from a config "
                "without its values; they come with the saved weights. Load the "
                "model with `keras.saving.load_model` or load its weights "
                "before using it."
            )

    def get_config(self) -> dict:
        config = {"mode": self.mode, "shape": list(self._shape)}
        config["num_free"] = self._num_free
        config["auto"] = self.auto
        return {**super().get_config(), **config}


def _check_sparse_rank(mode: str, shape) -> None:
    if mode == "sparse" and len(shape) != 2:
        raise ValueError(
            "mode='sparse' is a matrix product: it needs a 2-D tensor. "
            f"Received a tensor of shape {tuple(shape)}"
        )


def _float_array(value, name: str = "initial_value") -> np.ndarray:
    try:
        array = np.asarray(keras.ops.convert_to_numpy(value))
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"`{name}` must be a floating-point array or tensor. "
            f"Received: {name}={value!r}"
        ) from err
    if not np.issubdtype(array.dtype, np.floating) and array.dtype.name != "bfloat16":
        raise TypeError(
            f"`{name}` must be a floating-point tensor. "
            f"Received dtype {array.dtype}: {name}={value!r}"
        )
    return array


def _count(value, size: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"`num_free` must be an int. Received: num_free={value!r}")
    if not 0 <= value <= size:
        raise ValueError(
            f"`num_free` must be between 0 and the tensor's size {size}. "
            f"Received: num_free={value}"
        )
    return int(value)


def _constant(array, fill=0):
    if array is None:
        return keras.initializers.Constant(fill)
    return lambda shape, dtype=None: keras.ops.cast(np.asarray(array), dtype)


def scatter_into(base, positions, free):
    """``base`` with ``free[i]`` at flat position ``positions[i]``: the delta form.

    The one composition of :class:`PartialVariable` and the partial Keras
    layers (:mod:`refimpl.partial_layers`); ``free`` is cast to ``base``'s dtype.
    """
    shape = tuple(base.shape)
    flat = keras.ops.reshape(base, (-1,))
    free = keras.ops.cast(free, flat.dtype)
    positions = keras.ops.expand_dims(positions, -1)
    return keras.ops.reshape(keras.ops.scatter_update(flat, positions, free), shape)


def _read_now(variable) -> np.ndarray:
    """A variable's current value as NumPy, also while a function is traced."""
    return backend.read_now(variable)


def _compose(base, indices, free, mode, mask):
    if mode == "delta":
        flat = np.ravel_multi_index(tuple(np.asarray(indices).T), mask.shape)
        index_dtype = "int32" if mask.size < 2**31 else "int64"
        return scatter_into(base, keras.ops.convert_to_tensor(flat, index_dtype), free)
    return keras.ops.where(backend.bool_constant(mask), free, base)
