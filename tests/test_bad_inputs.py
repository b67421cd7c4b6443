# ruff: noqa: E501  (one bad-input case per line reads best as a table)
"""Every public entry point of refimpl rejects bad input with a precise error.

The rule (notes/API.md): a wrong type raises ``TypeError``, a wrong value or
shape raises ``ValueError``, and the message names the argument in backticks.
Each case calls one public name with one bad argument and pins

* the exception class exactly (a subclass does not count),
* the first backticked name in the message, by equality (``masks[0]`` is not
  ``masks``),
* a piece of the received value the message shows.

`test_every_public_name_has_a_bad_input_case` fails when a name is added to
`refimpl.__all__` without a case here.

Edge cases that are *valid* (an all-true mask, an empty mask where "nothing
is trainable" makes sense) are tested for what they do at the end.
"""

import inspect
import re

import keras
import numpy as np
import pytest

import refimpl

pytestmark = pytest.mark.every_backend

BACKEND = keras.backend.backend()

if BACKEND == "tensorflow":
    import tensorflow as tf  # the tests marked tensorflow_only

EYE = np.eye(3, dtype=bool)
W3 = np.arange(9, dtype="float32").reshape(3, 3)
V = (
    tf.Variable(W3, name="v")
    if BACKEND == "tensorflow"
    else keras.Variable(W3, name="v")
)


def _var():
    return tf.Variable(W3)


def _dense(units=3, n=3, **kwargs):
    layer = keras.layers.Dense(units, **kwargs)
    layer.build((None, n))
    return layer


def _full_dense():
    layer = _dense()
    layer.kernel.assign(np.ones((3, 3), "float32"))
    return layer


def _symbolic_x():
    @tf.function(input_signature=[tf.TensorSpec([None, 3])])
    def f(x):
        return refimpl.tf.one_hot_trainable(x, [[0, 0]])

    return f(tf.zeros((1, 3)))


def _built(layer, n):
    layer.build((None, n))


def _nan_minimize():
    v = tf.Variable([np.nan, 1.0])
    return refimpl.tf.minimize(lambda: tf.reduce_sum((v - 2.0) ** 2), v)


def _net():
    """A built subclassed model named Net, with one Dense layer `dense`."""

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)

        def call(self, x):
            return self.dense(x)

    model = Net()
    model(np.ones((1, 3), "float32"))
    return model


def _subclassed_model():
    return refimpl.merge(_net())


def _sgd():
    return keras.optimizers.SGD(0.1)


def _small_model():
    model = keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(3, name="d"),
            keras.layers.Dropout(0.1, name="drop"),
        ]
    )
    return model


def _partial_small():
    return refimpl.partialize(_small_model(), {"d": EYE})


def _drop_and_grow_fit(model, optimizer="adam"):
    model.compile(optimizer, "mse")
    callback = refimpl.DropAndGrow((W3, W3), every=1, fraction=0.5)
    model.fit(W3, W3, epochs=1, verbose=0, callbacks=[callback])


def _partialize_subclassed():
    return refimpl.partialize(_net(), {"dense": [[0, 0]]})


def _built_dense(units=3):
    layer = keras.layers.Dense(units)
    layer.build((None, 3))
    return layer


def _masked(masks, **kwargs):
    return refimpl.MaskedOptimizer(_sgd(), masks, **kwargs)


def _masked_build_foreign():
    optimizer = _masked([(V, EYE)])
    optimizer.build([_var()])


