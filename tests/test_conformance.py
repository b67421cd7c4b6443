"""Conformance: the exact techniques keep frozen entries bit-exact everywhere.

The same matrix as the book's exactness chapter, as assertions: every
technique of the matrix (`evidence.exactness.TECHNIQUES`) x every optimizer
class in `keras.optimizers` (with and without weight decay), then x dtype
policy and x execution mode, then random shapes, masks and densities with
hypothesis. A technique's `exact` flag in the registry is checked both ways:
an exact technique never moves a frozen bit, an inexact one does under some
optimizer. The matrix is long, so these tests are marked `slow`; the checks
that the matrix is complete are not.
"""

import inspect

import keras
import numpy as np
import pytest
from hypothesis import given, reject
from hypothesis import strategies as st

import refimpl
from evidence import exactness, registry

STEPS = 2
OPTIMIZERS = exactness.keras_optimizers()
MATRIX = [t.id for t in exactness.TECHNIQUES]
EXACT = [t.id for t in exactness.TECHNIQUES if t.exact]
INEXACT = [t.id for t in exactness.TECHNIQUES if not t.exact]
# Optimizers that look up `variable.path`, which a plain tf.Variable lacks.
# Muon runs 1-D variables through its inner AdamW, which needs no path.
NEEDS_PATH = {keras.optimizers.Muon, keras.optimizers.MultiOptimizer}
DECOUPLED = [name for name, o in OPTIMIZERS.items() if o.weight_decay]
MOVES_ZERO_GRADIENT = {  # besides decay: they move an entry whose gradient is 0
    keras.optimizers.Ftrl,
    keras.optimizers.ScheduleFreeAdamW,
    keras.optimizers.Muon,
    keras.optimizers.Adafactor,
}


def _mask(n, density, seed):
    return np.random.default_rng(seed).random((n, n)) < density


MASK = _mask(5, 0.4, 1)


def _drift(technique, optimizer, mask=None, **kwargs):
    if mask is None:
        mask = exactness.mask_for(technique, MASK)
    return exactness.frozen_drift(
        technique, OPTIMIZERS[optimizer], mask, steps=STEPS, **kwargs
    )


def _plain_variables(technique):
    """The variables of the technique's setup that are not Keras variables."""
    mask = exactness.mask_for(technique, MASK)
    init = np.ones(mask.shape, "float32")
    variables = registry.get(technique).setup(init, mask, "float32").variables
    return [v for v in variables if not isinstance(v, keras.Variable)]


def _refuses(technique, optimizer):
    cls = OPTIMIZERS[optimizer].cls
    if cls not in NEEDS_PATH:
        return False
    plain = _plain_variables(technique)
    if cls is keras.optimizers.Muon:
        return any(len(v.shape) > 1 for v in plain)
    return bool(plain)


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
    case = OPTIMIZERS[optimizer]
    built = case()
    assert isinstance(built, case.cls)
    assert float(getattr(built, "weight_decay", None) or 0.0) == case.weight_decay


def test_every_family_has_exact_techniques_in_the_matrix():
    for family in registry.FAMILIES:
        assert any(t.exact for t in exactness.TECHNIQUES if t.family == family)
    assert INEXACT  # the matrix shows failures too


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("technique", EXACT)
def test_exact_technique_leaves_frozen_entries_bit_exact(technique, optimizer):
    if _refuses(technique, optimizer):
        with pytest.raises(AttributeError, match="path"):
            _drift(technique, optimizer)
        return
    drift = _drift(technique, optimizer)
    assert drift.moved == 0, f"{drift.moved} of {drift.frozen} frozen entries moved"
    if registry.get(technique).family == registry.REPARAMETRIZE:
        assert drift.nonfinite == 0
    assert refimpl.testing.moved(drift.before, drift.after)[
        drift.mask
    ].any()  # it trained


