"""Training-step time and memory of partial fine-tuning on real models.

    python -m evidence.benchmarks.real_models  # results/real/cpu_{transformer,cnn}.csv
    python -m evidence.benchmarks.real_models --model cnn --quick  # a small CNN
    python -m evidence.benchmarks.real_models --quantized  # cpu_transformer_int8.csv

Two models, TensorFlow, AdamW:

* ``transformer``: a plain-Keras transformer, a token embedding, ``blocks``
  blocks of ``MultiHeadAttention`` and a 4x feed-forward with layer norms,
  and a ``Dense`` head; width 512, 8 heads, 128 tokens x batch 8;
* ``cnn``: a ResNet-style CNN, a 3x3 stem and three stages of two residual
  blocks (64, 128, 256 channels, batch norm), pooled into a ``Dense`` head;
  32x32x3 images x batch 32.

Every variant trains the same batch:

* ``full``: every weight;
* ``floor``: every kernel frozen, only norms and biases train, the least any
  method that trains kernel entries can cost;
* ``lora4``, ``lora8``: Keras' ``enable_lora`` on every kernel;
* ``random 1%`` (and 0.1%, 10%): ``refimpl.partialize`` with random entries
  of every kernel (the ``"delta"`` form); ``random 1% (remat)``: the same
  under ``keras.RematScope``, where the product is recomputed in the
  backward pass instead of keeping the composed kernel;
* ``rows 1%`` / ``columns 1%`` (the CNN's ``channels 1%`` / ``filters 1%``):
  whole input rows / output columns of every kernel (whole input channels /
  filters of every convolution), in the ``"slices"`` form; ``rows 1%
  (delta)`` (``filters 1% (delta)``): the same mask composed as ``"delta"``
  does, to show what the form changes.

Step times come from one process, interleaved rounds (:mod:`.timing`), as
ratios to ``full`` and to ``floor`` within each round. Memory comes from one
fresh process per variant: the peak resident set of three steps above what
the variant holds before them (as :mod:`.memory` measures it), and the
number of optimizer state values.

``--components`` times the parts of a step instead, interleaved as well:
composing the kernels, the forward pass and loss (less the composing), the
gradient (what forward and gradient take beyond the forward), and the update
alone (``results/real/cpu_transformer_components.csv``).

``--quantized`` runs the transformer on a base quantized by Keras
(``results/real/cpu_transformer_int8.csv``), in one run: ``full`` and
``floor`` in float32, and the same model after ``model.quantize("int8")``:

* ``int8 lora8``: Keras' ``enable_lora(8)`` on every kernel, as Keras' own
  guide fine-tunes a quantized model;
* ``int8 random 1%`` / ``int8 rows 1%``: ``refimpl.partialize`` of the int8
  model (in place), random entries (``mode="auto"``) or whole input rows
  (``"slices"``) of every kernel; the codes and scales stay frozen, the free
  values are float32, and each layer adds their correction to Keras' int8
  product (``form`` names the products the layers use);
* ``int8 floor``: the int8 model with only norms and biases training.

Its step times are ratios to ``full`` and to ``int8 lora8`` within each
round. Its memory columns, from a fresh process per variant (the median
``training_mb`` of ``--memory-repeats`` processes):

* ``weight_bytes``: the bytes of the model's variables from their dtypes and
  shapes (int8 codes, scales, free values, their positions, LoRA's factors,
  float weights), split into ``frozen_bytes`` and ``trainable_bytes``;
* ``training_mb``: the peak resident set during three steps above the
  resident set before the model was built (TensorFlow started, the batch
  made): the weights, the optimizer state, the traced step and the steps'
  activations and temporaries; ``training_vs_full`` divides it by
  ``full``'s;
* ``held_mb`` and ``step_mb`` split it: the resident set just before the
  steps above the one before the model, and the steps' peak above that.
  An int8 variant's ``held_mb`` also holds what ``model.quantize`` freed
  (the allocator keeps it, and later allocations reuse it).

The targets, printed at the end: a partial int8 step no slower than
``int8 lora8`` (the median ratio at most 1), and its training memory at most
0.5x ``full``'s. ``--quantized --components`` takes the int8 steps apart
(``results/real/cpu_transformer_int8_components.csv``).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import pathlib
import subprocess
import sys

RESULTS = pathlib.Path(__file__).parent / "results" / "real"
MODELS = ("transformer", "cnn")
#: The variants both models run: the references, LoRA and random masks.
_SHARED = (
    "full",
    "floor",
    "lora4",
    "lora8",
    "random 0.1%",
    "random 1%",
    "random 10%",
)
VARIANTS = {
    "transformer": _SHARED
    + ("random 1% (remat)", "rows 1%", "rows 1% (delta)", "columns 1%"),
    "cnn": _SHARED + ("channels 1%", "filters 1%", "filters 1% (delta)"),
}
#: The variants whose steps ``--components`` takes apart.
COMPONENTS = ("full", "floor", "lora8", "random 1%", "rows 1%")
#: The variants of ``--quantized``: the float references, then the same
#: transformer quantized by Keras to int8 (``model.quantize("int8")``).
QUANTIZED = (
    "full",
    "floor",
    "int8 lora8",
    "int8 random 1%",
    "int8 rows 1%",
    "int8 floor",
)
#: The references the ``--quantized`` step times are divided by, round by round.
QUANTIZED_REFERENCES = ("full", "int8 lora8")
#: The variants whose steps ``--quantized --components`` takes apart.
QUANTIZED_COMPONENTS = ("floor", "int8 lora8", "int8 random 1%", "int8 rows 1%")
#: The form each partial int8 variant asks ``partialize`` for: its automatic
#: choice for scattered entries (at 1 %, the ``"delta"`` correction on every
#: kernel; ``"sparse"`` exists for a ``Dense`` only, and is slower here) and
#: the dense sub-products for whole rows. Neither dequantizes a whole kernel.
_INT8_MODES = {"random": "auto", "rows": "slices"}
#: The side of the kernel each slice variant frees whole.
_SIDES = {"rows": "in", "channels": "in", "columns": "out", "filters": "out"}


def _sizes(quick: bool, model: str = "transformer") -> dict:
    if model == "cnn":
        if quick:
            return dict(model="cnn", image=8, widths=(8, 16), batch=4, classes=4)
        return dict(model="cnn", image=32, widths=(64, 128, 256), batch=32, classes=10)
    if quick:
        return dict(vocab=256, width=64, heads=4, blocks=1, tokens=16, batch=4)
    return dict(vocab=1024, width=512, heads=8, blocks=4, tokens=128, batch=8)


def build(keras, sizes):
    """The model of ``sizes``, built with a fixed seed."""
    keras.utils.set_random_seed(0)
    if sizes.get("model") == "cnn":
        return _cnn(keras, sizes)
    width, heads = sizes["width"], sizes["heads"]
    tokens = keras.Input((sizes["tokens"],), dtype="int32")
    h = keras.layers.Embedding(sizes["vocab"], width, name="embedding")(tokens)
    for b in range(sizes["blocks"]):
        a = keras.layers.LayerNormalization(name=f"b{b}_norm1")(h)
        a = keras.layers.MultiHeadAttention(
            heads, width // heads, name=f"b{b}_attention"
        )(a, a, use_causal_mask=True)
        h = h + a
        f = keras.layers.LayerNormalization(name=f"b{b}_norm2")(h)
        f = keras.layers.Dense(4 * width, activation="gelu", name=f"b{b}_up")(f)
        h = h + keras.layers.Dense(width, name=f"b{b}_down")(f)
    h = keras.layers.LayerNormalization(name="final_norm")(h)
    return keras.Model(tokens, keras.layers.Dense(sizes["vocab"], name="head")(h))


def _cnn(keras, sizes):
    layers = keras.layers

    def conv_bn(h, filters, stride, name, relu=True):
        h = layers.Conv2D(filters, 3, stride, "same", use_bias=False, name=name)(h)
        h = layers.BatchNormalization(name=name + "_bn")(h)
        return layers.ReLU()(h) if relu else h

    images = keras.Input((sizes["image"], sizes["image"], 3))
    h = conv_bn(images, sizes["widths"][0], 1, "stem")
    for s, width in enumerate(sizes["widths"]):
        for b in range(2):
            stride = 2 if s > 0 and b == 0 else 1
            name = f"s{s}b{b}"
            r = conv_bn(h, width, stride, name + "_conv1")
            r = conv_bn(r, width, 1, name + "_conv2", relu=False)
            if stride != 1 or h.shape[-1] != width:
                h = layers.Conv2D(
                    width, 1, stride, use_bias=False, name=name + "_proj"
                )(h)
            h = layers.ReLU()(layers.Add()([h, r]))
    h = layers.GlobalAveragePooling2D()(h)
    return keras.Model(images, layers.Dense(sizes["classes"], name="head")(h))


def _kernel_layers(keras, model):
    from refimpl import _compat

    kinds = (keras.layers.Dense, keras.layers.EinsumDense, keras.layers.Conv2D)
    return [layer for layer in _compat.sub_layers(model) if type(layer) in kinds]


def _slice_mask(layer, np, density, side):
    """Whole slices of ``layer``'s kernel along its last input (or output) axis."""
    from refimpl import ops

    shape = tuple(layer.kernel.shape)
    axes = ops._layer_axes(layer)
    axis = max(a for a, (s, _) in enumerate(axes) if s == side)
    count = max(1, math.ceil(density * shape[axis]))
    chosen = np.random.default_rng(axis).choice(shape[axis], count, replace=False)
    mask = np.zeros(shape, bool)
    index = [slice(None)] * len(shape)
    index[axis] = np.sort(chosen)
    mask[tuple(index)] = True
    return mask


