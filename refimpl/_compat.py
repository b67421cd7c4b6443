"""Every private Keras access refimpl makes, and the one protocol for shells.

refimpl follows Keras' public API wherever one exists. A few things it needs
have no public form; each sits here, behind a check against the running
version, so an upgrade that removes one fails here with a message that says
what is missing, never as a deep ``AttributeError`` in a user's model:

* :data:`KerasSaveable`, the base class Keras' saver walks (a constraint
  whose arrays go into the weights file);
* :func:`unlocked`, adding weights to a built layer (Keras' own
  ``enable_lora`` does the same);
* :func:`sub_layers`, every layer of a model at any depth;
* :func:`is_functional`, whether a model is a graph of layers that
  ``clone_model`` can rebuild (keras-hub's models subclass it);
* the variable behind a weight property (:func:`own_weight`), a layer's
  direct sub-layers (:func:`child_layers`), removing a variable
  (:func:`untrack_variable`), a ``RematScope``'s mode (:func:`remat_scope`),
  a causal convolution's padding (:func:`causal_padding`), and an optimizer's
  variables and their keys (:func:`optimizer_variables`,
  :func:`variable_key`);
* :func:`optimizer_slots` and :func:`multi_optimizer_part`, an optimizer's
  state for one variable, which drop and grow resets entry by entry: Keras
  keeps it in private attributes (:data:`OPTIMIZER_SLOTS` names them), so
  :func:`check_optimizer_slots` builds each optimizer once, at the first use,
  and fails naming the optimizer and the attribute that a Keras release no
  longer has.

What a Keras class defines is checked at import; what a built object holds,
on first use, with the same message.

The shell protocol: an object rebuilt from a config alone (``from_config``,
as ``load_model`` does before it loads the weights) has the right shapes but
none of the arrays that come with the weights. :func:`require_loaded` makes
every such object refuse to run with the same clear message until they are
loaded.
"""

from __future__ import annotations

import contextlib
import functools

import keras
import numpy as np

__all__ = [
    "Functional",
    "KERAS_FLOOR",
    "KerasSaveable",
    "NotLoadedError",
    "causal_padding",
    "child_layers",
    "class_config",
    "OPTIMIZER_SLOTS",
    "check_optimizer_slots",
    "is_functional",
    "multi_optimizer_part",
    "optimizer_slots",
    "is_shell",
    "optimizer_variables",
    "own_weight",
    "register_under",
    "remat_scope",
    "require_loaded",
    "shell_initializer",
    "sub_layers",
    "unlocked",
    "untrack_variable",
    "variable_key",
    "variable_layout",
]

#: The oldest Keras release refimpl is tested on (``pyproject.toml`` says the same).
KERAS_FLOOR = (3, 15)


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


if _version(keras.__version__) < KERAS_FLOOR:
    raise ImportError(
        f"refimpl needs Keras >= {'.'.join(map(str, KERAS_FLOOR))}, the oldest "
        f"release it is tested on. Received: keras {keras.__version__}. "
        "Upgrade with `pip install -U keras`."
    )


def _private(what: str, getter):
    try:
        return getter()
    except (AttributeError, ImportError) as err:  # pragma: no cover - upgrades
        raise ImportError(
            f"refimpl needs {what} from Keras {keras.__version__}, which no "
            "longer has it. Install a Keras release refimpl is tested on "
            f"(>= {'.'.join(map(str, KERAS_FLOOR))}) or a newer refimpl."
        ) from err


def _saveable():
    from keras.src.saving.keras_saveable import KerasSaveable

    return KerasSaveable


#: The class Keras' saver walks for ``save_own_variables``/``load_own_variables``.
KerasSaveable = _private("keras.src.saving.keras_saveable.KerasSaveable", _saveable)

#: What a :data:`KerasSaveable` that is not a layer tells the saver it is, so
#: that the saver walks no attributes of it (a loss has none to walk).
SAVEABLE_KIND = "Loss"


def _functional():
    from keras.src.models.functional import Functional

    return Functional


#: Keras' functional model class (``keras.Model(inputs, outputs)`` makes one).
Functional = _private("keras.src.models.functional.Functional", _functional)
for _name in ("_flatten_layers", "_untrack_variable"):
    _private(f"Layer.{_name}", lambda n=_name: getattr(keras.layers.Layer, n))
