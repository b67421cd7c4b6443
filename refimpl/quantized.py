"""A partial weight over a kernel that Keras quantized: codes, scales and free floats.

``layer.quantize("int8")`` (or ``"int4"``) keeps a ``Dense`` or
``EinsumDense`` kernel as integer codes with float scales. A partial weight
over such a kernel keeps them as they are, frozen (codes and scales do not
change, bit for bit, through any training: they are not trainable and have
no optimizer state), and holds its ``k`` free values as floats (the layer's
variable dtype, float32 by default, as Keras keeps LoRA's weights). The
kernel it stands for, ``W``, is the dequantized kernel with the free values
written at their positions, and the layer computes

    y = Keras' own quantized product of x by the codes
        + x @ D,   D = free - dequantized(codes)[positions], at the positions

before its bias and activation. Only the ``k`` needed codes and their scales
are read for ``D`` (never the whole kernel dequantized), and ``x @ D`` is the
product of the form: a gather and a segment sum (O(batch·k), the ``"sparse"``
form of a ``Dense``), a dense product of the free rows or columns
(``"slices"``), or a float matmul by the scattered ``D`` (``"delta"``). The
free values' gradient is the exact gradient of ``x @ W``.

Either order gives this layer: :func:`refimpl.partialize
<refimpl.convert.partialize>` of a quantized model, or ``model.quantize`` of a
converted (and perhaps trained) one, which quantizes the frozen base as Keras
quantizes the plain layer and keeps the trained free values. Keras' private
layout of the codes is read in one place, :mod:`refimpl._compat`.
"""

from __future__ import annotations

import keras
import numpy as np

from refimpl import _compat, ops

__all__ = ["QuantizedBase"]

#: Keras' quantization modes that a partial weight combines with.
COMBINED_MODES = _compat.QUANTIZED_MODES


class QuantizedBase:
    """The frozen base of a partial weight that Keras quantized.

    Attributes:
        layer: the quantized ``Dense`` or ``EinsumDense``.
        mode: ``"int8"`` or ``"int4"``.
        codes: the integer codes (the layer's ``_kernel``: int8, or int4
            packed two per byte).
        scales: the scale variables, in Keras' order: ``kernel_scale``, and
            ``kernel_zero`` and ``g_idx`` for int4 in groups.
        shape: the shape of the float kernel the codes stand for.

    A partial weight over a quantized kernel holds one, as ``.quantized``:

    >>> import refimpl
    >>> layer = keras.layers.Dense(4, name="d")
    >>> layer.build((None, 3))
    >>> layer.quantize("int8")
    >>> refimpl.enable_partial(layer, [[0, 1], [2, 3]])
    >>> pw = layer.partial_weight
    >>> pw.quantized.mode, pw.shape, pw.base.dtype, pw.free.dtype
    ('int8', (3, 4), 'int8', 'float32')
    >>> [v.name for v in pw.scales]
    ['kernel_scale']
    """

    def __init__(self, layer):
        self.layer = layer
        self.mode = layer.quantization_mode
        self.codes = _compat.own_weight(layer, "kernel")
        self.scales = _compat.quantization_variables(layer)
        self.shape = _compat.quantized_kernel_shape(layer)
        for variable in (self.codes, *self.scales):
            variable.trainable = False

    def dequantized(self):
        """The whole float kernel (a tensor): what ``value()`` writes into."""
        return _compat.dequantized_kernel(self.layer, self.dtype)

    def entries(self, positions):
        """The float kernel's entries at flat ``positions`` (a tensor), O(k)."""
        return _compat.dequantized_entries(self.layer, positions, self.dtype)

    @property
    def dtype(self) -> str:
        """The free values' dtype: the layer's variable dtype (float32)."""
        return keras.backend.standardize_dtype(self.layer.variable_dtype)

    def arrays(self) -> list[np.ndarray]:
        """The codes and every scale, as NumPy arrays (what a fingerprint reads)."""
        return [
            np.array(keras.ops.convert_to_numpy(v)) for v in (self.codes, *self.scales)
        ]


def combines(layer, mode) -> bool:
    """Whether a partial weight of ``layer`` combines with quantization ``mode``."""
    return mode in COMBINED_MODES and isinstance(
        layer, (keras.layers.Dense, keras.layers.EinsumDense)
    )


