"""A variable of which only some entries are trainable: free values plus a frozen base.

:class:`PartialVariable` keeps the trainable entries in their own
``tf.Variable`` and the fixed entries in a second, non-trainable one. Its
:meth:`~PartialVariable.value` builds the dense tensor in the forward pass
with :func:`compose`, so an optimizer only ever sees the free values and the
frozen entries keep their exact bits under any optimizer, weight decay
included. This is the frozen-base-plus-delta idea of Keras' ``enable_lora``,
with the delta restricted to a mask.

Two exact forms of the forward pass exist; both give the same tensor:

* ``"delta"`` (the default): ``free`` holds the k free values (shape
  ``[k]``), written into the base with ``tf.tensor_scatter_nd_update``. The
  optimizer state is k values per slot (2k for Adam).
* ``"select"``: ``free`` is a **full-size** trainable variable of the base's
  shape, and the forward pass is ``tf.where(mask, free, base)``. Its gradient
  is a dense masked copy, with no scatter or gather, which is faster when most
  entries are free; but it stores n values instead of k and its optimizer
  state is n values per slot whatever the density. Entries of ``free``
  outside the mask may drift (weight decay moves them) but are never read.

:func:`choose_mode` picks between them by the mask's density.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from refimpl.masks import mask_constant, mask_to_indices, normalize_shape, to_mask
from refimpl.structured import _index_list

__all__ = ["PartialVariable", "SELECT_ABOVE_DENSITY", "choose_mode", "compose"]

#: Density (fraction of free entries) from which ``"select"`` is chosen.
#: Measured for one training step (forward, gradient, Adam update) with a batch
#: of 64 on a 2-core CPU: the delta step grows with the number of free values
#: and overtakes the select step (about 1.1-1.3x the dense step, whatever the
#: density) between 10% and 20% free at n = 512, 1024 and 2048. The
#: benchmark's ``partial_delta`` and ``partial_select`` rows are the committed
#: evidence. Above it, "select" trades memory for time: n values and n per
#: optimizer slot instead of k.
SELECT_ABOVE_DENSITY = 0.15

_MODES = ("delta", "select")


def compose(base, indices, free, *, mode: str = "delta", mask=None) -> tf.Tensor:
    """Return the dense tensor made of a frozen ``base`` and the ``free`` values.

    Args:
        base: the dense tensor of fixed values.
        indices: the free positions, an index list of shape ``[k, rank]`` or
            anything else :func:`refimpl.masks.to_mask` accepts.
        free: for ``mode="delta"``, a 1-D tensor of the ``k`` free values, in
            the order of ``indices``; for ``mode="select"``, a tensor of the
            base's shape, of which only the entries at ``indices`` are used.
        mode: ``"delta"`` (``tf.tensor_scatter_nd_update``) or ``"select"``
            (``tf.where`` against the base).
        mask: the boolean mask of ``indices``; optional, computed when
            ``None``, and checked against ``indices`` otherwise.

    Returns:
        A tensor of the base's shape and dtype: the free values at
        ``indices``, the base's values everywhere else, bit for bit.

    Raises:
        ValueError: for an unknown mode, bad indices, a mask that disagrees
            with them, or a ``free`` of the wrong shape.
        TypeError: if ``free`` and ``base`` have different dtypes.

    >>> base = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    >>> compose(base, [[0, 1]], tf.constant([9.0])).numpy()
    array([[1., 9.],
           [3., 4.]], dtype=float32)
    >>> compose(base, [[0, 1]], tf.zeros((2, 2)), mode="select").numpy()
    array([[1., 0.],
           [3., 4.]], dtype=float32)
    """
    if mode not in _MODES:
        raise ValueError(f"`mode` must be one of {_MODES}. Received: mode={mode!r}")
    base = tf.convert_to_tensor(base)
    shape = normalize_shape(base.shape, name="base.shape")
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
    free = tf.convert_to_tensor(free)
    if free.dtype != base.dtype:
        raise TypeError(
            f"`free` must have the base's dtype {base.dtype.name}. "
            f"Received: free.dtype={free.dtype.name}"
        )
    expected = (len(index_list),) if mode == "delta" else shape
    if tuple(free.shape) != expected:
        raise ValueError(
            f'With mode="{mode}", `free` must have shape {expected}. '
            f"Received: free.shape={tuple(free.shape)}"
        )
    return _compose(base, index_list, free, mode, bool_mask)


def choose_mode(mask) -> str:
    """Return the faster exact mode for ``mask``: ``"delta"`` or ``"select"``.

    ``"select"`` is chosen when the fraction of free entries is at least
    :data:`SELECT_ABOVE_DENSITY`, a threshold measured on CPU; below it the
    scatter of a few values is cheaper than a full-size select, and it keeps
    the optimizer state at k values per slot.

    Args:
        mask: a boolean or 0.0/1.0 mask (``True`` = free). Index lists are
            not accepted here: the density needs the tensor's shape.

    Returns:
        ``"delta"`` or ``"select"``.

    >>> choose_mode(np.eye(10, dtype=bool))  # 10% free
    'delta'
    >>> choose_mode(np.ones((4, 4), dtype=bool))
    'select'
    """
    array = np.asarray(mask.numpy() if hasattr(mask, "numpy") else mask)
    if array.dtype != bool and not np.issubdtype(array.dtype, np.floating):
        raise TypeError(
            "`mask` must be a boolean (or 0.0/1.0) mask, so that its density is "
            f"known. Received dtype {array.dtype}"
        )
    array = to_mask(array, array.shape)
    density = float(array.mean()) if array.size else 0.0
    return "select" if density >= SELECT_ABOVE_DENSITY else "delta"


class PartialVariable(tf.Module):
    """A dense tensor of which only the entries in ``mask`` are trainable.

    The free values live in ``.free`` (the only trainable variable), the
    fixed ones in ``.base`` (a non-trainable variable). Both are tracked, so
    ``tf.train.Checkpoint`` saves and restores them. Read the tensor with
    :meth:`value` inside the forward pass (inside the ``GradientTape``).

    Args:
        initial_value: the dense starting tensor. Its entries outside
            ``mask`` become the frozen values; those inside, the free values.
        mask: the trainable positions, anything
            :func:`refimpl.masks.to_mask` accepts for this shape.
        mode: ``"delta"`` (``.free`` has shape ``[k]``), ``"select"``
            (``.free`` has the full shape, see the module docstring), or
            ``"auto"`` for :func:`choose_mode`.
        name: the module's name.

    Attributes:
        free: the trainable ``tf.Variable``.
        base: the frozen ``tf.Variable`` (``trainable=False``).
        indices: the ``[k, rank]`` int64 positions of the free values.
        mask: the boolean mask, a NumPy array.
        mode: ``"delta"`` or ``"select"``.

    >>> v = PartialVariable(tf.zeros((2, 2)), np.eye(2, dtype=bool), mode="delta")
    >>> [w.shape for w in v.trainable_variables]
    [TensorShape([2])]
    >>> _ = v.free.assign([1.0, 2.0])
    >>> v.value().numpy()
    array([[1., 0.],
           [0., 2.]], dtype=float32)
    """

    def __init__(self, initial_value, mask, *, mode: str = "auto", name=None):
        super().__init__(name=name)
        value = tf.convert_to_tensor(initial_value)
        if not value.dtype.is_floating:
            raise TypeError(
                "`initial_value` must be a floating-point tensor. "
                f"Received dtype {value.dtype.name}"
            )
        shape = normalize_shape(value.shape, name="initial_value.shape")
        self.mask = to_mask(mask, shape, name="mask")
        if mode == "auto":
            mode = choose_mode(self.mask)
        if mode not in _MODES:
            raise ValueError(
                f"`mode` must be one of {_MODES + ('auto',)}. Received: mode={mode!r}"
            )
        self.mode = mode
        self.indices = mask_to_indices(self.mask)
        self.base = tf.Variable(value, trainable=False, name="base")
        start = tf.gather_nd(value, self.indices) if mode == "delta" else value
        self.free = tf.Variable(start, trainable=True, name="free")

    @classmethod
    def from_dense(cls, w, mask, **kwargs) -> PartialVariable:
        """Build one from an existing dense tensor: the right-inverse of ``value``.

        ``PartialVariable.from_dense(w, mask).value()`` equals ``w`` bit for bit.

        Args:
            w: a dense tensor, array, ``tf.Variable`` or Keras variable.
            mask: the trainable positions.
            **kwargs: ``mode`` and ``name``, as for the constructor.

        >>> w = tf.constant([[1.0, 2.0], [3.0, 4.0]])
        >>> v = PartialVariable.from_dense(w, [[1, 0]], mode="delta")
        >>> v.free.numpy(), bool(tf.reduce_all(v.value() == w))
        (array([3.], dtype=float32), True)
        """
        return cls(tf.convert_to_tensor(w), mask, **kwargs)

    @property
    def shape(self) -> tf.TensorShape:
        """The shape of the dense tensor."""
        return self.base.shape

    @property
    def dtype(self) -> tf.DType:
        """The dtype of the dense tensor."""
        return self.base.dtype

    def value(self) -> tf.Tensor:
        """Return the dense tensor: free values at ``indices``, base elsewhere."""
        return _compose(self.base, self.indices, self.free, self.mode, self.mask)


def _compose(base, indices, free, mode, mask):
    if mode == "delta":
        return tf.tensor_scatter_nd_update(base, indices, free)
    if not isinstance(mask, tf.Tensor):
        mask = mask_constant(mask)
    return tf.where(mask, free, base)