_private("Optimizer._var_key", lambda: keras.optimizers.Optimizer._var_key)


def variable_layout(variable):
    """The ``keras.distribution.TensorLayout`` a variable was created with, or ``None``.

    Keras keeps it as ``Variable._layout`` and reads it the same way when an
    optimizer lays out its slots like their variable
    (``add_variable_from_reference``); there is no public accessor.
    """
    return getattr(variable, "_layout", None)


@contextlib.contextmanager
def unlocked(layer):
    """Let a built layer add weights (Keras locks its tracker after ``build``)."""
    tracker = getattr(layer, "_tracker", None)
    if tracker is None:
        raise ImportError(
            f"refimpl adds weights to built layers through `Layer._tracker`, "
            f"which Keras {keras.__version__} does not have."
        )
    tracker.unlock()
    try:
        yield
    finally:
        tracker.lock()


def _attribute(obj, name: str):
    """``getattr(obj, name)`` of a private attribute, or a clear ImportError."""
    try:
        return getattr(obj, name)
    except AttributeError:
        raise ImportError(
            f"refimpl reads `{type(obj).__name__}.{name}`, which Keras "
            f"{keras.__version__} does not have. Install a Keras release refimpl "
            f"is tested on (>= {'.'.join(map(str, KERAS_FLOOR))}) or a newer refimpl."
        ) from None


def own_weight(layer, name: str):
    """The variable behind a layer's weight property (``Dense.kernel`` reads
    ``Dense._kernel``): the one a partial weight keeps as its frozen base."""
    return _attribute(layer, "_" + name)


def child_layers(layer) -> list:
    """The layers directly inside ``layer`` (one level down), in Keras' order."""
    return list(layer._flatten_layers(include_self=False, recursive=False))


def sub_layers(model) -> list:
    """Every layer inside ``model``, at any depth, in Keras' order."""
    return list(model._flatten_layers(include_self=False, recursive=True))


def untrack_variable(layer, variable) -> None:
    """Remove ``variable`` from ``layer``'s weights (``Layer._untrack_variable``).

    Keras' ``Layer.__delattr__`` does the same, then a ``gc.collect()`` per
    variable, which took most of the time of merging a model of many layers.
    """
    _attribute(layer, "_untrack_variable")(variable)


def variable_key(optimizer, variable) -> str:
    """The key a Keras optimizer files ``variable``'s state under (``_var_key``)."""
    return _attribute(optimizer, "_var_key")(variable)


def optimizer_variables(optimizer) -> list:
    """The variables a built Keras optimizer trains (``_trainable_variables``)."""
    return _attribute(optimizer, "_trainable_variables")


def causal_padding(layer):
    """The left padding a ``Conv1D(padding="causal")`` gives its input."""
    return _attribute(layer, "_compute_causal_padding")()


def remat_scope(layer):
    """The ``keras.RematScope`` a layer was built in (its ``mode``,
    ``layer_names``, ``output_size_threshold``), or ``None``."""
    return getattr(layer, "_remat_mode", None)


def class_config(cls) -> dict:
    """What a loader needs to find the class ``cls`` again in a fresh process."""
    return {
        "module": cls.__module__,
        "class_name": cls.__name__,
        "registered_name": keras.saving.get_registered_name(cls),
    }


def is_functional(model) -> bool:
    """Whether ``model`` is a graph of layers (``Functional`` or a subclass)."""
    return isinstance(model, (Functional, keras.Sequential))


# -- An optimizer's state, entry by entry (drop and grow) ---------------------

