"""The TensorFlow backend's pieces (see :mod:`refimpl.backend`)."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf


def read_now(variable) -> np.ndarray:
    # init_scope lifts the read out of a function being traced.
    with tf.init_scope():
        return keras.ops.convert_to_numpy(variable.value)


def try_read_now(variable) -> np.ndarray | None:
    return read_now(variable)


def bool_constant(array):
    # tf.constant of a large bool array is slow (seconds at 4096 x 4096 inside
    # tf.function); the same bytes as uint8 are copied at once and cast.
    array = np.ascontiguousarray(array, dtype=bool)
    return tf.cast(tf.constant(array.view(np.uint8)), tf.bool)


def mask_sparse_gradient(grad, keep):
    if not isinstance(grad, tf.IndexedSlices):
        return None
    rows = tf.gather(keep, grad.indices)
    values = tf.where(rows, grad.values, tf.zeros_like(grad.values))
    return tf.IndexedSlices(values, grad.indices, grad.dense_shape)


def assign_on_every_replica(var, value) -> None:
    # In replica context a plain assign to a mirrored variable is aggregated
    # by the variable's `aggregation` (with SUM the replicas' writes add up).
    # Every replica computes the same value for its own copy, so the write
    # goes through a merge call that updates each copy with its own value.
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        var.assign(value)
        return
    tf_var = var.value if isinstance(var, keras.Variable) else var

    def merge_fn(strategy, variable, per_replica_value):
        strategy.extended.update(
            variable, lambda v, x: v.assign(x), args=(per_replica_value,)
        )

    tf.distribute.get_replica_context().merge_call(merge_fn, args=(tf_var, value))


def batch_gradients(model, loss_of_outputs, x) -> list:
    variables = model.trainable_variables
    with tf.GradientTape() as tape:
        value = loss_of_outputs(model(x, training=False))
    grads = tape.gradient(value, variables)
    return [None if g is None else keras.ops.convert_to_numpy(g) for g in grads]


def variable_gradients(model, loss_of_outputs, x, variables) -> list:
    with tf.GradientTape() as tape:
        for v in variables:  # frozen variables too
            tape.watch(v.value)
        value = loss_of_outputs(model(x, training=False))
    grads = tape.gradient(value, [v.value for v in variables])
    return [None if g is None else keras.ops.convert_to_numpy(g) for g in grads]


def is_variable(value) -> bool:
    return isinstance(value, (tf.Variable, keras.Variable))


def is_symbolic(value) -> bool:
    return not tf.executing_eagerly() or not hasattr(value, "numpy")
