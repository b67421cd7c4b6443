"""Keras layers whose weight is trainable only at some entries: the partial layers.

It is the pattern of Keras' own ``Dense.enable_lora`` and of
``torch.nn.utils.parametrize``. A *partial class* is the subclass of a Keras
layer class whose weight is trainable only at some entries
(``PartialConv2D`` of ``Conv2D``; :class:`PartialDense` of ``Dense``): one
weight per layer (the ``kernel`` or ``embeddings``, or another such as
``recurrent_kernel``), is held by a
:class:`~refimpl.partial.PartialWeight`:

* the layer's own weight stays where it is, as the frozen **base**
  (``trainable=False``);
* two weights are added: ``partial_free``, the ``k`` trainable values (in the
  ``"select"`` form a kernel-sized weight, with kernel-sized optimizer state), and
  ``partial_positions``, their flat positions;
* the weight's property (``kernel``, ``embeddings``) returns the base with the free
  values written in (:func:`refimpl.ops.compose`), so the layer's own ``call``
  runs unchanged, and every output equals the original layer's bit for bit
  until the free values move.

Each supported Keras class gets its partial class here when refimpl is
imported (``PartialDense`` is written out below):

* a weight behind a property (``Dense``, ``EinsumDense``, ``Conv1D``-``3D``,
  ``Embedding``, ``ReversibleEmbedding``): the partial class overrides the
  property;
* a weight kept as a plain attribute (``Conv1DTranspose``-``3DTranspose``,
  ``DepthwiseConv1D``/``2D``): the partial class adds a property of that name,
  which shadows the attribute and composes it;
* a layer with two weights of that kind (``SeparableConv1D``/``2D``: the
  depthwise and the pointwise kernel; ``SimpleRNNCell``, ``LSTMCell`` and
  ``GRUCell``: ``kernel`` and ``recurrent_kernel``): one of them is partial, the
  first (``depthwise_kernel``, ``kernel``) unless ``weight=`` names the other
  (``enable_partial``'s ``weight=``).

A subclass of one of them from Keras or keras-hub (keras-hub's
``ReversibleEmbedding``), and keras-hub's ``PositionEmbedding``, get theirs on
first use, without refimpl importing keras-hub. Those share one registered
name, ``refimpl>PartialLayer``, whose loader rebuilds them from the plain class
their config names, so a fresh process loads them too.

This module holds the shared mechanism (:class:`PartialWeightMixin`), the
registry of partial classes with the code that makes them, :class:`PartialDense`
and :func:`enable_partial`. An optimizer sees only the free values, so frozen
entries keep their bits under every optimizer. A reloaded layer has the same
weights bit for bit; :meth:`~PartialWeightMixin.to_dense` and
:func:`refimpl.merge <refimpl.convert.merge>` give the plain layer back.
"""

from __future__ import annotations

import functools
import gc
import importlib
import inspect
import math
import types

import keras
import numpy as np

from refimpl import _adapter_table, _compat, _layouts, backend, ops, quantized
from refimpl.masks import _check_int, _describe, _mask_shape, to_mask
from refimpl.ops import _LAYER_MODES, _check_mode, _mode_for, compose, sparse_matmul
from refimpl.partial import PartialWeight

__all__ = [
    "PartialDense",
    "PartialWeightMixin",
    "enable_partial",
    "partial_class",
    "supported_classes",
]

_ELEMENTWISE_REGULARIZERS = (
    keras.regularizers.L1,
    keras.regularizers.L2,
    keras.regularizers.L1L2,
)


# A constraint that acts entry by entry gives the free values exactly what it
# would give the composed weight's free entries.
_ELEMENTWISE_CONSTRAINTS = (keras.constraints.NonNeg,)


def _count(mask) -> int:
    """The number of free entries of a mask or index list, before any shape."""
    array = np.asarray(keras.ops.convert_to_numpy(mask))
    if array.dtype == bool or np.issubdtype(array.dtype, np.floating):
        return int((array != 0).sum())
    return int(array.shape[0]) if array.size else 0


def _composing(plain_class, target, attribute: bool = False):
    """The property that returns the composed weight, where the layer reads it."""
    doc = f"The {target}, the frozen base with the free values."
    if attribute:
        # The plain class sets the variable as an attribute; it is kept in the
        # instance's dict, which this property (a data descriptor) shadows.
        def fget_attribute(self):
            try:
                value = self.__dict__[target]
            except KeyError:
                raise AttributeError(target) from None
            if self._partial_target != target:
                # another weight of the layer is the partial one
                return self._partial_other(target, value)
            return self._partial_value(value)

        def fset(self, value):
            self.__dict__[target] = value

        return property(fget_attribute, fset, doc=doc)
    inherited = getattr(plain_class, target)

    def fget(self):
        holder = self.__dict__.get("partial_weight")
        if holder is not None and holder.quantized is not None:
            if self._partial_target == target:  # the float kernel, trained
                return holder.value()
        value = inherited.fget(self)
        if self._partial_target != target:
            return self._partial_other(target, value)
        return self._partial_value(value)

    return property(fget, doc=doc)


def _splittable_regularizer(regularizer) -> bool:
    """Whether a kernel regularizer can act on the free entries alone."""
    return regularizer is None or isinstance(regularizer, _ELEMENTWISE_REGULARIZERS)


def _check_constraint(constraint, name) -> None:
    if constraint is not None and not isinstance(constraint, _ELEMENTWISE_CONSTRAINTS):
        raise ValueError(
            f"Layer {name!r} has a kernel constraint, "
            f"{type(constraint).__name__}, that is not elementwise, so it "
            "cannot act on the free entries alone (Keras' `enable_lora` refuses "
            "kernel constraints too). Remove it, or keep it as a full-variable "
            "technique (`refimpl.FreezeEntries`, `refimpl.MaskedOptimizer`). "
            f"Received: kernel_constraint={type(constraint).__name__}"
        )


def _plain_class(layer) -> type:
    """The plain Keras class of a partial layer (``Conv2D`` for ``PartialConv2D``)."""
    return next(c for c in type(layer).__mro__ if not issubclass(c, PartialWeightMixin))


def _is_quantized_kernel(layer, base) -> bool:
    """Whether ``base`` is the codes of a kernel Keras quantized in a mode a
    partial weight combines with (int8, int4 of a Dense or EinsumDense)."""
    mode = getattr(layer, "quantization_mode", None)
    return bool(
        mode
        and quantized.combines(layer, mode)
        and base is getattr(layer, "_kernel", None)
    )


def _quantized_base(layer, base):
    """The :class:`~refimpl.quantized.QuantizedBase` of ``base`` if it is a
    quantized kernel (:func:`_is_quantized_kernel`); else ``None``."""
    return quantized.QuantizedBase(layer) if _is_quantized_kernel(layer, base) else None


def _weight_shape(layer, base) -> tuple:
    """The shape of the weight ``base`` holds: the float kernel's for the codes
    of a quantized kernel (int4 codes are packed two per byte)."""
    if _is_quantized_kernel(layer, base):
        return _compat.quantized_kernel_shape(layer)
    return tuple(base.shape)


def _select_refusal(layer) -> ValueError:
    return ValueError(
        "`mode` 'select' keeps a float weight of the kernel's shape beside the "
        f"kernel, and layer {layer.name!r} holds its kernel as "
        f"{layer.quantization_mode} codes: a quantized base takes the 'delta', "
        "'sparse' (Dense), 'slices' or 'auto' form. Received: mode='select'"
    )


def _plain_quantizes(layer) -> bool:
    """Whether Keras quantizes a layer of ``layer``'s plain class at all."""
    return _plain_class(layer).quantize is not keras.layers.Layer.quantize


def _check_quantize(layer, mode, *, argument="mode") -> None:
    """Refuse, naming ``mode`` and ``layer``, a quantization of a partial
    layer that a partial weight does not combine with."""
    if not quantized.combines(layer, mode):
        raise quantized.refusal(layer, mode, argument=argument, order="quantize")
    holder = layer.__dict__.get("partial_weight")
    if holder is not None and holder.mode == "select" and not holder.auto:
        raise ValueError(
            f"`{argument}` {mode!r} cannot quantize layer "
            f"{layer.path or layer.name!r}, whose partial weight is in the "
            "'select' form (a float weight of the kernel's shape): nothing was "
            "changed. Convert it with mode='delta', 'sparse', 'slices' or "
            f"'auto' to quantize it. Received: {argument}={mode!r}"
        )


