"""Every way to fine-tune the tiny GPT-2 of :mod:`evidence.text_lm` on Python source.

The transformer chapter's comparison. Each method starts from the committed
checkpoint (pretrained on the English documentation), trains on
``code_train.txt`` and is scored on ``code_heldout.txt``, other modules, in
nats per character.

``python -m evidence.text_finetune`` first picks each method's learning rate on
a validation slice of the training text (seed 0), then trains every method
at that rate for each seed, and writes ``evidence/data/text_lm/results.csv``.
Every run that masks checks that each entry outside its mask, and every
weight it does not train, kept its pretrained bits. The chapter reads the CSV,
and re-runs some rows to check that the code still gives them.
"""

from __future__ import annotations

import csv
import pathlib
import sys
import tempfile
import time

import keras
import keras_hub
import numpy as np

import refimpl
from evidence import text_lm
from refimpl import selection
from refimpl.partial import partial_weights

RESULTS = text_lm.DATA / "results.csv"
SEEDS = (0, 1, 2)
#: The learning rates tried, about 3x apart: the middle three first, then one
#: more beyond whichever end is best, until the best is not at an end.
LEARNING_RATES = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
STEPS, BATCH_SIZE = 200, 16

#: The weights the masks choose from: the tied token embedding and every kernel.
KERNEL_NAMES = (
    "query", "key", "value", "attention_output",
    "feedforward_intermediate_dense", "feedforward_output_dense",
)  # fmt: skip

#: New tokens for code, on the reserved rows: indentation, and three words.
NEW_TOKENS = {
    "    ": text_lm.FIRST_RESERVED,
    "self": text_lm.FIRST_RESERVED + 1,
    "def ": text_lm.FIRST_RESERVED + 2,
    "return": text_lm.FIRST_RESERVED + 3,
}

#: method name -> (family, argument)
METHODS = {
    "full": ("full", None),
    "tied embedding": ("embedding", None),
    **{f"LoRA r={r}": ("lora", r) for r in (1, 2, 4, 8)},
    **{
        f"{score} {fraction:.1%}": (score.lower(), fraction)
        for score in ("random", "magnitude", "Fisher")
        for fraction in (0.001, 0.01, 0.1)
    },
    "one head per block": ("heads", 1),
    "FFN neurons 1/8": ("neurons", 32),
    "new tokens": ("tokens", None),
    "drop and grow 1.0%": ("dropgrow", 0.01),
}

#: Drop and grow: from the random 1 % mask, every 20 steps a fifth of each
#: weight's entries is swapped, scored on one probe batch, until step 160.
DROP_AND_GROW = {"every": 20, "fraction": 0.2, "batch_size": 16, "stop_after": 160}

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def pretrained() -> keras_hub.models.GPT2Backbone:
    """The committed checkpoint, loaded as a keras-hub preset."""
    return keras_hub.models.GPT2Backbone.from_preset(str(text_lm.PRESET))


def targets(backbone) -> dict[str, np.ndarray]:
    """The weights masks choose from, by path, and their pretrained values."""
    return {
        w.path: keras.ops.convert_to_numpy(w)
        for w in backbone.weights
        if w.path == "token_embedding/embeddings"
        or (w.path.endswith("/kernel") and w.path.split("/")[-2] in KERNEL_NAMES)
    }


def top_k_across(scores: dict[str, np.ndarray], k: int) -> dict[str, np.ndarray]:
    """The ``k`` largest scores over all weights together, split back per weight."""
    flat = selection.top_k_mask(
        np.concatenate([s.ravel() for s in scores.values()]), k=k
    )
    parts = np.split(flat, np.cumsum([s.size for s in scores.values()])[:-1])
    return {p: part.reshape(s.shape) for (p, s), part in zip(scores.items(), parts)}


def train_data(seed: int, tokens=None, text: str = "code_train"):
    ids = text_lm.encode(text_lm.read(text), tokens)
    return text_lm.random_windows(ids, STEPS * BATCH_SIZE, seed)


