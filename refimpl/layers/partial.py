"""One mechanism for a Keras layer whose weight is trainable only at some entries.

It is the pattern of Keras' own ``Dense.enable_lora`` and of
``torch.nn.utils.parametrize``, for each layer class that
:func:`~refimpl.layers.classes.supported_classes` lists (``Dense``,
``EinsumDense``, the convolutions, the embeddings, the RNN cells). One weight
per layer is partial, the one :func:`~refimpl.layers.classes.target_weight`
names (the ``kernel`` or ``embeddings``, or another such as
``recurrent_kernel``):

* the layer's own weight stays where it is, as the frozen **base**
  (``trainable=False``);
* two weights are added: ``partial_free``, the ``k`` trainable values (in the
  ``"select"`` form a kernel-sized weight, with kernel-sized optimizer state), and
  ``partial_positions``, their flat positions (non-trainable, int32, int64
  above 2**31 entries);
* the weight's property (``kernel``, ``embeddings``) returns the base with the free
  values written in (:func:`refimpl.ops.compose`), so the layer's own ``call``
  runs unchanged, and every output equals the original layer's bit for bit
  until the free values move.

Each partial class is a subclass of the plain one with a name of its own
(``PartialConv2D``, registered as ``refimpl>PartialConv2D``);
:class:`~refimpl.layers.dense.PartialDense` can also be built from a mask. An
optimizer sees only the free values (``k`` values of state per slot; as many
as the weight has entries in the ``"select"`` form), so frozen entries keep
their bits under every optimizer. A reloaded layer has the same weights bit for bit;
:meth:`~PartialWeightMixin.to_dense` and
:func:`refimpl.merge <refimpl.convert.merge>` give the plain layer back.
"""

from __future__ import annotations

import gc

import keras
import numpy as np

from refimpl import _compat, _layouts, _slices, backend
from refimpl.layers import _products
from refimpl.layers._pieces import (
    _count,
    _is_partial_weight,
)
from refimpl.ops import (
    SelectMask,
    compose,
    index_dtype,
    mode_for,
    xla_enabled,
)
from refimpl.ops import (
    initializer as _constant,
)

__all__ = ["PartialWeightMixin"]


def _plain_class(layer) -> type:
    """The plain Keras class of a partial layer (``Conv2D`` for ``PartialConv2D``)."""
    return next(c for c in type(layer).__mro__ if not issubclass(c, PartialWeightMixin))


