"""The one TensorFlow-only piece of the sparse product: is XLA compiling this?

Imported lazily by :func:`refimpl.ops.xla_enabled`, only when Keras runs on
TensorFlow. The sparse product itself is plain ``keras.ops``
(:func:`refimpl.ops.sparse_matmul`): a version on
``tf.sparse.sparse_dense_matmul`` was measured beside it, was no faster under
``tf.function``, and does not compile under XLA, so it is not kept.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.ops import control_flow_util

__all__ = ["in_xla_context"]


def in_xla_context() -> bool:
    """Whether the function being traced is compiled by XLA (``jit_compile=True``).

    ``False`` eagerly and in a plain ``tf.function``.
    """
    graph = tf.compat.v1.get_default_graph()
    return bool(control_flow_util.GraphOrParentsInXlaContext(graph))
