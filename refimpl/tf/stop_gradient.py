"""Block the gradient of the frozen positions of a full tensor.

The tensor stays one full variable; the forward pass uses every entry, and the
backward pass lets the gradient through only at the trainable positions:

* :func:`partially_trainable` is the clean form, a select between ``x`` and
  ``tf.stop_gradient(x)``. Its forward value *is* ``x``, bit for bit, and it
  costs no arithmetic.
* :func:`one_hot_trainable` is the classic one-hot form: scatter the free values
  into a zero tensor and add the stopped rest. Same gradient; the forward value
  is ``x`` only for finite entries, and it does gather/scatter work.

Both belong to the "restrict the update" family: the variable is full, so an
optimizer that moves entries whose gradient is zero (weight decay) still moves
the frozen ones.
"""

from __future__ import annotations

from refimpl import backend

# The TensorFlow-level code: a clear error, before TensorFlow is imported.
backend.require_tensorflow("refimpl.tf.stop_gradient")

import tensorflow as tf  # noqa: E402

from refimpl.masks import (  # noqa: E402  # noqa: E402
    _describe,
    _mask_constant,
    _normalize_shape,
    mask_to_indices,
    to_mask,
)

__all__ = ["partially_trainable", "one_hot_trainable"]


def partially_trainable(x, mask) -> tf.Tensor:
    """Return ``x`` with a gradient only at the positions where ``mask`` is True.

    Computes ``tf.where(mask, x, tf.stop_gradient(x))``: the forward value is
    ``x`` bit for bit (also for ``inf``, ``nan`` and ``-0.0``), and the gradient
    is the incoming gradient where ``mask`` is True and exactly zero elsewhere.
    Works eagerly, in ``tf.function`` and under XLA (``jit_compile=True``), for
    any rank and dtype.

    Args:
        x: a tensor or variable with a static shape (as weights have).
        mask: the trainable positions, as a boolean mask of ``x``'s shape or an
            index list of shape ``[k, rank]``, in any form
            :func:`refimpl.masks.to_mask` accepts (NumPy array, list, eager
            tensor). Inside ``tf.function`` a symbolic **boolean** tensor is
            accepted too, if its static shape is ``x``'s shape; it is used as is,
            without the value checks a static mask gets.

    Returns:
        A tensor equal to ``x``, of ``x``'s dtype and shape.

    Raises:
        TypeError: for a mask that is neither boolean nor an index list, or a
            symbolic mask that is not boolean.
        ValueError: for a shape mismatch, mask values other than 0 and 1, or
            indices that are out of range or duplicated.

    >>> from refimpl.tf import partially_trainable
    >>> x = tf.Variable([1.0, 2.0, 3.0])
    >>> with tf.GradientTape() as tape:
    ...     y = partially_trainable(x, [True, False, True])
    ...     loss = tf.reduce_sum(y**2)
    >>> y.numpy()
    array([1., 2., 3.], dtype=float32)
    >>> tape.gradient(loss, x).numpy()
    array([2., 0., 6.], dtype=float32)
    """
    x = tf.convert_to_tensor(x)
    mask = _bool_mask(mask, x.shape)
    return tf.where(mask, x, tf.stop_gradient(x))


def one_hot_trainable(x, indices) -> tf.Tensor:
    """Return ``x`` with a gradient only at ``indices``, the one-hot way.

    Builds ``part = scatter_nd(indices, gather_nd(x, indices), shape)``, the
    free values in a tensor of zeros, and returns
    ``part + tf.stop_gradient(x - part)``. The gradient equals that of
    :func:`partially_trainable`; the forward value equals ``x`` for finite
    entries (an ``inf`` at a trainable position becomes ``nan``, and ``-0.0``
    becomes ``0.0``). For a rank-1 ``x`` the gradient comes as
    ``tf.IndexedSlices``, as for ``tf.gather``. The free values are gathered
    from a tensor, not from the variable, so the function also compiles under
    XLA on CPU.

    Args:
        x: a tensor or variable with a static shape.
        indices: the trainable positions, an index list of shape ``[k, rank]``
            or a boolean mask, in any form :func:`refimpl.masks.to_mask`
            accepts. Duplicated indices are rejected: ``scatter_nd`` would add
            the duplicated values up.

    Returns:
        A tensor equal to ``x`` (see above), of ``x``'s dtype and shape.

    Raises:
        TypeError: if ``indices`` is not an index list or boolean mask.
        ValueError: for indices out of range, duplicated, or of the wrong rank.

    >>> from refimpl.tf import one_hot_trainable
    >>> x = tf.Variable([1.0, 2.0])
    >>> with tf.GradientTape() as tape:
    ...     loss = tf.reduce_sum(one_hot_trainable(x, [[0]]) ** 2)
    >>> tf.convert_to_tensor(tape.gradient(loss, x)).numpy()
    array([2., 0.], dtype=float32)
    """
    x = tf.convert_to_tensor(x)
    shape = _static_shape(x.shape)
    mask = to_mask(indices, shape, name="indices", indices_expected=True)
    idx = tf.constant(mask_to_indices(mask), dtype=tf.int64)
    part = tf.scatter_nd(idx, tf.gather_nd(x, idx), tf.constant(shape, tf.int64))
    return part + tf.stop_gradient(x - part)


def _static_shape(shape: tf.TensorShape) -> tuple[int, ...]:
    if not shape.is_fully_defined():
        raise ValueError(
            "`x` must have a static shape (as a weight has), because the mask "
            f"is checked against it. Received: x with shape {shape}"
        )
    return _normalize_shape(shape, name="x.shape")


def _bool_mask(mask, x_shape: tf.TensorShape):
    """The mask as a bool NumPy array, or a checked symbolic bool tensor."""
    if isinstance(mask, (tf.Tensor, tf.Variable)) and not hasattr(mask, "numpy"):
        if mask.dtype != tf.bool:
            raise TypeError(
                "A symbolic `mask` must be a boolean tensor (index lists and 0/1 "
                "masks must be static: NumPy arrays or lists). Received: "
                f"mask={_describe(mask)}"
            )
        if mask.shape != x_shape or not x_shape.is_fully_defined():
            raise ValueError(
                f"`mask` must have the static shape of `x`, {x_shape}. "
                f"Received: mask={_describe(mask)}"
            )
        return mask
    return _mask_constant(to_mask(mask, _static_shape(x_shape)))