class PartialWeightMixin:
    """What a partial class adds to its Keras class: the members below, which
    every partial layer has (:class:`~refimpl.layers.dense.PartialDense`,
    ``PartialConv2D``, ...).

    >>> from refimpl import enable_partial
    >>> from refimpl.layers.partial import PartialWeightMixin
    >>> layer = keras.layers.Embedding(3, 2)
    >>> layer.build((None,))
    >>> enable_partial(layer, [[2, 0], [2, 1]])  # the last row
    >>> isinstance(layer, PartialWeightMixin), layer.num_free
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

    # -- the weight the layer's call reads ----------------------------------
    def _partial_value(self, value):
        free = getattr(self, "partial_free", None)
        if free is None:
            return value
        self._partial_check_loaded()
        positions = self.partial_positions
        if self._partial_mode == "select":
            mask = self._partial_select(positions)
            value = compose(
                value, positions.value, free.value, mode="select", mask=mask
            )
        else:
            value = compose(value, positions.value, free.value)
        return _layouts.constrained(value, self._partial_base())

    def _partial_base(self):
        if self._partial_attributes.get(self._partial_target, False):
            return self.__dict__[self._partial_target]
        return getattr(self, "_" + self._partial_target)

    # -- creation --------------------------------------------------------------
    def _partial_add_weights(self, num_free, positions, mode, auto):
        base = self._partial_base()
        shape = tuple(base.shape)
        size = int(np.prod(shape))
        if mode == "auto":
            mode = mode_for(num_free, shape, jit_compile=False)
            auto = mode != "select"
            # Whole rows or columns (slices that span an axis) below half
            # a Dense or EinsumDense kernel: the benchmark's real-model rows
            # and columns.
            axes = self._partial_slice_axes()
            if num_free < size / 2 and _slices.is_matrix_product(axes):
                sets = positions is not None and _slices.rectangle(positions, shape)
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
        base.trainable = False
        flat = None if positions is None else keras.ops.convert_to_numpy(base)
        if positions is None:  # a shell: the positions come with the weights
            start_positions = keras.initializers.Constant(size)
            start_free = "zeros"
        else:
            start_positions = _constant(positions)
            start_free = _constant(
                flat if mode == "select" else flat.ravel()[positions]
            )
        with (
            _compat.unlocked(self),
            _layouts.partial_weights(self, base, select=mode == "select"),
        ):
            self.partial_free = self.add_weight(
                name="partial_free",
                shape=shape if mode == "select" else (num_free,),
                initializer=start_free,
                dtype=base.dtype,
                # An elementwise penalty on the free values gives them the
                # plain layer's gradient; the frozen part is a constant.
                regularizer=base.regularizer,
                constraint=base.constraint,
            )
            self.partial_positions = self.add_weight(
                name="partial_positions",
                shape=(num_free,),
                initializer=start_positions,
                dtype=index_dtype(shape),
                trainable=False,
            )
        self._partial_num_free = int(num_free)
        self._partial_mode = mode
        self._partial_auto = bool(auto)
        self._partial_select = SelectMask(shape)
        self._partial_loaded = positions is not None
        self._partial_sets = (
            _slices.rectangle(positions, shape)
            if mode == "slices" and flat is not None
            else None
        )

    # -- the "slices" form (refimpl._slices) --------------------------------------
    def _partial_slice_axes(self):
        """Where each kernel axis goes in the product, or None: no slices form."""
        return _slices.layer_axes(self, self._partial_target)

    def _partial_check_slices(self, positions, shape):
        _slices.check(self, positions, shape, self._partial_target)

    def rematerialized_call(self, layer_call, *args, **kwargs):
        wrapped = super().rematerialized_call(layer_call, *args, **kwargs)
        if getattr(self, "partial_free", None) is None:
            return wrapped
        return _products.rematerialized(self, layer_call, wrapped)

    def build(self, input_shape):
        super().build(input_shape)
        shell = getattr(self, "_partial_shell", None)
        if shell is not None:
            self._partial_add_weights(shell[0], None, shell[1], shell[2])
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
        for variable in self.weights:
            if variable is not getattr(self, "partial_free", None):
                variable.trainable = False
        self._partial_rest_frozen = True

    def _partial_require_built(self, attribute: str) -> None:
        try:
            self._partial_mode  # noqa: B018  (set when the layer is built)
        except AttributeError:
            raise AttributeError(
                f"Build the layer before reading `{attribute}`. "
                f"Received: {self.name!r}, not built"
            ) from None

    def _partial_check_loaded(self):
        if self._partial_loaded:
            return
        size = int(np.prod(self._partial_base().shape))
        # None inside a JAX step, where the value is traced state: a layer
        # that was never checked eagerly cannot be trusted there.
        positions = backend.try_read_now(self.partial_positions)
        self._partial_loaded = positions is not None and not np.any(positions >= size)
        if not self._partial_loaded:
            raise _compat.require_loaded(f"Layer '{self.name}'")
        if self._partial_mode == "slices":
            shape = tuple(self._partial_base().shape)
            self._partial_check_slices(positions, shape)
            self._partial_sets = _slices.rectangle(positions, shape)

    def set_weights(self, weights):
        super().set_weights(weights)
        self._partial_loaded = False
        self._partial_check_loaded()

    # -- what it is --------------------------------------------------------------
    @property
    def trainable_mask(self) -> np.ndarray:
        """The boolean mask of the partial weight (``True`` = trainable).

        >>> from refimpl import enable_partial
        >>> layer = keras.layers.Dense(2)
        >>> layer.build((None, 3))
        >>> enable_partial(layer, [[0, 1], [2, 0]])
        >>> layer.trainable_mask.astype(int)
        array([[0, 1],
               [0, 0],
               [1, 0]])
        """
        self._partial_require_built("trainable_mask")
        self._partial_check_loaded()
        base = self._partial_base()
        mask = np.zeros(int(np.prod(base.shape)), bool)
        mask[backend.read_now(self.partial_positions)] = True
        return mask.reshape(tuple(base.shape))

    @property
    def base_weight(self):
        """The layer's own weight variable (with its ``path``), now the frozen
        base; ``layer.kernel`` (``embeddings``) is the composed tensor, as under
        Keras' LoRA.

        >>> from refimpl import enable_partial
        >>> layer = keras.layers.Dense(2, name="d")
        >>> layer.build((None, 3))
        >>> enable_partial(layer, [[0, 1]])
        >>> layer.base_weight.path, layer.base_weight.trainable
        ('d/kernel', False)
        """
        self._partial_require_built("base_weight")
        return self._partial_base()

    @property
    def num_free(self) -> int:
        """The number of trainable entries of the partial weight.

        >>> from refimpl import enable_partial
        >>> layer = keras.layers.Dense(2)
        >>> layer.build((None, 3))
        >>> enable_partial(layer, [[0, 1], [2, 0]], mode="select")
        >>> layer.num_free, tuple(layer.partial_free.shape)  # select: full-size
        (2, (3, 2))
        """
        self._partial_require_built("num_free")
        return self._partial_num_free

    @property
    def partial_mode(self) -> str:
        """The form in use (``"auto"`` resolved when built), one of ``"delta"``,
        ``"sparse"``, ``"select"`` and ``"slices"``."""
        self._partial_require_built("partial_mode")
        return self._partial_mode

    def product_mode(self) -> str:
        """The form the product uses in the step being traced.

        Returns:
            The form, as a ``str``: :attr:`partial_mode`, with one exception.
            A ``Dense`` layer whose kernel ``mode="auto"`` built in the
            ``"sparse"`` form gives ``"delta"`` when XLA compiles the step
            and at least :data:`~refimpl.ops.SPARSE_BELOW_DENSITY_XLA` of its
            entries are free (the two forms hold the same weights). Every
            other layer, ``EinsumDense`` and ``Embedding`` included, keeps its
            built form.

        >>> from refimpl import enable_partial
        >>> layer = keras.layers.Dense(100)
        >>> layer.build((None, 100))
        >>> enable_partial(layer, [[0, 0]], mode="auto")  # 1 of 10,000 free
        >>> layer.partial_mode, layer.product_mode()  # sparse with or without XLA
        ('sparse', 'sparse')
        """
        if not self._partial_auto or not xla_enabled():
            return self._partial_mode
        shape = tuple(self._partial_base().shape)
        return mode_for(self._partial_num_free, shape, jit_compile=True)

    # -- saving ------------------------------------------------------------------
    # Every variable as it is, as any Keras layer saves: the base untouched,
    # the free values and their positions, so a reloaded layer has the same
    # weights bit for bit. (The plain class saves its composed `kernel`.)
    def save_own_variables(self, store):
        keras.layers.Layer.save_own_variables(self, store)

    def load_own_variables(self, store):
        keras.layers.Layer.load_own_variables(self, store)
        self._partial_loaded = False
        self._partial_check_loaded()

    def get_config(self) -> dict:
        config = super().get_config()
        if hasattr(self, "_partial_num_free"):
            shell = (self._partial_num_free, self._partial_mode, self._partial_auto)
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
            from refimpl.layers.classes import plain_class_config

            config["plain_class"] = plain_class_config(self._partial_plain_class())
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        shell = (config.pop("num_free"), config.pop("mode"), config.pop("auto"))
        rest_trainable = config.pop("rest_trainable", True)
        target = config.pop("target", cls._partial_target)
        layer = super().from_config(config)
        layer._partial_target = target
        layer._partial_shell = shell
        layer._partial_rest_frozen = not rest_trainable
        return layer

    # -- the way out ---------------------------------------------------------------
    @classmethod
    def _partial_plain_class(cls):
        return next(c for c in cls.__mro__ if c in _PLAIN_TO_PARTIAL)

    def _partial_record(self) -> dict:
        """What a shell of this layer needs: its free count and its form."""
        return {
            "target": self._partial_target,
            "num_free": self._partial_num_free,
            "mode": self._partial_mode,
            "auto": self._partial_auto,
            "rest_trainable": not getattr(self, "_partial_rest_frozen", False),
        }

    def fold(self) -> None:
        """Turn this layer back into its plain class, in place, bit for bit.

        The trained weight is written into the layer's own variable, which
        trains again; ``partial_free`` and ``partial_positions`` are removed.
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
        self._partial_check_loaded()
        value = keras.ops.convert_to_numpy(getattr(self, self._partial_target))
        base = self._partial_base()
        for name in ("partial_free", "partial_positions"):
            # Keras' Layer.__delattr__ without its gc.collect() per variable,
            # which took most of the time of merging a model of many layers.
            self._untrack_variable(getattr(self, name))
            super(keras.layers.Layer, self).__delattr__(name)
        for name in (
            "_partial_num_free",
            "_partial_mode",
            "_partial_auto",
            "_partial_select",
            "_partial_sets",
            "_partial_loaded",
            "_partial_shell",
            "_partial_rest_frozen",
            "_partial_target",
        ):
            self.__dict__.pop(name, None)
        self.__class__ = self._partial_plain_class()
        base.assign(np.array(value))
        for variable in self.weights:
            variable.trainable = True  # the plain layer's `trainable` governs

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
        plain = plain_class.from_config(plain_class.get_config(self))
        plain.build_from_config(self.get_build_config())
        weights = []
        for variable in self.variables:
            if _is_partial_weight(variable):
                continue
            value = variable
            if variable is self._partial_base():
                value = getattr(self, self._partial_target)
            # Copies: JAX's trainer donates a model's buffers to its step.
            weights.append(np.array(keras.ops.convert_to_numpy(value)))
        plain.set_weights(weights)
        plain.trainable = self.trainable
        return plain


# The partial class of each plain class (`PartialDense` adds itself).
_PLAIN_TO_PARTIAL: dict[type, type] = {}
