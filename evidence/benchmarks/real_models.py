"""Training-step time and memory of partial fine-tuning on a real transformer.

    python -m evidence.benchmarks.real_models  # writes results/real/cpu_transformer.csv
    python -m evidence.benchmarks.real_models --quick  # a small model

The model is a plain-Keras transformer: a token embedding, ``blocks`` blocks
of ``MultiHeadAttention`` and a 4x feed-forward with layer norms, and a
``Dense`` head; width 512, 8 heads, 128 tokens x batch 8, AdamW, TensorFlow.
Every variant trains the same batch:

* ``full``: every weight;
* ``floor``: every kernel frozen, only norms and biases train, the least any
  method that trains kernel entries can cost;
* ``lora4``, ``lora8``: Keras' ``enable_lora`` on every kernel;
* ``random 1%`` (and 0.1%, 10%): ``refimpl.partialize`` with random entries
  of every kernel (the ``"delta"`` form); ``random 1% (remat)``: the same
  under ``keras.RematScope``, where the product is recomputed in the
  backward pass instead of keeping the composed kernel;
* ``rows 1%`` / ``columns 1%``: whole input rows / output columns of every
  kernel, in the ``"slices"`` form; ``rows 1% (delta)``: the same mask
  composed as ``"delta"`` does, to show what the form changes.

Step times come from one process, interleaved rounds (:mod:`.timing`), as
ratios to ``full`` and to ``floor`` within each round. Memory comes from one
fresh process per variant: the peak resident set of three steps above what
the variant holds before them (as :mod:`.memory` measures it), and the
number of optimizer state values.
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
VARIANTS = (
    "full",
    "floor",
    "lora4",
    "lora8",
    "random 0.1%",
    "random 1%",
    "random 10%",
    "random 1% (remat)",
    "rows 1%",
    "rows 1% (delta)",
    "columns 1%",
)


def _sizes(quick: bool) -> dict:
    if quick:
        return dict(vocab=256, width=64, heads=4, blocks=1, tokens=16, batch=4)
    return dict(vocab=1024, width=512, heads=8, blocks=4, tokens=128, batch=8)


def build(keras, sizes):
    """The transformer, built with a fixed seed."""
    keras.utils.set_random_seed(0)
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


def _kernel_layers(keras, model):
    from refimpl import _compat

    kinds = (keras.layers.Dense, keras.layers.EinsumDense)
    return [layer for layer in _compat.sub_layers(model) if type(layer) in kinds]


def _slice_mask(layer, keras, np, density, side):
    """Whole slices of ``layer``'s kernel along its last input (or output) axis."""
    from refimpl import _slices

    shape = tuple(layer.kernel.shape)
    if isinstance(layer, keras.layers.EinsumDense):
        axes = _slices.kernel_axes(layer.equation)
    else:
        axes = (("in", -1), ("out", -1))
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
        return refimpl.partialize(model, masks, train="all", mode="delta")
    side = "in" if name.startswith("rows") else "out"
    masks = {
        layer.path: _slice_mask(layer, keras, np, density, side) for layer in layers
    }
    mode = "delta" if name.endswith("(delta)") else "slices"
    return refimpl.partialize(model, masks, train="all", mode=mode)


def _freeze_embedding_and_kernels(model, keras):
    """``train="all"`` keeps every other weight as it was; freeze the embedding,
    so that each partial variant trains its kernel entries, the norms and the
    biases, as the floor does."""
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
    x = rng.integers(0, sizes["vocab"], (sizes["batch"], sizes["tokens"]))
    return x.astype("int32"), np.roll(x, -1, axis=1).astype("int32")


def _prepared(name, keras, np, tf, sizes):
    model = variant(name, keras, np, sizes)
    if name not in ("full",):
        _freeze_embedding_and_kernels(model, keras)
    step, optimizer = step_function(model, keras, tf)
    return model, step, optimizer


def memory_one(name: str, quick: bool) -> dict:
    """Peak memory of three steps of ``name``, in this (fresh) process."""
    from evidence.benchmarks.memory import _status_mb

    keras, np, tf = _setup_tf()
    sizes = _sizes(quick)
    x, y = _batch(np, sizes)
    model, step, optimizer = _prepared(name, keras, np, tf, sizes)
    step.get_concrete_function(tf.constant(x), tf.constant(y))
    resident = _status_mb("VmRSS")
    pathlib.Path("/proc/self/clear_refs").write_text("5")
    for _ in range(3):
        step(x, y).numpy()
    state = sum(int(np.prod(v.shape)) for v in optimizer.variables[2:])
    return {
        "variant": name,
        "trainable_values": sum(
            int(np.prod(v.shape)) for v in model.trainable_variables
        ),
        "optimizer_state_values": state,
        "resident_mb": round(resident, 1),
        "step_mb": round(_status_mb("VmHWM") - resident, 1),
    }


def timing(names, quick: bool, repeats: int) -> list[dict]:
    from evidence.benchmarks import timing as timer

    keras, np, tf = _setup_tf()
    sizes = _sizes(quick)
    x, y = _batch(np, sizes)
    steps, counts = {}, {}
    for name in names:
        _, steps[name], _ = _prepared(name, keras, np, tf, sizes)
        counts[name] = timer.warm_up(steps[name], x, y, target_s=0.2 if quick else 1.0)
    samples = timer.interleaved(steps, x, y, counts, repeats=repeats)
    rows = []
    for name in names:
        to_full = timer.summarise(samples[name], samples["full"])
        to_floor = timer.summarise(samples[name], samples["floor"])
        rows.append(
            {
                "variant": name,
                "step_ms": round(to_full["median_ms"], 2),
                "vs_full": round(to_full["ratio_to_dense"], 3),
                "vs_full_q25": round(to_full["ratio_q25"], 3),
                "vs_full_q75": round(to_full["ratio_q75"], 3),
                "vs_floor": round(to_floor["ratio_to_dense"], 3),
                "vs_floor_q25": round(to_floor["ratio_q25"], 3),
                "vs_floor_q75": round(to_floor["ratio_q75"], 3),
            }
        )
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--memory-one", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.memory_one:
        print(json.dumps(memory_one(args.memory_one, args.quick)))
        return 0
    tag = "cpu_quick" if args.quick else "cpu"
    rows = timing(VARIANTS, args.quick, args.repeats)
    memory = {}
    for name in VARIANTS:
        cmd = [sys.executable, "-m", __spec__.name, "--memory-one", name]
        cmd += ["--quick"] if args.quick else []
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        memory[name] = json.loads(done.stdout.strip().splitlines()[-1])
    for row in rows:
        row.update(memory[row["variant"]])
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / f"{tag}_transformer.csv", "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    for row in rows:
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