def _check_model_quantize(model, mode, config, filters) -> None:
    """Before ``model.quantize`` changes any layer: refuse a mode that a
    partial layer it would quantize does not combine with."""
    mode = _compat.resolve_quantize_mode(mode, config)
    layers = [model, *_compat.sub_layers(model)]
    if any(isinstance(layer, PartialWeightMixin) for layer in layers):
        _compat.resolve_policy_maps(model)  # Keras' quantize misreads a map
    for layer in layers:
        if (
            isinstance(layer, PartialWeightMixin)
            and "partial_weight" in layer.__dict__
            and _plain_quantizes(layer)
            and _compat.should_quantize(layer, filters)
        ):
            _check_quantize(layer, mode)


_compat.before_model_quantize(_check_model_quantize)


class PartialWeightMixin:
    """What a partial class adds to its Keras class.

    Every partial layer (:class:`~refimpl.layers.partial.PartialDense`,
    ``PartialConv2D``, ...) holds its partial weight as ``partial_weight``, a
    :class:`~refimpl.partial.PartialWeight` (``.mask``, ``.free``,
    ``.positions``, ``.base``, ``.num_free``, ``.mode``), and has the methods
    below.

    >>> from refimpl import enable_partial
    >>> from refimpl.layers.partial import PartialWeightMixin
    >>> layer = keras.layers.Embedding(3, 2)
    >>> layer.build((None,))
    >>> enable_partial(layer, [[2, 0], [2, 1]])  # the last row
    >>> isinstance(layer, PartialWeightMixin), layer.partial_weight.num_free
    (True, 2)
    """

    # The partial weight: the class's default, or the one chosen for this
    # layer (a SeparableConv's pointwise kernel, an RNN cell's recurrent one).
    _partial_target = "kernel"
    # The weights the class can make partial, each with whether the plain
    # class keeps it as a plain attribute (``self.kernel = add_weight(...)``)
    # rather than behind a property.
    _partial_attributes: dict = {"kernel": False}
    # Made on first use (a keras-hub class): its config names its plain class.
    _partial_on_demand = False
    # Whether `call` has a sparse product (only a Dense's does).
    _partial_sparse_product = False
    # The other weights that Keras multiplies a whole sequence by (an LSTM's
    # or a GRU's input kernel): frozen, they are read as trainable ones.
    _partial_read_as_trained: tuple = ()

    # -- the weight the layer's call reads ----------------------------------
    def _partial_value(self, value):
        holder = self.__dict__.get("partial_weight")
        if holder is None:
            return value
        value = holder.value(value.value if hasattr(value, "value") else value)
        return backend.read_as_trained(value, like=holder.base)

    def _partial_other(self, name, variable):
        """Another weight the layer's call reads (a cell's input kernel beside
        its partial recurrent kernel): one that PyTorch multiplies differently
        once frozen (``refimpl.backend.read_as_trained`` says why) is read as
        the plain layer's trainable weight.
        """
        if name in self._partial_read_as_trained:
            return backend.read_as_trained(variable)
        return variable

    def _partial_base(self):
        if self._partial_attributes.get(self._partial_target, False):
            return self.__dict__[self._partial_target]
        return _compat.own_weight(self, self._partial_target)

    # -- creation --------------------------------------------------------------
    def _partial_add_weights(self, num_free, positions, mode, auto):
        base = self._partial_base()
        quantized_base = _quantized_base(self, base)
        shape = _weight_shape(self, base)
        size = int(np.prod(shape))
        if mode == "auto":
            mode = _mode_for(num_free, shape, jit_compile=False)
            if mode == "select" and quantized_base is not None:
                mode = "delta"  # no select form over codes
            auto = mode != "select"
            # Whole rows or columns (slices that span an axis) below half
            # a Dense or EinsumDense kernel: the benchmark's real-model rows
            # and columns.
            axes = self._partial_slice_axes()
            if num_free < size / 2 and ops._is_matrix_product(axes):
                sets = positions is not None and ops._rectangle(positions, shape)
                if sets and any(axis is None for axis in sets):
                    mode, auto = "slices", False
            if mode == "sparse" and not self._partial_sparse_product:
                mode, auto = "delta", False  # the sparse product is a Dense's
        if mode == "slices":
            self._partial_check_slices(positions, shape)
        if mode == "sparse" and not self._partial_sparse_product:
            raise ValueError(
                "`mode` 'sparse' is a matrix product, which only a Dense layer "
                f"computes through its kernel. Received: mode='sparse' for layer "
                f"{self.name!r} of type {_plain_class(self).__name__}"
            )
        if mode == "select" and quantized_base is not None:
            raise _select_refusal(self)
        holder = PartialWeight.create(
            self,
            base,
            positions,
            num_free=num_free,
            mode=mode,
            auto=auto,
            names=("partial_free", "partial_positions"),
            quantized=quantized_base,
        )
        self.__dict__["partial_weight"] = holder  # not a Keras-tracked attribute
        _compat.dispatch_quantize(self)  # `quantize` of the partial class
        # The variables as attributes too: what tf.train.Checkpoint names them by.
        with _compat.unlocked(self):
            self._partial_free = holder.free
            self._partial_positions = holder.positions
        if mode == "slices" and positions is not None:
            holder.sets = ops._rectangle(positions, shape)

    # -- the "slices" form (refimpl.ops) --------------------------------------
    def _partial_slice_axes(self):
        """Where each kernel axis goes in the product, or None: no slices form."""
        return ops._layer_axes(self, self._partial_target)

    def _partial_check_slices(self, positions, shape):
        ops._check_slices(self, positions, shape, self._partial_target)

    def rematerialized_call(self, layer_call, *args, **kwargs):
        wrapped = super().rematerialized_call(layer_call, *args, **kwargs)
        if self.__dict__.get("partial_weight") is None:
            return wrapped
        return _rematerialized(self, layer_call, wrapped, args, kwargs)

    def build(self, input_shape):
        super().build(input_shape)
        shell = getattr(self, "_partial_shell", None)
        if shell is not None:
            self._partial_add_weights(shell[0], None, shell[1], shell[2])
            _adapter_table.build_shell(self)
            if getattr(self, "_partial_rest_frozen", False):
                self.freeze_rest()

    def freeze_rest(self) -> None:
        """Freeze the layer's other weights (its bias): only the free values train.

        What :func:`refimpl.partialize <refimpl.convert.partialize>` does by
        default; kept in the layer's config, so a reloaded layer is frozen alike.

        Returns:
            ``None``; the layer changes in place.

        >>> from refimpl import enable_partial
        >>> layer = keras.layers.Dense(2)
        >>> layer.build((None, 3))
        >>> enable_partial(layer, [[0, 0]])
        >>> layer.freeze_rest()
        >>> [w.name for w in layer.trainable_weights]  # the bias no more
        ['partial_free']
        """
        free = self.partial_weight.free
        for variable in self.weights:
            if variable is not free:
                variable.trainable = False
        self._partial_rest_frozen = True

    @property
    def trainable(self):
        return keras.layers.Layer.trainable.fget(self)

    @trainable.setter
    def trainable(self, value):
        # Keras sets every variable the layer created trainable: the frozen
        # base (and, after `freeze_rest`, the rest) must stay frozen.
        keras.layers.Layer.trainable.fset(self, value)
        holder = self.__dict__.get("partial_weight")
        if holder is None:
            return
        for variable in self.weights:
            if variable is holder.base or (
                getattr(self, "_partial_rest_frozen", False)
                and variable is not holder.free
            ):
                variable.trainable = False

    def set_weights(self, weights):
        super().set_weights(weights)
        self.partial_weight.check_loaded(again=True)
        _adapter_table.forget(self)

    def __getattr__(self, name):
        # Reached only for a name the layer does not have.
        if name in _MOVED_MEMBERS:
            raise AttributeError(
                f"`{name}` of a partial layer moved in refimpl 3.0: use "
                f"`layer.partial_weight.{_MOVED_MEMBERS[name]}`."
            )
        if name == "partial_weight":  # made when the layer is built
            raise AttributeError(
                "Build the layer before reading `partial_weight`. "
                f"Received: {self.name!r}, not built"
            )
        for cls in type(self).__mro__:  # a property that raised: its own error
            if isinstance(cls.__dict__.get(name), property):
                return cls.__dict__[name].fget(self)
        parent = getattr(super(), "__getattr__", None)  # torch.nn.Module's
        if parent is None:
            raise AttributeError(
                f"{type(self).__name__!r} object has no attribute {name!r}"
            )
        return parent(name)

    # -- saving ------------------------------------------------------------------
    # Every variable as it is, as any Keras layer saves: the base untouched,
    # the free values and their positions, so a reloaded layer has the same
    # weights bit for bit. (The plain class saves its composed `kernel`.)
    def save_own_variables(self, store):
        keras.layers.Layer.save_own_variables(self, store)

    def load_own_variables(self, store):
        keras.layers.Layer.load_own_variables(self, store)
        _adapter_table.forget(self)
        self.partial_weight.check_loaded(again=True)

    def get_config(self) -> dict:
        config = super().get_config()
        holder = self.__dict__.get("partial_weight")
        if holder is not None:
            shell = (holder.num_free, holder.mode, holder.auto)
        elif getattr(self, "_partial_shell", None) is not None:
            shell = self._partial_shell
        else:  # a PartialDense not built yet
            mask, mode = self._partial_given
            shell = (_count(mask), mode, False)
        config["num_free"], config["mode"], config["auto"] = shell
        config["rest_trainable"] = not getattr(self, "_partial_rest_frozen", False)
        if self._partial_target != type(self)._partial_target:
            config["target"] = self._partial_target
        if self._partial_on_demand:
            config["plain_class"] = _compat.class_config(self._partial_plain_class())
        _adapter_table.add_record(self, config)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        shell = (config.pop("num_free"), config.pop("mode"), config.pop("auto"))
        rest_trainable = config.pop("rest_trainable", True)
        target = config.pop("target", cls._partial_target)
        adapters = _adapter_table.pop_record(config)
        layer = super().from_config(config)
        if adapters is not None:  # a layer with adapters saved
            layer.__dict__["_adapter_shell"] = adapters
        layer._partial_target = target
        layer._partial_shell = shell
        layer._partial_rest_frozen = not rest_trainable
        return layer

    # -- a base Keras quantized (refimpl.quantized) ----------------------------------
    def _int8_call(self, inputs, *args, **kwargs):
        holder = self.__dict__.get("partial_weight")
        if holder is None or holder.quantized is None:
            return super()._int8_call(inputs, *args, **kwargs)
        return _quantized_output(self, inputs)

    def _int4_call(self, inputs, *args, **kwargs):
        holder = self.__dict__.get("partial_weight")
        if holder is None or holder.quantized is None:
            return super()._int4_call(inputs, *args, **kwargs)
        return _quantized_output(self, inputs)

    def quantize(self, mode=None, type_check=True, config=None):
        """Quantize the frozen base as Keras quantizes the plain layer; keep
        the free values (trained or not) as floats.

        What ``model.quantize(mode)`` calls. The base (the pretrained kernel)
        becomes Keras' codes and scales, exactly those of the plain layer
        quantized alike; the free values keep their float values and
        positions, and the layer computes the quantized base's product plus
        their correction (:mod:`refimpl.quantized`).

        Raises:
            ValueError: for a mode a partial weight does not combine with
                (``"float8"``, ``"gptq"``, ``"awq"``; a layer other than a
                ``Dense`` or ``EinsumDense``), before anything changes.
        """
        holder = self.__dict__.get("partial_weight")
        if holder is None or not _plain_quantizes(self):
            return super().quantize(mode, type_check=type_check, config=config)
        mode = _compat.resolve_quantize_mode(mode, config)
        _check_quantize(self, mode)
        plain = self._partial_plain_class()
        if type_check and plain not in (keras.layers.Dense, keras.layers.EinsumDense):
            # What Keras says of the plain subclass, which it does not quantize.
            raise self._not_implemented_error(self.quantize)
        holder.check_loaded()
        free = np.array(keras.ops.convert_to_numpy(holder.free))
        positions = np.array(backend.read_now(holder.positions))
        num_free, form = holder.num_free, "auto" if holder.auto else holder.mode
        rest_frozen = getattr(self, "_partial_rest_frozen", False)
        # Keras quantizes the plain layer's own kernel, the frozen base.
        for variable in (holder.free, holder.positions):
            _compat.untrack_variable(self, variable)
        for name in ("_partial_free", "_partial_positions"):
            super(keras.layers.Layer, self).__delattr__(name)
        del self.__dict__["partial_weight"]
        partial = type(self)
        self.__class__ = plain
        try:
            with _compat.unlocked(self):
                plain.quantize(self, mode, type_check=False, config=config)
        finally:
            self.__class__ = partial
        self._partial_add_weights(num_free, positions, form, False)
        self.partial_weight.free.assign(free)
        if rest_frozen:
            self.freeze_rest()

    # -- LoRA: refused ---------------------------------------------------------------
    def enable_lora(self, *args, **kwargs):
        """Refused: a partial weight and LoRA do not combine.

        Keras' ``enable_lora`` (which keras-hub's ``Backbone.enable_lora``
        calls on the ``query`` and ``value`` layers) would add its update to
        the weight this layer composes, whose free values then overwrite it at
        their entries; ``merge`` would count it twice.

        Raises:
            ValueError: always, naming the layer and what to do instead.

        >>> from refimpl import enable_partial
        >>> layer = keras.layers.Dense(2)
        >>> layer.build((None, 3))
        >>> enable_partial(layer, [[0, 0]])
        >>> try:
        ...     layer.enable_lora(2)
        ... except ValueError as err:
        ...     print(str(err).split(":")[0])
        LoRA cannot be enabled on a partially trainable layer
        """
        raise ValueError(
            "LoRA cannot be enabled on a partially trainable layer: its "
            f"`{self._partial_target}` already trains at some entries, where "
            "the free values would overwrite LoRA's update (and `merge` would "
            "add it twice). Merge first (`refimpl.merge(model)`, or "
            "`layer.fold()` for this layer) and enable LoRA on the plain "
            "layer, or enable LoRA on other layers (keras-hub: "
            "`backbone.enable_lora(rank, target_layer_names=[...])`). "
            f"Received: layer {self.path or self.name!r} "
            f"({type(self).__name__})"
        )

    # -- the way out ---------------------------------------------------------------
    @classmethod
    def _partial_plain_class(cls):
        return next(c for c in cls.__mro__ if c in _PLAIN_TO_PARTIAL)

    def _partial_record(self) -> dict:
        """What a shell of this layer needs: its free count and its form."""
        record = {
            "target": self._partial_target,
            **self.partial_weight.record(),
            "rest_trainable": not getattr(self, "_partial_rest_frozen", False),
        }
        _adapter_table.add_record(self, record)
        return record

    def fold(self) -> None:
        """Turn this layer back into its plain class, in place, bit for bit.

        The trained weight is written into the layer's own variable, which
        trains again; the free values and positions are removed.
        What :func:`refimpl.merge <refimpl.convert.merge>` does to every
        partial layer, at any depth.

        Returns:
            ``None``; the layer itself now has the plain class.

        >>> from refimpl import enable_partial
        >>> layer = keras.layers.Dense(2)
        >>> layer.build((None, 3))
        >>> enable_partial(layer, [[0, 0]])
        >>> layer.fold()
        >>> type(layer).__name__, [w.name for w in layer.trainable_weights]
        ('Dense', ['kernel', 'bias'])
        """
        self._fold()
        gc.collect()  # what Keras does when a variable is deleted: free its buffer

    def _fold(self) -> None:
        """``fold`` without the garbage collection, for a whole model at once."""
        holder = self.partial_weight
        holder.check_loaded()
        value = keras.ops.convert_to_numpy(getattr(self, self._partial_target))
        if holder.quantized is not None:
            self._fold_quantized(np.array(value))
            return
        base = holder.base
        _adapter_table.drop(self)
        for variable in (holder.free, holder.positions):
            _compat.untrack_variable(self, variable)
        for name in ("_partial_free", "_partial_positions"):
            # Keras' Layer.__delattr__ without its gc.collect() per variable.
            super(keras.layers.Layer, self).__delattr__(name)
        self._partial_become_plain()
        base.assign(np.array(value))
        for variable in self.weights:
            variable.trainable = True  # the plain layer's `trainable` governs

    def _partial_become_plain(self) -> None:
        """Forget the partial weight's attributes and take the plain class back."""
        for name in (
            "partial_weight",
            "_partial_shell",
            "_partial_rest_frozen",
            "_partial_target",
        ):
            self.__dict__.pop(name, None)
        self.__class__ = self._partial_plain_class()

    def _fold_quantized(self, value) -> None:
        """``_fold`` of a quantized base: the float plain layer, with ``value``
        (the dequantized kernel with the free values) as its kernel."""
        self._partial_become_plain()
        _compat.unquantize(self, value, drop=("_partial_free", "_partial_positions"))
        _compat.dispatch_quantize(self)
        for variable in self.weights:
            variable.trainable = True

    def to_dense(self):
        """Return the plain Keras layer with the trained weight, bit for bit.

        Its outputs equal this layer's exactly in the ``"delta"`` and
        ``"select"`` forms, and to rounding in ``"sparse"`` and ``"slices"``,
        which compute the product in pieces; its weights are copies.

        Returns:
            A new, built layer of the plain Keras class (a ``Conv2D`` for a
            ``PartialConv2D``); this layer is unchanged.

        >>> from refimpl import enable_partial
        >>> layer = keras.layers.Dense(2)
        >>> layer.build((None, 3))
        >>> enable_partial(layer, [[0, 0]])
        >>> plain = layer.to_dense()
        >>> composed = keras.ops.convert_to_numpy(layer.kernel)
        >>> type(plain).__name__, bool(np.array_equal(plain.get_weights()[0], composed))
        ('Dense', True)
        """
        plain_class = self._partial_plain_class()
        config = plain_class.get_config(self)
        holder = self.partial_weight
        if holder.quantized is not None:  # the float layer
            config["dtype"] = _compat.layer_policy(self)._source_name
            config.pop("quantization_config", None)
        plain = plain_class.from_config(config)
        plain.build_from_config(self.get_build_config())
        if holder.quantized is not None:
            kernel = np.array(keras.ops.convert_to_numpy(holder.value()))
            bias = [] if self.bias is None else [np.array(self.bias)]
            plain.set_weights([kernel, *bias])
            plain.trainable = self.trainable
            return plain
        adapters = _adapter_table.owned(self)
        weights = []
        for variable in self.variables:
            if variable is holder.free or variable is holder.positions:
                continue
            if id(variable) in adapters:
                continue
            value = variable
            if variable is holder.base:
                value = getattr(self, self._partial_target)
            # Copies: JAX's trainer donates a model's buffers to its step.
            weights.append(np.array(keras.ops.convert_to_numpy(value)))
        plain.set_weights(weights)
        plain.trainable = self.trainable
        return plain


