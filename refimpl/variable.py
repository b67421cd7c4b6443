"""A tensor of which only some entries are trainable: free values over a frozen base.

:class:`PartialVariable` keeps the trainable entries in their own weight and
the fixed entries in a second, non-trainable one, and builds the dense tensor
in the forward pass (:meth:`~PartialVariable.value`) with
:func:`refimpl.ops.compose`. An optimizer only ever sees the free values, so
the frozen entries keep their exact bits under any optimizer, weight decay
included, and the optimizer state is one value per free entry and slot (in the
default form; the opt-in ``"select"`` form keeps full-size state). This
is the frozen-base-plus-delta idea of Keras' ``enable_lora``, with the delta
restricted to a mask. The partial layers of :mod:`refimpl.layers` hold the
same three weights on a Keras layer's own kernel.
"""

from __future__ import annotations

import keras
import numpy as np

from refimpl import _compat
from refimpl.masks import _as_array, _check_int, _describe, _normalize_shape, to_mask
from refimpl.ops import _check_mode, _mode_for, sparse_matmul
from refimpl.ops import _initializer as _constant
from refimpl.partial import PartialWeight

__all__ = ["PartialVariable"]


@keras.saving.register_keras_serializable(package="refimpl")
class PartialVariable(keras.layers.Layer):
    """A dense tensor of which only the entries in ``mask`` are trainable.

    It is a Keras layer that holds weights (:attr:`free`, :attr:`base`,
    :attr:`positions`) and is never called on inputs: read the tensor with
    :meth:`value` in the forward pass. Create it in your layer's ``build`` and
    keep it as an attribute; Keras then trains ``.free`` in ``fit``, counts it
    in ``summary()`` and :func:`refimpl.testing.count_free_parameters`, and
    saves all three weights in ``.keras`` and ``.weights.h5`` files. In a
    custom loop, pass ``pv.trainable_variables`` to the optimizer;
    `tf.train.Checkpoint
    <https://www.tensorflow.org/api_docs/python/tf/train/Checkpoint>`__ saves
    it too.

    Its forms are ``"delta"`` (the default, the one to use unless measured),
    ``"sparse"`` and ``"select"`` (see :ref:`the forms <api-forms>`); in
    ``"sparse"``, :meth:`matmul` never composes the matrix, while :meth:`value`
    composes it as ``"delta"`` does. With ``"auto"``,
    :func:`refimpl.ops.choose_mode` picks one when it is built. When it picks
    ``"sparse"`` or ``"delta"`` (the same weights), :attr:`auto` is ``True``
    and :meth:`matmul` chooses between the two again each time it is traced
    (:meth:`product_mode`): when XLA compiles the step (always under JAX),
    ``"sparse"`` below :data:`~refimpl.ops.SPARSE_BELOW_DENSITY_XLA` free and
    ``"delta"`` from there on, whichever form was built; without XLA, the
    built form.

    Args:
        initial_value: the dense starting tensor (floating point). Its
            entries outside ``mask`` become the frozen values.
        mask: the trainable positions, anything
            :func:`refimpl.masks.to_mask` accepts for this shape.
        mode: ``"delta"``, ``"select"``, ``"sparse"`` (a matrix only) or
            ``"auto"``.
        **kwargs: base ``Layer`` arguments (``name``, ``dtype``).

    Loading passes three more arguments you never pass yourself: ``shape``
    and ``num_free`` build an empty :term:`shell` that the saved weights fill,
    and ``auto`` records that the mode was ``"auto"`` and chose ``"sparse"``
    or ``"delta"`` (:attr:`auto`).

    Attributes:
        free: the trainable weight: the ``k`` free values in the order of
            ``positions`` (full-size in the ``"select"`` form).
        base: the frozen full tensor (non-trainable); its entries at
            ``positions`` are not used.
        positions: the free entries' flat row-major positions (non-trainable).
        mode: the form in use, ``"delta"``, ``"select"`` or ``"sparse"``
            (``mode="auto"`` resolved when built).
        auto: whether :meth:`matmul` chooses again between ``"sparse"`` and
            ``"delta"`` when traced, by whether XLA compiles it
            (:meth:`product_mode`); ``True`` only when built with
            ``mode="auto"``.

    Raises:
        TypeError: for a non-floating ``initial_value`` or a bad mask type.
        ValueError: for an unknown mode or a mask that does not fit.

    In a layer of your own, create it in ``build``, keep it as an attribute, and
    multiply with :meth:`matmul`; the layer then trains the free values alone:

    >>> from refimpl import PartialVariable
    >>> class Partial(keras.layers.Layer):
    ...     def build(self, input_shape):
    ...         kernel = np.ones((input_shape[-1], 2), "float32")
    ...         self.w = PartialVariable(kernel, np.eye(input_shape[-1], 2, dtype=bool))
    ...
    ...     def call(self, x):
    ...         return self.w.matmul(x)
    >>> layer = Partial()
    >>> keras.ops.convert_to_numpy(layer(np.ones((1, 3), "float32")))
    array([[3., 3.]], dtype=float32)
    >>> [tuple(w.shape) for w in layer.trainable_weights]
    [(2,)]
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
        value, shape, num_free = _read_arguments(
            initial_value, mask, mode, shape, num_free, auto
        )
        if value is not None:
            kwargs.setdefault("dtype", value.dtype.name)
        super().__init__(**kwargs)
        if value is not None:
            _check_exact(value, self.variable_dtype)
            bool_mask = to_mask(mask, shape, name="mask")
            if mode == "auto":
                mode = _mode_for(int(bool_mask.sum()), shape, jit_compile=False)
                auto = mode != "select"
            _check_sparse_rank(mode, shape)
            num_free = int(bool_mask.sum())
        self._holder_kind = "PartialVariable"
        # A shell's base and positions hold the shell's marks until loaded.
        base = self.add_weight(
            name="base",
            shape=shape,
            initializer=(
                _compat.shell_initializer(self.variable_dtype)
                if value is None
                else _constant(value)
            ),
            trainable=False,
        )
        flat = None if value is None else np.flatnonzero(bool_mask)
        self.partial_weight = PartialWeight.create(
            self,
            base,
            flat,
            num_free=num_free,
            mode=mode,
            auto=auto,
            names=("free", "positions"),
            positions_first=True,
        )
        # The holder's variables, also as attributes (what tf.train.Checkpoint
        # names them by).
        self.base = base
        self.positions = self.partial_weight.positions
        self.free = self.partial_weight.free
        self.built = True

    @classmethod
    def from_dense(cls, w, mask, **kwargs) -> PartialVariable:
        """Build one from a dense tensor: the :term:`right inverse` of ``value``.

        ``PartialVariable.from_dense(w, mask).value()`` equals ``w`` bit for bit.

        Args:
            w: a dense tensor, array, ``tf.Variable`` or Keras variable.
            mask: the trainable positions.
            **kwargs: ``mode``, ``name`` and ``dtype``, as for the constructor.

        Returns:
            A new ``PartialVariable`` of ``w``'s shape.

        >>> from refimpl import PartialVariable
        >>> w = np.array([[1.0, 2.0], [3.0, 4.0]], "float32")
        >>> v = PartialVariable.from_dense(w, [[1, 0]])
        >>> keras.ops.convert_to_numpy(v.free)
        array([3.], dtype=float32)
        """
        return cls(_float_array(w, name="w"), mask, **kwargs)

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the dense tensor.

        >>> from refimpl import PartialVariable
        >>> PartialVariable(np.zeros((2, 3), "float32"), [[0, 1]]).shape
        (2, 3)
        """
        return self.partial_weight.shape

    @property
    def num_free(self) -> int:
        """The number of trainable entries.

        >>> from refimpl import PartialVariable
        >>> w = np.zeros((2, 3), "float32")
        >>> pv = PartialVariable(w, [[0, 1], [1, 2]], mode="select")
        >>> pv.num_free, tuple(pv.free.shape)  # the select form's free is full-size
        (2, (2, 3))
        """
        return self.partial_weight.num_free

    @property
    def mask(self) -> np.ndarray:
        """The boolean mask (``True`` = free), a NumPy array of shape
        :attr:`pv.shape <shape>`.

        >>> from refimpl import PartialVariable
        >>> pv = PartialVariable(np.zeros((2, 3), "float32"), [[1, 2], [0, 1]])
        >>> pv.mask.astype(int)
        array([[0, 1, 0],
               [0, 0, 1]])
        """
        return self.partial_weight.mask

    @property
    def indices(self) -> np.ndarray:
        """The ``[k, rank]`` int64 positions of the free values, in their order
        (row-major, whatever the order of the index list given).

        >>> from refimpl import PartialVariable
        >>> pv = PartialVariable(np.zeros((2, 3), "float32"), [[1, 2], [0, 1]])
        >>> pv.indices
        array([[0, 1],
               [1, 2]])
        """
        return self.partial_weight.indices

    def value(self):
        """Return the dense tensor: free values at their positions, base elsewhere.

        Returns:
            A backend tensor of shape :attr:`pv.shape <shape>`; inside a
            layer's ``call`` in the layer's compute dtype (mixed precision),
            elsewhere in the weights' dtype.

        >>> from refimpl import PartialVariable
        >>> w = np.array([[1.0, 2.0], [3.0, 4.0]], "float32")
        >>> pv = PartialVariable(w, [[0, 1]])
        >>> _ = pv.free.assign([9.0])  # the one free value: entry (0, 1)
        >>> keras.ops.convert_to_numpy(pv.value())
        array([[1., 9.],
               [3., 4.]], dtype=float32)
        """
        return self.partial_weight.value()

    def matmul(self, x):
        """Return ``x @ value()`` in the fastest exact form of the mode.

        For a matrix only. With ``mode="sparse"`` this is the sparse product
        (:func:`refimpl.ops.sparse_matmul`): the matrix is never composed,
        and the result equals ``x @ value()`` up to rounding. Otherwise it is
        ``x @ value()``. The weights have ``initial_value``'s dtype (pass a
        float32 array, or ``dtype=``); under a mixed-precision policy, inside a
        layer's ``call``, they are read in the layer's compute dtype, and ``x``
        is cast to it.

        Returns:
            A backend tensor of shape ``(*x.shape[:-1], shape[1])``.

        Raises:
            ValueError: if the tensor is not a matrix, or ``x``'s last axis
                is not the matrix's first.

        >>> from refimpl import PartialVariable
        >>> pv = PartialVariable(np.eye(2, dtype="float32"), [[0, 1]], mode="sparse")
        >>> keras.ops.convert_to_numpy(pv.matmul(np.ones((1, 2), "float32")))
        array([[1., 1.]], dtype=float32)
        """
        shape = self.shape
        if len(shape) != 2:
            raise ValueError(
                "`matmul` needs a matrix: this PartialVariable has shape "
                f"{shape}. Use `x @ value()` for other ranks"
            )
        x = keras.ops.convert_to_tensor(x)
        if not x.shape or x.shape[-1] not in (None, shape[0]):
            raise ValueError(
                f"`x` must end in an axis of size {shape[0]} (the "
                f"matrix's rows). Received: x.shape={tuple(x.shape)}"
            )
        self.partial_weight.check_loaded()
        if self.product_mode() == "sparse":
            base, free = self.base.value, self.free.value  # autocast in a call
            x = keras.ops.cast(x, base.dtype)
            return sparse_matmul(x, base, self.positions.value, free)
        value = self.value()
        return keras.ops.matmul(keras.ops.cast(x, value.dtype), value)

    def product_mode(self) -> str:
        """The form :meth:`matmul` uses here: ``"sparse"``, ``"delta"`` or ``"select"``.

        Returns:
            A ``str``: :attr:`mode`, with one exception. Built in the
            ``"sparse"`` form by ``mode="auto"`` (:attr:`auto`), it gives
            ``"delta"`` when XLA compiles the code being traced and at least
            :data:`~refimpl.ops.SPARSE_BELOW_DENSITY_XLA` of the entries are
            free.

        >>> from refimpl import PartialVariable
        >>> w = np.zeros((100, 100), "float32")
        >>> pv = PartialVariable(w, [[0, 0]], mode="auto")  # 1 of 10,000 free
        >>> pv.mode, pv.auto, pv.product_mode()  # sparse with or without XLA
        ('sparse', True, 'sparse')
        """
        return self.partial_weight.product_mode()

    def call(self, *args, **kwargs):
        raise TypeError(
            "A PartialVariable is a tensor, not a layer to call on inputs: "
            "read it with `.value()` inside your layer's `call`."
        )

    # The members of the holder, on the PartialVariable itself.
    mode = property(lambda self: self.partial_weight.mode, doc="The form in use.")
    auto = property(
        lambda self: self.partial_weight.auto,
        doc="Whether ``mode='auto'`` chose the form (see :meth:`product_mode`).",
    )

    def get_config(self) -> dict:
        pw = self.partial_weight
        config = {"mode": pw.mode, "shape": list(pw.shape)}
        config["num_free"] = pw.num_free
        config["auto"] = pw.auto
        return {**super().get_config(), **config}


