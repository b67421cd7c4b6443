import keras
import numpy as np
import pytest
from hypothesis import given

from refimpl.masks import _normalize_shape, indices_to_mask, mask_to_indices, to_mask
from tests.strategies import shape_and_mask

pytestmark = pytest.mark.every_backend

if keras.backend.backend() == "tensorflow":
    import tensorflow as tf  # the tests marked tensorflow_only


@given(shape_and_mask())
def test_mask_to_indices_round_trips_through_indices_to_mask(case):
    shape, mask = case
    indices = mask_to_indices(mask)
    assert indices.shape == (mask.sum(), len(shape))
    np.testing.assert_array_equal(indices_to_mask(indices, shape), mask)


@pytest.mark.tensorflow_only
@given(shape_and_mask())
def test_to_mask_accepts_bool_float_and_index_forms_alike(case):
    shape, mask = case
    np.testing.assert_array_equal(to_mask(mask, shape), mask)
    np.testing.assert_array_equal(to_mask(mask.astype("float32"), shape), mask)
    np.testing.assert_array_equal(to_mask(tf.constant(mask), shape), mask)
    indices = mask_to_indices(mask)
    ambiguous = indices.shape == shape and np.isin(indices, (0, 1)).all()
    if ambiguous:
        with pytest.raises(TypeError, match="ambiguous"):
            to_mask(indices, shape)
    else:
        np.testing.assert_array_equal(to_mask(indices, shape), mask)


def test_integer_array_of_the_tensor_shape_is_read_as_indices_only_if_unambiguous():
    # Two positions in a 3x2 tensor: values beyond 1 make it an index list.
    np.testing.assert_array_equal(
        to_mask([[2, 0], [0, 1]], (3, 2)),
        [[False, True], [False, False], [True, False]],
    )
    with pytest.raises(TypeError, match="ambiguous"):
        to_mask(np.eye(2, dtype=int), (2, 2))


def test_to_mask_returns_a_copy():
    mask = np.array([True, False])
    out = to_mask(mask, (2,))
    out[1] = True
    assert not mask[1]


def test_empty_index_list_means_nothing_trainable():
    np.testing.assert_array_equal(to_mask([], (2, 2)), np.zeros((2, 2), bool))


@pytest.mark.tensorflow_only
def test_to_mask_accepts_tensorshape():
    assert to_mask([[1]], tf.TensorShape([3])).tolist() == [False, True, False]


@pytest.mark.parametrize(
    "mask, shape, error, words",
    [
        pytest.param([True, False], (3,), ValueError, "shape (3,)", id="bool_shape"),
        pytest.param([0.0, 0.5, 1.0], (3,), ValueError, "0.5", id="float_not_01"),
        pytest.param([1, 0, 1], (3,), TypeError, "index lists", id="int_mask"),
        pytest.param(np.eye(3, dtype=int), (3, 3), TypeError, "boolean", id="int_2d"),
        pytest.param([[3]], (3,), ValueError, "out of range", id="index_too_big"),
        pytest.param([[-1]], (3,), ValueError, "negative", id="index_negative"),
        pytest.param([[1], [1]], (3,), ValueError, "more than once", id="duplicate"),
        pytest.param([[0, 1, 2]], (3, 3), ValueError, "[k, 2]", id="index_rank"),
        pytest.param([[0.5, 1.0]], (2, 2), ValueError, "shape (2, 2)", id="float_idx"),
        pytest.param(["a", "b"], (2,), TypeError, "dtype", id="strings"),
        pytest.param([[1, 2], [3]], (2,), TypeError, "rectangular", id="ragged"),
    ],
)
def test_bad_mask_raises(mask, shape, error, words):
    with pytest.raises(error, match="`mask`") as info:
        to_mask(mask, shape)
    assert words in str(info.value)


@pytest.mark.tensorflow_only
def test_symbolic_mask_raises_type_error():
    @tf.function
    def f(mask):
        return to_mask(mask, (2,))

    with pytest.raises(TypeError, match="static"):
        f(tf.constant([True, False]))


def test_bad_indices_raise_with_their_name():
    with pytest.raises(TypeError, match="`indices` must hold integers"):
        indices_to_mask([[0.0]], (2,))


@pytest.mark.parametrize(
    "shape, error",
    [
        ((2, None), ValueError),
        ((2, -1), ValueError),
        ("ab", TypeError),
        (2.5, TypeError),
    ],
)
def test_bad_shape_raises(shape, error):
    with pytest.raises(error, match="`shape`"):
        _normalize_shape(shape)


def test_mask_to_indices_rejects_non_boolean():
    with pytest.raises(TypeError, match="boolean"):
        mask_to_indices([1, 0])


def test_indices_expected_reads_an_ambiguous_integer_array_as_indices():
    mask = to_mask(np.eye(2, dtype=int), (2, 2), indices_expected=True)
    np.testing.assert_array_equal(mask, [[False, True], [True, False]])


def test_mask_constant_keeps_every_entry():
    from refimpl.masks import _mask_constant

    mask = np.random.default_rng(0).random((7, 5)) < 0.5
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(_mask_constant(mask)), mask
    )