# Layer members of refimpl 2.x, and where they are in 3.0.
_MOVED_MEMBERS = {
    "trainable_mask": "mask",
    "base_weight": "base",
    "num_free": "num_free",
    "partial_mode": "mode",
    "product_mode": "product_mode()",
    "partial_free": "free",
    "partial_positions": "positions",
}


# -- the products a partial layer computes itself ---------------------------------
# The products a partial layer computes itself, without the composed kernel.
#
# The plain class's ``call`` multiplies by (or looks up in) the composed
# kernel, which is what every partial layer does by default. Two cases take
# over the product:
#
# * the ``"slices"`` form (:mod:`refimpl.ops`), which never composes the
#   kernel;
# * a layer under ``keras.RematScope`` that Keras would rematerialize: its
#   product, composition included, is recomputed in the backward pass
#   (``keras.remat``), so the composed kernel is not kept from the forward
#   pass. The layer recomputes it itself with positional tensors: Keras' own
#   wrapper passes ``call``'s keyword arguments to ``tf.recompute_grad``, which
#   refuses them inside a ``tf.function`` (keras#21207), so under TensorFlow
#   it fails for a plain ``Dense`` in ``fit``.


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
            x = keras.ops.pad(x, _compat.causal_padding(layer))
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


def _takes_over(layer) -> bool:
    """Whether ``layer``'s own ``call`` does not multiply by the composed kernel."""
    holder = layer.__dict__.get("partial_weight")
    mode = None if holder is None else holder.mode
    if mode == "slices":
        return True
    return mode == "delta" and getattr(layer, "_partial_recompute", False)


