# ruff: noqa: E501  (one bad-input case per line reads best as a table)
"""Every public entry point of refimpl rejects bad input with a clear error.

Each case calls one public callable with one bad argument and expects a
ValueError or TypeError whose message names the argument and shows the value
received. `test_every_public_callable_has_a_bad_input_case` fails when a name
is added to `refimpl.__all__` without a case here.

Edge cases that are *valid* (an all-true mask, an empty mask where "nothing
is trainable" makes sense) are tested for what they do at the end.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import refimpl

EYE = np.eye(3, dtype=bool)
W3 = np.arange(9, dtype="float32").reshape(3, 3)


def _var():
    return tf.Variable(W3)


def _dense(units=3, n=3):
    layer = keras.layers.Dense(units)
    layer.build((None, n))
    return layer


def _symbolic_x():
    @tf.function(input_signature=[tf.TensorSpec([None, 3])])
    def f(x):
        return refimpl.one_hot_trainable(x, [[0, 0]])

    return f(tf.zeros((1, 3)))


def _built(layer, n):
    layer.build((None, n))


def _used_optimizer():
    opt = keras.optimizers.Adam()
    opt.build([tf.Variable(W3)])
    return refimpl.frozen_drift("gradient masking", opt, EYE)


def _nan_minimize():
    v = tf.Variable([np.nan, 1.0])
    return refimpl.minimize(lambda: tf.reduce_sum((v - 2.0) ** 2), v)


# (id, function name in refimpl.__all__, call, argument name, value shown[, xfail])
CASES = [
    # masks: the shared validation every entry point uses
    ("to_mask_wrong_shape", "to_mask", lambda: refimpl.to_mask([True], (2,)), "mask", "(1,)"),
    ("to_mask_float_not_01", "to_mask", lambda: refimpl.to_mask([0.5, 1.0], (2,)), "mask", "0.5"),
    ("to_mask_int_mask", "to_mask", lambda: refimpl.to_mask(np.eye(3, dtype=int), (3, 3)), "mask", "[[1, 0, 0]"),
    ("to_mask_int_mask_of_shape_k_by_2", "to_mask", lambda: refimpl.to_mask(np.eye(2, dtype=int), (2, 2)), "mask", "[[1, 0]"),
    ("to_mask_nan", "to_mask", lambda: refimpl.to_mask([np.nan, 1.0], (2,)), "mask", "nan"),
    ("indices_out_of_range", "indices_to_mask", lambda: refimpl.indices_to_mask([[3]], (3,)), "indices", "[3]"),
    ("indices_negative", "indices_to_mask", lambda: refimpl.indices_to_mask([[-1]], (3,)), "indices", "[-1]"),
    ("indices_duplicated", "indices_to_mask", lambda: refimpl.indices_to_mask([[1], [1]], (3,)), "indices", "[1]"),
    ("indices_float", "indices_to_mask", lambda: refimpl.indices_to_mask([[0.0]], (3,)), "indices", "float64"),
    ("indices_rank", "indices_to_mask", lambda: refimpl.indices_to_mask([[0, 0]], (3,)), "indices", "(1, 2)"),
    ("indices_bad_shape", "indices_to_mask", lambda: refimpl.indices_to_mask([[0]], (3, -1)), "shape", "-1"),
    ("mask_to_indices_int", "mask_to_indices", lambda: refimpl.mask_to_indices([1, 0]), "mask", "int"),
    # stop_gradient
    ("partially_trainable_shape", "partially_trainable", lambda: refimpl.partially_trainable(W3, [True]), "mask", "(1,)"),
    ("partially_trainable_float", "partially_trainable", lambda: refimpl.partially_trainable(W3, EYE * 0.5), "mask", "0.5"),
    ("partially_trainable_int", "partially_trainable", lambda: refimpl.partially_trainable(W3, np.eye(3, dtype=int)), "mask", "[[1, 0, 0]"),
    ("one_hot_out_of_range", "one_hot_trainable", lambda: refimpl.one_hot_trainable(W3, [[3, 0]]), "indices", "[3, 0]"),
    ("one_hot_negative", "one_hot_trainable", lambda: refimpl.one_hot_trainable(W3, [[0, -1]]), "indices", "[0, -1]"),
    ("one_hot_duplicated", "one_hot_trainable", lambda: refimpl.one_hot_trainable(W3, [[0, 1], [0, 1]]), "indices", "[0, 1]"),
    ("one_hot_unknown_shape", "one_hot_trainable", _symbolic_x, "x", "None"),
    # SciPy
    ("minimize_not_callable", "minimize", lambda: refimpl.minimize(1.0, _var()), "loss_fn", "1.0"),
    ("minimize_not_variable", "minimize", lambda: refimpl.minimize(lambda: 0.0, tf.constant(W3)), "variables", "tf.Tensor"),
    ("minimize_int_variable", "minimize", lambda: refimpl.minimize(lambda: 0.0, tf.Variable([1, 2])), "variables", "int32"),
    ("minimize_mask_shape", "minimize", lambda: refimpl.minimize(lambda: 0.0, _var(), [True]), "mask", "(1,)"),
    ("minimize_method", "minimize", lambda: refimpl.minimize(lambda: 0.0, _var(), method="sgd"), "method", "'sgd'"),
    ("minimize_nan_start", "minimize", _nan_minimize, "loss_fn", "nan"),
    ("minimize_empty_mask", "minimize", lambda: refimpl.minimize(lambda: 0.0, _var(), ~EYE & EYE), "mask", "[0]"),
    # gradients
    ("mask_gradients_not_list", "mask_gradients", lambda: refimpl.mask_gradients(W3, [EYE]), "grads", "array"),
    ("mask_gradients_lengths", "mask_gradients", lambda: refimpl.mask_gradients([W3, W3], [EYE]), "masks", "1"),
    ("mask_gradients_shape", "mask_gradients", lambda: refimpl.mask_gradients([tf.constant(W3)], [[True]]), "masks[0]", "(1,)"),
    ("apply_not_optimizer", "apply_masked_gradients", lambda: refimpl.apply_masked_gradients("adam", [(W3, _var())], [EYE]), "optimizer", "'adam'"),
    ("apply_not_variable", "apply_masked_gradients", lambda: refimpl.apply_masked_gradients(keras.optimizers.SGD(), [(W3, tf.constant(W3))], [EYE]), "grads_and_vars[0]", "EagerTensor"),
    ("apply_none_gradient", "apply_masked_gradients", lambda: refimpl.apply_masked_gradients(keras.optimizers.SGD(), [(None, _var())], [EYE]), "grads_and_vars[0]", "None"),
    ("apply_restore_not_bool", "apply_masked_gradients", lambda: refimpl.apply_masked_gradients(keras.optimizers.SGD(), [(W3, _var())], [EYE], restore_frozen="yes"), "restore_frozen", "'yes'"),
    ("masked_model_not_model", "MaskedGradientModel", lambda: refimpl.MaskedGradientModel("model", []), "model", "'model'"),
    ("masked_model_foreign_variable", "MaskedGradientModel", lambda: refimpl.MaskedGradientModel(_dense(), [(_var(), EYE)]), "masks[0]", "Variable"),
    ("multi_optimizer_empty", "MultiOptimizer", lambda: refimpl.MultiOptimizer([]), "groups", "[]"),
    ("multi_optimizer_not_pair", "MultiOptimizer", lambda: refimpl.MultiOptimizer(["sgd"]), "groups[0]", "'sgd'"),
    ("multi_optimizer_bad_selector", "MultiOptimizer", lambda: refimpl.MultiOptimizer([("sgd", 3.5)]), "groups[0]", "3.5"),
    # structured
    ("diagonal_rank", "diagonal", lambda: refimpl.diagonal(W3), "w", "(3, 3)"),
    ("diagonal_strings", "diagonal", lambda: refimpl.diagonal(["a", "b"]), "w", "string"),
    ("diagonal_matmul_size", "diagonal_matmul", lambda: refimpl.diagonal_matmul(np.ones((2, 4), "float32"), np.ones(3, "float32")), "x", "(2, 4)"),
    ("diagonal_matmul_dtype", "diagonal_matmul", lambda: refimpl.diagonal_matmul(np.ones((2, 3)), np.ones(3, "float32")), "x", "float64"),
    ("banded_duplicate_offsets", "banded", lambda: refimpl.banded([np.ones(3), np.ones(3)], [0, 0]), "offsets", "[0, 0]"),
    ("banded_wrong_length", "banded", lambda: refimpl.banded([np.ones(3), np.ones(3)], [0, 1]), "offsets", "lengths=[3, 3]"),
    ("banded_float_offset", "banded", lambda: refimpl.banded([np.ones(3)], [0.5]), "offsets", "0.5"),
    ("banded_counts_differ", "banded", lambda: refimpl.banded([np.ones(3)], [0, 1]), "offsets", "[0, 1]"),
    ("banded_mixed_dtypes", "banded", lambda: refimpl.banded([np.ones(3, "float32"), np.ones(2)], [0, 1]), "diagonals", "float64"),
    ("banded_matmul_size", "banded_matmul", lambda: refimpl.banded_matmul(np.ones((2, 4), "float32"), [np.ones(3, "float32")], [0]), "x", "(2, 4)"),
    ("block_ragged", "block", lambda: refimpl.block([[W3, None], [W3]]), "rows", "1"),
    ("block_heights_differ", "block", lambda: refimpl.block([[W3, np.ones((2, 2), "float32")]]), "rows", "[3, 2]"),
    ("block_dtype_mismatch", "block", lambda: refimpl.block([[tf.constant(W3), tf.constant(W3, tf.float64)]]), "rows", "float64"),
    ("block_matmul_size", "block_matmul", lambda: refimpl.block_matmul(np.ones((2, 4), "float32"), [[W3]]), "x", "(2, 4)"),
    ("scatter_free_out_of_range", "scatter_free", lambda: refimpl.scatter_free(W3, [[3, 0]], [1.0]), "indices", "[3, 0]"),
    ("scatter_free_duplicated", "scatter_free", lambda: refimpl.scatter_free(W3, [[0, 0], [0, 0]], [1.0, 2.0]), "indices", "[0, 0]"),
    ("scatter_free_count", "scatter_free", lambda: refimpl.scatter_free(W3, [[0, 0]], [1.0, 2.0]), "values", "2"),
    ("scatter_free_dtype", "scatter_free", lambda: refimpl.scatter_free(W3, [[0, 0]], np.array([1.0])), "values", "float64"),
    # variables
    ("compose_mode", "compose", lambda: refimpl.compose(W3, [[0, 0]], [1.0], mode="sparse"), "mode", "'sparse'"),
    ("compose_free_shape", "compose", lambda: refimpl.compose(W3, [[0, 0]], tf.constant([1.0, 2.0])), "free", "(2,)"),
    ("compose_dtype", "compose", lambda: refimpl.compose(W3, [[0, 0]], tf.constant([1.0], tf.float64)), "free", "float64"),
    ("compose_duplicated", "compose", lambda: refimpl.compose(W3, [[0, 0], [0, 0]], tf.constant([1.0, 2.0])), "indices", "[0, 0]"),
    ("compose_mask_disagrees", "compose", lambda: refimpl.compose(W3, [[0, 0]], [1.0], mask=EYE), "mask", "3"),
    ("choose_mode_int", "choose_mode", lambda: refimpl.choose_mode(np.eye(3, dtype=int)), "mask", "int"),
    ("partial_variable_int", "PartialVariable", lambda: refimpl.PartialVariable(np.eye(3, dtype=int), EYE), "initial_value", "int"),
    ("partial_variable_mask_shape", "PartialVariable", lambda: refimpl.PartialVariable(W3, [True]), "mask", "(1,)"),
    ("partial_variable_duplicated", "PartialVariable", lambda: refimpl.PartialVariable(W3, [[0, 0], [0, 0]]), "mask", "[0, 0]"),
    ("partial_variable_mode", "PartialVariable", lambda: refimpl.PartialVariable(W3, EYE, mode="sparse"), "mode", "'sparse'"),
    ("partial_variable_from_dense_shape", "PartialVariable", lambda: refimpl.PartialVariable.from_dense(W3, EYE[:2]), "mask", "(2, 3)"),
    # layers and constraints
    ("diagonal_dense_use_bias", "DiagonalDense", lambda: refimpl.DiagonalDense(use_bias="yes"), "use_bias", "'yes'"),
    ("banded_dense_negative", "BandedDense", lambda: refimpl.BandedDense(-1, 1), "lower", "-1"),
    ("banded_dense_too_wide", "BandedDense", lambda: _built(refimpl.BandedDense(3, 0), 3), "lower", "3"),
    ("banded_dense_fixed_length", "BandedDense", lambda: _built(refimpl.BandedDense(0, 0, fixed_diagonal=[1.0, 2.0]), 3), "fixed_diagonal", "2"),
    ("block_dense_unknown_entry", "BlockDense", lambda: refimpl.BlockDense([["train"]]), "blocks", "'train'"),
    ("block_dense_input_size", "BlockDense", lambda: _built(refimpl.BlockDense([[W3]]), 4), "input", "4"),
    ("partial_dense_units", "PartialDense", lambda: refimpl.PartialDense(-1, EYE), "units", "-1"),
    ("partial_dense_units_type", "PartialDense", lambda: refimpl.PartialDense("3", EYE), "units", "'3'"),
    ("partial_dense_mask_shape", "PartialDense", lambda: refimpl.PartialDense(3, EYE[:, :2]), "trainable_mask", "(3, 2)"),
    ("partial_dense_mode", "PartialDense", lambda: refimpl.PartialDense(3, EYE, mode="sparse"), "mode", "'sparse'"),
    ("partial_dense_index_out_of_range", "PartialDense", lambda: _built(refimpl.PartialDense(3, [[5, 0]]), 3), "trainable_mask", "[5, 0]"),
    ("freeze_entries_shape", "FreezeEntries", lambda: refimpl.FreezeEntries(EYE, np.zeros((2, 2))), "mask", "(3, 3)"),
    ("freeze_entries_strings", "FreezeEntries", lambda: refimpl.FreezeEntries(EYE, "abc"), "values", "'abc'"),
    ("freeze_entries_applied_shape", "FreezeEntries", lambda: refimpl.FreezeEntries(EYE, W3)(tf.zeros((2, 2))), "shape", "(2, 2)"),
    # testing and plotting
    ("moved_shapes", "moved", lambda: refimpl.moved([1.0], [1.0, 2.0]), "after", "(2,)"),
    ("moved_dtypes", "moved", lambda: refimpl.moved(np.ones(2, "float32"), np.ones(2)), "after", "float64"),
    ("assert_frozen_mask_shape", "assert_frozen", lambda: refimpl.assert_frozen(W3, W3, [True]), "mask", "(1,)"),
    ("count_free_parameters_strings", "count_free_parameters", lambda: refimpl.count_free_parameters(["a"]), "model_or_variables", "'a'"),
    ("count_free_parameters_int", "count_free_parameters", lambda: refimpl.count_free_parameters(3), "model_or_variables", "3"),
    ("plot_mask_rank", "plot_mask", lambda: refimpl.plot_mask(np.ones((2, 2, 2), bool)), "mask", "(2, 2, 2)"),
    # exactness
    ("frozen_drift_technique", "frozen_drift", lambda: refimpl.frozen_drift("magic", keras.optimizers.SGD(), EYE), "technique", "'magic'"),
    ("frozen_drift_int_mask", "frozen_drift", lambda: refimpl.frozen_drift("gradient masking", keras.optimizers.SGD(), np.eye(3, dtype=int)), "mask", "int"),
    ("frozen_drift_not_square", "frozen_drift", lambda: refimpl.frozen_drift("gradient masking", keras.optimizers.SGD(), EYE[:2]), "mask", "(2, 3)"),
    ("frozen_drift_steps", "frozen_drift", lambda: refimpl.frozen_drift("gradient masking", keras.optimizers.SGD(), EYE, steps=0), "steps", "0"),
    ("frozen_drift_dtype", "frozen_drift", lambda: refimpl.frozen_drift("gradient masking", keras.optimizers.SGD(), EYE, dtype="float16"), "dtype", "'float16'"),
    ("frozen_drift_mode", "frozen_drift", lambda: refimpl.frozen_drift("gradient masking", keras.optimizers.SGD(), EYE, mode="graph"), "mode", "'graph'"),
    ("frozen_drift_used_optimizer", "frozen_drift", _used_optimizer, "optimizer", "Adam"),
    ("frozen_drift_not_band", "frozen_drift", lambda: refimpl.frozen_drift("BandedDense layer", keras.optimizers.SGD(), np.eye(3, k=2, dtype=bool)), "mask", "1"),
    ("keras_optimizers_negative", "keras_optimizers", lambda: refimpl.keras_optimizers(weight_decay=-1.0), "weight_decay", "-1.0"),
    ("keras_optimizers_nan", "keras_optimizers", lambda: refimpl.keras_optimizers(weight_decay=float("nan")), "weight_decay", "nan"),
]  # fmt: skip

# Public names that take no user input of their own.
EXEMPT = {
    "Drift": "a NamedTuple record that frozen_drift returns",
    "TECHNIQUES": "a dict, not a callable",
    "__version__": "a string, not a callable",
}


def test_every_public_callable_has_a_bad_input_case():
    covered = {name for _, name, *_ in CASES} | set(EXEMPT)
    missing = sorted(set(refimpl.__all__) - covered)
    assert not missing, f"public names without a bad-input case: {missing}"


def test_cases_name_public_callables():
    assert {name for _, name, *_ in CASES} <= set(refimpl.__all__)


def _param(case_id, name, call, argument, shown, xfail=None):
    marks = [pytest.mark.xfail(strict=True, reason=xfail)] if xfail else []
    return pytest.param(call, argument, shown, id=case_id, marks=marks)


@pytest.mark.parametrize("call, argument, shown", [_param(*c) for c in CASES])
def test_bad_input_raises_naming_argument_and_value(call, argument, shown):
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    message = str(info.value)
    assert argument in message, f"the message does not name `{argument}`: {message}"
    assert shown in message, f"the message does not show {shown!r}: {message}"


# Valid edge cases: what the entry points do with them.
NONE, ALL = np.zeros((3, 3), bool), np.ones((3, 3), bool)


@pytest.mark.parametrize("mask", [NONE, ALL], ids=["no_entry", "every_entry"])
def test_partially_trainable_with_empty_or_full_mask_passes_all_or_no_gradient(mask):
    x = _var()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(refimpl.partially_trainable(x, mask) ** 2)
    np.testing.assert_array_equal(tape.gradient(loss, x), np.where(mask, 2 * W3, 0))


@pytest.mark.parametrize("mask", [NONE, ALL], ids=["no_entry", "every_entry"])
def test_partial_variable_with_empty_or_full_mask_round_trips(mask):
    v = refimpl.PartialVariable(W3, mask, mode="delta")
    assert v.free.shape == (int(mask.sum()),)
    np.testing.assert_array_equal(v.value(), W3)


@pytest.mark.parametrize("technique", list(refimpl.TECHNIQUES)[:-1])
def test_frozen_drift_with_nothing_trainable_counts_every_entry_as_frozen(technique):
    drift = refimpl.frozen_drift(technique, keras.optimizers.SGD(), NONE, steps=1)
    assert drift.frozen == 9 and drift.moved == 0


def test_frozen_drift_with_everything_trainable_has_nothing_frozen():
    drift = refimpl.frozen_drift("gradient masking", keras.optimizers.SGD(), ALL)
    assert drift.frozen == 0 and refimpl.moved(drift.before, drift.after).all()


def test_mask_gradients_with_full_mask_leaves_gradient_untouched():
    (out,) = refimpl.mask_gradients([tf.constant(W3)], [ALL])
    np.testing.assert_array_equal(out, W3)


def test_freeze_entries_with_empty_mask_returns_the_frozen_values():
    frozen = refimpl.FreezeEntries(NONE, W3)(tf.zeros((3, 3)))
    np.testing.assert_array_equal(frozen, W3)


def test_compose_with_no_index_returns_the_base():
    out = refimpl.compose(W3, np.zeros((0, 2), "int64"), tf.zeros([0]))
    np.testing.assert_array_equal(out, W3)


def test_apply_masked_gradients_casts_a_float64_gradient_as_keras_does():
    # A dtype mismatch that Keras itself accepts: the gradient is cast.
    a, b = _var(), _var()
    sgd = keras.optimizers.SGD
    refimpl.apply_masked_gradients(sgd(), [(W3.astype("float64"), a)], [EYE])
    refimpl.apply_masked_gradients(sgd(), [(W3, b)], [EYE])
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_nan_and_inf_frozen_values_are_kept_bit_exact():
    # NaN and inf are valid frozen values: they must come back with their bits.
    base = W3.copy()
    base[0, 1], base[1, 0], base[2, 0] = np.nan, np.inf, -0.0
    v = refimpl.PartialVariable(base, EYE, mode="delta")
    refimpl.assert_frozen(base, v.value(), EYE)
    frozen = refimpl.FreezeEntries(EYE, base)(tf.zeros((3, 3)))
    refimpl.assert_frozen(base, frozen, EYE)