@pytest.mark.slow
@pytest.mark.parametrize("technique", INEXACT)
def test_inexact_technique_moves_frozen_entries_under_weight_decay(technique):
    # The registry's `exact=False` is a finding too: AdamW shows it.
    drift = _drift(technique, "AdamW")
    assert drift.moved == drift.frozen  # the start values are non-zero normals


NO_DECAY = [
    name
    for name, o in OPTIMIZERS.items()
    if not o.weight_decay
    and o.cls not in MOVES_ZERO_GRADIENT
    and o.cls is not keras.optimizers.MultiOptimizer
]
DECAY = [name for name in DECOUPLED if OPTIMIZERS[name].cls not in NEEDS_PATH]


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", NO_DECAY)
@pytest.mark.parametrize("technique", INEXACT)
def test_masked_full_variable_is_exact_without_weight_decay(technique, optimizer):
    assert _drift(technique, optimizer).moved == 0


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", [*DECAY, "Ftrl"])
def test_masked_full_variable_moves_every_frozen_entry_under_decay_or_ftrl(
    optimizer,
):
    drift = _drift("grad_mask", optimizer)
    assert drift.moved == drift.frozen  # the start values are non-zero normals


@pytest.mark.slow
def test_adafactor_turns_everything_nan_where_a_frozen_row_meets_a_frozen_column():
    row_only, both = np.ones((4, 4), bool), np.ones((4, 4), bool)
    row_only[0] = both[0] = False
    both[:, 0] = False
    assert _drift("grad_mask", "Adafactor", row_only).nonfinite == 0
    assert _drift("grad_mask", "Adafactor", row_only).moved == 0
    assert _drift("grad_mask", "Adafactor", both).nonfinite == 16


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("technique", EXACT)
def test_exact_technique_is_exact_under_every_dtype_policy(technique, dtype):
    assert _drift(technique, "AdamW", dtype=dtype).moved == 0


@pytest.mark.slow
@pytest.mark.parametrize("execution", ["function", "xla"])
@pytest.mark.parametrize("technique", EXACT)
def test_exact_technique_is_exact_in_graph_and_xla(technique, execution):
    assert _drift(technique, "AdamW", execution=execution).moved == 0


@pytest.mark.slow
@pytest.mark.parametrize("execution", ["function", "xla"])
def test_graph_and_xla_train_like_eager_and_keep_frozen_bits(execution):
    eager = _drift("partial_delta", "Adam")
    compiled = _drift("partial_delta", "Adam", execution=execution)
    np.testing.assert_allclose(compiled.after, eager.after, rtol=1e-5)
    np.testing.assert_array_equal(compiled.after[~MASK], eager.before[~MASK])


@st.composite
def _cases(draw):
    technique = draw(st.sampled_from(EXACT))
    optimizer = draw(st.sampled_from(list(OPTIMIZERS)))
    n = draw(st.integers(1, 6))
    kind = registry.get(technique).mask
    if kind == "band":
        lower, upper = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        offsets = np.subtract.outer(np.arange(n), np.arange(n))  # row - column
        mask = (offsets <= lower) & (-offsets <= upper)
    elif kind == "diagonal":
        mask = np.eye(n, dtype=bool)
    elif kind == "rows":  # whole rows, at least one
        rows = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
        rows[draw(st.integers(0, n - 1))] = True
        mask = np.repeat(rows[:, None], n, axis=1)
    else:
        mask = _mask(n, draw(st.floats(0.0, 1.0)), draw(st.integers(0, 2**16)))
    return technique, optimizer, mask, draw(st.integers(0, 2**16))


@pytest.mark.slow
@given(_cases())
def test_exact_techniques_stay_exact_for_any_shape_mask_and_density(case):
    technique, optimizer, mask, seed = case
    if _refuses(technique, optimizer):
        reject()
    drift = exactness.frozen_drift(
        technique, OPTIMIZERS[optimizer], mask, steps=STEPS, seed=seed
    )
    assert drift.moved == 0
    refimpl.testing.assert_frozen(drift.before, drift.after, mask)