def _output(layer, inputs):
    """The layer's output, by :func:`_takes_over`'s product."""
    holder = layer.partial_weight
    holder.check_loaded()
    dtype = layer.compute_dtype
    if isinstance(layer, keras.layers.Embedding):  # whole rows, looked up
        ids = inputs
        if keras.backend.standardize_dtype(ids.dtype) not in ("int32", "int64"):
            ids = keras.ops.cast(ids, "int32")
        base = holder.base.value
        free = holder.free.value
        rows = holder.sets[0]
        return keras.ops.cast(ops._row_lookup(ids, base, free, rows), dtype)
    base = keras.ops.cast(holder.base.value, dtype)
    free = keras.ops.cast(holder.free.value, dtype)
    product = _product(layer)
    if holder.mode == "slices":
        axes = layer._partial_slice_axes()
        sets = holder.sets
        y = ops._slice_product(inputs, base, free, sets, axes, product)
    else:

        def composed_product(x, base, positions, free):
            kernel = backend.read_as_trained(compose(base, positions, free), like=base)
            return product(x, kernel)

        positions = holder.positions.value
        y = keras.remat(composed_product)(inputs, base, positions, free)
    if layer.bias is not None:
        y = _bias(layer, y, dtype)
    return layer.activation(y) if layer.activation is not None else y


def _quantized_output(layer, inputs):
    """A partial layer's output over a base Keras quantized: Keras' own
    quantized product, plus the free values' correction in the layer's form
    (:func:`refimpl.quantized.correction`), then the bias and activation."""
    holder = layer.partial_weight
    holder.check_loaded()
    y = _compat.quantized_product(layer, inputs)
    correction = quantized.correction(
        holder,
        keras.ops.cast(inputs, y.dtype),
        mode=holder.product_mode(),
        product=_product(layer),
        axes=layer._partial_slice_axes(),
    )
    y = keras.ops.add(y, correction)
    if layer.bias is not None:
        y = keras.ops.add(y, layer.bias)
    return layer.activation(y) if layer.activation is not None else y


def _product_call(plain_class):
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
            if _adapter_table.mixed(self):
                return _adapter_table.mixed_output(self, inputs)
            if _takes_over(self):
                return _output(self, inputs)
            return plain_class.call(self, inputs, training=training)

        return call
    if plain_class.call in inputs_only:

        def call(self, inputs):
            if _adapter_table.mixed(self):
                return _adapter_table.mixed_output(self, inputs)
            if _takes_over(self):
                return _output(self, inputs)
            return plain_class.call(self, inputs)

        return call
    return None  # a call of its own: left to it


def _keras_rematerializes(layer, args, kwargs) -> bool:
    """Whether Keras recomputes ``layer``'s whole call in the backward pass.

    Keras' own decision, read off the ``RematScope`` the layer was made under,
    as ``Layer.rematerialized_call`` takes it: ``"full"`` recomputes every
    layer, ``"list_of_layers"`` the layers it names, ``"larger_than"`` a layer
    whose outputs have more entries than the threshold; ``"activations"``
    recomputes the activation alone. Not from what Keras returns: Keras 3.16
    wraps every call that gets ``training`` (to keep it static), recomputed
    or not.

    >>> with keras.RematScope(mode="list_of_layers", layer_names=["b"]):
    ...     a, b = keras.layers.Dense(2, name="a"), keras.layers.Dense(2, name="b")
    >>> _keras_rematerializes(a, (), {}), _keras_rematerializes(b, (), {})
    (False, True)
    """
    scope = _compat.remat_scope(layer)
    kind = getattr(scope, "mode", None)
    if kind == "full":
        return True
    if kind == "list_of_layers":
        return layer.name in scope.layer_names
    if kind == "larger_than":
        spec = layer.compute_output_spec(*args, **kwargs)
        size = sum(
            math.prod(d or 1 for d in x.shape)
            for x in keras.tree.flatten(spec)
            if isinstance(x, keras.KerasTensor)
        )
        return size > scope.output_size_threshold
    return False