def variant(name, keras, np, sizes):
    """The model of one variant, not compiled."""
    import refimpl
    from refimpl import selection

    model = build(keras, sizes)
    modes, in_place = {}, False
    if name.startswith("int8 "):  # quantized by Keras, then as the float variant
        _quantize(model, "int8")
        name, modes = name[len("int8 ") :], _INT8_MODES
        # converted in place, as Keras' enable_lora is: no copy of the model
        in_place = True
    layers = _kernel_layers(keras, model)
    if name == "full":
        return model
    if name == "floor":
        for layer in layers:
            layer.kernel.trainable = False
        return model
    if name.startswith("lora"):
        for layer in layers:
            layer.enable_lora(int(name[4:]))  # freezes the kernel itself
        return model
    density = float(name.split()[1].rstrip("%")) / 100
    if name.startswith("random"):
        masks = {
            layer.path: selection.random_mask(
                tuple(layer.kernel.shape), fraction=density, seed=i
            )
            for i, layer in enumerate(layers)
        }
        if name.endswith("(remat)"):  # the product recomputed, not kept
            names = sorted({layer.name for layer in layers})
            with keras.RematScope(mode="list_of_layers", layer_names=names):
                return refimpl.partialize(model, masks, train="all", mode="delta")
        mode = modes.get("random", "delta")
        return refimpl.partialize(
            model, masks, train="all", mode=mode, in_place=in_place
        )
    kind = name.split()[0]
    side = _SIDES[kind]
    masks = {layer.path: _slice_mask(layer, np, density, side) for layer in layers}
    mode = "delta" if name.endswith("(delta)") else modes.get(kind, "slices")
    return refimpl.partialize(model, masks, train="all", mode=mode, in_place=in_place)


