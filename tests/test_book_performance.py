"""Checks that appendices/performance states without a cell of its own.

The page keeps the measured results; these facts were shown by cells of the
chapter it replaces (chapters/15_performance) and are still stated in the book:

* the structured products do less arithmetic than a dense product: a dense
  ``x @ A`` is exactly ``2 * batch * n**2`` floating-point operations, the
  diagonal ``x * w`` is ``batch * n``, and a band of three diagonals stays
  under ``5 * batch * n``, at every size;
* ``ResourceGatherNd`` (a gather straight from a variable) has no kernel for
  XLA's compilation devices, while ``GatherNd`` and ``ResourceGather`` have
  (the pitfalls page states it);
* XLA fuses Adam's update of a dense kernel: the twelve operations over the
  ``[n, n]`` kernel that ``tf.function`` traces become three fused loops, one
  per variable Adam writes (the glossary says XLA "compiles a whole training
  step into fused code").
"""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import kernels

import refimpl
from evidence.benchmarks import variants

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


def test_xla_fuses_adams_update_into_one_loop_per_variable():
    n, rng = 256, np.random.default_rng(0)
    x, y = (tf.constant(rng.standard_normal((64, n)).astype("float32")) for _ in "xy")
    square, adam = tf.TensorShape([n, n]), r"adam(?:_\d+)?/"

    def dense_step(jit):
        weight = variants.build(variants.BASELINE, n, rng)
        return variants.make_step(weight, keras.optimizers.Adam(), jit=jit)

    graph = dense_step(False).get_concrete_function(x, y).graph
    traced = [
        op.type
        for op in graph.get_operations()
        if re.match(adam, op.name)
        and op.type not in {"ReadVariableOp", "Identity", "IdentityN"}
        and any(t.shape == square for t in (*op.inputs, *op.outputs))
    ]
    hlo = dense_step(True).experimental_get_compiler_ir(x, y)(stage="optimized_hlo")
    compiled = re.findall(
        rf'= f32\[{n},{n}\]\S* (\w+)\(.*op_type="(\w+)" op_name="{adam}',
        hlo[hlo.index("\nENTRY") :],
    )
    writes = ["AssignAddVariableOp"] * 2 + ["AssignSubVariableOp"]  # m, v, kernel
    assert len(traced) == 12
    assert sorted(t for t in traced if "Assign" in t) == writes
    assert sorted(compiled) == [("fusion", w) for w in writes]