# (id, public name, call, exception class, first backticked name, value shown)
CASES = [
    # masks: the shared validation every entry point uses
    ("to_mask_wrong_shape", "to_mask", lambda: refimpl.masks.to_mask([True], (2,)), ValueError, "mask", "(1,)"),
    ("to_mask_float_not_01", "to_mask", lambda: refimpl.masks.to_mask([0.5, 1.0], (2,)), ValueError, "mask", "0.5"),
    ("to_mask_int_mask", "to_mask", lambda: refimpl.masks.to_mask(np.eye(3, dtype=int), (3, 3)), TypeError, "mask", "shape (3, 3)"),
    ("to_mask_int_mask_of_shape_k_by_2", "to_mask", lambda: refimpl.masks.to_mask(np.eye(2, dtype=int), (2, 2)), TypeError, "mask", "shape (2, 2)"),
    ("to_mask_nan", "to_mask", lambda: refimpl.masks.to_mask([np.nan, 1.0], (2,)), ValueError, "mask", "nan"),
    ("to_mask_strings", "to_mask", lambda: refimpl.masks.to_mask(["a", "b"], (2,)), TypeError, "mask", "<U1"),
    ("to_mask_objects", "to_mask", lambda: refimpl.masks.to_mask([object(), 1], (2,)), TypeError, "mask", "list of length 2"),
    ("partial_variable_int_vector", "PartialVariable", lambda: refimpl.PartialVariable(np.arange(3), [True, False, True]), TypeError, "initial_value", "int64"),
    ("to_mask_ragged", "to_mask", lambda: refimpl.masks.to_mask([[1, 2], [3]], (2,)), TypeError, "mask", "list of length 2"),
    ("to_mask_bad_shape", "to_mask", lambda: refimpl.masks.to_mask([True], "a"), TypeError, "shape", "'a'"),
    ("indices_out_of_range", "indices_to_mask", lambda: refimpl.masks.indices_to_mask([[3]], (3,)), ValueError, "indices", "[3]"),
    ("indices_negative", "indices_to_mask", lambda: refimpl.masks.indices_to_mask([[-1]], (3,)), ValueError, "indices", "[-1]"),
    ("indices_duplicated", "indices_to_mask", lambda: refimpl.masks.indices_to_mask([[1], [1]], (3,)), ValueError, "indices", "[1]"),
    ("indices_float", "indices_to_mask", lambda: refimpl.masks.indices_to_mask([[0.0]], (3,)), TypeError, "indices", "float64"),
    ("indices_rank", "indices_to_mask", lambda: refimpl.masks.indices_to_mask([[0, 0]], (3,)), ValueError, "indices", "(1, 2)"),
    ("indices_negative_shape", "indices_to_mask", lambda: refimpl.masks.indices_to_mask([[0]], (3, -1)), ValueError, "shape", "-1"),
    ("indices_unknown_shape", "indices_to_mask", lambda: refimpl.masks.indices_to_mask([[0]], (3, None)), ValueError, "shape", "None"),
    ("mask_to_indices_int", "mask_to_indices", lambda: refimpl.masks.mask_to_indices([1, 0]), TypeError, "mask", "int"),
    # stop_gradient
    ("partially_trainable_shape", "partially_trainable", lambda: refimpl.tf.partially_trainable(W3, [True]), ValueError, "mask", "(1,)"),
    ("partially_trainable_float", "partially_trainable", lambda: refimpl.tf.partially_trainable(W3, EYE * 0.5), ValueError, "mask", "0.5"),
    ("partially_trainable_int", "partially_trainable", lambda: refimpl.tf.partially_trainable(W3, np.eye(3, dtype=int)), TypeError, "mask", "shape (3, 3)"),
    ("one_hot_out_of_range", "one_hot_trainable", lambda: refimpl.tf.one_hot_trainable(W3, [[3, 0]]), ValueError, "indices", "[3, 0]"),
    ("one_hot_negative", "one_hot_trainable", lambda: refimpl.tf.one_hot_trainable(W3, [[0, -1]]), ValueError, "indices", "[0, -1]"),
    ("one_hot_duplicated", "one_hot_trainable", lambda: refimpl.tf.one_hot_trainable(W3, [[0, 1], [0, 1]]), ValueError, "indices", "[0, 1]"),
    ("one_hot_strings", "one_hot_trainable", lambda: refimpl.tf.one_hot_trainable(W3, [["a", "b"]]), TypeError, "indices", "<U1"),
    ("one_hot_unknown_shape", "one_hot_trainable", _symbolic_x, ValueError, "x", "None"),
    # SciPy
    ("minimize_not_callable", "minimize", lambda: refimpl.tf.minimize(1.0, _var()), TypeError, "loss_fn", "1.0"),
    ("minimize_not_variable", "minimize", lambda: refimpl.tf.minimize(lambda: 0.0, tf.constant(W3)), TypeError, "variables", "EagerTensor"),
    ("minimize_int_variable_in_list", "minimize", lambda: refimpl.tf.minimize(lambda: 0.0, [tf.Variable([1, 2])]), TypeError, "variables[0]", "int32"),
    ("minimize_int_variable", "minimize", lambda: refimpl.tf.minimize(lambda: 0.0, tf.Variable([1, 2])), TypeError, "variables", "int32"),
    ("minimize_duplicated_variable", "minimize", lambda: refimpl.tf.minimize(lambda: 0.0, [V, V]), ValueError, "variables", "more than once"),
    ("minimize_mask_shape", "minimize", lambda: refimpl.tf.minimize(lambda: 0.0, _var(), [True]), ValueError, "mask", "(1,)"),
    ("minimize_mask_list_length", "minimize", lambda: refimpl.tf.minimize(lambda: 0.0, [_var()], [EYE, EYE]), ValueError, "mask", "mask=list"),
    ("minimize_method", "minimize", lambda: refimpl.tf.minimize(lambda: 0.0, _var(), method="sgd"), ValueError, "method", "'sgd'"),
    ("minimize_options", "minimize", lambda: refimpl.tf.minimize(lambda: 0.0, _var(), options=5), TypeError, "options", "5"),
    ("minimize_nan_start", "minimize", _nan_minimize, ValueError, "loss_fn", "nan"),
    ("minimize_loss_not_scalar", "minimize", lambda: refimpl.tf.minimize(lambda: V * 2.0, V), ValueError, "loss_fn", "(3, 3)"),
    ("minimize_empty_mask", "minimize", lambda: refimpl.tf.minimize(lambda: 0.0, _var(), ~EYE & EYE), ValueError, "mask", "[0]"),
    # masked_optimizer: mask_gradients
    ("mask_gradients_not_list", "mask_gradients", lambda: refimpl.optimizers.mask_gradients(3, [(V, EYE)]), TypeError, "grads_and_vars", "3"),
    ("mask_gradients_not_pairs", "mask_gradients", lambda: refimpl.optimizers.mask_gradients(W3, [(V, EYE)]), TypeError, "grads_and_vars[0]", "shape (3,)"),
    ("mask_gradients_not_variable", "mask_gradients", lambda: refimpl.optimizers.mask_gradients([(W3, W3)], []), TypeError, "grads_and_vars[0]", "ndarray"),
    ("mask_gradients_masks_not_list", "mask_gradients", lambda: refimpl.optimizers.mask_gradients([(W3, V)], EYE), TypeError, "masks", "ndarray of shape"),
    ("mask_gradients_masks_not_pair", "mask_gradients", lambda: refimpl.optimizers.mask_gradients([(W3, V)], [V]), TypeError, "masks[0]", "Variable of shape (3, 3)"),
    ("mask_gradients_masks_not_variable", "mask_gradients", lambda: refimpl.optimizers.mask_gradients([(W3, V)], [(W3, EYE)]), TypeError, "masks[0]", "ndarray"),
    ("mask_gradients_shape", "mask_gradients", lambda: refimpl.optimizers.mask_gradients([(W3, V)], [(V, [True])]), ValueError, "masks[0]", "(1,)"),
    ("mask_gradients_float_mask", "mask_gradients", lambda: refimpl.optimizers.mask_gradients([(W3, V)], [(V, EYE * 0.5)]), ValueError, "masks[0]", "0.5"),
    ("mask_gradients_foreign_variable", "mask_gradients", lambda: refimpl.optimizers.mask_gradients([(W3, V)], [(_var(), EYE)]), ValueError, "masks[0]", "'Variable'"),
    ("mask_gradients_second_mask", "mask_gradients", lambda: refimpl.optimizers.mask_gradients([(W3, V)], [(V, EYE), (V, EYE)]), ValueError, "masks[1]", "'v'"),
    ("mask_gradients_variable_twice", "mask_gradients", lambda: refimpl.optimizers.mask_gradients([(W3, V), (W3, V)], [(V, EYE)]), ValueError, "grads_and_vars[1]", "'v'"),
    ("mask_gradients_none_gradient", "mask_gradients", lambda: refimpl.optimizers.mask_gradients([(None, V)], [(V, EYE)]), ValueError, "grads_and_vars[0]", "'v'"),
    # masked_optimizer: apply_masked_gradients
    ("apply_not_optimizer", "apply_masked_gradients", lambda: refimpl.optimizers.apply_masked_gradients("adam", [(W3, _var())], []), TypeError, "optimizer", "'adam'"),
    ("apply_not_variable", "apply_masked_gradients", lambda: refimpl.optimizers.apply_masked_gradients(_sgd(), [(W3, tf.constant(W3))], []), TypeError, "grads_and_vars[0]", "EagerTensor"),
    ("apply_masks_not_list", "apply_masked_gradients", lambda: refimpl.optimizers.apply_masked_gradients(_sgd(), [(W3, V)], None), TypeError, "masks", "None"),
    ("apply_mask_shape", "apply_masked_gradients", lambda: refimpl.optimizers.apply_masked_gradients(_sgd(), [(W3, V)], [(V, [True])]), ValueError, "masks[0]", "(1,)"),
    ("apply_mask_above_one", "apply_masked_gradients", lambda: refimpl.optimizers.apply_masked_gradients(_sgd(), [(W3, V)], [(V, EYE * 1.5)]), ValueError, "masks[0]", "1.5"),
    ("apply_int_mask", "apply_masked_gradients", lambda: refimpl.optimizers.apply_masked_gradients(_sgd(), [(W3, V)], [(V, np.eye(3, dtype=int))]), TypeError, "masks[0]", "shape (3, 3)"),
    ("apply_restore_not_bool", "apply_masked_gradients", lambda: refimpl.optimizers.apply_masked_gradients(_sgd(), [(W3, _var())], [], restore_frozen="yes"), TypeError, "restore_frozen", "'yes'"),
    ("apply_none_gradient", "apply_masked_gradients", lambda: refimpl.optimizers.apply_masked_gradients(_sgd(), [(None, V)], [(V, EYE)]), ValueError, "grads_and_vars[0]", "'v'"),
    # masked_optimizer: MaskedOptimizer
    ("masked_optimizer_not_optimizer", "MaskedOptimizer", lambda: refimpl.MaskedOptimizer(3, []), TypeError, "optimizer", "3"),
    ("masked_optimizer_unknown_name", "MaskedOptimizer", lambda: refimpl.MaskedOptimizer("nope", []), ValueError, "optimizer", "nope"),
    ("masked_optimizer_masks_none", "MaskedOptimizer", lambda: refimpl.MaskedOptimizer(_sgd(), None), TypeError, "masks", "None"),
    ("masked_optimizer_masks_array", "MaskedOptimizer", lambda: _masked(EYE), TypeError, "masks", "ndarray of shape"),
    ("masked_optimizer_masks_not_pair", "MaskedOptimizer", lambda: _masked([V]), TypeError, "masks[0]", "Variable of shape (3, 3)"),
    ("masked_optimizer_masks_slice", "MaskedOptimizer", lambda: _masked([(V[0], [True] * 3)]), TypeError, "masks[0]", "EagerTensor"),
    ("masked_optimizer_mask_shape", "MaskedOptimizer", lambda: _masked([(V, [True])]), ValueError, "masks[0]", "(1,)"),
    ("masked_optimizer_mask_negative", "MaskedOptimizer", lambda: _masked([(V, -EYE.astype("float32"))]), ValueError, "masks[0]", "-1"),
    ("masked_optimizer_second_mask", "MaskedOptimizer", lambda: _masked([(V, EYE), (V, EYE)]), ValueError, "masks[1]", "'v'"),
    ("masked_optimizer_not_trained", "MaskedOptimizer", _masked_build_foreign, ValueError, "masks[0]", "'v'"),
    ("masked_optimizer_restore_not_bool", "MaskedOptimizer", lambda: _masked([], restore_frozen=1), TypeError, "restore_frozen", "1"),
    ("masked_optimizer_clipnorm", "MaskedOptimizer", lambda: _masked([], clipnorm=1.0), ValueError, "clipnorm", "clipnorm=1.0 on the MaskedOptimizer"),
    ("masked_optimizer_unknown_argument", "MaskedOptimizer", lambda: _masked([], foo=1), TypeError, "foo", "foo"),
    # structured
    ("diagonal_rank", "diagonal", lambda: refimpl.structured.diagonal(W3), ValueError, "w", "(3, 3)"),
    ("diagonal_strings", "diagonal", lambda: refimpl.structured.diagonal(["a", "b"]), TypeError, "w", "string"),
    ("diagonal_matmul_size", "diagonal_matmul", lambda: refimpl.structured.diagonal_matmul(np.ones((2, 4), "float32"), np.ones(3, "float32")), ValueError, "x", "(2, 4)"),
    ("diagonal_matmul_dtype", "diagonal_matmul", lambda: refimpl.structured.diagonal_matmul(np.ones((2, 3)), np.ones(3, "float32")), TypeError, "x", "float64"),
    ("banded_duplicate_offsets", "banded", lambda: refimpl.structured.banded([np.ones(3), np.ones(3)], [0, 0]), ValueError, "offsets", "[0, 0]"),
    ("banded_wrong_length", "banded", lambda: refimpl.structured.banded([np.ones(3), np.ones(3)], [0, 1]), ValueError, "diagonals", "lengths=[3, 3]"),
    ("banded_float_offset", "banded", lambda: refimpl.structured.banded([np.ones(3)], [0.5]), TypeError, "offsets", "0.5"),
    ("banded_offsets_not_list", "banded", lambda: refimpl.structured.banded([np.ones(3)], 0), TypeError, "offsets", "0"),
    ("banded_counts_differ", "banded", lambda: refimpl.structured.banded([np.ones(3)], [0, 1]), ValueError, "diagonals", "[0, 1]"),
    ("banded_diagonals_tensor", "banded", lambda: refimpl.structured.banded(tf.ones(3), [0]), TypeError, "diagonals", "EagerTensor"),
    ("banded_mixed_dtypes", "banded", lambda: refimpl.structured.banded([np.ones(3, "float32"), np.ones(2)], [0, 1]), TypeError, "diagonals", "float64"),
    ("banded_matmul_size", "banded_matmul", lambda: refimpl.structured.banded_matmul(np.ones((2, 4), "float32"), [np.ones(3, "float32")], [0]), ValueError, "x", "(2, 4)"),
    ("block_empty", "block", lambda: refimpl.structured.block([]), ValueError, "rows", "[]"),
    ("block_ragged", "block", lambda: refimpl.structured.block([[W3, None], [W3]]), ValueError, "rows", "[2, 1]"),
    ("block_heights_differ", "block", lambda: refimpl.structured.block([[W3, np.ones((2, 2), "float32")]]), ValueError, "rows", "rows[0][1].shape=(2, 2)"),
    ("block_dtype_mismatch", "block", lambda: refimpl.structured.block([[tf.constant(W3), tf.constant(W3, tf.float64)]]), TypeError, "rows", "float64"),
    ("block_matmul_size", "block_matmul", lambda: refimpl.structured.block_matmul(np.ones((2, 4), "float32"), [[W3]]), ValueError, "x", "(2, 4)"),
    ("scatter_free_out_of_range", "compose", lambda: refimpl.ops.compose(W3, [[3, 0]], [1.0]), ValueError, "positions", "[3, 0]"),
    ("scatter_free_duplicated", "compose", lambda: refimpl.ops.compose(W3, [[0, 0], [0, 0]], [1.0, 2.0]), ValueError, "positions", "[0, 0]"),
    ("scatter_free_count", "compose", lambda: refimpl.ops.compose(W3, [[0, 0]], [1.0, 2.0]), ValueError, "free", "(2,)"),
    ("scatter_free_dtype", "compose", lambda: refimpl.ops.compose(W3, [[0, 0]], np.array([1.0])), TypeError, "free", "float64"),
    # variables
    ("compose_mode", "compose", lambda: refimpl.ops.compose(W3, [[0, 0]], [1.0], mode="sparse"), ValueError, "mode", "'sparse'"),
    ("compose_free_shape", "compose", lambda: refimpl.ops.compose(W3, [[0, 0]], tf.constant([1.0, 2.0])), ValueError, "free", "(2,)"),
    ("compose_dtype", "compose", lambda: refimpl.ops.compose(W3, [[0, 0]], tf.constant([1.0], tf.float64)), TypeError, "free", "float64"),
    ("sparse_matmul_x_shape", "sparse_matmul", lambda: refimpl.ops.sparse_matmul(np.ones((2, 4), "float32"), W3, np.array([0], "int32"), np.ones(1, "float32")), ValueError, "x", "(2, 4)"),
    ("compose_duplicated", "compose", lambda: refimpl.ops.compose(W3, [[0, 0], [0, 0]], tf.constant([1.0, 2.0])), ValueError, "positions", "[0, 0]"),
    ("choose_mode_int", "choose_mode", lambda: refimpl.ops.choose_mode(np.eye(3, dtype=int)), TypeError, "mask", "int"),
    ("choose_mode_fraction", "choose_mode", lambda: refimpl.ops.choose_mode(EYE * 0.5), ValueError, "mask", "0.5"),
    ("partial_variable_int", "PartialVariable", lambda: refimpl.PartialVariable(np.eye(3, dtype=int), EYE), TypeError, "initial_value", "int"),
    ("partial_variable_strings", "PartialVariable", lambda: refimpl.PartialVariable("abc", [True]), TypeError, "initial_value", "<U3"),
    ("partial_variable_mask_shape", "PartialVariable", lambda: refimpl.PartialVariable(W3, [True]), ValueError, "mask", "(1,)"),
    ("partial_variable_mask_float", "PartialVariable", lambda: refimpl.PartialVariable(W3, EYE * 0.5), ValueError, "mask", "0.5"),
    ("partial_variable_duplicated", "PartialVariable", lambda: refimpl.PartialVariable(W3, [[0, 0], [0, 0]]), ValueError, "mask", "[0, 0]"),
    ("partial_variable_mode", "PartialVariable", lambda: refimpl.PartialVariable(W3, EYE, mode="fast"), ValueError, "mode", "'fast'"),
    ("partial_variable_nothing", "PartialVariable", lambda: refimpl.PartialVariable(), ValueError, "initial_value", "initial_value=None"),
    ("partial_variable_no_mask", "PartialVariable", lambda: refimpl.PartialVariable(W3), ValueError, "mask", "mask=None"),
    ("partial_variable_shell_num_free", "PartialVariable", lambda: refimpl.PartialVariable(shape=(3,), num_free="2"), TypeError, "num_free", "'2'"),
    ("partial_variable_shell_num_free_range", "PartialVariable", lambda: refimpl.PartialVariable(shape=(3,), num_free=4), ValueError, "num_free", "4"),
    ("partial_variable_shell_auto", "PartialVariable", lambda: refimpl.PartialVariable(shape=(3,), num_free=1, mode="auto"), ValueError, "mode", "'auto'"),
    ("partial_variable_shape_and_value", "PartialVariable", lambda: refimpl.PartialVariable(W3, EYE, shape=(3, 3)), ValueError, "shape", "shape=(3, 3)"),
    ("partial_variable_from_dense_shape", "PartialVariable", lambda: refimpl.PartialVariable.from_dense(W3, EYE[:2]), ValueError, "mask", "(2, 3)"),
    ("partial_variable_from_dense_strings", "PartialVariable", lambda: refimpl.PartialVariable.from_dense("abc", [True]), TypeError, "w", "<U3"),
    # layers
    ("diagonal_dense_use_bias", "DiagonalDense", lambda: refimpl.DiagonalDense(use_bias="yes"), TypeError, "use_bias", "'yes'"),
    ("diagonal_dense_from_dense_not_dense", "DiagonalDense", lambda: refimpl.DiagonalDense.from_dense(W3), TypeError, "dense", "ndarray of shape"),
    ("diagonal_dense_from_dense_not_square", "DiagonalDense", lambda: refimpl.DiagonalDense.from_dense(_dense(2, 3)), ValueError, "dense", "(3, 2)"),
    ("diagonal_dense_from_dense_off_diagonal", "DiagonalDense", lambda: refimpl.DiagonalDense.from_dense(_full_dense()), ValueError, "dense", "6 non-zero"),
    ("diagonal_dense_from_dense_regularizer", "DiagonalDense", lambda: refimpl.DiagonalDense.from_dense(_dense(kernel_regularizer="l2")), ValueError, "dense", "kernel_regularizer="),
    ("banded_dense_negative", "BandedDense", lambda: refimpl.BandedDense(-1, 1), ValueError, "lower", "-1"),
    ("banded_dense_float_width", "BandedDense", lambda: refimpl.BandedDense(0, 1.5), TypeError, "upper", "1.5"),
    ("banded_dense_too_wide", "BandedDense", lambda: _built(refimpl.BandedDense(3, 0), 3), ValueError, "lower", "3"),
    ("banded_dense_fixed_length", "BandedDense", lambda: _built(refimpl.BandedDense(0, 0, fixed_diagonal=[1.0, 2.0]), 3), ValueError, "fixed_diagonal", "2 numbers"),
    ("banded_dense_fixed_strings", "BandedDense", lambda: refimpl.BandedDense(0, 0, fixed_diagonal=["a"]), TypeError, "fixed_diagonal", "['a']"),
    ("banded_dense_from_dense_outside_band", "BandedDense", lambda: refimpl.BandedDense.from_dense(_full_dense(), 1, 0), ValueError, "dense", "4 non-zero"),
    ("banded_dense_from_dense_constraint", "BandedDense", lambda: refimpl.BandedDense.from_dense(_dense(kernel_constraint="non_neg"), 1, 1), ValueError, "dense", "kernel_constraint="),
    ("block_dense_unknown_entry", "BlockDense", lambda: refimpl.BlockDense([["train"]]), ValueError, "blocks[0][0]", "'train'"),
    ("block_dense_not_a_grid", "BlockDense", lambda: refimpl.BlockDense(5), TypeError, "blocks", "5"),
    ("block_dense_empty_grid", "BlockDense", lambda: refimpl.BlockDense([]), ValueError, "blocks", "[]"),
    ("block_dense_sizes_type", "BlockDense", lambda: refimpl.BlockDense([["trainable"]], row_sizes=[1.5], col_sizes=[2]), TypeError, "row_sizes", "[1.5]"),
    ("block_dense_sizes_string", "BlockDense", lambda: refimpl.BlockDense([["trainable"]], row_sizes="a", col_sizes=[2]), TypeError, "row_sizes", "'a'"),
    ("block_dense_sizes_zero", "BlockDense", lambda: refimpl.BlockDense([["trainable"]], row_sizes=[0], col_sizes=[2]), ValueError, "row_sizes", "[0]"),
    ("block_dense_ragged", "BlockDense", lambda: refimpl.BlockDense([[W3], [W3, W3]]), ValueError, "blocks", "[1, 2]"),
    ("block_dense_heights_differ", "BlockDense", lambda: refimpl.BlockDense([[W3, np.ones((2, 2))]]), ValueError, "blocks", "blocks[0][1].shape=(2, 2)"),
    ("block_dense_unknown_size", "BlockDense", lambda: refimpl.BlockDense([["trainable"]]), ValueError, "row_sizes", "block row 0"),
    ("block_dense_sizes_count", "BlockDense", lambda: refimpl.BlockDense([["trainable"]], row_sizes=[3], col_sizes=[2, 1]), ValueError, "col_sizes", "[2, 1]"),
    ("block_dense_input_size", "BlockDense", lambda: _built(refimpl.BlockDense([[W3]]), 4), ValueError, "input_shape", "(None, 4)"),
    ("block_dense_from_dense_sizes", "BlockDense", lambda: refimpl.BlockDense.from_dense(_dense(), [["trainable"]], row_sizes=[2], col_sizes=[3]), ValueError, "row_sizes", "row_sizes=[2]"),
    ("block_dense_from_dense_nonzero_outside", "BlockDense", lambda: refimpl.BlockDense.from_dense(_full_dense(), [["trainable", None]], row_sizes=[3], col_sizes=[2, 1]), ValueError, "dense", "3 non-zero"),
    ("partial_dense_units", "PartialDense", lambda: refimpl.PartialDense(-1, EYE), ValueError, "units", "-1"),
    ("partial_dense_units_type", "PartialDense", lambda: refimpl.PartialDense("3", EYE), TypeError, "units", "'3'"),
    ("partial_dense_no_mask", "PartialDense", lambda: refimpl.PartialDense(3), ValueError, "trainable_mask", "trainable_mask=None"),
    ("partial_dense_mask_shape", "PartialDense", lambda: refimpl.PartialDense(3, EYE[:, :2]), ValueError, "trainable_mask", "(3, 2)"),
    ("partial_dense_mode", "PartialDense", lambda: refimpl.PartialDense(3, EYE, mode="fast"), ValueError, "mode", "'fast'"),
    ("partial_dense_index_out_of_range", "PartialDense", lambda: _built(refimpl.PartialDense(3, [[5, 0]]), 3), ValueError, "trainable_mask", "[5, 0]"),
    ("partial_dense_mask_and_num_free", "PartialDense", lambda: refimpl.PartialDense(3, EYE, num_free=2), ValueError, "num_free", "num_free=2"),
    ("partial_dense_from_dense_not_dense", "PartialDense", lambda: refimpl.PartialDense.from_dense(keras.layers.Dense(3), EYE), TypeError, "dense", "Dense"),
    ("partial_dense_from_dense_mask_shape", "PartialDense", lambda: refimpl.PartialDense.from_dense(_dense(), EYE[:2]), ValueError, "trainable_mask", "(2, 3)"),
    # conversion
    ("merge_not_model", "merge", lambda: refimpl.merge(_dense()), TypeError, "model", "Dense"),
    ("merge_subclassed", "merge", _subclassed_model, TypeError, "model", "Net"),
    ("merge_not_built", "merge", lambda: refimpl.merge(keras.Sequential([keras.layers.Dense(1)])), ValueError, "model", "sequential"),
    ("partialize_not_model", "partialize", lambda: refimpl.partialize(_dense(), {}), TypeError, "model", "Dense"),
    ("partialize_subclassed", "partialize", _partialize_subclassed, TypeError, "model", "Net"),
    ("partialize_not_dict", "partialize", lambda: refimpl.partialize(_small_model(), [("d", EYE)]), TypeError, "layer_masks", "list of length 1"),
    ("partialize_unknown_layer", "partialize", lambda: refimpl.partialize(_small_model(), {"nope": EYE}), ValueError, "layer_masks['nope']", "'d'"),
    ("partialize_unsupported_layer", "partialize", lambda: refimpl.partialize(_small_model(), {"drop": EYE}), TypeError, "layer_masks['drop']", "Dropout"),
    ("partialize_mask_shape", "partialize", lambda: refimpl.partialize(_small_model(), {"d": [True]}), ValueError, "layer_masks['d']", "(1,)"),
    ("partialize_policy_shape", "partialize", lambda: refimpl.partialize(_small_model(), {"d": lambda w: w[:1] > 0}), ValueError, "layer_masks['d']", "(1, 3)"),
    ("partialize_in_place_flag", "partialize", lambda: refimpl.partialize(_small_model(), {}, in_place=1), TypeError, "in_place", "1"),
    ("partialize_train_type", "partialize", lambda: refimpl.partialize(_small_model(), {}, train=3), TypeError, "train", "3"),
    ("partialize_train_unknown", "partialize", lambda: refimpl.partialize(_small_model(), {}, train=["nope"]), ValueError, "train['nope']", "'d'"),
    ("merge_in_place_flag", "merge", lambda: refimpl.merge(_small_model(), in_place=1), TypeError, "in_place", "1"),
    ("enable_partial_weight", "enable_partial", lambda: refimpl.enable_partial(_dense(), EYE, weight="bias"), ValueError, "weight", "'bias'"),
    ("save_partial_weights_suffix", "save_partial_weights", lambda: refimpl.save_partial_weights(_small_model(), "x.h5"), ValueError, "path", "x.h5"),
    ("save_partial_weights_path_type", "save_partial_weights", lambda: refimpl.save_partial_weights(_small_model(), 3), TypeError, "path", "3"),
    ("save_partial_weights_nothing_partial", "save_partial_weights", lambda: refimpl.save_partial_weights(_small_model(), "x.npz"), ValueError, "model", "sequential"),
    ("load_partial_weights_not_model", "load_partial_weights", lambda: refimpl.load_partial_weights("m", "x.npz"), TypeError, "model", "'m'"),
    ("partial_weights_not_model", "partial_weights", lambda: refimpl.partial.partial_weights("m"), TypeError, "model", "'m'"),
    ("trainable_summary_print_fn", "trainable_summary", lambda: refimpl.convert.trainable_summary(_small_model(), print_fn=3), TypeError, "print_fn", "3"),
    ("enable_partial_not_layer", "enable_partial", lambda: refimpl.enable_partial("d", EYE), TypeError, "layer", "'d'"),
    ("enable_partial_unsupported", "enable_partial", lambda: refimpl.enable_partial(keras.layers.Dropout(0.1), EYE), TypeError, "layer", "Dropout"),
    ("enable_partial_not_built", "enable_partial", lambda: refimpl.enable_partial(keras.layers.Dense(3), EYE), ValueError, "layer", "dense"),
    ("enable_partial_mask_shape", "enable_partial", lambda: refimpl.enable_partial(_built_dense(), [True]), ValueError, "mask", "(1,)"),
    ("selection_k_and_fraction", "random_mask", lambda: refimpl.selection.random_mask((3, 3), k=1, fraction=0.5), ValueError, "k", "fraction=0.5"),
    ("selection_k_too_big", "magnitude_mask", lambda: refimpl.selection.magnitude_mask(W3, k=10), ValueError, "k", "10"),
    ("selection_fraction_type", "random_mask", lambda: refimpl.selection.random_mask((3,), fraction="half"), TypeError, "fraction", "'half'"),
    ("selection_scores_nan", "top_k_mask", lambda: refimpl.selection.top_k_mask([np.nan], k=1), ValueError, "scores", "NaN"),
    ("selection_rows_range", "rows_mask", lambda: refimpl.selection.rows_mask((3, 2), [3]), ValueError, "rows", "[3]"),
    ("selection_band_negative", "band_mask", lambda: refimpl.selection.band_mask((3, 3), -1, 0), ValueError, "lower", "-1"),
    ("selection_band_type", "band_mask", lambda: refimpl.selection.band_mask((3, 3), 0, 1.5), TypeError, "upper", "1.5"),
    ("selection_block_sizes", "block_mask", lambda: refimpl.selection.block_mask((3, 3), [1, 1], [3], []), ValueError, "row_sizes", "[1, 1]"),
    ("selection_fisher_batches", "fisher_scores", lambda: refimpl.selection.fisher_scores(_small_model(), W3, W3, loss="mse", batches=0), ValueError, "batches", "0"),
    ("selection_fisher_batch_type", "fisher_scores", lambda: refimpl.selection.fisher_scores(_small_model(), W3, W3, loss="mse", batch_size="32"), TypeError, "batch_size", "'32'"),
    ("selection_columns_range", "columns_mask", lambda: refimpl.selection.columns_mask((3, 2), [2]), ValueError, "columns", "[2]"),
    ("selection_diagonal_shape", "diagonal_mask", lambda: refimpl.selection.diagonal_mask((3, 3, 3)), ValueError, "shape", "(3, 3, 3)"),
    ("selection_fisher_mask_k", "fisher_mask", lambda: refimpl.selection.fisher_mask(W3, k=10), ValueError, "k", "10"),
    # constraints
    ("freeze_entries_shape", "FreezeEntries", lambda: refimpl.FreezeEntries(np.zeros((2, 2)), EYE), ValueError, "mask", "(3, 3)"),
    ("freeze_entries_strings", "FreezeEntries", lambda: refimpl.FreezeEntries("abc", EYE), TypeError, "values", "'abc'"),
    ("freeze_entries_int_mask", "FreezeEntries", lambda: refimpl.FreezeEntries(W3, np.eye(3, dtype=int)), TypeError, "mask", "shape (3, 3)"),
    ("freeze_entries_scalar_with_indices", "FreezeEntries", lambda: refimpl.FreezeEntries(0.0, [[0, 0]]), ValueError, "mask", "[[0, 0]]"),
    ("freeze_entries_applied_shape", "FreezeEntries", lambda: refimpl.FreezeEntries(W3, EYE)(tf.zeros((2, 2))), ValueError, "w", "(2, 2)"),
    ("freeze_entries_from_variable_mask", "FreezeEntries", lambda: refimpl.FreezeEntries.from_variable(V, [True]), ValueError, "mask", "(1,)"),
    ("freeze_entries_from_variable_strings", "FreezeEntries", lambda: refimpl.FreezeEntries.from_variable("abc", EYE), TypeError, "variable", "abc"),
    # testing and plotting
    ("moved_shapes", "moved", lambda: refimpl.testing.moved([1.0], [1.0, 2.0]), ValueError, "before", "(2,)"),
    ("moved_dtypes", "moved", lambda: refimpl.testing.moved(np.ones(2, "float32"), np.ones(2)), TypeError, "before", "float64"),
    ("moved_objects", "moved", lambda: refimpl.testing.moved([object()], [object()]), TypeError, "before", "list of length 1"),
    ("assert_frozen_mask_shape", "assert_frozen", lambda: refimpl.testing.assert_frozen(W3, W3, [True]), ValueError, "mask", "(1,)"),
    ("assert_frozen_shapes", "assert_frozen", lambda: refimpl.testing.assert_frozen(W3, W3[:2], EYE), ValueError, "before", "(2, 3)"),
    ("count_free_parameters_strings", "count_free_parameters", lambda: refimpl.testing.count_free_parameters(["a"]), TypeError, "model_or_variables", "'a'"),
    ("count_free_parameters_int", "count_free_parameters", lambda: refimpl.testing.count_free_parameters(3), TypeError, "model_or_variables", "3"),
    ("count_optimizer_state_not_optimizer", "count_optimizer_state", lambda: refimpl.testing.count_optimizer_state("adam"), TypeError, "optimizer", "'adam'"),
    ("count_optimizer_state_not_built", "count_optimizer_state", lambda: refimpl.testing.count_optimizer_state(_sgd()), ValueError, "optimizer", "SGD"),
    ("plot_mask_rank", "plot_mask", lambda: refimpl.plotting.plot_mask(np.ones((2, 2, 2), bool)), ValueError, "mask", "(2, 2, 2)"),
    ("drop_and_grow_every", "DropAndGrow", lambda: refimpl.DropAndGrow((W3, W3), every=0), ValueError, "every", "0"),
    ("drop_and_grow_every_type", "DropAndGrow", lambda: refimpl.DropAndGrow((W3, W3), every=1.5), TypeError, "every", "1.5"),
    ("drop_and_grow_fraction_one", "DropAndGrow", lambda: refimpl.DropAndGrow((W3, W3), fraction=1.0), ValueError, "fraction", "1.0"),
    ("drop_and_grow_fraction_zero", "DropAndGrow", lambda: refimpl.DropAndGrow((W3, W3), fraction=0), ValueError, "fraction", "0"),
    ("drop_and_grow_fraction_string", "DropAndGrow", lambda: refimpl.DropAndGrow((W3, W3), fraction="10%"), TypeError, "fraction", "'10%'"),
    ("drop_and_grow_data", "DropAndGrow", lambda: refimpl.DropAndGrow(W3), TypeError, "data", "ndarray"),
    ("drop_and_grow_data_rows", "DropAndGrow", lambda: refimpl.DropAndGrow((W3, W3[:2])), ValueError, "data", "3 and 2"),
    ("drop_and_grow_no_partial_layer", "DropAndGrow", lambda: _drop_and_grow_fit(_small_model()), ValueError, "model", "'"),
    ("drop_and_grow_in_predict", "DropAndGrow", lambda: _partial_small().predict(W3, callbacks=[refimpl.DropAndGrow((W3, W3))], verbose=0), ValueError, "callbacks", "predict"),
    ("drop_and_grow_outside_fit", "DropAndGrow", lambda: refimpl.DropAndGrow((W3, W3)).on_train_batch_end(0), ValueError, "callbacks", "outside fit"),
    ("drop_and_grow_optimizer", "DropAndGrow", lambda: _drop_and_grow_fit(_partial_small(), keras.optimizers.Adafactor()), ValueError, "optimizer", "Adafactor"),
    ("regrow_model", "regrow", lambda: refimpl.callbacks.regrow("model", (W3, W3), fraction=0.5), TypeError, "model", "'model'"),
    ("regrow_batches", "regrow", lambda: refimpl.callbacks.regrow(_partial_small(), (W3, W3), fraction=0.5, batches=0), ValueError, "batches", "0"),
    ("regrow_no_loss", "regrow", lambda: refimpl.callbacks.regrow(_partial_small(), (W3, W3), fraction=0.5), ValueError, "loss", "None"),
    ("plot_mask_int", "plot_mask", lambda: refimpl.plotting.plot_mask([[1, 0]]), TypeError, "mask", "shape (1, 2)"),
]  # fmt: skip

