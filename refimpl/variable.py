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

from refimpl import _compat, backend
from refimpl._variable_arguments import (
    check_exact,
    check_sparse_rank,
    float_array,
    read_arguments,
)
from refimpl.masks import to_mask
from refimpl.ops import (
    SelectMask,
    compose,
    index_dtype,
    mode_for,
    sparse_matmul,
    xla_enabled,
)
from refimpl.ops import (
    initializer as _constant,
)

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
        value, shape, num_free = read_arguments(
            initial_value, mask, mode, shape, num_free, auto
        )
        if value is not None:
            kwargs.setdefault("dtype", value.dtype.name)
        super().__init__(**kwargs)
        if value is not None:
            check_exact(value, self.variable_dtype)
            bool_mask = to_mask(mask, shape, name="mask")
            if mode == "auto":
                mode = mode_for(int(bool_mask.sum()), shape, jit_compile=False)
                auto = mode != "select"
            check_sparse_rank(mode, shape)
            flat = np.flatnonzero(bool_mask)
            num_free = len(flat)
        self.mode = mode
        self.auto = bool(auto)
        self._select = SelectMask(shape)
        self._shape = shape
        self._num_free = num_free
        self._loaded = value is not None
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
            dtype=index_dtype(shape),
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
        return cls(float_array(w, name="w"), mask, **kwargs)

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the dense tensor.

        >>> from refimpl import PartialVariable
        >>> PartialVariable(np.zeros((2, 3), "float32"), [[0, 1]]).shape
        (2, 3)
        """
        return self._shape

    @property
    def num_free(self) -> int:
        """The number of trainable entries.

        >>> from refimpl import PartialVariable
        >>> w = np.zeros((2, 3), "float32")
        >>> pv = PartialVariable(w, [[0, 1], [1, 2]], mode="select")
        >>> pv.num_free, tuple(pv.free.shape)  # the select form's free is full-size
        (2, (2, 3))
        """
        return self._num_free

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
        self._check_loaded()
        mask = np.zeros(int(np.prod(self._shape)), bool)
        mask[backend.read_now(self.positions)] = True
        return mask.reshape(self._shape)

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
        self._check_loaded()
        flat = backend.read_now(self.positions).astype(np.int64)
        return np.stack(np.unravel_index(flat, self._shape), axis=-1)

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
        self._check_loaded()
        base, free = self.base.value, self.free.value  # autocast in a call
        if self.mode == "select":
            mask = self._select(self.positions)
            return compose(base, self.positions.value, free, mode="select", mask=mask)
        return compose(base, self.positions.value, free)

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
        if not self.auto or not xla_enabled():
            return self.mode
        return mode_for(self._num_free, self._shape, jit_compile=True)

    def call(self, *args, **kwargs):
        raise TypeError(
            "A PartialVariable is a tensor, not a layer to call on inputs: "
            "read it with `.value()` inside your layer's `call`."
        )

    def _check_loaded(self) -> None:
        # A shell is filled by load_model, load_weights, set_weights or an
        # assign: whichever it was, its marks are gone. Read once, eagerly.
        if self._loaded:
            return
        size = int(np.prod(self._shape))
        positions = backend.read_now(self.positions)
        base = backend.read_now(self.base)
        self._loaded = not (
            np.any(positions >= size) or (size > 0 and np.all(np.isnan(base)))
        )
        if not self._loaded:
            raise _compat.require_loaded(f"PartialVariable '{self.name}'")

    def get_config(self) -> dict:
        config = {"mode": self.mode, "shape": list(self._shape)}
        config["num_free"] = self._num_free
        config["auto"] = self.auto
        return {**super().get_config(), **config}
