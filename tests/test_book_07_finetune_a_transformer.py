"""What the transformer chapter no longer shows, still checked.

The chapter (chapters/07_finetune_a_transformer) states the comparison of
fine-tuning methods in one sentence and links to the comparison page. These
tests keep the stored comparison (evidence/data/text_lm/results.csv) honest:
the statements made about it hold on its values, the committed checkpoint is
the one it describes, and the code still gives its rows.
"""

import csv
import statistics

import numpy as np
import pytest

from evidence import text_finetune, text_lm


def _table():
    with open(text_finetune.RESULTS) as file:
        rows = list(csv.DictReader(file))
    runs = {m: [r for r in rows if r["method"] == m] for m in text_finetune.METHODS}
    nats = {
        m: [float(r["heldout_nats_per_char"]) for r in rs] for m, rs in runs.items()
    }
    return {
        "runs": runs,
        "loss": {m: statistics.fmean(v) for m, v in nats.items()},
        "spread": {m: float(np.std(v)) for m, v in nats.items()},
        "rate": {m: float(rs[0]["learning_rate"]) for m, rs in runs.items()},
        "trainable": {m: int(rs[0]["trainable"]) for m, rs in runs.items()},
        "state": {m: int(rs[0]["optimizer_state"]) for m, rs in runs.items()},
        "bytes": {
            m: statistics.median(int(r["file_bytes"]) for r in rs)
            for m, rs in runs.items()
        },
        "step": {
            m: statistics.median(float(r["step_time_vs_full"]) for r in rs)
            for m, rs in runs.items()
        },
    }


def test_every_method_has_three_seeds_of_one_size():
    t = _table()
    for m, rs in t["runs"].items():
        assert len(rs) == len(text_finetune.SEEDS), m
        assert all(int(r["trainable"]) == t["trainable"][m] for r in rs), m


def test_the_statements_about_the_comparison_hold():
    t = _table()
    loss, spread, trainable = t["loss"], t["spread"], t["trainable"]
    state, rate, step = t["state"], t["rate"], t["step"]

    def real(a, b):  # a is lower than b by more than twice the larger spread
        return loss[b] - loss[a] > 2 * max(spread[a], spread[b])

    methods = list(text_finetune.METHODS)
    # Full fine-tuning ends lowest, at the smallest learning rate.
    assert all(loss[m] - loss["full"] > 0.05 for m in methods if m != "full")
    assert rate["full"] == min(rate.values())
    # Where the trained values sit matters more than how many there are.
    assert trainable["FFN neurons 1/8"] < trainable["random 10.0%"]
    for m in ("random 10.0%", "magnitude 10.0%"):
        assert abs(loss["FFN neurons 1/8"] - loss[m]) < 0.01
    assert trainable["one head per block"] == trainable["FFN neurons 1/8"]
    assert real("LoRA r=8", "one head per block")
    assert real("tied embedding", "one head per block")
    assert abs(trainable["LoRA r=8"] / trainable["FFN neurons 1/8"] - 1) < 0.1
    assert real("FFN neurons 1/8", "LoRA r=8")
    # Among fixed masks of one size, no score wins everywhere.
    assert abs(loss["random 10.0%"] - loss["magnitude 10.0%"]) < spread["random 10.0%"]
    assert real("random 10.0%", "Fisher 10.0%")
    assert real("magnitude 10.0%", "Fisher 10.0%")
    assert real("Fisher 0.1%", "random 0.1%") and real("Fisher 0.1%", "magnitude 0.1%")
    assert abs(loss["random 1.0%"] - loss["Fisher 1.0%"]) < 2 * spread["Fisher 1.0%"]
    assert real("random 1.0%", "magnitude 1.0%")
    assert real("Fisher 1.0%", "magnitude 1.0%")
    assert loss["LoRA r=2"] > loss["LoRA r=1"]
    # Drop and grow beats every fixed mask of its size, at the same counts;
    # LoRA at rank 1, with a fifth more values, is slightly better still.
    for s in ("random", "magnitude", "Fisher"):
        assert real("drop and grow 1.0%", f"{s} 1.0%")
        assert trainable["drop and grow 1.0%"] == trainable[f"{s} 1.0%"]
        assert state["drop and grow 1.0%"] == state[f"{s} 1.0%"]
    assert loss["LoRA r=1"] < loss["drop and grow 1.0%"]
    assert 1.1 < trainable["LoRA r=1"] / trainable["drop and grow 1.0%"] < 1.3
    # Four new token rows: below every 0.1 % mask, above every 1 % mask.
    assert trainable["new tokens"] == 4 * text_lm.CONFIG["hidden_dim"]
    for s in ("random", "magnitude", "Fisher"):
        assert real("new tokens", f"{s} 0.1%") and real(f"{s} 1.0%", "new tokens")
    # Adam's two moments per trainable value; fixed masks step no slower.
    assert all(state[m] == 2 * trainable[m] for m in methods)
    fixed = [m for m in methods if m not in ("full", "drop and grow 1.0%")]
    assert all(0.75 <= step[m] < 1 for m in fixed)
    assert step["drop and grow 1.0%"] > 1


def test_the_file_sizes_per_value():
    t = _table()
    biases = 4 * text_lm.CONFIG["hidden_dim"]  # of the query and value projections
    stored = {
        m: n - (biases if m.startswith("LoRA") else 0)
        for m, n in t["trainable"].items()
    }
    per_value = {m: t["bytes"][m] / stored[m] for m in stored}
    assert abs(per_value["LoRA r=8"] - per_value["random 10.0%"]) < 0.5
    for s in ("random", "magnitude", "Fisher"):
        assert per_value[f"{s} 0.1%"] > 4 * per_value["random 10.0%"]
    assert min(t["bytes"], key=t["bytes"].get) == "new tokens"


def test_the_checkpoint_knows_the_documentation_better_than_code():
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone.from_preset(str(text_lm.PRESET))
    model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    docs = text_lm.nats_per_character(model, text_lm.read("docs")[:50_000])
    code = text_lm.nats_per_character(model, text_lm.read("code_heldout"))
    assert code > docs + 0.5


@pytest.mark.slow
@pytest.mark.parametrize(
    "method", ["Fisher 1.0%", "LoRA r=4", "new tokens", "drop and grow 1.0%"]
)
def test_the_code_gives_the_stored_rows(method):
    import keras

    t = _table()
    [stored] = [r for r in t["runs"][method] if int(r["seed"]) == 0]
    keras.backend.clear_session()
    again = text_finetune.fine_tune(method, 0, t["rate"][method])
    for key in ("trainable", "optimizer_state", "file_bytes"):
        assert again[key] == int(stored[key]), key
    np.testing.assert_allclose(
        again["heldout_nats_per_char"],
        float(stored["heldout_nats_per_char"]),
        rtol=1e-5,
    )