# Public names that take no user input of their own.
EXEMPT = {
    "xla_enabled": "takes no argument",
    "PartialWeight": "made by a partial layer or a PartialVariable, never by a user",
}
# The documented submodules whose functions and classes are public entry points.
_SUBMODULES = (
    "callbacks",
    "convert",
    "masks",
    "ops",
    "optimizers",
    "partial",
    "plotting",
    "selection",
    "structured",
    "testing",
)


def _public_names() -> set:
    names = {n for n in refimpl.__all__ if not inspect.ismodule(getattr(refimpl, n))}
    for module in _SUBMODULES:
        mod = getattr(refimpl, module)
        names |= {n for n in mod.__all__ if callable(getattr(mod, n))}
    if refimpl.backend.name == "tensorflow":
        names |= set(refimpl.tf.__all__)
    return names


def test_every_public_name_has_a_bad_input_case():
    covered = {name for _, name, *_ in CASES} | set(EXEMPT)
    missing = sorted(_public_names() - covered)
    assert not missing, f"public names without a bad-input case: {missing}"


def test_cases_name_public_names_only():
    named = {name for _, name, *_ in CASES} | set(EXEMPT)
    public = _public_names() | _TENSORFLOW_LEVEL
    assert named <= public, sorted(named - public)


def test_case_ids_are_unique():
    ids = [case_id for case_id, *_ in CASES]
    assert len(ids) == len(set(ids))