#: The optimizers whose per-entry state drop and grow resets, by class name
#: (``keras.optimizers.<name>``): each private attribute that holds one state
#: variable per model variable, with the value Keras starts an entry at
#: (``"zero"``, or ``"initial"``: the optimizer's ``initial_accumulator_value``)
#: and the public setting that makes Keras keep it (``None``: always).
OPTIMIZER_SLOTS = {
    "Adam": {
        "_momentums": ("zero", None),
        "_velocities": ("zero", None),
        "_velocity_hats": ("zero", "amsgrad"),
    },
    "AdamW": {
        "_momentums": ("zero", None),
        "_velocities": ("zero", None),
        "_velocity_hats": ("zero", "amsgrad"),
    },
    "Nadam": {"_momentums": ("zero", None), "_velocities": ("zero", None)},
    "Adamax": {"_m": ("zero", None), "_u": ("zero", None)},
    "Lamb": {"_momentums": ("zero", None), "_velocities": ("zero", None)},
    "Lion": {"_momentums": ("zero", None)},
    "SGD": {"momentums": ("zero", "momentum")},
    "RMSprop": {
        "_velocities": ("zero", None),
        "_momentums": ("zero", "momentum"),
        "_average_gradients": ("zero", "centered"),
    },
    "Adadelta": {
        "_accumulated_grads": ("zero", None),
        "_accumulated_delta_vars": ("zero", None),
    },
    "Adagrad": {"_accumulators": ("initial", None)},
    "Ftrl": {"_accumulators": ("initial", None), "_linears": ("zero", None)},
}
#: What every optimizer above may keep too, from Keras' base class; ``"value"``:
#: a moving average of the weights starts at the entry's value.
COMMON_SLOTS = {
    "_accumulated_gradients": ("zero", "gradient_accumulation_steps"),
    "_model_variables_moving_average": ("value", "use_ema"),
}
#: A value of each setting above that makes Keras keep its slot.
_SETTING_ON = {
    "amsgrad": True,
    "momentum": 0.5,
    "centered": True,
    "gradient_accumulation_steps": 2,
    "use_ema": True,
}
for _name in OPTIMIZER_SLOTS:
    _private(f"keras.optimizers.{_name}", lambda n=_name: getattr(keras.optimizers, n))
_private("keras.optimizers.Optimizer._get_variable_index",
         lambda: keras.optimizers.Optimizer._get_variable_index)  # fmt: skip


def _lacks(what: str) -> ImportError:
    return ImportError(
        f"refimpl needs `{what}` from Keras {keras.__version__}, which no longer "
        "has it: drop and grow resets a grown entry's optimizer state through "
        "it, and would otherwise leave that state stale. Install a Keras release "
        f"refimpl is tested on (>= {'.'.join(map(str, KERAS_FLOOR))}) or a newer "
        "refimpl."
    )


def optimizer_slots(optimizer, variable) -> list:
    """``(attribute, state, fresh)`` for each per-entry state of ``variable``.

    ``optimizer`` is built and of a class :data:`OPTIMIZER_SLOTS` names (no
    wrapper); a slot its settings turn off is left out, and so is one Keras
    keeps no state in for ``variable`` (``overwrite_with_gradient``). Raises
    an ``ImportError`` naming the optimizer and the attribute if this Keras
    keeps the state elsewhere.
    """
    check_optimizer_slots()
    name = type(optimizer).__name__
    try:
        index = optimizer._get_variable_index(variable)
    except AttributeError as err:  # pragma: no cover - upgrades
        raise _lacks(f"{name}._get_variable_index") from err
    found, table = [], {**OPTIMIZER_SLOTS[name], **COMMON_SLOTS}
    for attribute, (fresh, setting) in table.items():
        if setting is not None and not _setting(optimizer, setting):
            continue
        states = getattr(optimizer, attribute, None)
        if not isinstance(states, (list, tuple)) or len(states) <= index:
            raise _lacks(f"{name}.{attribute}")
        if states[index] is not None:
            found.append((attribute, states[index], fresh))
    return found


def _setting(optimizer, setting: str):
    try:
        return getattr(optimizer, setting)
    except AttributeError as err:  # pragma: no cover - upgrades
        raise _lacks(f"{type(optimizer).__name__}.{setting}") from err


def multi_optimizer_part(optimizer, variable):
    """The optimizer a ``keras.optimizers.MultiOptimizer`` updates ``variable`` with."""
    choose = getattr(optimizer, "_optimizer_map", None)
    if not callable(choose):
        raise _lacks(f"{type(optimizer).__name__}._optimizer_map")
    return choose(variable)


