"""Any Keras layer with a kernel (or an embedding table), partially trainable.

One mechanism for every weight-bearing layer Keras ships with a ``kernel`` or
``embeddings`` property: ``Dense``, ``EinsumDense`` (the projections of
``MultiHeadAttention``), ``Conv1D``/``Conv2D``/``Conv3D`` and ``Embedding``.
It is the pattern of Keras' own ``enable_lora``:

* the layer's own weight stays where it is, as the frozen **base**
  (``trainable=False``);
* two weights are added: ``partial_free``, the ``k`` trainable values, and
  ``partial_positions``, their flat positions (non-trainable, int32);
* the ``kernel`` (or ``embeddings``) property returns the base with the free
  values scattered in, so the layer's own ``call`` runs unchanged, and every
  output equals the original layer's bit for bit until the free values move.

An optimizer sees only the ``k`` free values: frozen entries keep their bits
under every optimizer, and the optimizer state is ``k`` values per slot. A
kernel regularizer (L1, L2) moves to the free values: their gradient is the
plain layer's, and the frozen entries' share of the penalty, a constant, is
left out of the loss.

When saved, the layer writes exactly what the plain layer writes, the trained
weight in place of the base, followed by the positions. So a ``.weights.h5``
file of the *original* model loads into the converted one, and
:meth:`to_dense` (or :func:`refimpl.merge`) gives the plain layer back.

Use :func:`refimpl.partialize` to convert a model, or
:func:`enable_partial` to convert one built layer in place.
"""

from __future__ import annotations

import keras
import numpy as np

from refimpl.masks import to_mask
from refimpl.variables import _constant, _read_now, scatter_into

__all__ = ["PARTIAL_CLASSES", "enable_partial", "partial_class"]

_TARGETS = {keras.layers.Embedding: "embeddings"}
_SUPPORTED = (
    keras.layers.Dense,
    keras.layers.EinsumDense,
    keras.layers.Conv1D,
    keras.layers.Conv2D,
    keras.layers.Conv3D,
    keras.layers.Embedding,
)