# Rows that need two floating-point dtypes: JAX without x64 reads float64 as
# float32, so they run under TensorFlow (and PyTorch) only. (`compose` reads
# the dtype an array comes with, so its row runs on JAX too.)
_TWO_FLOAT_DTYPES = {
    "diagonal_matmul_dtype",
    "banded_mixed_dtypes",
}
_TENSORFLOW_LEVEL = {"partially_trainable", "one_hot_trainable", "minimize"}


def _param(case_id, name, call, error, argument, shown):
    source = inspect.getsource(call)
    tensorflow_only = (
        name in _TENSORFLOW_LEVEL
        or re.search(r"\btf\.|_var\(|_symbolic_x", source)
        or "tf." in shown
        or shown in ("EagerTensor", "string")
        or (case_id in _TWO_FLOAT_DTYPES and BACKEND == "jax")
    )
    marks = [pytest.mark.tensorflow_only] if tensorflow_only else []
    return pytest.param(call, error, argument, shown, id=case_id, marks=marks)


def first_backticked(message: str) -> str | None:
    """The first name in backticks in ``message``, or ``None``."""
    match = re.search(r"`([^`]+)`", message)
    return match.group(1) if match else None


def test_first_backticked_reads_the_first_name_only():
    assert first_backticked("`masks[0]` must hold `x`") == "masks[0]"
    assert first_backticked("no name here") is None