@functools.cache
def check_optimizer_slots() -> None:
    """Check that each optimizer of :data:`OPTIMIZER_SLOTS` keeps the state it names.

    Builds each one on a variable of two entries, with every setting that
    adds a slot on, and raises an ``ImportError`` that names the optimizer and
    the attribute it lacks. It runs once, at the first use of
    :func:`optimizer_slots` or of drop and grow's optimizer check (0.1 to
    0.2 s on a CPU, once): at import it would create variables, which starts
    the backend's devices before a user can configure them (and costs 0.25 s
    on TensorFlow, 1.1 s on JAX, on a CPU).
    """
    probe = keras.Variable(keras.ops.zeros((2,)), name="refimpl_probe")
    for name, table in OPTIMIZER_SLOTS.items():
        cls = getattr(keras.optimizers, name)
        settings = {s for _, s in {**table, **COMMON_SLOTS}.values() if s}
        optimizer = cls(**{s: _SETTING_ON[s] for s in settings})
        optimizer.build([probe])
        for attribute in {**table, **COMMON_SLOTS}:
            states = getattr(optimizer, attribute, None)
            if (
                not isinstance(states, (list, tuple))
                or len(states) != 1
                or states[0] is None
                or tuple(states[0].shape) != (2,)
            ):
                raise _lacks(f"{name}.{attribute}")
        if optimizer._get_variable_index(probe) != 0:  # pragma: no cover
            raise _lacks(f"{name}._get_variable_index")
    multi = keras.optimizers.MultiOptimizer(lambda _: optimizer)
    if multi_optimizer_part(multi, probe) is not optimizer:  # pragma: no cover
        raise _lacks("MultiOptimizer._optimizer_map")


def register_under(cls, name: str, loader) -> None:
    """Serialize ``cls`` under the registered ``name``; load that name with ``loader``.

    Many classes made at run time (one per plain class, such as
    ``PartialMultiHeadAttention``) share one registered name, so a fresh
    process that has not made them yet can load them: ``loader.from_config``
    rebuilds each from what its config says. Only public Keras calls:
    registering sets both directions, then the name is pointed at the loader.
    """
    keras.saving.register_keras_serializable(
        package=name.split(">")[0], name=name.split(">")[1]
    )(cls)
    keras.saving.get_custom_objects()[name] = loader


#: What a shell's arrays hold until the saved weights fill them: NaN in a
#: floating-point weight, -1 in an integer one (positions, indices).
SHELL_FLOAT, SHELL_INT = float("nan"), -1


def shell_initializer(dtype: str = "int32"):
    """The initializer of a shell's weight that the saved weights fill."""
    floating = "float" in str(dtype)
    return keras.initializers.Constant(SHELL_FLOAT if floating else SHELL_INT)


def is_shell(array) -> bool:
    """Whether ``array`` (read now; ``None`` if unknown) still holds the shell's marks.

    The one "not loaded" check of every object that a config can rebuild:
    the partial weights, the structured layers, ``MaskedOptimizer`` and
    ``FreezeEntries``.
    """
    if array is None:
        return True
    array = np.asarray(array)
    if array.size == 0:
        return False
    if np.issubdtype(array.dtype, np.floating):
        return bool(np.all(np.isnan(array)))
    return bool(np.any(array < 0))


class NotLoadedError(ValueError):
    """An object rebuilt from a config was used before its weights were loaded."""


def require_loaded(what: str) -> NotLoadedError:
    """The one error of the shell protocol: ``raise require_loaded(...)``.

    Args:
        what: the object, as the user knows it (``"Layer 'dense'"``).
    """
    return NotLoadedError(
        f"{what} was rebuilt from a config without its weights, and its "
        "arrays (free positions, frozen values, masks) come with them. Load "
        "the model with `keras.saving.load_model`, or call `load_weights` "
        "(or `set_weights`) before using it."
    )


# -- Keras' quantized kernels: the base of a partial weight -------------------
# A Dense or EinsumDense that Keras quantized (``layer.quantize("int8")``)
# keeps its kernel as integer codes (``_kernel``: int8, or two int4 codes per
# byte) with float scales (``kernel_scale``; ``kernel_zero`` and ``g_idx`` for
# int4 in groups, ``Int4QuantizationConfig(block_size=...)``). Keras has no
# public way to read the float kernel they stand for, nor to multiply by them
# without the layer's bias and activation: the functions below are the one
# place refimpl reads that layout.

#: The quantization modes a partial weight combines with (a Dense or EinsumDense).
QUANTIZED_MODES = ("int8", "int4")

