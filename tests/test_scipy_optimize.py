import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given

from refimpl.testing import assert_frozen
from refimpl.tf import minimize
from tests.strategies import shape_and_mask


def _quadratic(variable, target):
    return lambda: tf.reduce_sum((variable - target) ** 2)


@given(shape_and_mask())
def test_frozen_entries_stay_bit_exact_and_free_ones_reach_target(case):
    shape, mask = case
    rng = np.random.default_rng(mask.size)
    start = rng.normal(size=shape).astype("float32")
    target = rng.normal(size=shape).astype("float32")
    X = tf.Variable(start)
    if not mask.any():
        with pytest.raises(ValueError, match="no entry free"):
            minimize(_quadratic(X, target), X, mask)
        return
    result = minimize(_quadratic(X, target), X, mask)
    assert result.success
    assert_frozen(start, X, mask)
    np.testing.assert_allclose(X.numpy()[mask], target[mask], atol=1e-4)
    assert result.x.shape == (mask.sum(),)


def test_two_variables_with_one_mask_each():
    a = tf.Variable([1.0, 2.0, 3.0])
    b = tf.Variable([[0.0, 0.0], [0.0, 0.0]], dtype=tf.float64)

    def loss():
        return tf.reduce_sum((a - 5.0) ** 2) + tf.cast(
            tf.reduce_sum((b + 1) ** 2), a.dtype
        )

    minimize(loss, [a, b], [[[1]], np.array([[True, False], [False, True]])])
    np.testing.assert_allclose(a.numpy(), [1.0, 5.0, 3.0], atol=1e-5)
    np.testing.assert_allclose(b.numpy(), [[-1.0, 0.0], [0.0, -1.0]], atol=1e-5)


def test_no_mask_frees_every_entry():
    X = tf.Variable([1.0, 2.0])
    minimize(_quadratic(X, [2.0, -3.0]), X)
    np.testing.assert_allclose(X.numpy(), [2.0, -3.0], atol=1e-5)


def test_none_in_mask_list_frees_that_variable():
    a, b = tf.Variable([0.0, 0.0]), tf.Variable([0.0, 0.0])
    minimize(lambda: tf.reduce_sum((a - 1) ** 2 + (b - 1) ** 2), [a, b], [None, [[0]]])
    np.testing.assert_allclose(a.numpy(), [1.0, 1.0], atol=1e-5)
    np.testing.assert_allclose(b.numpy(), [1.0, 0.0], atol=1e-5)


@pytest.mark.parametrize("method", ["L-BFGS-B", "BFGS", "CG", "Nelder-Mead", "TNC"])
def test_scipy_methods_keep_frozen_entries(method):
    X = tf.Variable([1.0, 2.0, -1.0])
    result = minimize(_quadratic(X, [2.0, -3.0, 4.0]), X, [[0], [2]], method=method)
    assert_frozen(np.float32([1.0, 2.0, -1.0]), X, [[0], [2]])
    np.testing.assert_allclose(X.numpy()[[0, 2]], [2.0, 4.0], atol=1e-3)
    np.testing.assert_allclose(result.fun, 25.0, atol=1e-4)


def test_variable_holds_scipy_result_and_options_are_passed():
    X = tf.Variable([10.0, 2.0])
    result = minimize(_quadratic(X, [0.0, 0.0]), X, [[0]], options={"maxiter": 1})
    assert result.nit <= 1
    assert X.numpy()[0] == np.float32(result.x[0])


def test_variable_unused_by_the_loss_gets_zero_gradient():
    a, b = tf.Variable([0.0]), tf.Variable([7.0])
    result = minimize(lambda: tf.reduce_sum((a - 1) ** 2), [a, b])
    assert result.success
    assert b.numpy()[0] == 7.0


def test_non_trainable_variable_is_optimised_when_listed():
    X = tf.Variable([0.0, 0.0], trainable=False)
    minimize(_quadratic(X, [1.0, 1.0]), X, [True, False])
    np.testing.assert_allclose(X.numpy(), [1.0, 0.0], atol=1e-5)


def test_works_with_a_tf_function_loss():
    X = tf.Variable([0.0, 0.0])
    minimize(tf.function(_quadratic(X, [3.0, 3.0])), X, [[1]])
    np.testing.assert_allclose(X.numpy(), [0.0, 3.0], atol=1e-5)


X0 = tf.Variable([1.0, 2.0])


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        pytest.param({"loss_fn": 3.0}, TypeError, "`loss_fn`", id="loss_not_callable"),
        pytest.param({"variables": X0.numpy()}, TypeError, "`variables`", id="array"),
        pytest.param({"variables": []}, TypeError, "`variables`", id="empty_list"),
        pytest.param(
            {"variables": tf.Variable([1, 2])}, TypeError, "floating", id="int_var"
        ),
        pytest.param({"variables": [X0, X0]}, ValueError, "more than once", id="dup"),
        pytest.param({"mask": [True]}, ValueError, "`mask`", id="mask_shape"),
        pytest.param({"mask": [[2]]}, ValueError, "out of range", id="mask_index"),
        pytest.param({"mask": [False, False]}, ValueError, "no entry free", id="none"),
        pytest.param(
            {"variables": [X0], "mask": [[True], [False]]},
            ValueError,
            "one per variable",
            id="mask_list_length",
        ),
        pytest.param({"method": "adam"}, ValueError, "`method`", id="unknown_method"),
        pytest.param({"method": "trust-ncg"}, ValueError, "Hessian", id="hessian"),
        pytest.param({"method": None}, ValueError, "`method`", id="method_none"),
        pytest.param({"options": 5}, TypeError, "`options`", id="options"),
        pytest.param(
            {"loss_fn": lambda: X0 * 2.0}, ValueError, "scalar", id="loss_not_scalar"
        ),
    ],
)
def test_bad_input_raises(kwargs, error, words):
    args = {"loss_fn": lambda: tf.reduce_sum(X0**2), "variables": X0, "mask": None}
    args.update(kwargs)
    with pytest.raises(error) as info:
        minimize(args.pop("loss_fn"), args.pop("variables"), args.pop("mask"), **args)
    assert words in str(info.value)