class _PartialMixin:
    """The added behaviour; combined with a Keras layer class by partial_class."""

    _partial_target = "kernel"

    # -- the weight the layer's call reads ----------------------------------
    def _partial_value(self, value):
        if getattr(self, "partial_free", None) is None:
            return value
        self._partial_check_loaded()
        return scatter_into(
            value, self.partial_positions.value, self.partial_free.value
        )

    def _partial_base(self):
        return getattr(self, "_" + self._partial_target)

    # -- creation --------------------------------------------------------------
    def _partial_add_weights(self, num_free: int, positions=None):
        base = self._partial_base()
        base.trainable = False
        size = int(np.prod(base.shape))
        index_dtype = "int32" if size < 2**31 else "int64"
        if positions is None:  # a shell: its positions come with the weights
            start_positions = keras.initializers.Constant(size)
            start_free = "zeros"
        else:
            flat = keras.ops.convert_to_numpy(base).reshape(-1)
            start_positions = _constant(positions)
            start_free = _constant(flat[positions])
        self._tracker.unlock()
        self.partial_free = self.add_weight(
            name="partial_free",
            shape=(num_free,),
            initializer=start_free,
            dtype=base.dtype,
            # Keras regularizes trainable weights only. An elementwise penalty
            # on the free values gives them the plain layer's gradient; the
            # frozen entries' part, a constant, is left out of the loss.
            regularizer=base.regularizer,
        )
        self.partial_positions = self.add_weight(
            name="partial_positions",
            shape=(num_free,),
            initializer=start_positions,
            dtype=index_dtype,
            trainable=False,
        )
        self._tracker.lock()
        self._partial_num_free = num_free
        self._partial_loaded = positions is not None

    def build(self, *args, **kwargs):
        super().build(*args, **kwargs)
        num_free = getattr(self, "_partial_shell", None)
        if num_free is not None:
            self._partial_add_weights(num_free)

    def _partial_check_loaded(self):
        if self._partial_loaded:
            return
        size = int(np.prod(self._partial_base().shape))
        positions = _read_now(self.partial_positions)
        self._partial_loaded = not np.any(positions >= size)
        if not self._partial_loaded:
            raise ValueError(
                f"Layer '{self.name}' was rebuilt from a config without its "
                "trainable positions, which come with its saved weights. Load "
                "the model with `keras.saving.load_model`, or its weights, "
                "before using it."
            )

    # -- what it is --------------------------------------------------------------
    @property
    def trainable_mask(self) -> np.ndarray:
        """The boolean mask of the partial weight (``True`` = trainable)."""
        self._partial_check_loaded()
        base = self._partial_base()
        mask = np.zeros(int(np.prod(base.shape)), bool)
        mask[_read_now(self.partial_positions)] = True
        return mask.reshape(tuple(base.shape))

    @property
    def base_weight(self):
        """The layer's own weight variable, now the frozen base.

        ``layer.kernel`` (``embeddings``) is the composed tensor, as under
        Keras' LoRA; this is the variable (with its ``path``).
        """
        return self._partial_base()

    @property
    def num_free(self) -> int:
        """The number of trainable entries of the partial weight."""
        return self._partial_num_free

    # -- saving ------------------------------------------------------------------
    def save_own_variables(self, store):
        if not self.built:
            return
        # Write the free values into the base: the value does not change
        # (the base's free positions are never read), and the plain layer's
        # own save then writes the trained weight.
        base = self._partial_base()
        merged = self._partial_value(keras.ops.convert_to_tensor(base))
        base.assign(merged)
        own: dict = {}
        super().save_own_variables(own)
        for key, value in own.items():
            store[key] = value
        store[str(len(own))] = self.partial_positions

    def load_own_variables(self, store):
        keys = sorted(store.keys(), key=int)
        plain = [v for v in self.variables if not _is_partial_weight(v)]
        if len(keys) not in (len(plain), len(plain) + 1):
            raise ValueError(
                f"Layer '{self.name}' expected {len(plain)} weights (a plain "
                f"{self._partial_plain_class().__name__} file) or "
                f"{len(plain) + 1} (with the trainable positions), but the file "
                f"holds {len(keys)}"
            )
        own = {key: store[key] for key in keys[: len(plain)]}
        if len(keys) == len(plain) + 1:
            positions = np.asarray(store[keys[-1]])
            if positions.shape != tuple(self.partial_positions.shape):
                raise ValueError(
                    f"Layer '{self.name}' has {self.num_free} trainable "
                    f"entries, but the file holds {positions.shape[0]}"
                )
            self.partial_positions.assign(positions)
            self._partial_loaded = True
        self._partial_skip_count_check = True
        try:
            super().load_own_variables(own)
        finally:
            self._partial_skip_count_check = False
        self._partial_check_loaded()
        flat = keras.ops.reshape(self._partial_base(), (-1,))
        positions = keras.ops.convert_to_numpy(self.partial_positions)
        self.partial_free.assign(keras.ops.take(flat, positions))

    def _check_load_own_variables(self, store):
        if getattr(self, "_partial_skip_count_check", False):
            return
        super()._check_load_own_variables(store)

    def get_config(self) -> dict:
        config = super().get_config()
        config["num_free"] = self._partial_num_free
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        num_free = config.pop("num_free")
        layer = super().from_config(config)
        layer._partial_shell = num_free
        return layer

    # -- the way out ---------------------------------------------------------------
    @classmethod
    def _partial_plain_class(cls):
        return next(c for c in cls.__mro__[1:] if c in _SUPPORTED)

    def to_dense(self):
        """Return the plain Keras layer with the trained weight, bit for bit.

        Its outputs equal this layer's exactly. (The name follows
        :meth:`refimpl.PartialDense.to_dense`; the result is of the original
        class, a ``Conv2D`` for a partial ``Conv2D``.)
        """
        config = super().get_config()
        plain = self._partial_plain_class().from_config(config)
        plain.build_from_config(self.get_build_config())
        weights = []
        for variable in self.variables:
            if _is_partial_weight(variable):
                continue
            if variable is self._partial_base():
                value = self._partial_value(keras.ops.convert_to_tensor(variable))
                weights.append(np.array(keras.ops.convert_to_numpy(value)))
            else:
                weights.append(np.array(keras.ops.convert_to_numpy(variable)))
        plain.set_weights(weights)  # copies: see _layer_base._copy
        plain.trainable = self.trainable
        return plain


def _is_partial_weight(variable) -> bool:
    return variable.path.split("/")[-1] in ("partial_free", "partial_positions")


def _target_property(plain_class, target):
    inherited = getattr(plain_class, target)

    def fget(self):
        return self._partial_value(inherited.fget(self))

    return property(fget, doc=f"The {target}: the frozen base with the free values.")


_CLASSES: dict[type, type] = {}
_ELEMENTWISE = (keras.regularizers.L1, keras.regularizers.L2, keras.regularizers.L1L2)
_NAMES = {keras.layers.Dense: "PartialKerasDense"}


