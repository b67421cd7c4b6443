"""Rough throughput of a mixed batch over 8 adapters of 1 % each.

A GPT-2 backbone (keras-hub, random init; width 256, 4 layers, 64 tokens,
a batch of 64 rows: 8 per adapter) with 8 adapters, each a random 1 % of
every attention and feed-forward kernel. Times, interleaved and as medians:

* the base alone (``model.predict`` with no adapter active);
* ``refimpl.adapters.predict`` of the mixed batch (one pass);
* ``refimpl.adapters.use`` then ``model.predict`` per adapter's group.

Run: ``KERAS_BACKEND=jax python scripts/time_mixed_adapters.py``
(``HIDDEN``, ``LAYERS``, ``SEQ``, ``BATCH``, ``REPEATS`` in the environment
change the sizes). A script, not a test: the numbers depend on the machine.
"""

import os
import tempfile
import time

import keras
import keras_hub
import numpy as np

import refimpl
from refimpl import adapters, selection
from refimpl.partial import partial_weights

HIDDEN = int(os.environ.get("HIDDEN", 256))
LAYERS = int(os.environ.get("LAYERS", 4))
SEQ = int(os.environ.get("SEQ", 64))
BATCH = int(os.environ.get("BATCH", 64))
REPEATS = int(os.environ.get("REPEATS", 5))
KEYS = [
    "query",
    "key",
    "value",
    "attention_output",
    "feedforward_intermediate_dense",
    "feedforward_output_dense",
]


def backbone():
    keras.utils.set_random_seed(0)
    return keras_hub.models.GPT2Backbone(
        vocabulary_size=1000, num_layers=LAYERS, num_heads=4, hidden_dim=HIDDEN,
        intermediate_dim=4 * HIDDEN, max_sequence_length=SEQ, dropout=0.0,
        name="gpt2_backbone",
    )  # fmt: skip


def one_percent(seed):
    return lambda w: selection.random_mask(w.shape, fraction=0.01, seed=seed)


def main():
    folder = tempfile.mkdtemp()
    model = backbone()
    for i in range(8):
        masks = {key: one_percent(10 * i + j) for j, key in enumerate(KEYS)}
        tuned = refimpl.partialize(backbone(), masks)
        for pw in partial_weights(tuned):  # as if trained
            pw.free.assign(pw.free + 0.01)
        refimpl.save_partial_weights(tuned, f"{folder}/{i}.npz")
        adapters.load(model, f"{folder}/{i}.npz", f"t{i}")
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 1000, (BATCH, SEQ))
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    names = [f"t{i % 8}" for i in range(BATCH)]
    rng.shuffle(names)

    def base():
        adapters.use(model, None)
        return model.predict(x, batch_size=BATCH, verbose=0)

    def mixed():
        return adapters.predict(model, x, names, batch_size=BATCH)

    def per_group():
        for name in sorted(set(names)):
            rows = [i for i, n in enumerate(names) if n == name]
            adapters.use(model, name)
            model.predict({k: v[rows] for k, v in x.items()}, verbose=0)

    runs = {"base": base, "mixed": mixed, "use per group": per_group}
    times = {name: [] for name in runs}
    for run in runs.values():
        run()  # compiled once
    for _ in range(REPEATS):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    median = {name: float(np.median(t)) for name, t in times.items()}
    print(
        f"{keras.backend.backend()}, width {HIDDEN}, {LAYERS} layers, "
        f"{SEQ} tokens, batch {BATCH}: "
        + ", ".join(f"{n} {t * 1e3:.0f} ms" for n, t in median.items())
        + "; throughput against the base: "
        + ", ".join(
            f"{n} {median['base'] / t:.2f}x" for n, t in median.items() if n != "base"
        )
    )


if __name__ == "__main__":
    main()
