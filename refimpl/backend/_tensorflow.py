"""The TensorFlow backend's pieces (see :mod:`refimpl.backend`)."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.ops import control_flow_util


def read_now(variable) -> np.ndarray:
    """The current value of ``variable`` as NumPy, also while a function is traced.

    >>> read_now(keras.Variable([1.0, 2.0]))
    array([1., 2.], dtype=float32)
    """
    # init_scope lifts the read out of a function being traced.
    with tf.init_scope():
        return keras.ops.convert_to_numpy(variable.value)


def bool_constant(array):
    """A boolean NumPy mask as a tensor of this backend.

    >>> keras.ops.convert_to_numpy(bool_constant([[True, False]]))
    array([[ True, False]])
    >>> bool_constant(True).shape  # a scalar mask stays a scalar
    TensorShape([])
    """
    # tf.constant of a large bool array is slow (seconds at 4096 x 4096 inside
    # tf.function); the same bytes as uint8 are copied at once and cast.
    # (np.ascontiguousarray would turn a 0-d mask into a 1-d one.)
    array = np.require(np.asarray(array, dtype=bool), requirements="C")
    return tf.cast(tf.constant(array.view(np.uint8)), tf.bool)


def mask_sparse_gradient(grad, keep):
    """Zero a ``tf.IndexedSlices`` gradient where ``keep`` (the variable's mask)
    is False; ``None`` for a dense gradient, which the caller masks itself.

    >>> grad = tf.IndexedSlices(tf.ones((2, 2)), tf.constant([0, 2]), (3, 2))
    >>> keep = tf.constant([[True, False], [True, True], [False, True]])
    >>> keras.ops.convert_to_numpy(mask_sparse_gradient(grad, keep).values)
    array([[1., 0.],
           [0., 1.]], dtype=float32)
    """
    if not isinstance(grad, tf.IndexedSlices):
        return None
    rows = tf.gather(keep, grad.indices)
    values = tf.where(rows, grad.values, tf.zeros_like(grad.values))
    return tf.IndexedSlices(values, grad.indices, grad.dense_shape)


def assign_on_every_replica(var, value) -> None:
    """``var.assign(value)``, also correct inside a ``tf.distribute`` replica function.

    >>> v = keras.Variable([1.0, 2.0])
    >>> assign_on_every_replica(v, [3.0, 4.0])
    >>> keras.ops.convert_to_numpy(v)
    array([3., 4.], dtype=float32)
    """
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
    """:func:`refimpl.backend.batch_gradients` on TensorFlow: a GradientTape."""
    variables = model.trainable_variables
    with tf.GradientTape() as tape:
        value = loss_of_outputs(model(x, training=False))
    grads = tape.gradient(value, variables)
    return [None if g is None else keras.ops.convert_to_numpy(g) for g in grads]


def variable_gradients(model, loss_of_outputs, x, variables) -> list:
    """:func:`refimpl.backend.variable_gradients` on TensorFlow: a GradientTape."""
    with tf.GradientTape() as tape:
        for v in variables:  # frozen variables too
            tape.watch(v.value)
        value = loss_of_outputs(model(x, training=False))
    grads = tape.gradient(value, [v.value for v in variables])
    return [None if g is None else keras.ops.convert_to_numpy(g) for g in grads]


def is_variable(value) -> bool:
    """Whether ``value`` is a variable: a ``keras.Variable`` or a ``tf.Variable``.

    >>> is_variable(keras.Variable(1.0)), is_variable(np.ones(2))
    (True, False)
    """
    return isinstance(value, (tf.Variable, keras.Variable))


def is_symbolic(value) -> bool:
    """Whether ``value`` has no value yet: inside a traced ``tf.function``.

    >>> traced = tf.function(lambda: is_symbolic(tf.ones(2)))
    >>> is_symbolic(tf.ones(2)), bool(traced())
    (False, True)
    """
    return not tf.executing_eagerly() or not hasattr(value, "numpy")


def in_xla_context() -> bool:
    """Whether the function being traced is compiled by XLA (``jit_compile=True``).

    ``False`` eagerly and in a plain ``tf.function``. (The sparse product is
    plain ``keras.ops``; a version on ``tf.sparse.sparse_dense_matmul`` was no
    faster under ``tf.function`` and does not compile under XLA.)
    """
    graph = tf.compat.v1.get_default_graph()
    return bool(control_flow_util.GraphOrParentsInXlaContext(graph))
