"""Checks that chapters/04_structured_matrices states without a cell of its own.

* a band cut with ``band_part`` once, outside the forward pass, is a constant:
  it ignores later updates of the variable and passes it no gradient, while the
  same lines run in the forward pass follow the variable and reach its gradient.
"""

import numpy as np
import tensorflow as tf


def _cut_band(a):
    return tf.linalg.set_diag(tf.linalg.band_part(a, 1, 1), tf.ones(4))


def test_a_band_cut_once_is_a_constant_snapshot():
    a = tf.Variable(tf.zeros((4, 4)))
    snapshot = _cut_band(a)  # at the top of a program
    a.assign(tf.fill((4, 4), 5.0))  # what an optimizer step does
    with tf.GradientTape(persistent=True) as tape:
        snapshot_loss = tf.reduce_sum(snapshot)
        live = _cut_band(a)  # in the forward pass
        live_loss = tf.reduce_sum(live)
    np.testing.assert_array_equal(tf.linalg.diag_part(snapshot, k=1), 0.0)
    np.testing.assert_array_equal(tf.linalg.diag_part(live, k=1), 5.0)
    assert tape.gradient(snapshot_loss, a) is None
    assert tape.gradient(live_loss, a) is not None