# -- the constructor's arguments ----------------------------------------------
def _read_arguments(initial_value, mask, mode, shape, num_free, auto):
    """Check :class:`PartialVariable`'s arguments: a value and a mask, or a shell.

    Returns ``(value, shape, num_free)``: the dense value as a floating
    NumPy array (``None`` for a shell), its shape, and the shell's count.
    """
    _check_mode(mode)
    if not isinstance(auto, (bool, np.bool_)):
        raise TypeError(f"`auto` must be a bool. Received: auto={_describe(auto)}")
    if auto and mode not in ("sparse", "delta"):
        raise ValueError(
            "`auto` goes with a resolved mode 'sparse' or 'delta' (what "
            f"mode='auto' resolves to). Received: auto=True, mode={_describe(mode)}"
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
        shape = _normalize_shape(shape, name="shape")
        num_free = _check_int(num_free, "num_free", maximum=int(np.prod(shape)))
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
                f"other. Received: shape={_describe(shape)}, "
                f"num_free={_describe(num_free)}"
            )
        value = _float_array(initial_value)
        shape = tuple(value.shape)
    return value, shape, num_free


def _check_sparse_rank(mode: str, shape) -> None:
    if mode == "sparse" and len(shape) != 2:
        raise ValueError(
            "mode='sparse' is a matrix product: it needs a 2-D tensor. "
            f"Received a tensor of shape {tuple(shape)}"
        )


def _check_exact(value: np.ndarray, dtype: str) -> None:
    # The promise is bit-for-bit frozen entries: a dtype that rounds them
    # would break it before the first step, so the rounding must be asked for.
    cast = np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(value, dtype)))
    if not np.array_equal(cast.astype(value.dtype), value, equal_nan=True):
        raise ValueError(
            f"`dtype` {dtype!r} cannot hold the values of `initial_value` "
            f"({value.dtype.name}) exactly, so the frozen entries would be "
            "rounded. Cast the values yourself to accept that, for example "
            f"`initial_value.astype({dtype!r})`. Received: dtype={dtype!r}"
        )


def _float_array(value, name: str = "initial_value") -> np.ndarray:
    return _as_array(value, name, kind="floating", what="a floating-point tensor")
