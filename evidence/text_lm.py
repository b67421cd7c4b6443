"""A tiny character-level GPT-2 and the real text it learns, for chapter 11.

Python ships two kinds of real text: its English reference documentation
(``pydoc_data.topics``) and the source code of its standard library. The
chapter pretrains nothing itself: it loads a checkpoint of a small keras-hub
``GPT2Backbone`` pretrained on the documentation, and adapts it to the code.

``python -m evidence.text_lm`` makes the committed files under
``evidence/data/text_lm`` once, so that the chapter's outputs do not depend on
the Python version installed:

* ``docs.txt``: the documentation topics, in name order;
* ``code_train.txt``, ``code_validation.txt`` and ``code_heldout.txt``:
  standard-library modules, different ones in each;
* ``docs_gpt2/``: a keras-hub preset directory (``config.json``,
  ``model.weights.h5``) of the backbone pretrained on ``docs.txt``, which
  ``keras_hub.models.GPT2Backbone.from_preset`` loads without a network.

The tokens are characters: ``"\\n"`` and printable ASCII, id 0 for anything
else (after a few typographic characters are mapped to ASCII), and
:data:`RESERVED` rows at the end of the table that pretraining never sees, for
new tokens, as BERT's ``[unused]`` rows are.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np

DATA = pathlib.Path(__file__).parent / "data" / "text_lm"
PRESET = DATA / "docs_gpt2"

#: The characters, in id order from 1; id 0 stands for any other character.
ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))
#: Rows of the embedding table after the alphabet that pretraining never uses.
RESERVED = 7
VOCABULARY_SIZE = 1 + len(ALPHABET) + RESERVED
#: The first reserved id.
FIRST_RESERVED = 1 + len(ALPHABET)
SEQUENCE_LENGTH = 64

#: The tiny backbone: two blocks of width 64 with four heads of size 16.
CONFIG = {
    "vocabulary_size": VOCABULARY_SIZE,
    "num_layers": 2,
    "num_heads": 4,
    "hidden_dim": 64,
    "intermediate_dim": 256,
    "dropout": 0.0,
    "max_sequence_length": SEQUENCE_LENGTH,
}

#: Standard-library modules: the adaptation's training and held-out text.
TRAIN_MODULES = (
    "textwrap", "shlex", "heapq", "calendar", "string", "copy", "csv", "queue",
    "contextlib", "pprint",
)  # fmt: skip
VALIDATION_MODULES = ("reprlib", "abc", "operator")
HELDOUT_MODULES = ("fnmatch", "glob", "sched", "graphlib", "bisect", "colorsys")

_TYPOGRAPHY = str.maketrans(
    {"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"', "\u2014": "-",
     "\u2013": "-", "\u2026": "...", "\t": "    "}
)  # fmt: skip
_IDS = {c: i + 1 for i, c in enumerate(ALPHABET)}


def encode(text: str, tokens: dict[str, int] | None = None) -> np.ndarray:
    """The int32 token ids of ``text``.

    ``tokens`` maps extra strings (such as four spaces) to reserved ids; at
    each position the longest one that matches is taken, else one character.
    """
    text = text.translate(_TYPOGRAPHY)
    if not tokens:
        return np.array([_IDS.get(c, 0) for c in text], np.int32)
    by_length = sorted(tokens, key=len, reverse=True)
    ids, i = [], 0
    while i < len(text):
        for token in by_length:
            if text.startswith(token, i):
                ids.append(tokens[token])
                i += len(token)
                break
        else:
            ids.append(_IDS.get(text[i], 0))
            i += 1
    return np.array(ids, np.int32)


def decode(ids) -> str:
    return "".join(ALPHABET[i - 1] if 0 < i < FIRST_RESERVED else "?" for i in ids)


def read(name: str) -> str:
    """A committed text: ``"docs"``, ``"code_train"``, ``"code_validation"``,
    ``"code_heldout"``."""
    return (DATA / f"{name}.txt").read_text(encoding="utf-8")


def inputs(windows: np.ndarray) -> dict[str, np.ndarray]:
    """GPT-2's inputs for token windows of shape (batch, length)."""
    return {"token_ids": windows, "padding_mask": np.ones_like(windows, bool)}


def random_windows(ids: np.ndarray, count: int, seed: int, length=SEQUENCE_LENGTH):
    """``count`` windows of ``length + 1`` ids at random starts: inputs and targets."""
    starts = np.random.default_rng(seed).integers(0, len(ids) - length - 1, count)
    windows = np.stack([ids[s : s + length + 1] for s in starts])
    return inputs(windows[:, :-1]), windows[:, 1:]


def consecutive_windows(ids: np.ndarray, length=SEQUENCE_LENGTH):
    """The text cut into windows; each target is the next id (the last is dropped)."""
    count = (len(ids) - 1) // length
    x = ids[: count * length].reshape(count, length)
    y = ids[1 : count * length + 1].reshape(count, length)
    return inputs(x), y


def nats_per_character(model, text: str, tokens=None, batch_size: int = 64) -> float:
    """The model's loss on ``text`` in nats per character.

    Per character, not per token, so that tokenizations with and without extra
    tokens compare: the total over every predicted token, divided by the
    characters those tokens cover.
    """
    import keras

    ids = encode(text, tokens)
    x, y = consecutive_windows(ids)
    logits = model.predict(x, batch_size=batch_size, verbose=0)
    losses = keras.ops.convert_to_numpy(
        keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
    )
    lengths = _lengths(tokens)
    characters = sum(lengths.get(int(i), 1) for i in y.ravel())
    return float(losses.astype(np.float64).sum() / characters)


def _lengths(tokens) -> dict[int, int]:
    return {i: len(t) for t, i in (tokens or {}).items()}


def make_texts() -> None:
    import pydoc_data.topics
    import sysconfig

    DATA.mkdir(parents=True, exist_ok=True)
    topics = pydoc_data.topics.topics
    docs = "\n\n".join(topics[name].strip() for name in sorted(topics))
    (DATA / "docs.txt").write_text(docs.translate(_TYPOGRAPHY) + "\n")
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    for name, modules in (
        ("code_train", TRAIN_MODULES),
        ("code_validation", VALIDATION_MODULES),
        ("code_heldout", HELDOUT_MODULES),
    ):
        parts = [(stdlib / f"{m}.py").read_text(encoding="utf-8") for m in modules]
        (DATA / f"{name}.txt").write_text("\n".join(parts).translate(_TYPOGRAPHY))


def pretrain(steps: int = 3000, batch_size: int = 32, seed: int = 0) -> None:
    """Pretrain the tiny backbone on ``docs.txt`` and save it as a preset."""
    import keras
    import keras_hub

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.GPT2Backbone(**CONFIG)
    model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0, steps, warmup_target=3e-3, warmup_steps=steps // 20
    )
    model.compile(
        optimizer=keras.optimizers.AdamW(schedule, weight_decay=0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[],
    )
    docs = encode(read("docs"))
    x, y = random_windows(docs, steps * batch_size, seed)
    model.fit(x, y, batch_size=batch_size, epochs=1, verbose=2)
    print(f"docs: {nats_per_character(model, read('docs')[:50000]):.3f} nats/char")
    print(f"code: {nats_per_character(model, read('code_heldout')):.3f} nats/char")
    backbone.save_to_preset(str(PRESET))


if __name__ == "__main__":
    make_texts()
    pretrain(*(int(a) for a in sys.argv[1:]))
