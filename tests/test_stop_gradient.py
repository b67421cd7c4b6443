import re

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st

from refimpl.masks import mask_to_indices
from refimpl.testing import moved
from refimpl.tf import one_hot_trainable, partially_trainable
from tests.strategies import shape_and_mask

FUNCTIONS = [
    pytest.param(partially_trainable, id="where"),
    pytest.param(one_hot_trainable, id="one_hot"),
]


def _forward_and_gradient(fn, x, mask, upstream, mode="eager"):
    """y = fn(x, mask) and the gradient of sum(upstream * y) with respect to x."""
    x = tf.Variable(x)

    def run():
        with tf.GradientTape() as tape:
            y = fn(x, mask)
            loss = tf.reduce_sum(tf.cast(upstream, y.dtype) * y)
        return y, tf.convert_to_tensor(tape.gradient(loss, x))

    if mode != "eager":
        run = tf.function(run, jit_compile=(mode == "xla"))
    y, grad = run()
    return y.numpy(), grad.numpy()


def _random(shape, seed):
    rng = np.random.default_rng(seed)
    return rng.normal(size=shape).astype("float32"), rng.normal(size=shape)


@pytest.mark.parametrize("fn", FUNCTIONS)
@given(case=shape_and_mask(), seed=st.integers(0, 2**16))
def test_forward_is_x_and_gradient_flows_only_where_mask(fn, case, seed):
    shape, mask = case
    x, upstream = _random(shape, seed)
    y, grad = _forward_and_gradient(fn, x, mask, upstream)
    assert not moved(x, y).any()
    # The full gradient of sum(upstream * x) is upstream itself.
    full = upstream.astype("float32")
    np.testing.assert_array_equal(grad, np.where(mask, full, 0.0))
    assert not grad[~mask].any()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["eager", "function", "xla"])
@pytest.mark.parametrize("fn", FUNCTIONS)
def test_works_in_every_execution_mode(fn, mode):
    mask = np.array([[True, False, False], [False, True, True]])
    x, upstream = _random(mask.shape, 0)
    y, grad = _forward_and_gradient(fn, x, mask, upstream, mode)
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(grad, np.where(mask, upstream, 0).astype("f4"))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("fn", FUNCTIONS)
def test_any_floating_dtype(fn, dtype):
    x = tf.constant([[1.0, -2.0], [3.0, 0.5]], dtype=dtype)
    mask = np.array([[False, True], [True, False]])
    y, grad = _forward_and_gradient(fn, x, mask, np.full((2, 2), 2.0))
    assert y.dtype == x.numpy().dtype
    np.testing.assert_array_equal(y, x.numpy())
    np.testing.assert_array_equal(grad.astype("float64"), np.where(mask, 2.0, 0.0))


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_mask_forms_agree(fn):
    mask = np.array([[True, False], [False, True], [True, True]])
    x, upstream = _random(mask.shape, 1)
    expected = _forward_and_gradient(fn, x, mask, upstream)[1]
    for form in (
        mask.tolist(),
        tf.constant(mask),
        mask.astype("float32"),
        mask_to_indices(mask),
        mask_to_indices(mask).tolist(),
    ):
        np.testing.assert_array_equal(
            _forward_and_gradient(fn, x, form, upstream)[1], expected
        )


@pytest.mark.slow
def test_static_mask_inside_tf_function():
    x = tf.Variable([1.0, 2.0, 3.0])

    @tf.function(jit_compile=True)
    def grad():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(partially_trainable(x, [[2]]) * 5.0)
        return tape.gradient(loss, x)

    np.testing.assert_array_equal(grad(), [0.0, 0.0, 5.0])


def test_symbolic_bool_mask_is_accepted():
    x = tf.Variable([1.0, 2.0, 3.0])

    @tf.function
    def grad(mask):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(partially_trainable(x, mask) * 5.0)
        return tape.gradient(loss, x)

    np.testing.assert_array_equal(grad(tf.constant([True, False, True])), [5, 0, 5])
    np.testing.assert_array_equal(grad(tf.constant([False, True, False])), [0, 5, 0])


@pytest.mark.parametrize("mode", ["eager", "function", "xla"])
@pytest.mark.parametrize("free", [True, False])
def test_a_scalar_stays_a_scalar(mode, free):
    y, grad = _forward_and_gradient(
        partially_trainable, np.float32(2.0), free, np.float32(3.0), mode=mode
    )
    assert y.shape == grad.shape == ()
    assert y == 2.0 and grad == (3.0 if free else 0.0)


def test_where_form_keeps_special_values_bit_exact():
    x = tf.constant([np.inf, -0.0, np.nan, 1.0])
    y = partially_trainable(x, [True, True, True, False])
    assert not moved(x, y).any()


def test_one_hot_form_turns_trainable_inf_into_nan():
    y = one_hot_trainable(tf.constant([np.inf, 1.0]), [[0]])
    assert np.isnan(y.numpy()[0])


@pytest.mark.parametrize(
    "mask, error, words",
    [
        pytest.param([True, False], ValueError, "shape (3,)", id="shape_mismatch"),
        pytest.param([0.0, 0.5, 1.0], ValueError, "0.5", id="float_not_01"),
        pytest.param([1, 0, 1], TypeError, "index lists", id="int_mask"),
        pytest.param([[3]], ValueError, "out of range", id="index_too_big"),
        pytest.param([[1], [1]], ValueError, "more than once", id="duplicate"),
        pytest.param([[0, 1]], ValueError, "[k, 1]", id="index_rank"),
        pytest.param(["a", "b", "c"], TypeError, "dtype", id="strings"),
    ],
)
@pytest.mark.parametrize("fn", FUNCTIONS)
def test_bad_mask_raises(fn, mask, error, words):
    with pytest.raises(error) as info:
        fn(tf.constant([1.0, 2.0, 3.0]), mask)
    assert type(info.value) is error
    assert words in str(info.value)
    # Each function names its own argument: partially_trainable(x, mask),
    # one_hot_trainable(x, indices).
    argument = "mask" if fn is partially_trainable else "indices"
    assert re.search(r"`([^`]+)`", str(info.value)).group(1) == argument


@pytest.mark.parametrize(
    "mask, error",
    [
        pytest.param(tf.constant([1.0, 0.0, 1.0]), TypeError, id="float_tensor"),
        pytest.param(tf.constant([True, False]), ValueError, id="wrong_shape"),
    ],
)
def test_bad_symbolic_mask_raises(mask, error):
    @tf.function
    def f(m):
        return partially_trainable(tf.constant([1.0, 2.0, 3.0]), m)

    with pytest.raises(error, match="`mask`"):
        f(mask)


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_bad_x_with_unknown_shape_raises(fn):
    @tf.function(input_signature=[tf.TensorSpec([None])])
    def f(x):
        return fn(x, [[0]])

    with pytest.raises(ValueError, match="`x` must have a static shape"):
        f.get_concrete_function()
