"""The product ``x @ W`` of a partial tensor, without composing ``W``.

For a matrix made of a frozen ``base`` and ``k`` free values at ``positions``,

.. math::

    x W = x\\,\\mathrm{base} + x\\,S, \\qquad
    S_{r_i c_i} = \\mathrm{free}_i - \\mathrm{base}_{r_i c_i},

where ``S`` is the sparse matrix of the free entries' differences from the
base. ``x @ S`` is a gather of the ``k`` needed rows of ``xᵀ``, a product by
the differences and a scatter-add (``segment_sum``) into the output columns:
O(batch·k), with no n² temporary. Its gradient with respect to the free
values is the sampled product ``Σ_b x[b, r_i] g[b, c_i]``, also O(batch·k),
instead of the full kernel gradient ``xᵀg`` (O(batch·n²)) and a gather of it.
Everything is ``keras.ops``, so autodiff gives that gradient on every backend,
with no custom gradient.

The difference ``free - base[positions]`` makes the product right whatever
the base holds at the free positions (zeros, or the original values, as
weights saved from the delta mode do).

It pays below a few percent of free entries: every free entry costs a
``batch``-long gather and scatter, where the dense product spends
``2·batch`` multiply-adds per entry on fast, blocked code.
:func:`refimpl.choose_mode` holds the measured thresholds.
"""

from __future__ import annotations

import keras

__all__ = ["sparse_matmul", "xla_enabled"]


def sparse_matmul(x, base, positions, free):
    """``x @ W`` for ``W`` = ``base`` with ``free[i]`` at flat ``positions[i]``.

    Args:
        x: the input, of shape ``[..., n_in]``.
        base: the frozen matrix, ``[n_in, n_out]``.
        positions: the row-major flat positions of the free values, ``[k]``
            integers.
        free: the free values, ``[k]``, in the order of ``positions``.

    Returns:
        ``x @ W``, of shape ``[..., n_out]``, equal to the dense product up to
        rounding (the free entries' terms are added after the base's).

    >>> import numpy as np
    >>> base = np.array([[1.0, 2.0], [3.0, 4.0]], "float32")
    >>> x = np.array([[1.0, 1.0]], "float32")
    >>> y = sparse_matmul(x, base, np.array([1], "int32"), np.float32([9.0]))
    >>> keras.ops.convert_to_numpy(y)  # x @ [[1, 9], [3, 4]]
    array([[ 4., 13.]], dtype=float32)
    """
    n_in, n_out = (int(d) for d in base.shape)
    x = keras.ops.convert_to_tensor(x)
    lead = tuple(x.shape[:-1])
    flat_x = keras.ops.reshape(x, (-1, n_in))
    dtype = flat_x.dtype
    base = keras.ops.cast(keras.ops.convert_to_tensor(base), dtype)
    free = keras.ops.cast(keras.ops.convert_to_tensor(free), dtype)
    positions = keras.ops.convert_to_tensor(positions)
    # The difference from the base at each free position: O(k).
    delta = free - keras.ops.take(keras.ops.reshape(base, (-1,)), positions)
    rows = keras.ops.floor_divide(positions, n_out)
    cols = positions - rows * n_out
    # Rows of xᵀ, one per free entry: [k, batch]; then scaled and summed into
    # the output column of each entry: [n_out, batch].
    picked = keras.ops.take(keras.ops.transpose(flat_x), rows, axis=0)
    added = keras.ops.segment_sum(
        picked * keras.ops.expand_dims(delta, -1), cols, num_segments=n_out
    )
    y = keras.ops.matmul(flat_x, base) + keras.ops.transpose(added)
    if len(lead) == 1:
        return y
    return keras.ops.reshape(y, (-1, *lead[1:], n_out))


def xla_enabled() -> bool:
    """Whether the code being traced is compiled by XLA.

    Always under JAX (``jax.jit`` compiles with XLA), never under PyTorch; under
    TensorFlow, inside a function with ``jit_compile=True``.
    """
    name = keras.backend.backend()
    if name == "jax":
        return True
    if name != "tensorflow":
        return False
    from refimpl.backend.sparse_tensorflow import in_xla_context

    return in_xla_context()