def refusal(layer, mode, *, argument: str, order: str) -> ValueError:
    """The one error for a quantization that a partial weight does not combine with.

    Args:
        layer: the layer (partial, or chosen to be).
        mode: the quantization mode.
        argument: how the user gave it (``"mode"``, ``"layer_masks['d']"``).
        order: ``"quantize"`` (a converted model is being quantized), or
            another word (a quantized model is being converted).
    """
    where = repr(layer.path or layer.name)
    kind = type(layer).__name__
    if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense)):
        why = (
            f"{mode} is not one that keeps integer codes with scales a partial "
            f"weight can add its free values to (it combines with "
            f"{list(COMBINED_MODES)})"
        )
    else:
        why = (
            f"a partial weight combines with quantization only in a Dense or "
            f"EinsumDense (modes {list(COMBINED_MODES)}), not in a {kind}"
        )
    if order == "quantize":
        return ValueError(
            f"`{argument}` {mode!r} cannot quantize layer {where} ({kind}), "
            f"which holds a partial weight: {why}. Nothing was changed. Quantize "
            "with one of those modes, leave the layer out (`filters=`), or "
            "merge first (`refimpl.merge(model)`) and quantize the plain model. "
            f"Received: {argument}={mode!r}"
        )
    named = (
        f"`{argument}` {where} ({kind}) is"
        if argument == "layer"
        else f"`{argument}` names layer {where} ({kind}),"
    )
    return ValueError(
        f"{named} quantized with {mode}: "
        f"{why}. Nothing was converted. Convert the float model (and quantize it "
        "after, in one of those modes), or leave this layer out. "
        f"Received: {argument} for a {mode} layer"
    )


def correction(holder, inputs, *, mode: str, product, axes):
    """``x @ D``: the free values' correction to the quantized base's product.

    ``D`` holds ``free - dequantized(codes)`` at the positions, zero
    elsewhere; ``product(x, kernel)`` is the layer's product (linear in the
    kernel) and ``axes`` where each kernel axis goes
    (:func:`refimpl.ops._layer_axes`). The form ``mode`` picks the product.
    """
    quantized = holder.quantized
    positions = holder.positions.value
    delta = holder.free.value - quantized.entries(positions)
    dtype = keras.backend.standardize_dtype(inputs.dtype)
    delta = keras.ops.cast(delta, dtype)
    shape = holder.shape
    if mode == "sparse":
        return _sparse_correction(inputs, positions, delta, shape)
    if mode == "slices":
        sets = holder.sets
        block = [d if s is None else len(s) for s, d in zip(sets, shape)]
        partial = product(
            ops._gather(inputs, sets, axes), keras.ops.reshape(delta, block)
        )
        for axis, chosen in enumerate(sets):
            side, where = axes[axis]
            if chosen is not None and side == "out":
                partial = ops._expand(partial, chosen, int(shape[axis]), where)
        return partial
    size = int(np.prod(shape))
    index = keras.ops.expand_dims(positions, -1)
    scattered = keras.ops.scatter(index, delta, (size,))
    return product(inputs, keras.ops.reshape(scattered, shape))


def _sparse_correction(x, positions, delta, shape):
    """``x @ D`` for a ``[n_in, n_out]`` ``D`` of ``k`` entries: a gather of the
    ``k`` needed input columns, a product by ``delta`` and a segment sum into
    the output columns, O(batch·k) (the sparse product's correction,
    :func:`refimpl.ops.sparse_matmul`)."""
    n_in, n_out = (int(d) for d in shape)
    lead = tuple(x.shape[:-1])
    flat_x = keras.ops.reshape(x, (-1, n_in))
    rows = keras.ops.floor_divide(positions, n_out)
    cols = positions - rows * n_out
    picked = keras.ops.take(keras.ops.transpose(flat_x), rows, axis=0)
    added = keras.ops.segment_sum(
        picked * keras.ops.expand_dims(delta, -1), cols, num_segments=n_out
    )
    y = keras.ops.transpose(added)
    if len(lead) == 1:
        return y
    return keras.ops.reshape(y, (-1, *lead[1:], n_out))
