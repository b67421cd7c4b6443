"""The TensorFlow-level teaching code: TensorFlow tensors and ``tf.Variable`` s.

The book builds each TF 1 answer in today's TensorFlow with these:

* :func:`partially_trainable <refimpl.tf.stop_gradient.partially_trainable>` and
  :func:`one_hot_trainable <refimpl.tf.stop_gradient.one_hot_trainable>` block the
  gradient of the frozen positions of a full tensor (``tf.stop_gradient``);
* :func:`minimize <refimpl.tf.scipy_optimize.minimize>` runs SciPy over the free entries
  of some variables only,
  the replacement for TF 1's ``ScipyOptimizerInterface``; it needs SciPy
  (``pip install ".[scipy]"`` in the repository).

They need ``KERAS_BACKEND=tensorflow`` and raise a clear ``ImportError``
otherwise. Everything a Keras user needs (the layers, ``PartialVariable``,
``MaskedOptimizer``, ``FreezeEntries``) is in :mod:`refimpl` and runs on every
backend.
"""

from __future__ import annotations

from refimpl import backend

backend.require_tensorflow("refimpl.tf")

from refimpl.tf.stop_gradient import one_hot_trainable, partially_trainable  # noqa: E402


def __getattr__(name: str):
    # SciPy is an extra: `minimize` is imported when first used.
    if name == "minimize":
        from refimpl.tf.scipy_optimize import minimize

        return minimize
    raise AttributeError(f"module 'refimpl.tf' has no attribute {name!r}")


__all__ = ["minimize", "one_hot_trainable", "partially_trainable"]