def partial_class(layer_class: type) -> type:
    """The partially trainable subclass of a Keras layer class.

    Registered for ``.keras`` files as ``refimpl>Partial<Name>`` (for
    ``Dense``, ``refimpl>PartialKerasDense``: ``refimpl.PartialDense`` is the
    layer built from a mask, with a weight layout of its own). Its
    ``__name__`` is the plain class's, as Keras names weight-file groups
    after it: a converted model reads the original's ``.weights.h5``.

    Raises:
        TypeError: for a class this mechanism does not support.
    """
    if layer_class in _CLASSES.values():
        return layer_class
    if layer_class not in _SUPPORTED:
        raise TypeError(
            "`layer_class` must be one of the Keras layers with a kernel or an "
            f"embedding table: {[c.__name__ for c in _SUPPORTED]}. Received: "
            f"{layer_class.__name__}"
        )
    if layer_class not in _CLASSES:
        target = _TARGETS.get(layer_class, "kernel")
        # refimpl.PartialDense (built from a mask, with its own weight layout)
        # has that name; a converted keras Dense keeps Dense's layout.
        name = _NAMES.get(layer_class, f"Partial{layer_class.__name__}")
        # The class keeps the plain class's __name__: Keras names a layer's
        # group in a weights file after it, so the two files line up.
        cls = type(
            layer_class.__name__,
            (_PartialMixin, layer_class),
            {
                "_partial_target": target,
                target: _target_property(layer_class, target),
                "__module__": __name__,
                "__qualname__": name,
                "__doc__": (
                    f"A ``keras.layers.{layer_class.__name__}`` whose "
                    f"``{target}`` is only trainable at some entries. Build it "
                    "with :func:`refimpl.partialize` or "
                    ":func:`refimpl.partial_layers.enable_partial`."
                ),
            },
        )
        _CLASSES[layer_class] = keras.saving.register_keras_serializable(
            package="refimpl", name=name
        )(cls)
    return _CLASSES[layer_class]


#: The partial class of every supported Keras layer class.
PARTIAL_CLASSES = {c: partial_class(c) for c in _SUPPORTED}


def enable_partial(layer, mask) -> None:
    """Make a built layer's kernel (or embeddings) trainable only in ``mask``.

    In place, like Keras' ``enable_lora``: the layer becomes an instance of
    its :func:`partial_class`, its weight becomes the frozen base, and its
    outputs do not change. Compile the model again after converting.

    Args:
        layer: a built layer of a supported class (not already partial).
        mask: the trainable entries of its ``kernel`` (``embeddings`` for an
            ``Embedding``): a boolean mask of the weight's shape or an index
            list (see :func:`refimpl.masks.to_mask`).

    Raises:
        TypeError: for a layer of another class.
        ValueError: for a layer that is not built, is already partial, uses
            LoRA or quantization, or a mask that does not fit.
    """
    if not isinstance(layer, keras.layers.Layer):
        raise TypeError(f"`layer` must be a Keras layer. Received: layer={layer!r}")
    if isinstance(layer, _PartialMixin):
        raise ValueError(
            f"`layer` is already partially trainable. Received: layer={layer.name!r}"
        )
    plain = type(layer)
    if plain not in _SUPPORTED:
        raise TypeError(
            f"`layer` must be one of {[c.__name__ for c in _SUPPORTED]}, whose "
            "weight this mechanism knows. Received: layer "
            f"{layer.name!r} of type {plain.__name__}"
        )
    if not layer.built:
        raise ValueError(
            f"`layer` must be built (call the model once). Received: {layer.name!r}"
        )
    if getattr(layer, "lora_enabled", False) or getattr(
        layer, "quantization_mode", None
    ):
        raise ValueError(
            f"`layer` uses LoRA or quantization, which a partial weight does "
            f"not combine with. Received: {layer.name!r}"
        )
    target = _TARGETS.get(plain, "kernel")
    base = getattr(layer, "_" + target)
    if base.regularizer is not None and not isinstance(base.regularizer, _ELEMENTWISE):
        raise ValueError(
            f"`layer` {layer.name!r} has a regularizer on its {target} that is "
            "not elementwise (L1, L2 or L1L2), so it cannot be split between "
            f"free and frozen entries. Received: {target}_regularizer="
            f"{type(base.regularizer).__name__}"
        )
    bool_mask = to_mask(mask, tuple(base.shape), name="mask")
    layer.__class__ = partial_class(plain)
    positions = np.flatnonzero(bool_mask)
    layer._partial_add_weights(len(positions), positions)