def masks_for(backbone, family: str, arg, seed: int) -> dict[str, np.ndarray]:
    """The masks of a masked method, by weight path."""
    weights = targets(backbone)
    rng = np.random.default_rng(seed)
    total = backbone.count_params()
    if family == "random":
        return top_k_across({p: rng.random(w.shape) for p, w in weights.items()},
                            round(arg * total))  # fmt: skip
    if family == "magnitude":
        return top_k_across(
            {p: np.abs(w) for p, w in weights.items()}, round(arg * total)
        )
    if family == "fisher":  # on 4 batches of 16 windows of the new text
        model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
        x, y = train_data(seed + 1000)
        fisher = selection.fisher_scores(model, x, y, loss=LOSS, batch_size=16)
        return top_k_across({p: fisher[p] for p in weights}, round(arg * total))
    if family == "heads":  # the same random head(s) of every attention layer
        masks = {}
        for p, w in weights.items():
            heads = rng.choice(4, arg, replace=False)
            name = p.split("/")[-2]
            if name in ("query", "key", "value"):
                masks[p] = np.zeros(w.shape, bool)
                masks[p][:, heads, :] = True
            elif name == "attention_output":
                masks[p] = np.zeros(w.shape, bool)
                masks[p][heads] = True
        return masks
    if family == "neurons":  # the same neurons in and out of every feed-forward
        masks = {}
        for block in range(text_lm.CONFIG["num_layers"]):
            neurons = np.sort(
                rng.choice(text_lm.CONFIG["intermediate_dim"], arg, replace=False)
            )
            prefix = f"transformer_layer_{block}/feedforward_"
            shape_in = weights[prefix + "intermediate_dense/kernel"].shape
            masks[prefix + "intermediate_dense/kernel"] = selection.columns_mask(
                shape_in, neurons
            )
            masks[prefix + "output_dense/kernel"] = selection.rows_mask(
                shape_in[::-1], neurons
            )
        return masks
    if family == "tokens":
        table = weights["token_embedding/embeddings"]
        return {
            "token_embedding/embeddings": selection.rows_mask(
                table.shape, list(NEW_TOKENS.values())
            )
        }
    raise ValueError(family)


def build(method: str, seed: int, learning_rate: float):
    """The model to fine-tune for ``method``: ``(model, masks, tokens, callbacks)``."""
    family, arg = METHODS[method]
    keras.utils.set_random_seed(seed)
    backbone = pretrained()
    masks, tokens = None, None
    if family == "tokens":  # a new row starts as the mean of its characters' rows
        tokens = NEW_TOKENS
        table = backbone.token_embedding.embeddings
        rows = keras.ops.convert_to_numpy(table).copy()
        for text, i in tokens.items():
            rows[i] = rows[text_lm.encode(text)].mean(0)
        table.assign(rows)
    if family == "embedding":
        for layer in backbone.layers:
            layer.trainable = layer.name == "token_embedding"
    elif family == "lora":
        backbone.enable_lora(rank=arg)
    elif family != "full":
        masks = masks_for(
            backbone, "random" if family == "dropgrow" else family, arg, seed
        )
        masks = {p: m for p, m in masks.items() if m.any()}
        backbone = refimpl.partialize(backbone, masks)  # the rest frozen
    model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss=LOSS, metrics=[])
    callbacks = []
    if family == "dropgrow":  # probe windows of their own, from the training text
        callbacks.append(refimpl.DropAndGrow(train_data(seed + 2000), **DROP_AND_GROW))
    return model, masks, tokens, callbacks


class _EverActive(keras.callbacks.Callback):
    """The union of each partial weight's masks over training, by weight path,
    read after each update of ``grow`` (a :class:`refimpl.DropAndGrow`)."""

    def __init__(self, masks, grow):
        super().__init__()
        self.masks = {p: m.copy() for p, m in masks.items()}
        self.grow, self.seen = grow, 0

    def on_train_batch_end(self, batch, logs=None):
        if len(self.grow.history) == self.seen:
            return
        self.seen = len(self.grow.history)
        for weight in partial_weights(self.model.backbone):
            self.masks[weight.path] |= weight.mask


class _StepTimer(keras.callbacks.Callback):
    """Seconds per step, from step ``skip`` on (after compiling and warming up)."""

    def __init__(self, skip: int = 50):
        super().__init__()
        self.skip, self.start, self.seconds = skip, None, None

    def on_train_batch_begin(self, batch, logs=None):
        if batch == self.skip:
            self.start = time.perf_counter()

    def on_train_end(self, logs=None):
        self.seconds = (time.perf_counter() - self.start) / (STEPS - self.skip)


def values_of(model) -> dict[str, np.ndarray]:
    """Every weight of the backbone by its pretrained path (partial ones composed)."""
    backbone = model.backbone
    values = {w.path: keras.ops.convert_to_numpy(w) for w in backbone.weights}
    for weight in partial_weights(backbone):  # the base's path: the pretrained one
        values[weight.path] = weight.folded()
    plain = _plain_paths()
    assert plain <= set(values), plain - set(values)
    return {p: v for p, v in values.items() if p in plain}


def _plain_paths() -> set[str]:
    if not _PLAIN_PATHS:
        _PLAIN_PATHS.update(
            w.path for w in keras_hub.models.GPT2Backbone(**text_lm.CONFIG).weights
        )
    return _PLAIN_PATHS