def _rematerialized(layer, layer_call, wrapped, args, kwargs):
    """What ``Layer.rematerialized_call`` returns for a partial layer.

    ``wrapped`` is Keras' answer for ``layer_call`` called with ``args`` and
    ``kwargs``. A partial ``Dense`` or ``EinsumDense`` in the ``"delta"`` form
    that Keras recomputes (:func:`_keras_rematerializes`) recomputes its own
    product instead (see the module docstring); other layers, and every
    layer Keras does not recompute, keep Keras' answer.
    """
    if (
        layer.partial_weight.mode != "delta"
        or layer.partial_weight.quantized is not None
        or not ops._is_product(layer._partial_slice_axes())
        or not _keras_rematerializes(layer, args, kwargs)
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


# The partial class of each plain class.
_PLAIN_TO_PARTIAL: dict[type, type] = {}
# plain class: its weights that can be partial, the default first, each with
# whether it is a plain attribute
_SPECS: dict[type, tuple[tuple[str, bool], ...]] = {}
# Classes of other packages, known by module and name (never imported here).
_BY_NAME = {
    ("keras_hub.src.layers.modeling.position_embedding", "PositionEmbedding"): (
        ("position_embeddings", True),
    ),
}
_ON_DEMAND_NAME = "refimpl>PartialLayer"
# The weights a class's layer multiplies a whole sequence by, under Keras'
# PyTorch backend (its LSTM and GRU, on the CPU): read as trainable when
# frozen beside a partial weight (PartialWeightMixin._partial_other).
_READ_AS_TRAINED = {
    keras.layers.LSTMCell: ("kernel",),
    keras.layers.GRUCell: ("kernel",),
}


def _make(plain_class, targets=(("kernel", False),), on_demand=False):
    name = f"Partial{plain_class.__name__}"
    names = " or ".join(f"``{target}``" for target, _ in targets)
    namespace = {
        "_partial_target": targets[0][0],
        "_partial_attributes": dict(targets),
        "_partial_on_demand": on_demand,
        "_partial_read_as_trained": next(
            (
                names
                for c, names in _READ_AS_TRAINED.items()
                if issubclass(plain_class, c)
            ),
            (),
        ),
        "__module__": __name__,
        "__qualname__": name,
        "__doc__": (
            f"A ``{plain_class.__module__.split('.')[0]}`` "
            f"``{plain_class.__name__}`` whose {names} is trainable only "
            "at some entries: made by "
            ":func:`refimpl.partialize <refimpl.convert.partialize>` or "
            ":func:`refimpl.enable_partial "
            "<refimpl.layers.partial.enable_partial>`."
        ),
    }
    for target, attribute in targets:
        namespace[target] = _composing(plain_class, target, attribute)
    call = _product_call(plain_class)
    if call is not None:
        namespace["call"] = call
    cls = type(name, (PartialWeightMixin, plain_class), namespace)
    _SPECS[plain_class] = tuple(targets)
    if on_demand:
        _compat.register_under(cls, _ON_DEMAND_NAME, _Loader)
    else:
        keras.saving.register_keras_serializable(package="refimpl", name=name)(cls)
    _PLAIN_TO_PARTIAL[plain_class] = cls
    return cls


class _Loader:
    """Rebuilds an on-demand partial class from the plain class its config names."""

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        ref = config.pop("plain_class")
        plain = keras.saving.get_registered_object(ref["registered_name"])
        if plain is None:
            plain = vars(importlib.import_module(ref["module"]))[ref["class_name"]]
        return partial_class(plain).from_config(config)


# The one name of the on-demand classes loads in a fresh process, before any
# of them is made there.
keras.saving.get_custom_objects()[_ON_DEMAND_NAME] = _Loader


@keras.saving.register_keras_serializable(package="refimpl")
class PartialDense(PartialWeightMixin, keras.layers.Dense):
    """A ``keras.layers.Dense`` whose kernel is trainable only in a mask.

    The partial class of
    `Dense <https://keras.io/api/layers/core_layers/dense/>`__: what
    :func:`refimpl.partialize <refimpl.convert.partialize>` and
    :func:`~refimpl.layers.partial.enable_partial` make of a Dense layer, and the
    layer to build from a mask. The ``Dense`` arguments work as for Dense, with
    two limits: a ``kernel_regularizer`` must be elementwise (L1, L2 or L1L2),
    and a ``kernel_constraint`` must act on each entry alone (``NonNeg``);
    others raise ``ValueError``. The kernel initializer draws the whole
    starting kernel (the frozen entries and the free values' start).

    Args:
        units: the output size, as for Dense.
        trainable_mask: the trainable kernel entries: a boolean mask of shape
            ``[input_dim, units]`` or an index list of shape ``[k, 2]``.
        mode: the form (see :ref:`the forms <api-forms>`); ``"slices"`` for
            whole rows, columns or a block of the kernel.
        rest_trainable: whether the bias trains (``False`` is what
            :func:`refimpl.partialize <refimpl.convert.partialize>` gives a converted
            layer).
        **kwargs: every other ``keras.layers.Dense`` argument.

    Loading a saved layer also passes ``num_free`` and ``auto``; you never pass
    them. (They rebuild a :term:`shell`, an empty layer with ``num_free`` free
    values whose positions and values come with the saved weights, and
    ``auto`` says whether its mode was ``"auto"``.)

    Attributes:
        partial_weight: the :class:`~refimpl.partial.PartialWeight` of the
            kernel: its ``free`` values (the weight ``partial_free``), their
            ``positions`` (``partial_positions``), the frozen ``base`` (the
            layer's own ``kernel`` variable), ``mask`` and ``num_free``.

    The classes that :func:`refimpl.partialize <refimpl.convert.partialize>`
    makes for other layers (``PartialConv2D``, ...) hold the same two weights;
    they are made from a built layer, by ``partialize`` or
    :func:`~refimpl.layers.partial.enable_partial`, not constructed directly.
    Besides :meth:`from_dense` and ``kernel``, every member (``partial_weight``,
    ``freeze_rest``, ``fold``, ``to_dense``) is that of every partial layer:
    see :class:`~refimpl.layers.partial.PartialWeightMixin`.

    >>> from refimpl import PartialDense
    >>> layer = PartialDense(2, [[0, 0], [2, 1]], use_bias=False)
    >>> layer.build((None, 3))
    >>> [(w.name, tuple(w.shape), w.trainable) for w in layer.weights]
    [('kernel', (3, 2), False), ('partial_free', (2,), True), \
('partial_positions', (2,), False)]
    """

    kernel = _composing(keras.layers.Dense, "kernel")
    _partial_sparse_product = True

    def __init__(
        self,
        units,
        trainable_mask=None,
        *,
        mode: str = "delta",
        num_free: int | None = None,
        auto: bool = False,
        rest_trainable: bool = True,
        **kwargs,
    ):
        super().__init__(_check_int(units, "units", minimum=1), **kwargs)
        _check_mode(mode, allowed=_LAYER_MODES)
        shape = None if trainable_mask is None else _mask_shape(trainable_mask)
        if shape is not None and shape[1:] != (self.units,):
            raise ValueError(
                f"`trainable_mask` must have shape [input_dim, {self.units}]. "
                f"Received a mask of shape {shape}"
            )
        if trainable_mask is None and num_free is None:
            raise ValueError(
                "`trainable_mask` is required: a boolean mask of shape "
                f"[input_dim, {self.units}] or an index list of shape [k, 2]. "
                "Received: trainable_mask=None"
            )
        if trainable_mask is not None and num_free is not None:
            raise ValueError(
                "`num_free` is only for a shell rebuilt from a config, which has "
                "no `trainable_mask`: give one or the other. "
                f"Received: num_free={_describe(num_free)} with a trainable_mask"
            )
        _check_constraint(self.kernel_constraint, self.name)
        regularizer = self.kernel_regularizer
        if not _splittable_regularizer(regularizer):
            raise ValueError(
                "`kernel_regularizer` must be elementwise (L1, L2 or L1L2) to be "
                "split between free and frozen entries. Received: "
                f"kernel_regularizer={type(regularizer).__name__}"
            )
        if not isinstance(rest_trainable, bool):
            raise TypeError(
                "`rest_trainable` must be True or False. "
                f"Received: rest_trainable={_describe(rest_trainable)}"
            )
        self._partial_rest_frozen = not rest_trainable
        self._partial_given = (trainable_mask, mode)
        self._partial_shell = None
        if trainable_mask is None:
            self._partial_shell = (num_free, mode, bool(auto))

    def build(self, input_shape):
        keras.layers.Dense.build(self, input_shape)
        shell = getattr(self, "_partial_shell", None)
        given = getattr(self, "_partial_given", (None, None))
        if shell is not None:
            self._partial_add_weights(shell[0], None, shell[1], shell[2])
            _adapter_table.build_shell(self)
        elif given[0] is not None:
            base = _compat.own_weight(self, "kernel")
            mask = to_mask(given[0], _weight_shape(self, base), name="trainable_mask")
            positions = np.flatnonzero(mask)
            self._partial_add_weights(len(positions), positions, given[1], False)
        if self._partial_rest_frozen:
            self.freeze_rest()

    def call(self, inputs, training=None):
        if _adapter_table.mixed(self):
            return _adapter_table.mixed_output(self, inputs)
        if _takes_over(self):
            return _output(self, inputs)
        holder = self.__dict__.get("partial_weight")
        if holder is None or holder.product_mode() != "sparse":
            return super().call(inputs, training=training)
        holder.check_loaded()
        x = sparse_matmul(
            inputs, holder.base.value, holder.positions.value, holder.free.value
        )
        if self.bias is not None:
            x = keras.ops.add(x, self.bias)
        return self.activation(x) if self.activation is not None else x

    @classmethod
    def from_config(cls, config):
        """A shell of the saved layer; its values come with its weights.

        Returns:
            An unbuilt ``PartialDense``, usable once its weights load.
        """
        config = dict(config)
        adapters = _adapter_table.pop_record(config)
        if config.get("quantization_config") is not None:  # as Dense reads it
            config["quantization_config"] = keras.saving.deserialize_keras_object(
                config["quantization_config"]
            )
        layer = cls(**config)
        if adapters is not None:  # a layer with adapters saved
            layer.__dict__["_adapter_shell"] = adapters
        return layer

    @classmethod
    def from_dense(cls, dense, trainable_mask, *, mode: str = "delta") -> PartialDense:
        """A partial copy of a built ``keras.layers.Dense``; ``dense`` is unchanged.

        Returns:
            A built ``PartialDense`` whose kernel, bias and outputs equal the
            Dense layer's, bit for bit.

        >>> from refimpl import PartialDense
        >>> dense = keras.layers.Dense(2)
        >>> dense.build((None, 3))
        >>> layer = PartialDense.from_dense(dense, np.eye(3, 2, dtype=bool))
        >>> kernel = keras.ops.convert_to_numpy(layer.kernel)
        >>> bool(np.array_equal(kernel, keras.ops.convert_to_numpy(dense.kernel)))
        True
        """
        if type(dense) is not keras.layers.Dense or not dense.built:
            raise TypeError(
                "`dense` must be a built keras.layers.Dense. "
                f"Received: dense={_describe(dense)}"
            )
        kernel_shape = tuple(dense.kernel.shape)
        to_mask(trainable_mask, kernel_shape, name="trainable_mask")  # names it
        copy = keras.layers.Dense.from_config(dense.get_config())
        copy.build_from_config(dense.get_build_config())
        copy.set_weights([np.array(w) for w in dense.get_weights()])
        enable_partial(copy, trainable_mask, mode=mode)
        return copy


_PLAIN_TO_PARTIAL[keras.layers.Dense] = PartialDense
_SPECS[keras.layers.Dense] = (("kernel", False),)


_KERNEL = (("kernel", False),)
_EMBEDDINGS = (("embeddings", False),)
_ATTRIBUTE = (("kernel", True),)
for _plain, _targets in (
    (keras.layers.EinsumDense, _KERNEL),
    (keras.layers.Conv1D, _KERNEL),
    (keras.layers.Conv2D, _KERNEL),
    (keras.layers.Conv3D, _KERNEL),
    (keras.layers.Embedding, _EMBEDDINGS),
    (keras.layers.ReversibleEmbedding, _EMBEDDINGS),
    (keras.layers.Conv1DTranspose, _ATTRIBUTE),
    (keras.layers.Conv2DTranspose, _ATTRIBUTE),
    (keras.layers.Conv3DTranspose, _ATTRIBUTE),
    (keras.layers.DepthwiseConv1D, _ATTRIBUTE),
    (keras.layers.DepthwiseConv2D, _ATTRIBUTE),
    (
        keras.layers.SeparableConv1D,
        (("depthwise_kernel", True), ("pointwise_kernel", True)),
    ),
    (
        keras.layers.SeparableConv2D,
        (("depthwise_kernel", True), ("pointwise_kernel", True)),
    ),
    (keras.layers.SimpleRNNCell, (("kernel", True), ("recurrent_kernel", True))),
    (keras.layers.LSTMCell, (("kernel", True), ("recurrent_kernel", True))),
    (keras.layers.GRUCell, (("kernel", True), ("recurrent_kernel", True))),
):
    _make(_plain, _targets)

#: The partial class of each supported Keras layer class, a read-only mapping
#: (``_PARTIAL_CLASSES[keras.layers.Dense]`` is ``PartialDense``): every class
#: supported from the start, and a class made on first use (keras-hub's) once
#: :func:`partial_class` has made it.
_PARTIAL_CLASSES = types.MappingProxyType(_PLAIN_TO_PARTIAL)


def supported_classes() -> tuple[type, ...]:
    """The Keras layer classes that have a partial class (and keras-hub's, once
    made: its ``ReversibleEmbedding`` and ``PositionEmbedding``).

    Returns:
        A tuple of Keras layer classes.

    >>> from refimpl.layers.partial import supported_classes
    >>> keras.layers.Conv2D in supported_classes()
    True
    """
    return tuple(_PLAIN_TO_PARTIAL)


def _spec(layer_class):
    if layer_class in _SPECS:
        return _SPECS[layer_class]
    key = (layer_class.__module__, layer_class.__name__)
    if key in _BY_NAME:
        return _BY_NAME[key]
    if layer_class.__module__.split(".")[0] in ("keras", "keras_hub"):
        for base in layer_class.__mro__[1:]:
            if base in _SPECS:
                return _SPECS[base]
    return None


def _is_supported(layer_class) -> bool:
    """Whether a layer class has (or can be given) a partial class.

    Returns:
        A Python ``bool``.

    >>> from refimpl.layers.partial import _is_supported
    >>> _is_supported(keras.layers.Embedding), _is_supported(keras.layers.Dropout)
    (True, False)
    """
    return isinstance(layer_class, type) and (
        layer_class in _PLAIN_TO_PARTIAL.values() or _spec(layer_class) is not None
    )


def _supported_names() -> list[str]:
    """The names an error message lists."""
    names = [c.__name__ for c in _PLAIN_TO_PARTIAL]
    return sorted(set(names) | {"PositionEmbedding"})


def partial_class(layer_class: type) -> type:
    """The partial class of a Keras layer class (``PartialDense`` for ``Dense``).

    Returns:
        The partial class (a ``type``), a subclass of ``layer_class``.

    Raises:
        TypeError: for a class this mechanism does not support.

    >>> from refimpl.layers.partial import partial_class
    >>> partial_class(keras.layers.Conv2D).__name__
    'PartialConv2D'
    """
    if layer_class in _PLAIN_TO_PARTIAL.values():
        return layer_class
    if layer_class in _PLAIN_TO_PARTIAL:
        return _PLAIN_TO_PARTIAL[layer_class]
    spec = _spec(layer_class) if isinstance(layer_class, type) else None
    if spec is None:
        raise TypeError(
            "`layer_class` must be one of the layers with a kernel or an "
            f"embedding table: {_supported_names()}. Received: "
            f"{getattr(layer_class, '__name__', _describe(layer_class))}"
        )
    return _make(layer_class, spec, on_demand=True)


def _weight_names(layer) -> tuple[str, ...]:
    """The weights of ``layer`` that can be partial, the default first.

    >>> from refimpl.layers.partial import _weight_names
    >>> _weight_names(keras.layers.LSTMCell(2))
    ('kernel', 'recurrent_kernel')
    """
    if isinstance(layer, PartialWeightMixin):
        return tuple(layer._partial_attributes)
    return tuple(name for name, _ in _spec(type(layer)))


def _target_weight(layer, weight: str | None = None):
    """The variable a partial form of ``layer`` freezes: its kernel (or
    embeddings), or the weight named ``weight`` (``"recurrent_kernel"``).

    Returns:
        The ``keras.Variable`` (the base, once ``layer`` is partial).

    >>> from refimpl.layers.partial import _target_weight
    >>> layer = keras.layers.Embedding(3, 2, name="emb")
    >>> layer.build((None,))
    >>> _target_weight(layer).path
    'emb/embeddings'
    """
    if isinstance(layer, PartialWeightMixin) and weight in (
        None,
        layer._partial_target,
    ):
        return layer._partial_base()
    specs = dict(
        layer._partial_attributes
        if isinstance(layer, PartialWeightMixin)
        else _spec(type(layer))
    )
    weight = weight or next(iter(specs))
    if specs[weight]:
        return layer.__dict__[weight]
    return _compat.own_weight(layer, weight)


def enable_partial(
    layer, mask, *, mode: str = "delta", weight: str | None = None
) -> None:
    """Make a built layer's kernel (or embeddings) trainable only in ``mask``.

    In place, like Keras' ``enable_lora``: the layer becomes an instance of
    its :func:`~refimpl.layers.partial.partial_class`, its weight becomes the frozen
    base, and its
    outputs do not change. Unlike :func:`~refimpl.convert.partialize`, this
    freezes nothing else: the layer's bias and other weights keep training
    (:meth:`layer.freeze_rest() <refimpl.layers.partial.PartialWeightMixin.freeze_rest>`
    freezes them). Compile the model again after converting. For a sub-layer
    of a layer that builds its own sub-layers (a ``MultiHeadAttention``
    projection, a keras-hub block), convert the model with
    :func:`~refimpl.convert.partialize` instead, which also records such
    sub-layers in the model's config, so that the saved model reloads.

    Args:
        layer: a built layer of a supported class (not already partial).
        mask: the trainable entries of its ``kernel`` (``embeddings`` for an
            ``Embedding``): a boolean mask of the weight's shape or an index
            list (see :func:`refimpl.masks.to_mask`).
        mode: the form (see :ref:`the forms <api-forms>`): ``"delta"``,
            ``"select"`` or ``"auto"`` for every layer, ``"sparse"`` for a
            ``Dense`` layer, and ``"slices"`` for a weight free in whole
            slices:

            * a ``Dense`` or ``EinsumDense`` kernel: rows, columns, blocks,
              heads;
            * a convolution kernel: whole filters or input channels;
            * an ``Embedding`` table: whole rows.
        weight: which weight, for a layer with two that can be partial: a
            ``SeparableConv``'s ``"depthwise_kernel"`` (the default) or
            ``"pointwise_kernel"``, an RNN cell's ``"kernel"`` (the default)
            or ``"recurrent_kernel"``. One weight per layer is partial.

    Returns:
        ``None``; ``layer`` changes in place.

    Raises:
        TypeError: for a layer of another class.
        ValueError: for a layer that is not built, is already partial, uses
            LoRA or a quantization other than a Dense's or EinsumDense's int8
            or int4 (:mod:`refimpl.quantized`), has a regularizer or
            constraint that is not elementwise, or a mask that does not fit.

    >>> from refimpl import enable_partial
    >>> layer = keras.layers.Dense(2)
    >>> layer.build((None, 3))
    >>> enable_partial(layer, [[0, 0], [2, 1]])
    >>> type(layer).__name__, layer.partial_weight.num_free
    ('PartialDense', 2)
    >>> layer.partial_weight.base.trainable
    False
    """
    if not isinstance(layer, keras.layers.Layer):
        raise TypeError(
            f"`layer` must be a Keras layer. Received: layer={_describe(layer)}"
        )
    if isinstance(layer, PartialWeightMixin):
        raise ValueError(
            f"`layer` is already partially trainable. Received: layer={layer.name!r}"
        )
    plain = type(layer)
    if not _is_supported(plain):
        raise TypeError(
            f"`layer` must be one of {_supported_names()}, "
            f"whose weight this mechanism knows. Received: layer {layer.name!r} "
            f"of type {plain.__name__}"
        )
    _check_mode(mode, allowed=_LAYER_MODES)
    if not layer.built:
        raise ValueError(
            f"`layer` must be built (call the model once). Received: {layer.name!r}"
        )
    if getattr(layer, "lora_enabled", False):
        raise ValueError(
            f"`layer` uses LoRA, which a partial weight does not combine with. "
            f"Received: {layer.name!r}"
        )
    quantization = getattr(layer, "quantization_mode", None)
    if quantization and not quantized.combines(layer, quantization):
        raise quantized.refusal(layer, quantization, argument="layer", order="other")
    names = _weight_names(layer)
    if weight is not None and weight not in names:
        raise ValueError(
            f"`weight` must be one of {list(names)} for layer {layer.name!r} of "
            f"type {plain.__name__}. Received: weight={_describe(weight)}"
        )
    weight = weight or names[0]
    base = _target_weight(layer, weight)
    target = base.path.split("/")[-1]
    if not _splittable_regularizer(base.regularizer):
        raise ValueError(
            f"`layer` {layer.name!r} has a regularizer on its {target} that is "
            "not elementwise (L1, L2 or L1L2), so it cannot be split between "
            f"free and frozen entries. Received: {target}_regularizer="
            f"{type(base.regularizer).__name__}"
        )
    _check_constraint(base.constraint, layer.name)
    bool_mask = to_mask(mask, _weight_shape(layer, base), name="mask")
    _check_layout(layer, base, bool_mask, mode, weight)
    positions = np.flatnonzero(bool_mask)
    layer.__class__ = partial_class(plain)
    layer._partial_target = weight
    try:
        layer._partial_add_weights(len(positions), positions, mode, False)
    except Exception:
        # Refused before any weight was added: the layer stays as it was.
        layer.__dict__.pop("_partial_target", None)
        layer.__class__ = plain
        raise


def _check_layout(layer, base, mask, mode, weight=None) -> None:
    """Refuse, before converting, what the weights of ``mode`` cannot take:
    a ``LayoutMap`` entry named for a partial weight that does not fit it,
    or a mask of other than whole slices for ``"slices"``."""
    num_free = int(np.count_nonzero(mask))
    shape = _weight_shape(layer, base)
    quantized_base = _is_quantized_kernel(layer, base)
    if mode == "select" and quantized_base:
        raise _select_refusal(layer)
    if mode == "slices":
        positions = np.flatnonzero(to_mask(mask, shape, name="mask"))
        name = weight or _weight_names(layer)[0]
        ops._check_slices(layer, positions, shape, name)
    if mode == "auto":
        mode = _mode_for(num_free, shape, jit_compile=False)
        if mode == "select" and quantized_base:
            mode = "delta"
    _layouts.check_named(layer, base, num_free, select=mode == "select")


def _make_shell(
    layer,
    *,
    num_free: int,
    mode: str,
    auto: bool,
    rest_trainable: bool = True,
    target: str | None = None,
    adapters: dict | None = None,
) -> None:
    """Turn a built plain ``layer`` into a partial shell, in place.

    Called by loaders (a user does not need it): a shell's free values and
    positions come with the saved weights; :mod:`refimpl.layers.partial` says what
    a rebuilt host does to its sub-layers.

    >>> from refimpl.layers.partial import _make_shell
    >>> layer = keras.layers.Dense(2)
    >>> layer.build((None, 3))
    >>> _make_shell(layer, num_free=2, mode="delta", auto=False)
    >>> type(layer).__name__, tuple(layer.partial_weight.free.shape)
    ('PartialDense', (2,))
    """
    layer.__class__ = partial_class(type(layer))
    layer._partial_target = target or layer._partial_target
    layer._partial_add_weights(num_free, None, mode, auto)
    if adapters is not None:  # a layer with adapters saved
        layer.__dict__["_adapter_shell"] = adapters
    _adapter_table.build_shell(layer)
    if not rest_trainable:
        layer.freeze_rest()


# -- hosts: partial layers inside layers that build their own sub-layers ------
# Partial layers inside layers that build their own sub-layers.
#
# A ``MultiHeadAttention`` builds its projections in its own ``build``; a
# keras-hub ``TransformerDecoder`` builds its attention and feed-forward layers
# there; a keras-hub backbone builds every layer in its constructor. Their
# configs hold their own arguments, not their sub-layers' configs, so a model
# rebuilt from its config has *plain* sub-layers where the saved model had
# partial ones, and their saved weights do not fit.
#
# A **host** is a layer whose config does not record its sub-layers (any layer
# except a plain functional or ``Sequential`` model and the wrappers
# ``TimeDistributed`` and ``Bidirectional``; a subclass of a model, such as a
# keras-hub backbone, is a host: :func:`_is_container`). A partial layer's host
# is the outermost such layer above it, if any. ``_mark_hosts``
# gives each host a subclass of its own class (``PartialMultiHeadAttention``,
# ``PartialGPT2Backbone``) whose config adds what its partial sub-layers need:
# their paths, free counts and modes, and which sub-layers are frozen. Loading
# rebuilds the plain host from its own config, then turns those sub-layers into
# shells that the saved weights fill. :func:`_unmark_hosts` gives the plain class
# back, as :func:`refimpl.merge <refimpl.convert.merge>` does.

#: The one registered name of every host class; its loader is :class:`_Loader`.
_HOST_NAME = "refimpl>PartialHost"

_HOST_CLASSES: dict[type, type] = {}


def _is_container(layer) -> bool:
    """Whether ``layer``'s config holds its sub-layers' configs (and classes).

    Returns:
        A Python ``bool``.

    >>> from refimpl.layers.partial import _is_container
    >>> _is_container(keras.Sequential()), _is_container(keras.layers.Dense(1))
    (True, False)
    """
    return type(layer) in (
        _compat.Functional,
        keras.Sequential,
        keras.layers.TimeDistributed,
        keras.layers.Bidirectional,
    )


class _HostMixin:
    """What a host class adds to its plain class: the partial sub-layers' record."""

    def get_config(self) -> dict:
        plain = self._host_plain
        return {
            "layer": {
                "module": plain.__module__,
                "class_name": plain.__name__,
                "registered_name": keras.saving.get_registered_name(plain),
                "config": plain.get_config(self),
                "build_config": self.get_build_config(),
            },
            "partial": [
                {"path": _relative(self, sub), **sub._partial_record()}
                for sub in _compat.sub_layers(self)
                if isinstance(sub, PartialWeightMixin)
            ],
            "frozen": [
                _relative(self, sub)
                for sub in _compat.sub_layers(self)
                if not sub.trainable and sub.path
            ],
            **_quantized_record(self),
        }

    @classmethod
    def from_config(cls, config):
        return _Loader.from_config(config)


class _Loader:
    """Rebuilds a host from its config: the plain layer, then its shells."""

    @classmethod
    def from_config(cls, config):
        layer = keras.saving.deserialize_keras_object(config["layer"])
        _requantize(layer, config.get("quantized", ()))
        _install(layer, config["partial"], config.get("frozen", ()))
        return layer


def _quantized_record(host) -> dict:
    """The sub-layers of ``host`` that Keras quantized (its plain config does
    not record them: a ``MultiHeadAttention``'s projections after
    ``model.quantize``), by path, with their mode and quantization config;
    nothing for a host without any."""
    record = [
        {
            "path": _relative(host, sub),
            "mode": mode,
            "config": keras.saving.serialize_keras_object(
                getattr(sub, "quantization_config", None)
            ),
        }
        for sub in _compat.sub_layers(host)
        if (mode := getattr(_compat.layer_policy(sub), "quantization_mode", None))
    ]
    return {"quantized": record} if record else {}


def _requantize(layer, records) -> None:
    """Quantize the sub-layers of a rebuilt plain host that Keras had
    quantized when it was saved (:func:`_quantized_record`), as Keras
    quantizes them, before they become shells and the saved weights fill them."""
    if not records:
        return
    _compat.resolve_policy_maps(layer)  # Keras' quantize misreads a map
    by_path = {_relative(layer, sub): sub for sub in _compat.sub_layers(layer)}
    for record in records:
        sub = by_path.get(record["path"])
        if sub is None:
            raise ValueError(
                f"Layer {layer.name!r} ({type(layer).__name__}) was rebuilt "
                f"without a sub-layer at {record['path']!r}, where the saved "
                f"model has a layer Keras quantized in {record['mode']!r}: the "
                "layer's code builds different sub-layers than when it was saved."
            )
        if getattr(_compat.layer_policy(sub), "quantization_mode", None) is None:
            sub.quantize(
                record["mode"],
                config=keras.saving.deserialize_keras_object(record["config"]),
                type_check=False,
            )


# The one name of every host class loads in a fresh process, before any host
# class is made there.
keras.saving.get_custom_objects()[_HOST_NAME] = _Loader


def _host_class(plain: type) -> type:
    """The host class of a layer class, made once.

    Every host class is registered under one name, ``refimpl>PartialHost``
    (its loader rebuilds the plain layer, then its partial sub-layers).

    >>> from refimpl.layers.partial import _host_class
    >>> host = _host_class(keras.layers.MultiHeadAttention)
    >>> host.__name__, host is _host_class(keras.layers.MultiHeadAttention)
    ('PartialMultiHeadAttention', True)
    """
    if issubclass(plain, _HostMixin):
        return plain
    if plain not in _HOST_CLASSES:
        name = f"Partial{plain.__name__}"
        cls = type(
            name,
            (_HostMixin, plain),
            {
                "_host_plain": plain,
                "__module__": __name__,
                "__qualname__": name,
                "__doc__": (
                    f"A ``{plain.__name__}`` that holds partial sub-layers: "
                    "made by :func:`refimpl.partialize <refimpl.convert.partialize>`."
                ),
                **(
                    {"enable_lora": _enable_lora}
                    if hasattr(plain, "default_lora_layer_names")
                    else {}
                ),
            },
        )
        _compat.register_under(cls, _HOST_NAME, _Loader)
        _HOST_CLASSES[plain] = cls
    return _HOST_CLASSES[plain]


def _enable_lora(self, *args, **kwargs):
    """keras-hub's ``Backbone.enable_lora``, refused before it changes anything
    when it would reach a partial layer (it freezes every layer, then enables
    LoRA layer by layer, and a partial layer refuses it)."""
    plain = self._host_plain.enable_lora
    try:
        given = inspect.signature(plain).bind(self, *args, **kwargs).arguments
    except TypeError:
        return plain(self, *args, **kwargs)  # keras-hub's own message
    names = given.get("target_layer_names")
    if names is None:
        names = self.default_lora_layer_names()
    reached = [
        f"{sub.path or sub.name!r} ({type(sub).__name__})"
        for sub in _compat.sub_layers(self)
        if isinstance(sub, PartialWeightMixin) and sub.name in names
    ]
    if reached:
        raise ValueError(
            f"`enable_lora` would apply LoRA to {len(reached)} partially "
            f"trainable layer(s) of {self.name!r}, whose free values would "
            "overwrite LoRA's update (and `merge` would add it twice): "
            f"{', '.join(reached)}. Nothing was changed. Merge first "
            "(`refimpl.merge(model)`) and enable LoRA on the merged model, or "
            "leave these layers out of `target_layer_names`. Received: "
            f"target_layer_names={list(names)}"
        )
    return plain(self, *args, **kwargs)


def _install(layer, records, frozen=()) -> None:
    """Make a rebuilt plain ``layer`` a host again: its sub-layers become shells."""
    by_path = {_relative(layer, sub): sub for sub in _compat.sub_layers(layer)}
    for record in records:
        record = dict(record)
        path = record.pop("path")
        sub = by_path.get(path)
        if sub is None:
            raise ValueError(
                f"Layer {layer.name!r} ({type(layer).__name__}) was rebuilt "
                f"without a sub-layer at {path!r}, where the saved model has a "
                "partial layer: the layer's code builds different sub-layers "
                "than when it was saved."
            )
        if not isinstance(sub, PartialWeightMixin):
            _make_shell(sub, **record)
    for path in frozen:
        if path in by_path:
            by_path[path].trainable = False
    layer.__class__ = _host_class(type(layer))


def _mark_hosts(model) -> list:
    """Give every host of a partial layer in ``model`` its host class.

    ``model`` is a Keras model or layer.

    :func:`refimpl.partialize <refimpl.convert.partialize>` calls it; call it
    yourself after
    :func:`refimpl.enable_partial <refimpl.layers.partial.enable_partial>` on a
    sub-layer of a host (an attention layer's projection, say), before saving.

    Returns:
        The hosts it marked, outermost first.

    >>> from refimpl.layers.partial import _mark_hosts
    >>> from refimpl import enable_partial
    >>> attention = keras.layers.MultiHeadAttention(2, 4, kernel_initializer="zeros")
    >>> attention.build((None, 3, 8), (None, 3, 8))
    >>> enable_partial(attention.query_dense, [[0, 0, 0]])
    >>> [type(host).__name__ for host in _mark_hosts(attention)]
    ['PartialMultiHeadAttention']
    """
    hosts: dict[int, object] = {}

    def walk(layer, host):
        for child in _compat.child_layers(layer):
            if isinstance(child, PartialWeightMixin):
                if host is not None:
                    hosts[id(host)] = host
                continue
            walk(child, host if host is not None or _is_container(child) else child)

    walk(model, None if _is_container(model) else model)
    for host in hosts.values():
        if not isinstance(host, _HostMixin):
            host.__class__ = _host_class(type(host))
    return list(hosts.values())


def _unmark_hosts(model) -> None:
    """Give every host in ``model`` (and ``model`` itself) its plain class back.

    Returns:
        ``None``; the hosts change class in place.

    >>> from refimpl.layers.partial import _mark_hosts, _unmark_hosts
    >>> from refimpl import enable_partial
    >>> attention = keras.layers.MultiHeadAttention(2, 4, kernel_initializer="zeros")
    >>> attention.build((None, 3, 8), (None, 3, 8))
    >>> enable_partial(attention.query_dense, [[0, 0, 0]])
    >>> _ = _mark_hosts(attention)
    >>> _unmark_hosts(attention)
    >>> type(attention).__name__
    'MultiHeadAttention'
    """
    for layer in [model, *_compat.sub_layers(model)]:
        if isinstance(layer, _HostMixin):
            layer.__class__ = layer._host_plain


def _relative(host, sub) -> str:
    path = sub.path or sub.name
    prefix = (host.path or host.name) + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path
