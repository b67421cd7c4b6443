"""Checks that chapters/03_mask_the_gradient states without a cell of its own.

The chapter keeps one example per idea; these facts were shown by cells of the
chapters it replaces and are still stated in the book:

* the one-hot trick changes only the gradient, so SciPy methods that read loss
  values alone (Nelder-Mead, Powell) move the "frozen" entry unless
  ``refimpl.tf.minimize`` is given the mask;
* ``tf.gather_nd`` straight from a variable does not compile under XLA, while
  gathering from its value, ``one_hot_trainable`` and the select do;
* ``restore_frozen=True`` keeps the frozen entries under Adafactor where a
  fully frozen row meets a fully frozen column, but the free entries become NaN;
* ``restore_frozen=True`` gives the same result in ``tf.function`` as eagerly;
* the one-hot form turns a free ``-0.0`` into ``0.0``, the select keeps it.
"""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import refimpl
from refimpl.testing import assert_frozen

Y = tf.constant([2.0, -3.0])


def _one_hot_x(x):
    part = tf.scatter_nd([[0]], [x[0]], [2])
    return part + tf.stop_gradient(x - part)


def _loss(x):
    return tf.reduce_sum((x - Y) ** 2)


@pytest.mark.parametrize("method", ["Nelder-Mead", "Powell"])
def test_value_only_scipy_methods_move_the_entry_the_trick_freezes(method):
    tricked = tf.Variable([1.0, 2.0])
    refimpl.tf.minimize(lambda: _loss(_one_hot_x(tricked)), tricked, method=method)
    np.testing.assert_allclose(tricked.numpy(), [2.0, -3.0], atol=1e-3)

    masked = tf.Variable([1.0, 2.0])
    refimpl.tf.minimize(lambda: _loss(masked), masked, [True, False], method=method)
    assert_frozen(np.float32([1.0, 2.0]), masked, [True, False])


def test_lbfgs_keeps_the_entry_the_trick_freezes():
    x = tf.Variable([1.0, 2.0])
    refimpl.tf.minimize(lambda: _loss(_one_hot_x(x)), x)  # no mask: all free
    assert_frozen(np.float32([1.0, 2.0]), x, [True, False])
    np.testing.assert_allclose(x.numpy()[0], 2.0, atol=1e-5)


def _xla_gradient(build, w, indices, upstream):
    @tf.function(jit_compile=True)
    def gradient():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(upstream * build(w, indices))
        return tape.gradient(loss, w)

    with tf.device("/CPU:0"):
        return tf.convert_to_tensor(gradient()).numpy()


def _one_hot_from_variable(v, idx):
    part = tf.scatter_nd(idx, tf.gather_nd(v, idx), v.shape)  # gathers from v
    return part + tf.stop_gradient(v - part)


def _one_hot_from_value(v, idx):
    x = tf.convert_to_tensor(v)
    part = tf.scatter_nd(idx, tf.gather_nd(x, idx), x.shape)
    return part + tf.stop_gradient(x - part)


def test_gather_nd_from_a_variable_does_not_compile_under_xla():
    rng = np.random.default_rng(0)
    mask = rng.random((5, 6)) < 0.4
    indices = refimpl.masks.mask_to_indices(mask)
    upstream = tf.constant(rng.normal(size=(5, 6)).astype("float32"))
    with tf.device("/CPU:0"):
        w = tf.Variable(rng.normal(size=(5, 6)).astype("float32"))
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        _xla_gradient(_one_hot_from_variable, w, indices, upstream)
    assert re.search(r"No registered 'ResourceGatherNd' OpKernel", str(info.value))

    expected = np.where(mask, upstream.numpy(), 0.0)
    for build in (
        _one_hot_from_value,
        refimpl.tf.one_hot_trainable,
        refimpl.tf.partially_trainable,
    ):
        np.testing.assert_array_equal(
            _xla_gradient(build, w, indices, upstream), expected
        )


def test_restore_frozen_under_adafactor_keeps_frozen_entries_but_not_free_ones():
    start = np.random.default_rng(0).normal(size=(4, 4)).astype("float32")
    mask = np.ones((4, 4), bool)
    mask[1, :] = False  # a fully frozen row
    mask[:, 2] = False  # meets a fully frozen column
    w = keras.Variable(start)
    optimizer = refimpl.MaskedOptimizer(
        keras.optimizers.Adafactor(0.01), [(w, mask)], restore_frozen=True
    )
    for _ in range(3):
        optimizer.apply([tf.constant(start)], [w])
    after = keras.ops.convert_to_numpy(w)
    assert_frozen(start, after, mask)
    assert np.isnan(after[mask]).all()


def test_restore_frozen_in_tf_function_matches_the_eager_run():
    start = np.random.default_rng(1).normal(size=(3, 3)).astype("float32")
    mask = np.random.default_rng(2).random((3, 3)) < 0.5

    def train(graph):
        w = tf.Variable(start)
        optimizer = keras.optimizers.AdamW(0.01)

        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum((w - 1.0) ** 2)
            refimpl.optimizers.apply_masked_gradients(
                optimizer,
                [(tape.gradient(loss, w), w)],
                [(w, mask)],
                restore_frozen=True,
            )

        if graph:
            step = tf.function(step)
        for _ in range(5):
            step()
        return w.numpy()

    eager, graph = train(False), train(True)
    assert_frozen(start, graph, mask)
    np.testing.assert_array_equal(graph, eager)


def test_the_one_hot_form_loses_the_sign_of_a_free_zero_and_the_select_keeps_it():
    x = tf.constant([-0.0, 1.0])
    one_hot = refimpl.tf.one_hot_trainable(x, [[0]]).numpy()
    select = refimpl.tf.partially_trainable(x, [[0]]).numpy()
    assert one_hot[0] == 0.0 and not np.signbit(one_hot[0])
    assert np.signbit(select[0])