@pytest.mark.parametrize("call, error, argument, shown", [_param(*c) for c in CASES])
def test_bad_input_raises_the_exact_class_naming_the_argument(
    call, error, argument, shown
):
    with pytest.raises(Exception) as info:
        call()
    message = str(info.value)
    assert type(info.value) is error, f"{type(info.value).__name__}: {message}"
    assert first_backticked(message) == argument, message
    assert shown in message, f"the message does not show {shown!r}: {message}"


# Valid edge cases: what the entry points do with them.
NONE, ALL = np.zeros((3, 3), bool), np.ones((3, 3), bool)


@pytest.mark.tensorflow_only
@pytest.mark.parametrize("mask", [NONE, ALL], ids=["no_entry", "every_entry"])
def test_partially_trainable_with_empty_or_full_mask_passes_all_or_no_gradient(mask):
    x = _var()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(refimpl.tf.partially_trainable(x, mask) ** 2)
    np.testing.assert_array_equal(tape.gradient(loss, x), np.where(mask, 2 * W3, 0))


@pytest.mark.parametrize("mask", [NONE, ALL], ids=["no_entry", "every_entry"])
def test_partial_variable_with_empty_or_full_mask_round_trips(mask):
    v = refimpl.PartialVariable(W3, mask, mode="delta")
    assert v.free.shape == (int(mask.sum()),)
    np.testing.assert_array_equal(v.value(), W3)


