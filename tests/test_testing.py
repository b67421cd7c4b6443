import keras
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given

from refimpl import MaskedOptimizer
from refimpl.testing import (
    assert_frozen,
    count_free_parameters,
    count_optimizer_state,
    moved,
)
from tests.strategies import shape_and_mask

pytestmark = pytest.mark.every_backend

if keras.backend.backend() == "tensorflow":
    import tensorflow as tf  # the tests marked tensorflow_only


def test_assert_frozen_passes_when_only_trainable_entries_move():
    before = np.zeros((2, 2), "float32")
    after = np.array([[1.0, 0.0], [0.0, 2.0]], "float32")
    assert_frozen(before, after, np.eye(2, dtype=bool))


def test_assert_frozen_catches_a_one_ulp_change():
    before = np.float32([1.0, 1.0])
    after = before.copy()
    after[1] = np.nextafter(np.float32(1.0), np.float32(2.0))
    with pytest.raises(AssertionError, match="1 of 1 frozen entries moved"):
        assert_frozen(before, after, [True, False])


def test_assert_frozen_sees_minus_zero_and_nan_as_changes():
    with pytest.raises(AssertionError):
        assert_frozen(np.float32([0.0]), np.float32([-0.0]), [False])
    with pytest.raises(AssertionError):
        assert_frozen(np.float32([1.0]), np.float32([np.nan]), [False])


def test_assert_frozen_accepts_an_unchanged_nan():
    assert_frozen(np.float32([np.nan]), np.float32([np.nan]), [False])


@pytest.mark.tensorflow_only
def test_assert_frozen_works_with_variables_and_bfloat16():
    v = tf.Variable(tf.constant([1.0, 2.0], tf.bfloat16))
    before = tf.identity(v)
    v.assign(tf.constant([1.5, 2.0], tf.bfloat16))
    assert_frozen(before, v, [True, False])
    assert moved(before, v).tolist() == [True, False]
    assert np.asarray(keras.ops.convert_to_numpy(v)).dtype == ml_dtypes.bfloat16


@given(shape_and_mask())
def test_moved_is_true_exactly_where_an_entry_changed_by_one_ulp(case):
    shape, changed = case
    values = np.random.default_rng(0).normal(size=shape).astype("float32")
    assert not moved(values, values.copy()).any()
    after = np.where(changed, np.nextafter(values, np.float32(np.inf)), values)
    np.testing.assert_array_equal(moved(values, after), changed)
    # The same change, seen by assert_frozen: allowed exactly where it happened.
    assert_frozen(values, after, changed)
    if changed.any():
        with pytest.raises(AssertionError, match=f"{int(changed.sum())} of"):
            assert_frozen(values, after, np.zeros(shape, bool))


def test_moved_rejects_mismatched_inputs():
    with pytest.raises(ValueError, match="same shape"):
        moved([1.0], [1.0, 2.0])
    with pytest.raises(TypeError, match="same dtype"):
        moved(np.float32([1.0]), np.float64([1.0]))
    with pytest.raises(TypeError, match="`before`"):
        moved([object()], [object()])


def test_assert_frozen_rejects_a_mask_of_the_wrong_shape():
    with pytest.raises(ValueError, match="`mask`"):
        assert_frozen([1.0, 2.0], [1.0, 2.0], [True])


@pytest.mark.tensorflow_only
def test_count_free_parameters_counts_trainable_weights_only():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    assert count_free_parameters(model) == 15
    model.layers[0].trainable = False
    assert count_free_parameters(model) == 0
    variables = [tf.Variable(tf.ones(3)), tf.Variable(tf.ones(5), trainable=False)]
    assert count_free_parameters(variables) == 3


def test_count_free_parameters_rejects_other_objects():
    with pytest.raises(TypeError, match="`model_or_variables`"):
        count_free_parameters(3)


def test_count_optimizer_state_counts_slots_of_every_group_and_wrapper():
    a = keras.Variable(np.ones((3, 4), "float32"), name="a")
    b = keras.Variable(np.ones(5, "float32"), name="b")
    adam = keras.optimizers.Adam()
    adam.build([a, b])
    assert count_optimizer_state(adam) == 2 * (12 + 5)
    sgd = keras.optimizers.SGD()
    sgd.build([a])
    assert count_optimizer_state(sgd) == 0  # no slots without momentum
    masked = MaskedOptimizer(keras.optimizers.Adam(), [(a, np.eye(3, 4) > 0)])
    masked.build([a, b])
    assert count_optimizer_state(masked) == 12 + 2 * (12 + 5)  # mask + moments
