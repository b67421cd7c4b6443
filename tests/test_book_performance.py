"""Checks that appendices/performance states without a cell of its own.

The page keeps the measured results; these facts were shown by cells of the
chapter it replaces (chapters/15_performance) and are still stated in the book:

* the structured products do less arithmetic than a dense product: a dense
  ``x @ A`` is exactly ``2 * batch * n**2`` floating-point operations, the
  diagonal ``x * w`` is ``batch * n``, and a band of three diagonals stays
  under ``5 * batch * n``, at every size;
* ``ResourceGatherNd`` (a gather straight from a variable) has no kernel for
  XLA's compilation devices, while ``GatherNd`` and ``ResourceGather`` have.
"""

import pytest
import tensorflow as tf
from tensorflow.python.framework import kernels

import refimpl

BATCH = 64


def _float_ops(fn, *shapes):
    specs = [tf.TensorSpec(s) for s in shapes]
    graph = tf.function(fn).get_concrete_function(*specs).graph
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    return tf.compat.v1.profiler.profile(graph, options=options).total_float_ops


def _tridiagonal(x, upper, below):
    ones = tf.ones(upper.shape[0] + 1)  # the fixed main diagonal
    return refimpl.structured.banded_matmul(x, [ones, upper, below], [0, 1, -1])


@pytest.mark.parametrize("n", [64, 256, 1024])
def test_structured_products_count_fewer_operations_than_a_dense_one(n):
    dense = _float_ops(lambda x, w: x @ tf.linalg.diag(w), (BATCH, n), (n,))
    diagonal = _float_ops(refimpl.structured.diagonal_matmul, (BATCH, n), (n,))
    band = _float_ops(_tridiagonal, (BATCH, n), (n - 1,), (n - 1,))
    assert dense == 2 * BATCH * n * n
    assert diagonal == BATCH * n
    assert band <= 5 * BATCH * n


def test_a_gather_from_a_variable_has_no_xla_kernel():
    v = tf.Variable(tf.ones((4, 4)))
    tf.function(
        lambda: tf.gather_nd(tf.convert_to_tensor(v), [[0, 1]]), jit_compile=True
    )()
    # XLA adds its kernels to the registry when it first compiles (above).
    xla = {"XLA_CPU_JIT", "XLA_GPU_JIT"}

    def devices(op):
        return {k.device_type for k in kernels.get_registered_kernels_for_op(op).kernel}

    assert not xla & devices("ResourceGatherNd")
    assert xla <= devices("GatherNd")
    assert xla <= devices("ResourceGather")