@pytest.mark.tensorflow_only
@pytest.mark.parametrize("mask", [NONE, ALL], ids=["no_entry", "every_entry"])
def test_masked_optimizer_with_empty_or_full_mask_freezes_all_or_nothing(mask):
    x = _var()
    optimizer = refimpl.MaskedOptimizer(keras.optimizers.SGD(1.0), [(x, mask)])
    optimizer.apply([tf.ones((3, 3))], [x])
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(x), np.where(mask, W3 - 1.0, W3)
    )


@pytest.mark.tensorflow_only
def test_masked_optimizer_with_no_pair_trains_every_variable_in_full():
    x = _var()
    refimpl.MaskedOptimizer(keras.optimizers.SGD(1.0), []).apply([tf.ones((3, 3))], [x])
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(x), W3 - 1.0)


@pytest.mark.tensorflow_only
def test_mask_gradients_with_full_mask_leaves_gradient_untouched():
    [(out, _)] = refimpl.optimizers.mask_gradients([(tf.constant(W3), V)], [(V, ALL)])
    np.testing.assert_array_equal(out, W3)


@pytest.mark.tensorflow_only
def test_freeze_entries_with_empty_mask_returns_the_frozen_values():
    frozen = refimpl.FreezeEntries(W3, NONE)(tf.zeros((3, 3)))
    np.testing.assert_array_equal(frozen, W3)