_private(
    "keras.src.quantizers.quantization_config.validate_and_resolve_config",
    lambda: (
        __import__(
            "keras.src.quantizers.quantization_config", fromlist=["x"]
        ).validate_and_resolve_config
    ),
)
_private(
    "keras.src.quantizers.utils.should_quantize_layer",
    lambda: (
        __import__("keras.src.quantizers.utils", fromlist=["x"]).should_quantize_layer
    ),
)
for _cls in (keras.layers.Dense, keras.layers.EinsumDense):
    for _name in ("_int8_call", "_int4_call"):
        _private(f"{_cls.__name__}.{_name}", lambda c=_cls, n=_name: getattr(c, n))
_private(
    "EinsumDense._adjust_scale_for_dequant",
    lambda: keras.layers.EinsumDense._adjust_scale_for_dequant,
)


def quantization_variables(layer) -> tuple:
    """The scale variables of a quantized kernel, in Keras' order:
    ``kernel_scale``, then ``kernel_zero`` and ``g_idx`` where Keras has them
    (int4 in groups)."""
    found = []
    for name in ("kernel_scale", "kernel_zero", "g_idx"):
        variable = getattr(layer, name, None)
        if isinstance(variable, keras.Variable):
            found.append(variable)
    return tuple(found)


def _int4_grid(layer) -> tuple[int, int]:
    """The ``[rows, columns]`` a layer's int4 codes are stored as (packed by
    pairs along the columns)."""
    if isinstance(layer, keras.layers.EinsumDense):
        return (
            int(_attribute(layer, "_int4_rows")),
            int(_attribute(layer, "_int4_unpacked_column_size")),
        )
    return (
        int(_attribute(layer, "_orig_input_dim")),
        int(_attribute(layer, "_orig_output_dim")),
    )


def _grouped(layer) -> bool:
    block_size = getattr(layer, "_int4_block_size", None)
    return block_size is not None and block_size != -1


def quantized_kernel_shape(layer) -> tuple:
    """The shape of the float kernel that a quantized layer's codes stand for."""
    if layer.quantization_mode == "int8":
        return tuple(int(d) for d in own_weight(layer, "kernel").shape)
    if isinstance(layer, keras.layers.EinsumDense):
        return tuple(int(d) for d in _attribute(layer, "original_kernel_shape"))
    return _int4_grid(layer)


def _dequant_scale(layer):
    """An int8 kernel's scale, of the kernel's rank (1 on the reduced axes)."""
    scale = keras.ops.convert_to_tensor(layer.kernel_scale)
    if isinstance(layer, keras.layers.EinsumDense):
        return _attribute(layer, "_adjust_scale_for_dequant")(scale)
    return keras.ops.reshape(scale, (1, -1))


def dequantized_kernel(layer, dtype="float32"):
    """The float kernel of a quantized layer: every entry as
    :func:`dequantized_entries` gives it (so the two agree bit for bit on
    every backend; XLA may round a division by a broadcast scale otherwise).

    int8: ``codes / kernel_scale``; int4: the unpacked codes divided by their
    scale (per channel) or ``(codes - kernel_zero) * kernel_scale`` by group.
    A tensor of :func:`quantized_kernel_shape`, in ``dtype``.
    """
    shape = quantized_kernel_shape(layer)
    size = int(np.prod(shape))
    every = keras.ops.arange(0, size, dtype="int32" if size < 2**31 else "int64")
    return keras.ops.reshape(dequantized_entries(layer, every, dtype), shape)


