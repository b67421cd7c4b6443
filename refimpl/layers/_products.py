"""The products a partial ``Dense`` or ``EinsumDense`` computes itself.

The plain class's ``call`` multiplies by the composed kernel, which is what
every partial layer does by default. Two cases take over the product:

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
    return keras.ops.matmul


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
        y = keras.ops.add(y, keras.ops.cast(layer.bias, dtype))
    return layer.activation(y) if layer.activation is not None else y


def product_call(plain_class):
    """The ``call`` of the partial class of ``Dense`` or ``EinsumDense``.

    It has the plain class's signature, ``(inputs, training=None)``, which
    Keras reads to decide what to pass; ``None`` for other classes, whose
    ``call`` is the plain one.
    """
    products = (keras.layers.Dense.call, keras.layers.EinsumDense.call)
    if plain_class.call not in products:  # a call of its own: left to it
        return None

    def call(self, inputs, training=None):
        if takes_over(self):
            return output(self, inputs)
        return plain_class.call(self, inputs, training=training)

    return call


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
        or layer._partial_slice_axes() is None
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