@pytest.mark.tensorflow_only
def test_freeze_entries_with_a_scalar_value_and_a_boolean_mask():
    frozen = refimpl.FreezeEntries(7.0, EYE)(tf.zeros((3, 3)))
    np.testing.assert_array_equal(frozen, np.where(EYE, 0.0, 7.0))


@pytest.mark.tensorflow_only
def test_compose_with_no_index_returns_the_base():
    out = refimpl.ops.compose(W3, np.zeros((0, 2), "int64"), tf.zeros([0]))
    np.testing.assert_array_equal(out, W3)


@pytest.mark.tensorflow_only
def test_apply_masked_gradients_casts_a_float64_gradient_as_keras_does():
    # A dtype mismatch that Keras itself accepts: the gradient is cast.
    a, b = _var(), _var()
    sgd = keras.optimizers.SGD
    refimpl.optimizers.apply_masked_gradients(
        sgd(), [(W3.astype("float64"), a)], [(a, EYE)]
    )
    refimpl.optimizers.apply_masked_gradients(sgd(), [(W3, b)], [(b, EYE)])
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b)
    )


@pytest.mark.tensorflow_only
def test_nan_and_inf_frozen_values_are_kept_bit_exact():
    # NaN and inf are valid frozen values: they must come back with their bits.
    base = W3.copy()
    base[0, 1], base[1, 0], base[2, 0] = np.nan, np.inf, -0.0
    v = refimpl.PartialVariable(base, EYE, mode="delta")
    refimpl.testing.assert_frozen(base, v.value(), EYE)
    frozen = refimpl.FreezeEntries(base, EYE)(tf.zeros((3, 3)))
    refimpl.testing.assert_frozen(base, frozen, EYE)


def test_banded_dense_accepts_a_numpy_fixed_diagonal():
    layer = refimpl.BandedDense(0, 0, fixed_diagonal=np.array([1.0, 2.0, 3.0]))
    layer.build((None, 3))
    np.testing.assert_array_equal(layer.kernel, np.diag([1.0, 2.0, 3.0]))