def dequantized_entries(layer, positions, dtype="float32"):
    """The float kernel's entries at flat ``positions``: O(k), the codes and
    their scales gathered, never the whole kernel. Equal, bit for bit, to
    ``dequantized_kernel(layer).ravel()[positions]``."""
    ops = keras.ops
    positions = ops.convert_to_tensor(positions)
    codes = ops.reshape(ops.convert_to_tensor(own_weight(layer, "kernel")), (-1,))
    if layer.quantization_mode == "int8":
        shape = quantized_kernel_shape(layer)
        scale = _dequant_scale(layer)
        scale_shape = tuple(int(d) for d in scale.shape)
        index = ops.zeros_like(positions)
        stride, scale_stride = 1, 1
        for dim, scale_dim in zip(reversed(shape), reversed(scale_shape)):
            if scale_dim != 1:
                along = ops.mod(ops.floor_divide(positions, stride), dim)
                index = index + along * scale_stride
            stride *= dim
            scale_stride *= scale_dim
        picked = ops.take(ops.reshape(scale, (-1,)), index)
        value = ops.divide(ops.cast(ops.take(codes, positions), dtype), picked)
        return ops.cast(value, dtype)
    rows, columns = _int4_grid(layer)
    row = ops.floor_divide(positions, columns)
    column = positions - row * columns
    byte = ops.cast(ops.take(codes, row * ((columns + 1) // 2) + column // 2), "int32")
    nibble = ops.bitwise_and(ops.right_shift(byte, (column % 2) * 4), 15)
    code = ops.where(nibble >= 8, nibble - 16, nibble)
    if _grouped(layer):
        group = ops.cast(ops.take(ops.convert_to_tensor(layer.g_idx), row), "int32")
        at = group * columns + column
        scale = ops.reshape(ops.convert_to_tensor(layer.kernel_scale), (-1,))
        zero = ops.reshape(ops.convert_to_tensor(layer.kernel_zero), (-1,))
        scale = ops.take(scale, at)
        shifted = ops.cast(code, scale.dtype) - ops.cast(
            ops.take(zero, at), scale.dtype
        )
        value = ops.multiply(shifted, scale)
    else:
        scale = ops.take(ops.convert_to_tensor(layer.kernel_scale), column)
        value = ops.divide(ops.cast(code, dtype), scale)
    return ops.cast(value, dtype)


class _WithoutBiasOrActivation:
    """A layer as Keras' quantized call reads it, without its bias, its
    activation and LoRA: that call's product alone."""

    bias = None
    activation = None
    lora_enabled = False

    def __init__(self, layer):
        object.__setattr__(self, "_layer", layer)

    def __getattr__(self, name):
        return getattr(self._layer, name)


def quantized_product(layer, inputs):
    """Keras' own quantized product of ``layer`` (``Dense._int8_call`` and the
    like), before its bias and activation: the inputs quantized as Keras
    quantizes them, the integer product, and Keras' gradient for the inputs."""
    name = f"_{layer.quantization_mode}_call"
    for cls in type(layer).__mro__:
        if cls.__module__.split(".")[0] == "keras" and name in cls.__dict__:
            return cls.__dict__[name](_WithoutBiasOrActivation(layer), inputs)
    raise ImportError(  # pragma: no cover - upgrades
        f"refimpl multiplies by a quantized kernel through `{name}`, which "
        f"{type(layer).__name__} of Keras {keras.__version__} does not have."
    )


def resolve_quantize_mode(mode, config):
    """The mode a ``quantize(mode, config)`` call means, as Keras resolves it
    (``config`` alone names it too); ``mode`` itself where Keras cannot."""
    from keras.src.quantizers.quantization_config import validate_and_resolve_config

    try:
        return validate_and_resolve_config(mode, config).mode
    except (ValueError, TypeError):
        return mode


def should_quantize(layer, filters) -> bool:
    """Whether ``model.quantize(..., filters=filters)`` quantizes ``layer``."""
    from keras.src.quantizers.utils import should_quantize_layer

    return should_quantize_layer(layer, filters)


def dispatch_quantize(layer) -> None:
    """Make ``layer.quantize`` call the method of the layer's class now.

    Keras binds ``quantize`` to the instance when a layer is made (with a
    wrapper that resolves the config and unlocks the layer); a layer whose
    class changes later (a partial layer, and back) would call the old
    class's. This wrapper does what Keras' does, with the current class.
    """

    def quantize(mode=None, config=None, **kwargs):
        from keras.src.quantizers.quantization_config import (
            validate_and_resolve_config,
        )

        config = validate_and_resolve_config(mode, config)
        mode = config.mode
        layer._check_quantize_args(mode, layer.compute_dtype)
        with unlocked(layer):
            type(layer).quantize(layer, mode=mode, config=config, **kwargs)

    quantize.__doc__ = type(layer).quantize.__doc__
    layer.__dict__["quantize"] = quantize


_BEFORE_MODEL_QUANTIZE: list = []


def before_model_quantize(check) -> None:
    """Run ``check(model, mode, config, filters)`` at the start of every
    ``Model.quantize``, before Keras changes any layer.

    ``Model.quantize`` quantizes layer after layer, and skips with a warning
    a layer whose ``quantize`` raises ``NotImplementedError``: a check in a
    layer's own ``quantize`` comes after the layers before it changed. This
    wraps ``keras.Model.quantize`` once (every model made from then on, and a
    model given to :func:`dispatch_quantize`, calls it).
    """
    _BEFORE_MODEL_QUANTIZE.append(check)
    original = keras.Model.quantize
    if getattr(original, "_refimpl_checked", False):
        return

    @functools.wraps(original)
    def quantize(self, mode=None, config=None, filters=None, **kwargs):
        for hook in _BEFORE_MODEL_QUANTIZE:
            hook(self, mode, config, filters)
        return original(self, mode=mode, config=config, filters=filters, **kwargs)

    quantize._refimpl_checked = True
    keras.Model.quantize = quantize


#: What Keras' ``quantize`` adds to a Dense or EinsumDense besides its variables.
_QUANTIZATION_ATTRIBUTES = (
    "_is_quantized",
    "inputs_quantizer",
    "quantization_axis",
    "_int4_block_size",
    "_orig_input_dim",
    "_orig_output_dim",
    "_int4_unpacked_column_size",
    "_int4_rows",
    "original_kernel_shape",
)


def unquantize(layer, kernel, drop=()) -> None:
    """Turn a quantized Dense or EinsumDense back into its float form, in place.

    Every variable of ``layer`` is removed (the codes, the scales); the layer
    gets its float dtype policy back and is built again by its class's
    ``build`` (call it once the layer has its plain class), in the plain
    layer's order of variables, with ``kernel`` (a NumPy array) as its kernel
    and its old bias. The attributes named in ``drop`` go too.
    """
    source = _attribute(layer_policy(layer), "_source_name")
    bias = (
        None if layer.bias is None else np.array(keras.ops.convert_to_numpy(layer.bias))
    )
    input_shape = layer.get_build_config()["input_shape"]
    owned = list(layer._trainable_variables) + list(layer._non_trainable_variables)
    for variable in owned:
        layer._untrack_variable(variable)
    for name in ("_kernel", "kernel_scale", "kernel_zero", "g_idx", "bias", *drop):
        if name in vars(layer):
            # Keras' Layer.__delattr__ without its gc.collect() per variable.
            super(keras.layers.Layer, layer).__delattr__(name)
    for name in _QUANTIZATION_ATTRIBUTES:
        vars(layer).pop(name, None)
    layer.quantization_config = None
    layer.dtype_policy = keras.dtype_policies.get(source)
    with unlocked(layer):
        layer.built = False
        type(layer).build(layer, input_shape)  # the plain class's, not the wrapper
        layer.built = True
    own_weight(layer, "kernel").assign(kernel)
    if bias is not None:
        layer.bias.assign(bias)


def layer_policy(layer):
    """The dtype policy that applies to ``layer``: its entry of a
    ``DTypePolicyMap`` (a keras-hub model rebuilt from a config gives every
    sub-layer the model's map), else its own."""
    policy = layer.dtype_policy
    if isinstance(policy, keras.dtype_policies.DTypePolicyMap) and layer.path:
        return policy[layer.path]
    return policy


def resolve_policy_maps(model) -> None:
    """Give every layer of ``model`` that reads its dtype policy from a
    ``DTypePolicyMap`` its own entry of it, as a model built in code has.

    A keras-hub model rebuilt from its config (as ``partialize`` and
    ``merge`` copy it, or loaded from ``.keras``) after ``quantize`` gives
    itself and every sub-layer the model's map. Keras' quantized layers then
    misread it: ``Dense``/``Embedding.save_own_variables`` ask
    ``layer.dtype_policy.quantization_mode``, which a map answers ``None``,
    save ``None`` for the scale and ``model.save`` fails ("Invalid dtype:
    object"); ``quantize`` names the new policy after the map ("Cannot convert
    'map_float32'"). The model's config then records each layer's policy
    again (keras-hub's ``Backbone.get_config`` makes the map from them).
    """
    for layer in [model, *sub_layers(model)]:
        policy = getattr(layer, "_dtype_policy", None)
        if isinstance(policy, keras.dtype_policies.DTypePolicyMap):
            layer._dtype_policy = (
                policy[layer.path] if layer.path else policy.default_policy
            )