def _quantize(model, mode):
    """``model.quantize(mode)``, without Keras' warnings about the layers it
    has nothing to quantize in (the norms, the input)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Layer .* does not have a `quantize`")
        model.quantize(mode)


def weight_bytes(model) -> dict:
    """The bytes of ``model``'s variables, from their dtypes and shapes.

    Every variable counts once: the float weights, an int8 base's codes and
    scales, the free values and their positions, LoRA's factors. ``frozen``
    and ``trainable`` split the total by the variables' ``trainable``.
    """
    import numpy as np

    seen, held = set(), {"trainable": 0, "frozen": 0}
    for v in model.variables:
        if id(v) in seen:
            continue
        seen.add(id(v))
        size = int(np.prod(v.shape)) * np.dtype(str(v.dtype)).itemsize
        held["trainable" if v.trainable else "frozen"] += size
    return {
        "weight_bytes": held["trainable"] + held["frozen"],
        "frozen_bytes": held["frozen"],
        "trainable_bytes": held["trainable"],
    }


def _freeze_embedding_and_kernels(model, keras):
    """``train="all"`` keeps every other weight as it was; freeze the embedding,
    so that each partial variant trains its kernel entries, the norms and the
    biases, as the floor does."""
    if any(layer.name == "embedding" for layer in model.layers):
        model.get_layer("embedding").trainable = False


def step_function(model, keras, tf):
    optimizer = keras.optimizers.AdamW(1e-4)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    return step, optimizer


def _setup_tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import keras
    import numpy as np
    import tensorflow as tf

    return keras, np, tf


def _batch(np, sizes):
    rng = np.random.default_rng(0)
    if sizes.get("model") == "cnn":
        shape = (sizes["batch"], sizes["image"], sizes["image"], 3)
        x = rng.normal(size=shape).astype("float32")
        return x, rng.integers(0, sizes["classes"], sizes["batch"]).astype("int32")
    x = rng.integers(0, sizes["vocab"], (sizes["batch"], sizes["tokens"]))
    return x.astype("int32"), np.roll(x, -1, axis=1).astype("int32")


def _prepared(name, keras, np, tf, sizes):
    model = variant(name, keras, np, sizes)
    if name not in ("full",):
        _freeze_embedding_and_kernels(model, keras)
    step, optimizer = step_function(model, keras, tf)
    return model, step, optimizer


def memory_one(name: str, quick: bool, model_name: str = "transformer") -> dict:
    """Peak memory of three steps of ``name``, in this (fresh) process.

    ``step_mb``: the peak resident set during the steps above the resident set
    just before them (the step's activations, gradients and temporaries);
    ``training_mb``: the same peak above the resident set before the model was
    built (with TensorFlow started and the batch made), so it also holds the
    weights, the optimizer state and the traced step; ``held_mb`` is the
    difference. ``weight_bytes``: see :func:`weight_bytes`.
    """
    from evidence.benchmarks.memory import _status_mb

    keras, np, tf = _setup_tf()
    sizes = _sizes(quick, model_name)
    x, y = (tf.constant(a) for a in _batch(np, sizes))  # TensorFlow started
    before = _status_mb("VmRSS")
    model, step, optimizer = _prepared(name, keras, np, tf, sizes)
    step.get_concrete_function(x, y)
    resident = _status_mb("VmRSS")
    pathlib.Path("/proc/self/clear_refs").write_text("5")
    for _ in range(3):
        step(x, y).numpy()
    peak = _status_mb("VmHWM")
    state = sum(int(np.prod(v.shape)) for v in optimizer.variables[2:])
    return {
        "variant": name,
        "trainable_values": sum(
            int(np.prod(v.shape)) for v in model.trainable_variables
        ),
        "optimizer_state_values": state,
        "resident_mb": round(resident, 1),
        "step_mb": round(peak - resident, 1),
        **weight_bytes(model),
        "held_mb": round(resident - before, 1),
        "training_mb": round(peak - before, 1),
        "form": _form(model),
    }


def _form(model) -> str:
    """The products the kernels of ``model`` use: the partial weights' forms,
    ``lora``, or nothing for plain kernels ("+" between several)."""
    from refimpl import _compat

    forms = set()
    for layer in _compat.sub_layers(model):
        if hasattr(layer, "partial_weight"):
            forms.add(layer.partial_weight.product_mode())
        elif getattr(layer, "lora_enabled", False):
            forms.add("lora")
    return "+".join(sorted(forms))


#: The memory columns of the float tables (``cpu_{transformer,cnn}.csv``).
_MEMORY_COLUMNS = (
    "trainable_values",
    "optimizer_state_values",
    "resident_mb",
    "step_mb",
)


def timing(
    names,
    quick: bool,
    repeats: int,
    model_name="transformer",
    references=("full", "floor"),
) -> list[dict]:
    """Step times of ``names``, interleaved, as ratios to each of ``references``
    within each round (columns ``vs_<reference>``, spaces as ``_``)."""
    from evidence.benchmarks import timing as timer

    keras, np, tf = _setup_tf()
    sizes = _sizes(quick, model_name)
    x, y = _batch(np, sizes)
    steps, counts = {}, {}
    for name in names:
        _, steps[name], _ = _prepared(name, keras, np, tf, sizes)
        counts[name] = timer.warm_up(steps[name], x, y, target_s=0.2 if quick else 1.0)
    samples = timer.interleaved(steps, x, y, counts, repeats=repeats)
    rows = []
    for name in names:
        row = {"variant": name}
        for reference in references:
            to = timer.summarise(samples[name], samples[reference])
            row.setdefault("step_ms", round(to["median_ms"], 2))
            column = "vs_" + reference.replace(" ", "_")
            row[column] = round(to["ratio_to_dense"], 3)
            row[column + "_q25"] = round(to["ratio_q25"], 3)
            row[column + "_q75"] = round(to["ratio_q75"], 3)
        rows.append(row)
    return rows


def stages(model, keras, tf):
    """The parts of a step as functions of ``(x, y)``.

    ``compose``: every kernel a partial layer's call composes (none for a
    plain model, none in the ``"slices"`` form); ``forward``: the forward
    pass and the loss; ``gradient``: and the gradient; ``update``: the
    optimizer's update alone, applying gradients computed once; ``step``:
    the whole training step.
    """
    from refimpl import _compat
    from refimpl.layers.partial import _takes_over

    step, optimizer = step_function(model, keras, tf)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    composing = [
        layer
        for layer in _compat.sub_layers(model)
        if hasattr(layer, "partial_weight")
        and not _takes_over(layer)
        # a quantized base adds its correction to the int8 product instead
        and getattr(layer.partial_weight, "quantized", None) is None
    ]

    @tf.function
    def compose(x, y):
        return tf.add_n([tf.reduce_sum(layer.kernel) for layer in composing] + [0.0])

    @tf.function
    def forward(x, y):
        return loss_fn(y, model(x, training=True))

    def gradients(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    @tf.function
    def gradient(x, y):
        return tf.add_n([tf.reduce_sum(g) for g in gradients(x, y)])

    fixed = None

    @tf.function
    def apply(grads):
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return tf.constant(0.0)

    def update(x, y):
        nonlocal fixed
        if fixed is None:  # the gradients of the batch, computed once
            fixed = [tf.convert_to_tensor(g) for g in tf.function(gradients)(x, y)]
        return apply(fixed)

    return {
        "compose": compose,
        "forward": forward,
        "gradient": gradient,
        "update": update,
        "step": step,
    }


def components(names, quick: bool, repeats: int) -> list[dict]:
    """Milliseconds of each part of a step of each variant (:func:`stages`)."""
    from evidence.benchmarks import timing as timer

    keras, np, tf = _setup_tf()
    sizes = _sizes(quick)
    x, y = _batch(np, sizes)
    steps, counts = {}, {}
    for name in names:
        model = variant(name, keras, np, sizes)
        if name != "full":
            _freeze_embedding_and_kernels(model, keras)
        for part, function in stages(model, keras, tf).items():
            steps[name, part] = function
            target = 0.1 if quick else 0.5
            counts[name, part] = timer.warm_up(function, x, y, target_s=target)
    samples = timer.interleaved(steps, x, y, counts, repeats=repeats)
    ms = {key: float(np.median(value)) * 1e3 for key, value in samples.items()}
    rows = []
    for name in names:
        compose, forward = ms[name, "compose"], ms[name, "forward"]
        gradient, update = ms[name, "gradient"], ms[name, "update"]
        rows.append(
            {
                "variant": name,
                "compose_ms": round(compose, 2),
                "forward_ms": round(forward - compose, 2),
                "gradient_ms": round(gradient - forward, 2),
                "update_ms": round(update, 2),
                "step_ms": round(ms[name, "step"], 2),
            }
        )
    return rows


def _write(rows, path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    for row in rows:
        print(row)


def _memory(names, quick, model_name, repeats=1):
    """:func:`memory_one` of each of ``names``, each in a fresh process; of
    ``repeats`` processes, the one with the median ``training_mb``."""
    memory = {}
    for name in names:
        cmd = [sys.executable, "-m", __spec__.name, "--memory-one", name]
        cmd += ["--model", model_name] + (["--quick"] if quick else [])
        runs = []
        for _ in range(repeats):
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        runs.sort(key=lambda run: run.get("training_mb", 0))
        memory[name] = runs[len(runs) // 2]
    return memory


def _run(model_name, quick, repeats, out):
    tag = "cpu_quick" if quick else "cpu"
    names = VARIANTS[model_name]
    rows = timing(names, quick, repeats, model_name)
    memory = _memory(names, quick, model_name)
    for row in rows:
        row.update({key: memory[row["variant"]][key] for key in _MEMORY_COLUMNS})
    _write(rows, out / f"{tag}_{model_name}.csv")


def quantized(quick: bool, repeats: int, memory_repeats: int = 3) -> list[dict]:
    """The rows of ``cpu_transformer_int8.csv``: the step times of
    :data:`QUANTIZED` (one process, interleaved, ratios to
    :data:`QUANTIZED_REFERENCES`), then each variant's memory (a fresh process
    each, :func:`memory_one`, the median of ``memory_repeats`` processes) and
    its training memory as a fraction of full fine-tuning's."""
    rows = timing(QUANTIZED, quick, repeats, references=QUANTIZED_REFERENCES)
    memory = _memory(QUANTIZED, quick, "transformer", memory_repeats)
    full = memory["full"]["training_mb"]
    for row in rows:
        found = memory[row["variant"]]
        row.update(
            {
                key: found[key]
                for key in (
                    "trainable_values",
                    "optimizer_state_values",
                    "weight_bytes",
                    "frozen_bytes",
                    "trainable_bytes",
                    "held_mb",
                    "step_mb",
                    "training_mb",
                )
            }
        )
        row["training_vs_full"] = round(found["training_mb"] / full, 3)
        row["form"] = found["form"]
    return rows


