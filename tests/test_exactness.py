"""`evidence.exactness`: its arguments, its edge cases and its optimizer columns.

Fast checks of the instrument itself; the matrix it measures is in
`tests/test_conformance.py`.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import refimpl
from evidence import exactness, registry

EYE = np.eye(3, dtype=bool)
NONE, ALL = np.zeros((3, 3), bool), np.ones((3, 3), bool)


def _used_optimizer():
    opt = keras.optimizers.Adam()
    opt.build([tf.Variable(1.0)])
    return exactness.frozen_drift("grad_mask", opt, EYE)


def _drift(technique="grad_mask", optimizer=keras.optimizers.SGD, mask=EYE, **kw):
    return exactness.frozen_drift(technique, optimizer, mask, **kw)


BAD = [
    ("unknown_technique", lambda: _drift("magic"), "technique", "'magic'"),
    ("a_label", lambda: _drift("gradient masking"), "technique", "gradient masking"),
    ("no_setup", lambda: _drift("partial_select"), "technique", "'partial_select'"),
    ("int_mask", lambda: _drift(mask=np.eye(3, dtype=int)), "mask", "int"),
    ("not_square", lambda: _drift(mask=EYE[:2]), "mask", "(2, 3)"),
    ("steps", lambda: _drift(steps=0), "steps", "0"),
    ("dtype", lambda: _drift(dtype="float16"), "dtype", "'float16'"),
    ("execution", lambda: _drift(execution="graph"), "execution", "'graph'"),
    ("used_optimizer", _used_optimizer, "optimizer", "Adam"),
    ("not_an_optimizer", lambda: _drift(optimizer="adam"), "optimizer", "'adam'"),
    (
        "not_a_band",
        lambda: _drift("banded_dense", mask=np.eye(3, k=2, dtype=bool)),
        "mask",
        "1",
    ),
    ("not_the_diagonal", lambda: _drift("diagonal_dense", mask=ALL), "mask", "9"),
    ("not_whole_rows", lambda: _drift("partial_slices", mask=EYE), "mask", "3"),
    (
        "negative_decay",
        lambda: exactness.keras_optimizers(weight_decay=-1.0),
        "weight_decay",
        "-1.0",
    ),
    (
        "nan_decay",
        lambda: exactness.keras_optimizers(weight_decay=float("nan")),
        "weight_decay",
        "nan",
    ),
]


@pytest.mark.parametrize(
    "call, argument, shown", [pytest.param(*c[1:], id=c[0]) for c in BAD]
)
def test_bad_input_raises_naming_argument_and_value(call, argument, shown):
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    message = str(info.value)
    assert argument in message, f"the message does not name `{argument}`: {message}"
    assert shown in message, f"the message does not show {shown!r}: {message}"


ANY_MASK = [t.id for t in exactness.TECHNIQUES if t.mask == "any"]


@pytest.mark.parametrize("technique", ANY_MASK)
def test_nothing_trainable_counts_every_entry_as_frozen(technique):
    drift = _drift(technique, mask=NONE, steps=1)
    assert drift.frozen == 9 and drift.moved == 0


def test_everything_trainable_has_nothing_frozen():
    drift = _drift(mask=ALL)
    assert drift.frozen == 0 and refimpl.testing.moved(drift.before, drift.after).all()


def test_a_record_an_id_and_an_optimizer_case_give_the_same_drift():
    record = registry.get("grad_mask")
    case = exactness.keras_optimizers()["AdamW"]
    by_record = exactness.frozen_drift(record, case, EYE, steps=2)
    by_id = exactness.frozen_drift("grad_mask", keras.optimizers.AdamW(), EYE, steps=2)
    np.testing.assert_array_equal(by_record.after, by_id.after)
    assert by_record.moved == by_id.moved == 6


def test_frozen_drift_agrees_with_a_loop_written_by_hand():
    # The loop the exactness chapter writes out, for gradient masking + AdamW.
    mask = np.random.default_rng(3).random((4, 4)) < 0.5
    rng = np.random.default_rng(0)
    init = rng.normal(size=(4, 4)).astype("float32")
    x = tf.constant(rng.normal(size=(8, 4)).astype("float32"))
    t = tf.constant(rng.normal(size=(8, 4)).astype("float32"))
    w, optimizer = tf.Variable(init), keras.optimizers.AdamW()
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((x @ w - t) ** 2)
        optimizer.apply_gradients([(tf.where(mask, tape.gradient(loss, w), 0.0), w)])
    drift = _drift(optimizer=keras.optimizers.AdamW(), mask=mask, steps=3)
    np.testing.assert_array_equal(drift.after, w.numpy())


@pytest.mark.parametrize("technique", [t.id for t in exactness.TECHNIQUES])
def test_every_technique_of_the_matrix_runs_one_step(technique):
    band = np.eye(4, dtype=bool) | np.eye(4, k=1, dtype=bool)
    mask = exactness.mask_for(technique, band)
    drift = _drift(technique, keras.optimizers.AdamW, mask, steps=1)
    assert drift.frozen == int((~mask).sum())
    assert refimpl.testing.moved(drift.before, drift.after)[mask].any()  # it trained
    if registry.get(technique).exact:
        assert drift.moved == 0


def test_mask_for_keeps_any_mask_and_builds_the_structured_ones():
    mask = np.random.default_rng(0).random((4, 4)) < 0.5
    np.testing.assert_array_equal(exactness.mask_for("partial_delta", mask), mask)
    np.testing.assert_array_equal(
        exactness.mask_for("diagonal_dense", mask), np.eye(4, dtype=bool)
    )
    band = exactness.mask_for("banded_dense", mask)
    assert band.sum() == 4 + 2 * 3 and band[0, 1] and not band[0, 2]
    rows = exactness.mask_for("partial_slices", mask)
    np.testing.assert_array_equal(rows.any(axis=1), [False, True, False, False])
    assert rows[1].all() and rows.sum() == 4


def test_the_matrix_rows_are_the_registry_techniques_with_a_setup():
    assert exactness.TECHNIQUES == tuple(
        t for t in registry.TECHNIQUES if t.setup is not None
    )
    # Rows of one family are contiguous, restrict-the-update first (the
    # chapter draws one line between the families).
    families = [t.family for t in exactness.TECHNIQUES]
    assert families == sorted(families, key=registry.FAMILIES.index)


def test_optimizer_cases_are_records_not_labels_to_parse():
    optimizers = exactness.keras_optimizers(weight_decay=0.01)
    assert list(optimizers) == [case.name for case in optimizers.values()]
    adam = optimizers["Adam(weight_decay=0.01)"]
    assert adam.cls is keras.optimizers.Adam and adam.weight_decay == 0.01
    assert optimizers["Adam"].weight_decay == 0.0
    assert optimizers["AdamW"].weight_decay == 0.004  # Keras' default
    assert optimizers["AdamW(weight_decay=0)"].weight_decay == 0.0
    assert optimizers["SGD(momentum=0.9)"]().momentum == 0.9
    wrapped = optimizers["LossScaleOptimizer"]()
    assert isinstance(wrapped.inner_optimizer, keras.optimizers.Adam)
    first, second = adam(), adam()
    assert first is not second and not first.built  # a fresh one every call