_PLAIN_PATHS: set[str] = set()


def fine_tune(
    method: str, seed: int, learning_rate: float, *, heldout="code_heldout", keep=False
):
    """Train one method on the code; its held-out loss, counts and sizes.

    With ``keep``, also the trained model and its tokens: ``(row, model, tokens)``.
    """
    model, masks, tokens, callbacks = build(method, seed, learning_rate)
    before = values_of(model)
    x, y = train_data(seed, tokens)
    timer = _StepTimer()
    if callbacks:  # masks that change: check against every entry ever active
        callbacks.append(_EverActive(masks, callbacks[0]))
    model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, shuffle=False, verbose=0,
              callbacks=[*callbacks, timer])  # fmt: skip
    after = values_of(model)
    if callbacks:
        masks = callbacks[-1].masks
    if masks is not None:  # every entry outside the masks kept its bits
        for path, value in before.items():
            if path in masks:
                refimpl.testing.assert_frozen(value, after[path], masks[path])
            else:
                np.testing.assert_array_equal(after[path], value, err_msg=path)
    loss = text_lm.nats_per_character(model, text_lm.read(heldout), tokens)
    row = {
        "method": method,
        "seed": seed,
        "learning_rate": learning_rate,
        "heldout_nats_per_char": loss,
        "trainable": refimpl.testing.count_free_parameters(model),
        "optimizer_state": refimpl.testing.count_optimizer_state(model.optimizer),
        "file_bytes": trained_file_bytes(model, masks),
        "seconds_per_step": timer.seconds,
    }
    return (row, model, tokens) if keep else row


def trained_file_bytes(model, masks) -> int:
    """The size of the file that holds what this method trained."""
    backbone = model.backbone
    with tempfile.TemporaryDirectory() as tmp:
        if masks is not None:
            path = pathlib.Path(tmp, "entries.npz")
            refimpl.save_partial_weights(backbone, path)
        elif getattr(backbone, "_lora_enabled_layers", None):
            path = pathlib.Path(tmp, "adapters.lora.h5")
            backbone.save_lora_weights(str(path))
        else:  # the trained weights whole
            path = pathlib.Path(tmp, "trained.npz")
            np.savez(
                path,
                *[keras.ops.convert_to_numpy(w) for w in backbone.trainable_weights],
            )
        return path.stat().st_size


def choose_rate(method: str) -> float:
    """The learning rate with the lowest validation loss at seed 0."""
    losses = {}

    def validation(i):
        if i not in losses:
            keras.backend.clear_session()
            rate = LEARNING_RATES[i]
            row = fine_tune(method, 0, rate, heldout="code_validation")
            loss = row["heldout_nats_per_char"]
            losses[i] = loss if np.isfinite(loss) else np.inf
            print(f"{method:20s} lr {rate:g}: validation {loss:.4f}", flush=True)
        return losses[i]

    low, high = 2, 4
    for i in range(low, high + 1):
        validation(i)
    while True:
        best = min(losses, key=losses.get)
        if best == low and low > 0:
            low -= 1
            validation(low)
        elif best == high and high < len(LEARNING_RATES) - 1:
            high += 1
            validation(high)
        else:
            return LEARNING_RATES[best]


def main(*methods: str) -> None:
    """Run ``methods`` (all by default) and write their rows into the CSV.

    Naming methods replaces their rows and keeps the others. Step times
    compare only within one run, so each row's ``step_time_vs_full`` divides
    by the median step of full fine-tuning in the same run (timed again, at
    its stored rate, when ``full`` is not among ``methods``).
    """
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown methods {unknown}; known: {list(METHODS)}")
    rows = []
    for method in methods or METHODS:
        best = choose_rate(method)
        for seed in SEEDS:
            keras.backend.clear_session()
            row = fine_tune(method, seed, best)
            print(row, flush=True)
            rows.append(row)
    full = [r["seconds_per_step"] for r in rows if r["method"] == "full"]
    if not full:
        with open(RESULTS) as file:
            [rate] = {
                float(r["learning_rate"])
                for r in csv.DictReader(file)
                if r["method"] == "full"
            }
        full = []
        for seed in SEEDS:
            keras.backend.clear_session()
            full.append(fine_tune("full", seed, rate)["seconds_per_step"])
    for row in rows:
        row["step_time_vs_full"] = row["seconds_per_step"] / float(np.median(full))
    if methods and RESULTS.exists():
        with open(RESULTS) as file:
            kept = [r for r in csv.DictReader(file) if r["method"] not in methods]
        order = list(METHODS)
        rows = sorted(
            kept + rows, key=lambda r: (order.index(r["method"]), int(r["seed"]))
        )
    with open(RESULTS, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main(*sys.argv[1:])