def targets(rows) -> list[str]:
    """The two targets for each partial int8 variant, met or missed:
    a step no slower than Keras LoRA r8 on the same int8 model (the median of
    the per-round ratios at most 1), and training memory at most half of
    float full fine-tuning's."""
    lines = []
    for row in rows:
        name = row["variant"]
        if not name.startswith("int8 ") or "lora" in name or "floor" in name:
            continue
        speed = row["vs_int8_lora8"]
        memory = row["training_vs_full"]
        lines.append(
            f"{name}: step {speed:.3f}x int8 lora8 (target <= 1: "
            f"{'met' if speed <= 1 else 'missed'}); training memory "
            f"{memory:.3f}x full (target <= 0.5: "
            f"{'met' if memory <= 0.5 else 'missed'})"
        )
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODELS + ("all",), default="all")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--memory-repeats",
        type=int,
        default=3,
        help="processes per variant for --quantized's memory (the median)",
    )
    parser.add_argument("--components", action="store_true")
    parser.add_argument(
        "--quantized",
        action="store_true",
        help="the transformer's int8 variants (results/real/cpu_transformer_int8.csv)",
    )
    parser.add_argument("--memory-one", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.memory_one:
        print(json.dumps(memory_one(args.memory_one, args.quick, args.model)))
        return 0
    tag = "cpu_quick" if args.quick else "cpu"
    if args.quantized and args.components:
        rows = components(QUANTIZED_COMPONENTS, args.quick, args.repeats)
        _write(rows, args.out / f"{tag}_transformer_int8_components.csv")
        return 0
    if args.components:
        rows = components(COMPONENTS, args.quick, args.repeats)
        _write(rows, args.out / f"{tag}_transformer_components.csv")
        return 0
    if args.quantized:
        rows = quantized(args.quick, args.repeats, args.memory_repeats)
        _write(rows, args.out / f"{tag}_transformer_int8.csv")
        print("\n".join(targets(rows)))
        return 0
    for model_name in MODELS if args.model == "all" else (args.model,):
        _run(model_name, args.quick, args.repeats, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
