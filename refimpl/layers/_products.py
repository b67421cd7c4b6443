"""The products a partial layer computes itself, without the composed kernel.

The plain class's ``call`` multiplies by (or looks up in) the composed
kernel, which is what every partial layer does by default. Two cases take
over the product:

* the ``"slices"`` form (:mod:`refimpl._slices`), which never composes the
  kernel;
* a layer under ``keras.RematScope`` that Keras would rematerialize: its
  product, composition included, is recomputed in the backward pass
  (``keras.remat``), so the composed kernel is not kept from the forward
  pass. The layer recomputes it itself with positional tensors: Keras' own
  wrapper passes ``call``'s keyword arguments to ``tf.recompute_grad``, which
  refuses them inside a ``tf.function`` (keras#21207), so under TensorFlow
  it fails for a plain ``Dense`` in ``fit``.
"""

from __future__ import annotations

import functools

import keras

from refimpl import _slices
from refimpl.ops import compose


def _product(layer):
    if isinstance(layer, keras.layers.EinsumDense):
        equation = layer.equation
        return lambda a, b: keras.ops.einsum(equation, a, b)
    if isinstance(layer, keras.layers.Dense):
        return keras.ops.matmul
    padding = layer.padding
    causal = padding == "causal"  # Conv1D's: padded on the left, as its call does

    def convolution(x, kernel):
        if causal:
            x = keras.ops.pad(x, layer._compute_causal_padding())
        return keras.ops.conv(
            x,
            kernel,
            strides=list(layer.strides),
            padding="valid" if causal else padding,
            dilation_rate=layer.dilation_rate,
            data_format=layer.data_format,
        )

    return convolution


def _bias(layer, y, dtype):
    bias = keras.ops.cast(layer.bias, dtype)
    if getattr(layer, "data_format", "channels_last") == "channels_first":
        bias = keras.ops.reshape(bias, (1, -1) + (1,) * layer.rank)
    return keras.ops.add(y, bias)


def takes_over(layer) -> bool:
    """Whether ``layer``'s own ``call`` does not multiply by the composed kernel."""
    mode = getattr(layer, "_partial_mode", None)
    if mode == "slices":
        return True
    return mode == "delta" and getattr(layer, "_partial_recompute", False)


def output(layer, inputs):
    """The layer's output, by :func:`takes_over`'s product."""
    layer._partial_check_loaded()
    dtype = layer.compute_dtype
    if isinstance(layer, keras.layers.Embedding):  # whole rows, looked up
        ids = inputs
        if keras.backend.standardize_dtype(ids.dtype) not in ("int32", "int64"):
            ids = keras.ops.cast(ids, "int32")
        base = layer._partial_base().value
        free = layer.partial_free.value
        rows = layer._partial_sets[0]
        return keras.ops.cast(_slices.row_lookup(ids, base, free, rows), dtype)
    base = keras.ops.cast(layer._partial_base().value, dtype)
    free = keras.ops.cast(layer.partial_free.value, dtype)
    product = _product(layer)
    if layer._partial_mode == "slices":
        axes = layer._partial_slice_axes()
        sets = layer._partial_sets
        y = _slices.slice_product(inputs, base, free, sets, axes, product)
    else:

        def composed_product(x, base, positions, free):
            return product(x, compose(base, positions, free))

        positions = layer.partial_positions.value
        y = keras.remat(composed_product)(inputs, base, positions, free)
    if layer.bias is not None:
        y = _bias(layer, y, dtype)
    return layer.activation(y) if layer.activation is not None else y


def product_call(plain_class):
    """The ``call`` of the partial class of a class :func:`output` computes.

    It has the plain class's signature, ``(inputs, training=None)`` for
    ``Dense`` and ``EinsumDense``, ``(inputs)`` for a convolution or an
    ``Embedding``, which Keras reads to decide what to pass; ``None`` for
    other classes, whose ``call`` is the plain one.
    """
    with_training = (keras.layers.Dense.call, keras.layers.EinsumDense.call)
    inputs_only = (
        keras.layers.Conv1D.call,
        keras.layers.Conv2D.call,
        keras.layers.Embedding.call,
    )
    if plain_class.call in with_training:

        def call(self, inputs, training=None):
            if takes_over(self):
                return output(self, inputs)
            return plain_class.call(self, inputs, training=training)

        return call
    if plain_class.call in inputs_only:

        def call(self, inputs):
            if takes_over(self):
                return output(self, inputs)
            return plain_class.call(self, inputs)

        return call
    return None  # a call of its own: left to it


def rematerialized(layer, layer_call, wrapped):
    """What ``Layer.rematerialized_call`` returns for a partial layer.

    ``wrapped`` is Keras' answer: ``layer_call`` itself when the layer is not
    rematerialized. Otherwise a partial ``Dense`` or ``EinsumDense`` in the
    ``"delta"`` form recomputes its own product instead (see the module
    docstring); other layers and Keras' ``"activations"`` mode keep Keras'.
    """
    mode = getattr(layer._remat_mode, "mode", None)
    if (
        wrapped is layer_call
        or mode == "activations"
        or getattr(layer, "_partial_mode", None) != "delta"
        or not _slices.is_product(layer._partial_slice_axes())
    ):
        return wrapped

    @functools.wraps(layer_call)
    def recomputing(*args, **kwargs):
        layer._partial_recompute = True
        try:
            return layer_call(*args, **kwargs)
        finally:
            layer._partial_recompute = False

    return recomputing
