"""Conformance: the exact techniques keep frozen entries bit-exact everywhere.

The same matrix as the book's exactness chapter, as assertions: every exact
technique x every optimizer class in `keras.optimizers` (with and without
weight decay), then x dtype policy and x execution mode, then random shapes,
masks and densities with hypothesis. The restrict-the-update techniques are
checked for the claims the book makes about them: exact without decay, not
exact with it.
"""

import inspect

import keras
import numpy as np
import pytest
from hypothesis import given, reject
from hypothesis import strategies as st

import refimpl

STEPS = 2
OPTIMIZERS = refimpl.keras_optimizers()
EXACT = [
    name
    for name, family in refimpl.TECHNIQUES.items()
    if family == "reparametrize" or name.endswith("restore_frozen") or "Freeze" in name
]
PLAIN = ["mask stop_gradient", "one-hot stop_gradient", "gradient masking"]
# Optimizers that look up `variable.path`, which a plain tf.Variable lacks.
NEEDS_KERAS_VARIABLES = {"Muon", "Muon(weight_decay=0)", "MultiOptimizer"}
KERAS_VARIABLE_TECHNIQUES = {"FreezeEntries constraint", "PartialDense layer"}
KERAS_VARIABLE_TECHNIQUES |= {"BandedDense layer"}


def _mask(n, density, seed):
    return np.random.default_rng(seed).random((n, n)) < density


MASK = _mask(5, 0.4, 1)
BAND = np.abs(np.subtract.outer(np.arange(5), np.arange(5))) <= 1


def _drift(technique, optimizer, mask=None, **kwargs):
    if mask is None:
        mask = BAND if technique == "BandedDense layer" else MASK
    return refimpl.frozen_drift(
        technique, OPTIMIZERS[optimizer], mask, steps=STEPS, **kwargs
    )


def _refuses(technique, optimizer):
    return (
        optimizer in NEEDS_KERAS_VARIABLES
        and technique not in KERAS_VARIABLE_TECHNIQUES
        and not (optimizer.startswith("Muon") and technique in _VECTOR_TECHNIQUES)
    )


# Muon runs 1-D variables through its inner AdamW, which needs no path.
_VECTOR_TECHNIQUES = {"separate variables", "PartialVariable (delta)"}


def test_every_keras_optimizer_class_is_in_the_matrix():
    classes = {
        name
        for name, obj in vars(keras.optimizers).items()
        if inspect.isclass(obj)
        and issubclass(obj, keras.optimizers.Optimizer)
        and obj is not keras.optimizers.Optimizer
    }
    assert classes <= set(OPTIMIZERS)


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_every_optimizer_in_the_matrix_can_be_built(optimizer):
    # A new Keras optimizer that needs arguments keras_optimizers() does not
    # know would show as an error column; this test says so first.
    assert isinstance(OPTIMIZERS[optimizer](), keras.optimizers.Optimizer)


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("technique", EXACT)
def test_exact_technique_leaves_frozen_entries_bit_exact(technique, optimizer):
    if _refuses(technique, optimizer):
        with pytest.raises(AttributeError, match="path"):
            _drift(technique, optimizer)
        return
    drift = _drift(technique, optimizer)
    assert drift.moved == 0, f"{drift.moved} of {drift.frozen} frozen entries moved"
    if refimpl.TECHNIQUES[technique] == "reparametrize":
        assert drift.nonfinite == 0
    assert refimpl.moved(drift.before, drift.after)[drift.mask].any()  # it trained


NO_DECAY = [
    name
    for name in OPTIMIZERS
    if name.split("(")[0] not in ("Ftrl", "ScheduleFreeAdamW", "Muon", "Adafactor")
    and name != "AdamW"
    and ("weight_decay=" not in name or "weight_decay=0)" in name)
    and name not in NEEDS_KERAS_VARIABLES
]
DECAY = [name for name in OPTIMIZERS if "weight_decay=0.004" in name or name == "AdamW"]


@pytest.mark.parametrize("optimizer", NO_DECAY)
@pytest.mark.parametrize("technique", PLAIN)
def test_masked_full_variable_is_exact_without_weight_decay(technique, optimizer):
    assert _drift(technique, optimizer).moved == 0


@pytest.mark.parametrize("optimizer", [*DECAY, "Ftrl"])
def test_masked_full_variable_moves_every_frozen_entry_under_decay_or_ftrl(
    optimizer,
):
    drift = _drift("gradient masking", optimizer)
    assert drift.moved == drift.frozen  # the start values are non-zero normals


def test_adafactor_turns_everything_nan_where_a_frozen_row_meets_a_frozen_column():
    row_only, both = np.ones((4, 4), bool), np.ones((4, 4), bool)
    row_only[0] = both[0] = False
    both[:, 0] = False
    assert _drift("gradient masking", "Adafactor", row_only).nonfinite == 0
    assert _drift("gradient masking", "Adafactor", row_only).moved == 0
    assert _drift("gradient masking", "Adafactor", both).nonfinite == 16


@pytest.mark.parametrize("dtype", ["float32", "mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("technique", EXACT)
def test_exact_technique_is_exact_under_every_dtype_policy(technique, dtype):
    assert _drift(technique, "AdamW", dtype=dtype).moved == 0


@pytest.mark.parametrize("mode", ["function", "xla"])
@pytest.mark.parametrize("technique", EXACT)
def test_exact_technique_is_exact_in_graph_and_xla(technique, mode):
    assert _drift(technique, "AdamW", mode=mode).moved == 0


@pytest.mark.parametrize("mode", ["function", "xla"])
def test_graph_and_xla_train_like_eager_and_keep_frozen_bits(mode):
    eager = _drift("PartialVariable (delta)", "Adam")
    compiled = _drift("PartialVariable (delta)", "Adam", mode=mode)
    np.testing.assert_allclose(compiled.after, eager.after, rtol=1e-5)
    np.testing.assert_array_equal(compiled.after[~MASK], eager.before[~MASK])


@st.composite
def _cases(draw):
    technique = draw(st.sampled_from(EXACT))
    optimizer = draw(st.sampled_from(list(OPTIMIZERS)))
    n = draw(st.integers(1, 6))
    if technique == "BandedDense layer":
        lower, upper = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        offsets = np.subtract.outer(np.arange(n), np.arange(n))  # row - column
        mask = (offsets <= lower) & (-offsets <= upper)
    else:
        mask = _mask(n, draw(st.floats(0.0, 1.0)), draw(st.integers(0, 2**16)))
    return technique, optimizer, mask, draw(st.integers(0, 2**16))


@given(_cases())
def test_exact_techniques_stay_exact_for_any_shape_mask_and_density(case):
    technique, optimizer, mask, seed = case
    if _refuses(technique, optimizer):
        reject()
    drift = refimpl.frozen_drift(
        technique, OPTIMIZERS[optimizer], mask, steps=STEPS, seed=seed
    )
    assert drift.moved == 0
    refimpl.assert_frozen(drift.before, drift.after, mask)


def test_every_technique_has_a_setup_and_a_family():
    from refimpl._exactness_cases import CASES

    assert set(CASES) == set(refimpl.TECHNIQUES)
    assert set(refimpl.TECHNIQUES.values()) == {"reparametrize", "restrict the update"}
