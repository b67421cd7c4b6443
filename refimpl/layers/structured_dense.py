"""Dense layers whose kernel is built from its structure: diagonal, band, blocks.

Each layer keeps only its free values as trainable weights, so ``summary()``
and :func:`refimpl.testing.count_free_parameters` report the true number of free
parameters, and no optimizer (weight decay included) can move a fixed entry.
The math is :mod:`refimpl.structured`; these classes only hold the weights.
Like ``Dense``, each computes ``activation(x @ kernel + bias)``. Each has its
own ``from_dense`` (copy a built ``keras.layers.Dense``) and the same
``kernel`` (the dense kernel), ``trainable_mask`` (its free entries, for
:func:`refimpl.testing.assert_frozen`) and ``to_dense`` (return a Dense),
documented once, with :class:`DiagonalDense`; :func:`refimpl.merge
<refimpl.convert.merge>` folds a whole model back into plain Keras.
:class:`refimpl.PartialDense <refimpl.layers.partial.PartialDense>` (any mask
over a frozen base) lives in :mod:`refimpl.layers.partial`.

Fixed values (a fixed diagonal, fixed blocks) are non-trainable weights, so
they live in the weights file and never in ``get_config``.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from refimpl import _compat, backend, selection
from refimpl.masks import _as_array, _check_int, _describe
from refimpl.ops import _initializer as _constant
from refimpl.structured import (
    _block_sizes,
    _check_rectangular,
    _split_last,
    banded,
    banded_matmul,
    block,
    block_matmul,
    diagonal,
    diagonal_matmul,
)

__all__ = [
    "BandedDense",
    "BlockDense",
    "DiagonalDense",
]


# -- argument checks ------------------------------------------------------------
def _dense_arguments(dense, name: str = "dense") -> tuple[np.ndarray, dict]:
    """Check a built ``keras.layers.Dense``; return its kernel and layer arguments.

    Raises:
        TypeError: if ``dense`` is not a built ``keras.layers.Dense``.
        ValueError: if it has a kernel regularizer or kernel constraint, which
            a layer built from free values cannot carry over unchanged.
    """
    if not isinstance(dense, keras.layers.Dense) or not dense.built:
        raise TypeError(
            f"`{name}` must be a built keras.layers.Dense. Received: "
            f"{name}={_describe(dense)}"
        )
    for option in ("kernel_regularizer", "kernel_constraint"):
        if getattr(dense, option) is not None:
            raise ValueError(
                f"`{name}` has a {option}, which refimpl's layers do not "
                "carry over: their kernel is built from free values. Remove it "
                f"(or use a bias/activity regularizer). Received: "
                f"{option}={_describe(getattr(dense, option))}"
            )
    kwargs = {
        "activation": dense.activation,
        "use_bias": dense.use_bias,
        "bias_regularizer": dense.bias_regularizer,
        "bias_constraint": dense.bias_constraint,
        "activity_regularizer": dense.activity_regularizer,
        "dtype": dense.dtype_policy,
        "name": dense.name,
    }
    return keras.ops.convert_to_numpy(dense.kernel), kwargs


def _check_outside(kernel: np.ndarray, keep: np.ndarray, project: bool, what: str):
    """Refuse a kernel with non-zero entries outside ``keep``, unless ``project``."""
    outside = kernel[~keep]
    if not project and outside.size and (outside != 0).any():
        raise ValueError(
            f"`dense` has {int((outside != 0).sum())} non-zero kernel entries "
            f"outside the {what} (largest magnitude "
            f"{float(np.abs(outside).max()):.3g}); the new layer cannot hold "
            "them. Pass `project=True` to drop them."
        )


def _copy_bias(layer, dense) -> None:
    if dense.use_bias:
        layer.bias.assign(_copy(dense.bias))


def _copy(value) -> np.ndarray:
    # A copy, never the other variable's buffer: JAX's trainer donates a
    # model's buffers to its jitted step, which would free the shared one.
    return np.array(keras.ops.convert_to_numpy(value))


def _input_dim(input_shape) -> int:
    n = input_shape[-1] if len(input_shape) else None
    if n is None:
        raise ValueError(
            "The last dimension of the input must be known. Received an input "
            f"of shape {tuple(input_shape)}"
        )
    return int(n)


def _float_array(value, name: str, *, max_ndim: int) -> np.ndarray:
    array = _as_array(value, name, kind="numeric", what="numeric").astype(np.float64)
    if array.ndim > max_ndim:
        raise ValueError(
            f"`{name}` must have at most {max_ndim} dimension(s). "
            f"Received shape {array.shape}"
        )
    return array


def _given_sizes(sizes, count: int, name: str):
    if sizes is None:
        return [None] * count
    if not isinstance(sizes, (list, tuple)):
        raise TypeError(
            f"`{name}` must be a list of {count} positive ints, one per "
            f"block {name[:3]}. Received: {name}={_describe(sizes)}"
        )
    if len(sizes) != count:
        raise ValueError(
            f"`{name}` must be a list of {count} positive ints, one per "
            f"block {name[:3]}. Received: {name}={_describe(sizes)}"
        )
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            raise TypeError(
                f"`{name}` must hold positive ints. Received: {name}={_describe(sizes)}"
            )
        if s <= 0:
            raise ValueError(
                f"`{name}` must hold positive ints. Received: {name}={_describe(sizes)}"
            )
    return [int(s) for s in sizes]


def _parse_grid(blocks, row_sizes, col_sizes):
    """Validate a block grid; return it (arrays, None, strings) and sizes.

    A string entry is ``"trainable"`` or ``"fixed"`` (a fixed block whose
    values come with the saved weights); both need their sizes from the
    other blocks or from ``row_sizes``/``col_sizes``.
    """
    _check_rectangular(blocks, "blocks")
    grid = []
    for i, row in enumerate(blocks):
        grid.append([])
        for j, b in enumerate(row):
            if isinstance(b, str) and b not in ("trainable", "fixed"):
                raise ValueError(
                    f"`blocks[{i}][{j}]` must be None, 'trainable', 'fixed' or "
                    f"a 2-D array. Received: blocks[{i}][{j}]={_describe(b)}"
                )
            if b is not None and not isinstance(b, str):
                b = _float_array(b, f"blocks[{i}][{j}]", max_ndim=2)
                if b.ndim != 2 or 0 in b.shape:
                    raise ValueError(
                        f"`blocks[{i}][{j}]` must be a non-empty 2-D array. "
                        f"Received: blocks[{i}][{j}].shape={b.shape}"
                    )
            grid[-1].append(b)
    shapes = [[b.shape if isinstance(b, np.ndarray) else None for b in r] for r in grid]
    heights, widths = _block_sizes(
        shapes,
        "blocks",
        _given_sizes(row_sizes, len(grid), "row_sizes"),
        _given_sizes(col_sizes, len(grid[0]), "col_sizes"),
        size_names=("row_sizes", "col_sizes"),
    )
    return grid, heights, widths


# -- the shared base ------------------------------------------------------------
# Dense arguments a kernel built from its structure cannot take.
_NOT_FOR_STRUCTURE = (
    "kernel_regularizer",
    "kernel_constraint",
    "lora_rank",
    "lora_alpha",
    "quantization_config",
)


class _StructuredDense(keras.layers.Dense):
    """A ``keras.layers.Dense`` whose kernel is built from the values of its structure.

    It is Dense, ``activation(x @ kernel + bias)``, with what differs
    overridden: ``build`` creates only the structure's values (fixed ones as
    non-trainable weights, never ``get_config`` entries), ``kernel`` builds
    the dense kernel from them, and ``call`` multiplies by the structure
    without building it. The contract of a subclass: ``build`` (ending in
    ``_build_bias``), ``_product(x, dtype)``, ``_compose_kernel(dtype)``,
    ``_trainable_mask()`` and ``_units_for(n)``; ``from_dense`` copies a
    built Dense and ``to_dense()`` (here) returns one.
    """

    def __init__(
        self,
        *,
        activation=None,
        use_bias=False,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        bias_regularizer=None,
        bias_constraint=None,
        units=None,
        **kwargs,
    ):
        if not isinstance(use_bias, bool):
            raise TypeError(
                f"`use_bias` must be a bool. Received: use_bias={_describe(use_bias)}"
            )
        for name in _NOT_FOR_STRUCTURE:
            value = kwargs.pop(name, None)
            if value is not None:
                raise ValueError(
                    f"`{name}` does not apply to {type(self).__name__}, whose "
                    "kernel is built from the values of its structure. "
                    f"Received: {name}={_describe(value)}"
                )
        # Dense wants its units now; a square layer knows them when built.
        super().__init__(
            units or 1,
            activation=activation,
            use_bias=use_bias,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            bias_regularizer=bias_regularizer,
            bias_constraint=bias_constraint,
            **kwargs,
        )
        self.units = units
        # The names of fixed weights whose values come with the saved weights
        # (a shell's), checked once before the first use.
        self._from_weights: list = []

    def _check_loaded(self) -> None:
        if self._from_weights and all(
            _compat.is_shell(backend.try_read_now(getattr(self, name)))
            for name in self._from_weights
        ):
            raise _compat.require_loaded(f"Layer '{self.name}'")
        self._from_weights = []

    def _build_bias(self, input_dim: int, units: int) -> None:
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(
                name="bias",
                shape=(units,),
                initializer=self.bias_initializer,
                regularizer=self.bias_regularizer,
                constraint=self.bias_constraint,
            )
        self.units = units
        self.input_spec = keras.layers.InputSpec(min_ndim=2, axes={-1: input_dim})

    def call(self, inputs, training=None):
        self._check_loaded()
        y = self._product(inputs, self.compute_dtype)
        if self.bias is not None:
            y = y + keras.ops.cast(self.bias, self.compute_dtype)
        return self.activation(y) if self.activation is not None else y

    @property
    def kernel(self):
        """The dense kernel ``[input_dim, units]``, in the variable dtype.

        Raises:
            AttributeError: if the layer is not built (as ``keras.layers.Dense``).
        """
        if not self.built:
            raise AttributeError(
                f"Build the layer before reading `kernel`. Received: {self.name!r}, "
                "not built"
            )
        self._check_loaded()
        return self._compose_kernel(self.variable_dtype)

    @property
    def trainable_mask(self) -> np.ndarray:
        """Boolean mask of the kernel's shape, ``True`` where an entry is free.

        Returns:
            A NumPy ``bool`` array of shape ``[input_dim, units]``.

        Raises:
            AttributeError: if the layer is not built.
        """
        if not self.built:
            raise AttributeError(
                "Build the layer before reading `trainable_mask`. "
                f"Received: {self.name!r}, not built"
            )
        return self._trainable_mask()

    def to_dense(self) -> keras.layers.Dense:
        """Return a plain ``keras.layers.Dense`` with this layer's kernel and bias.

        The Dense layer has the same name, dtype policy, activation, bias
        regularizer and constraint, and activity regularizer. Its kernel and
        bias equal this layer's bit for bit. A diagonal's output agrees bit for
        bit too (one non-zero term per output entry, as :func:`refimpl.merge
        <refimpl.convert.merge>` says); the band's and the blocks' products add
        in another order than a dense product, so their outputs agree to
        rounding.

        Returns:
            A new, built ``keras.layers.Dense``; this layer is unchanged.

        Raises:
            ValueError: if the layer is not built.

        >>> from refimpl import DiagonalDense
        >>> layer = DiagonalDense()  # the diagonal starts at ones
        >>> layer.build((None, 3))
        >>> dense = layer.to_dense()
        >>> type(dense).__name__, dense.get_weights()[0].astype(int)
        ('Dense', array([[1, 0, 0],
               [0, 1, 0],
               [0, 0, 1]]))
        """
        if not self.built:
            raise ValueError(
                f"Build the layer before calling `to_dense()`. Received: {self.name!r}"
            )
        kernel = keras.ops.convert_to_numpy(self.kernel)
        dense = keras.layers.Dense(
            kernel.shape[1],
            activation=self.activation,
            use_bias=self.use_bias,
            bias_regularizer=self.bias_regularizer,
            bias_constraint=self.bias_constraint,
            activity_regularizer=self.activity_regularizer,
            dtype=self.dtype_policy,
            name=self.name,
        )
        dense.build((None, kernel.shape[0]))
        dense.kernel.assign(_copy(kernel))
        if self.use_bias:
            dense.bias.assign(_copy(self.bias))
        return dense

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self._units_for(input_shape[-1]))

    # Dense saves and loads `_kernel` and the bias; these layers save their own
    # weights, as any Keras layer does.
    def save_own_variables(self, store):
        keras.layers.Layer.save_own_variables(self, store)

    def load_own_variables(self, store):
        keras.layers.Layer.load_own_variables(self, store)

    def enable_lora(self, *args, **kwargs):
        raise NotImplementedError(
            f"{type(self).__name__} trains only the values of its structure; LoRA "
            "adds a dense update. Call `to_dense()` first for a LoRA Dense layer."
        )

    def quantize(self, *args, **kwargs):
        raise NotImplementedError(
            f"{type(self).__name__} has no dense kernel to quantize. Call "
            "`to_dense()` first."
        )

    def get_config(self) -> dict:
        config = super().get_config()  # Dense's, less what does not apply
        for name in ("units", *_NOT_FOR_STRUCTURE):
            config.pop(name, None)
        return config


@keras.saving.register_keras_serializable(package="refimpl")
class DiagonalDense(_StructuredDense):
    """``y = x * w (+ b)``: a Dense layer whose kernel is ``diag(w)``, in O(n).

    The only kernel weight is ``diagonal`` (shape ``[n]``, ``n`` the input
    size); the output has the input's shape.

    Args:
        activation: as for ``keras.layers.Dense``.
        use_bias: add a trainable bias of length ``n`` (default ``False``).
        kernel_initializer: for ``diagonal``; ``"ones"`` starts at the identity.
        bias_initializer: for the bias.
        **kwargs: base ``Layer`` arguments (``name``, ``dtype``, ...).

    >>> from refimpl import DiagonalDense
    >>> layer = DiagonalDense()
    >>> keras.ops.convert_to_numpy(layer(np.ones((1, 3), "float32")))
    array([[1., 1., 1.]], dtype=float32)
    >>> layer.count_params()
    3
    """

    def __init__(self, *, kernel_initializer="ones", **kwargs):
        super().__init__(kernel_initializer=kernel_initializer, **kwargs)

    @classmethod
    def from_dense(cls, dense, *, project: bool = False) -> DiagonalDense:
        """Copy a built square ``keras.layers.Dense`` whose kernel is diagonal.

        Args:
            dense: the layer to copy (name, dtype policy, activation, bias and
                its regularizer and constraint, activity regularizer).
            project: drop non-zero entries off the diagonal instead of
                refusing them.

        Returns:
            A built ``DiagonalDense``; ``dense`` is unchanged.

        Raises:
            TypeError: if ``dense`` is not a built ``keras.layers.Dense``.
            ValueError: for a kernel that is not square, non-zero entries off
                the diagonal (unless ``project``), or a kernel regularizer or
                constraint.

        >>> from refimpl import DiagonalDense
        >>> dense = keras.layers.Dense(3, kernel_initializer="identity")
        >>> dense.build((None, 3))
        >>> DiagonalDense.from_dense(dense).count_params()
        6
        """
        kernel, kwargs = _dense_arguments(dense)
        n = _square(kernel)
        _check_outside(kernel, np.eye(n, dtype=bool), project, "diagonal")
        layer = cls(**kwargs)
        layer.build((None, n))
        layer.diagonal.assign(np.diagonal(kernel))
        _copy_bias(layer, dense)
        return layer

    def build(self, input_shape):
        n = _input_dim(input_shape)
        self.diagonal = self.add_weight(
            name="diagonal", shape=(n,), initializer=self.kernel_initializer
        )
        self._build_bias(n, n)

    def _units_for(self, n):
        return n

    def _product(self, x, dtype):
        return diagonal_matmul(x, ops.cast(self.diagonal, dtype))

    def _compose_kernel(self, dtype):
        return diagonal(ops.cast(self.diagonal, dtype))

    def _trainable_mask(self):
        n = self.diagonal.shape[0]
        return selection.diagonal_mask((n, n))


@keras.saving.register_keras_serializable(package="refimpl")
class BandedDense(_StructuredDense):
    """A square Dense layer whose kernel is zero outside a band, in O(n*b).

    The kernel ``W`` (``y = x @ W``) keeps the diagonals at offsets ``-lower``
    to ``upper``, as ``tf.linalg.band_part(W, lower, upper)`` would: ``lower``
    diagonals below the main one, ``upper`` above. Trainable weights: the
    off-diagonals, concatenated from the lowest offset up (``off_diagonals``),
    and the main diagonal (``diagonal``) unless ``fixed_diagonal`` is given.
    Its ``kernel``, ``trainable_mask`` and ``to_dense()`` are as for
    :class:`DiagonalDense`.

    Args:
        lower: number of trainable diagonals below the main one, ``>= 0``.
        upper: number of trainable diagonals above the main one, ``>= 0``.
        fixed_diagonal: ``None`` for a trainable main diagonal, or its fixed
            value: a number, or a list of ``n`` numbers. It is kept in a
            non-trainable weight ``fixed_diagonal``. (``"from_weights"``
            builds that weight for values loaded with saved weights: what
            ``from_config`` does; the layer refuses to run until they are.)
        activation: as for ``keras.layers.Dense``.
        use_bias: add a trainable bias (default ``False``).
        kernel_initializer: for ``off_diagonals`` (default ``"zeros"``).
        diagonal_initializer: for a trainable main diagonal (default
            ``"ones"``, so that by default the layer starts as the identity).
        bias_initializer: for the bias.
        **kwargs: base ``Layer`` arguments.

    Raises:
        TypeError: for widths that are not ints (``BandedDense(1.5, 1)``), or
            a ``fixed_diagonal`` that is not numbers.
        ValueError: for negative widths (``BandedDense(-1, 1)``) or (when
            built) widths not below ``n``, and for a ``fixed_diagonal`` of more
            than one dimension or (when built) of a length other than ``n``.

    >>> from refimpl import BandedDense
    >>> layer = BandedDense(1, 1, fixed_diagonal=1.0)
    >>> layer.build((None, 4))
    >>> sum(int(np.prod(w.shape)) for w in layer.trainable_weights)  # 3 + 3
    6
    """

    def __init__(
        self,
        lower: int,
        upper: int,
        *,
        fixed_diagonal=None,
        kernel_initializer="zeros",
        diagonal_initializer="ones",
        **kwargs,
    ):
        super().__init__(kernel_initializer=kernel_initializer, **kwargs)
        self.lower = _check_int(lower, "lower")
        self.upper = _check_int(upper, "upper")
        self._fixed = (
            fixed_diagonal
            if fixed_diagonal is None
            or (isinstance(fixed_diagonal, str) and fixed_diagonal == "from_weights")
            else _float_array(fixed_diagonal, "fixed_diagonal", max_ndim=1)
        )
        self.diagonal_initializer = keras.initializers.get(diagonal_initializer)

    def build(self, input_shape):
        n = _input_dim(input_shape)
        for name, width in (("lower", self.lower), ("upper", self.upper)):
            if width >= n:
                raise ValueError(
                    f"`{name}` must be below the matrix size {n}: an {n}x{n} "
                    f"matrix has {n - 1} diagonals on each side. Received: "
                    f"{name}={width}"
                )
        fixed = isinstance(self._fixed, np.ndarray)
        if fixed and self._fixed.ndim == 1 and len(self._fixed) != n:
            raise ValueError(
                f"`fixed_diagonal` must be a number or {n} numbers, one per "
                f"input feature. Received {len(self._fixed)} numbers"
            )
        self._n = n
        self._off = [k for k in range(-self.lower, self.upper + 1) if k != 0]
        self.off_diagonals = None
        if self._off:
            self.off_diagonals = self.add_weight(
                name="off_diagonals",
                shape=(sum(n - abs(k) for k in self._off),),
                initializer=self.kernel_initializer,
            )
        self.diagonal = self.fixed_diagonal = None
        if self._fixed is not None:
            # Values that come with the weights start as the shell's mark.
            self.fixed_diagonal = self.add_weight(
                name="fixed_diagonal",
                shape=(n,),
                initializer=(
                    _compat.shell_initializer(self.variable_dtype)
                    if not fixed
                    else _constant(np.broadcast_to(self._fixed, (n,)))
                ),
                trainable=False,
            )
            if not fixed:
                self._from_weights.append("fixed_diagonal")
        else:
            self.diagonal = self.add_weight(
                name="diagonal", shape=(n,), initializer=self.diagonal_initializer
            )
        self._build_bias(n, n)

    @classmethod
    def from_dense(
        cls, dense, lower: int, upper: int, *, project: bool = False
    ) -> BandedDense:
        """Copy a built square ``keras.layers.Dense`` whose kernel is a band.

        The main diagonal and the ``lower`` and ``upper`` diagonals around it
        become trainable weights; ``project`` is as for
        :meth:`DiagonalDense.from_dense`.

        Returns:
            A built ``BandedDense``; ``dense`` is unchanged.

        Raises:
            TypeError: if ``dense`` is not a built ``keras.layers.Dense``, or
                for widths that are not ints.
            ValueError: for a kernel that is not square, widths that are
                negative or not below ``n``, non-zero entries outside the band
                (unless ``project``), or a kernel regularizer or constraint.

        >>> from refimpl import BandedDense
        >>> dense = keras.layers.Dense(3, kernel_initializer="identity")
        >>> dense.build((None, 3))
        >>> BandedDense.from_dense(dense, 1, 0).count_params()  # 3 + 2 + 3 bias
        8
        """
        kernel, kwargs = _dense_arguments(dense)
        n = _square(kernel)
        layer = cls(lower, upper, **kwargs)
        layer.build((None, n))
        _check_outside(kernel, layer.trainable_mask, project, "band")
        layer.diagonal.assign(np.diagonal(kernel))
        if layer._off:
            layer.off_diagonals.assign(
                np.concatenate([np.diagonal(kernel, k) for k in layer._off])
            )
        _copy_bias(layer, dense)
        return layer

    def _units_for(self, n):
        return n

    def _diagonals(self, dtype):
        """The band as (diagonals, offsets), for :mod:`refimpl.structured`."""
        main = self.diagonal if self._fixed is None else self.fixed_diagonal
        main = ops.cast(main, dtype)
        diagonals, offsets = [main], [0]
        if self._off:
            sizes = [self._n - abs(k) for k in self._off]
            pieces = _split_last(ops.cast(self.off_diagonals, dtype), sizes)
            diagonals += pieces
            offsets += self._off
        return diagonals, offsets

    def _product(self, x, dtype):
        return banded_matmul(x, *self._diagonals(dtype))

    def _compose_kernel(self, dtype):
        return banded(*self._diagonals(dtype))

    def _trainable_mask(self):
        shape = (self._n, self._n)
        band = selection.band_mask(shape, self.lower, self.upper)
        if self._fixed is not None:  # the main diagonal is fixed
            band &= ~selection.diagonal_mask(shape)
        return band

    def get_config(self) -> dict:
        config = {
            "lower": self.lower,
            "upper": self.upper,
            "fixed_diagonal": None if self._fixed is None else "from_weights",
            "diagonal_initializer": keras.initializers.serialize(
                self.diagonal_initializer
            ),
        }
        return {**super().get_config(), **config}


def _square(kernel: np.ndarray) -> int:
    if kernel.shape[0] != kernel.shape[1]:
        raise ValueError(
            "`dense` must be square (as many units as inputs) for this layer. "
            f"Received a kernel of shape {kernel.shape}"
        )
    return kernel.shape[0]


@keras.saving.register_keras_serializable(package="refimpl")
class BlockDense(_StructuredDense):
    """A Dense layer whose kernel is a grid of fixed, zero and trainable blocks.

    The kernel ``W`` (``y = x @ W``) is assembled like ``np.block(blocks)``;
    the product runs as split matmuls that skip the zero blocks, and only the
    trainable blocks are trainable weights (``block_i_j``).

    Args:
        blocks: a rectangular list of block rows. Each entry is ``None`` (a
            zero block), ``"trainable"`` (a trainable block drawn by
            ``kernel_initializer``), or a 2-D array of fixed values, kept in a
            non-trainable weight ``fixed_i_j``. (``"fixed"`` is a fixed block
            whose values come with saved weights: what ``from_config``
            builds; the layer refuses to run until they are loaded.)
        row_sizes: the height of each block row (input features); needed only
            for a row without a fixed block, checked against the others.
        col_sizes: the width of each block column (output units); likewise.
        activation: as for ``keras.layers.Dense``.
        use_bias: add a trainable bias (default ``False``).
        kernel_initializer: for the trainable blocks, called once per block.
        bias_initializer: for the bias.
        **kwargs: base ``Layer`` arguments.

    Raises:
        TypeError: for a grid that is not a list of lists, a fixed block whose
            values are not numbers, or ``row_sizes`` or ``col_sizes`` that are
            not lists of ints.
        ValueError: for an empty or ragged grid, an unknown entry, a fixed
            block that is not 2-D, blocks whose heights or widths disagree,
            sizes that cannot be inferred, ``row_sizes`` or ``col_sizes`` of
            another length than the block rows or columns or holding an int
            below 1, or (when built) an input size other than the sum of the
            heights.

    Its ``kernel``, ``trainable_mask`` and ``to_dense()`` are as for
    :class:`~refimpl.layers.structured_dense.DiagonalDense`.

    >>> from refimpl import BlockDense
    >>> eye = np.eye(2)
    >>> layer = BlockDense([[None, -0.2 * eye], [0.35 * eye, "trainable"]])
    >>> layer.build((None, 4))
    >>> [(w.name, tuple(w.shape)) for w in layer.trainable_weights]
    [('block_1_1', (2, 2))]
    """

    def __init__(
        self,
        blocks,
        *,
        row_sizes=None,
        col_sizes=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self._grid, self._heights, self._widths = _parse_grid(
            blocks, row_sizes, col_sizes
        )

    def build(self, input_shape):
        n = _input_dim(input_shape)
        if n != sum(self._heights):
            raise ValueError(
                f"`input_shape` must end in the sum of the block-row heights "
                f"{self._heights}, {sum(self._heights)}. Received: "
                f"input_shape={tuple(input_shape)}"
            )
        for i, row in enumerate(self._grid):
            for j, entry in enumerate(row):
                shape = (self._heights[i], self._widths[j])
                if isinstance(entry, str) and entry == "trainable":
                    weight = self.add_weight(
                        name=f"block_{i}_{j}",
                        shape=shape,
                        initializer=self.kernel_initializer,
                    )
                    setattr(self, f"block_{i}_{j}", weight)  # tracked by name
                elif entry is not None:
                    shell = isinstance(entry, str)  # "fixed": it comes with the weights
                    weight = self.add_weight(
                        name=f"fixed_{i}_{j}",
                        shape=shape,
                        initializer=(
                            _compat.shell_initializer(self.variable_dtype)
                            if shell
                            else _constant(entry)
                        ),
                        trainable=False,
                    )
                    setattr(self, f"fixed_{i}_{j}", weight)
                    if shell:
                        self._from_weights.append(f"fixed_{i}_{j}")
        self._build_bias(n, sum(self._widths))

    @classmethod
    def from_dense(
        cls, dense, layout, *, row_sizes, col_sizes, project: bool = False
    ) -> BlockDense:
        """Copy a built ``keras.layers.Dense`` into a grid of blocks.

        Args:
            dense: the layer to copy.
            layout: a rectangular list of block rows; each entry ``None``
                (the block must be zero), ``"trainable"`` or ``"fixed"``
                (copied from the kernel).
            row_sizes: the height of each block row; they sum to the input size.
            col_sizes: the width of each block column; they sum to the units.
            project: drop non-zero entries of ``None`` blocks instead of
                refusing them.

        Returns:
            A built ``BlockDense``; ``dense`` is unchanged.

        Raises:
            TypeError: if ``dense`` is not a built ``keras.layers.Dense``.
            ValueError: for a layout that does not fit the kernel, non-zero
                entries in a ``None`` block (unless ``project``), or a kernel
                regularizer or constraint.

        >>> from refimpl import BlockDense
        >>> dense = keras.layers.Dense(4)
        >>> dense.build((None, 4))
        >>> layout = [["fixed", None], [None, "trainable"]]
        >>> layer = BlockDense.from_dense(
        ...     dense, layout, row_sizes=[2, 2], col_sizes=[2, 2], project=True
        ... )  # project: drop the random kernel's entries outside the blocks
        >>> [w.name for w in layer.trainable_weights]
        ['block_1_1', 'bias']
        """
        kernel, kwargs = _dense_arguments(dense)
        layer = cls(layout, row_sizes=row_sizes, col_sizes=col_sizes, **kwargs)
        if (sum(layer._heights), sum(layer._widths)) != kernel.shape:
            raise ValueError(
                f"`row_sizes` and `col_sizes` must sum to the kernel's shape "
                f"{kernel.shape}. Received: row_sizes={row_sizes}, "
                f"col_sizes={col_sizes}"
            )
        layer.build((None, kernel.shape[0]))
        rows = np.cumsum([0, *layer._heights])
        cols = np.cumsum([0, *layer._widths])
        keep = np.zeros(kernel.shape, bool)
        for i, row in enumerate(layer._grid):
            for j, b in enumerate(row):
                part = kernel[rows[i] : rows[i + 1], cols[j] : cols[j + 1]]
                if b is not None:
                    keep[rows[i] : rows[i + 1], cols[j] : cols[j + 1]] = True
                    getattr(layer, f"{_kind(b)}_{i}_{j}").assign(part)
        _check_outside(kernel, keep, project, "non-zero blocks")
        _copy_bias(layer, dense)
        return layer

    def _units_for(self, n):
        return sum(self._widths)

    def _rows(self, dtype):
        """The grid as tensors, ``None`` for zero blocks, for :mod:`structured`."""
        return [
            [
                None
                if b is None
                else ops.cast(getattr(self, f"{_kind(b)}_{i}_{j}"), dtype)
                for j, b in enumerate(row)
            ]
            for i, row in enumerate(self._grid)
        ]

    def _product(self, x, dtype):
        return block_matmul(x, self._rows(dtype))

    def _compose_kernel(self, dtype):
        return block(self._rows(dtype))

    def _trainable_mask(self):
        trainable = [
            (i, j)
            for i, row in enumerate(self._grid)
            for j, b in enumerate(row)
            if _kind(b) == "block" and b is not None
        ]
        shape = (sum(self._heights), sum(self._widths))
        return selection.block_mask(shape, self._heights, self._widths, trainable)

    def get_config(self) -> dict:
        layout = [
            [None if b is None else "trainable" if _kind(b) == "block" else "fixed"]
            for row in self._grid
            for b in row
        ]
        width = len(self._widths)
        config = {
            "blocks": [
                sum(layout[r : r + width], []) for r in range(0, len(layout), width)
            ],
            "row_sizes": list(self._heights),
            "col_sizes": list(self._widths),
        }
        return {**super().get_config(), **config}


def _kind(block) -> str:
    """``"block"`` for a trainable block's weight name, ``"fixed"`` otherwise."""
    return "block" if isinstance(block, str) and block == "trainable" else "fixed"
