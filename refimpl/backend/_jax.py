"""The JAX backend's pieces (see :mod:`refimpl.backend`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import keras  # noqa: F401  (the doctests use it)
import numpy as np


def read_now(variable) -> np.ndarray:
    """The current value of ``variable`` as NumPy, also while a function is traced.

    Raises a ``ValueError`` inside ``fit``'s traced step, where Keras holds the
    value in the step's state.

    >>> read_now(keras.Variable([1.0, 2.0]))
    array([1., 2.], dtype=float32)
    """
    value = try_read_now(variable)
    if value is None:
        raise ValueError(
            f"The value of '{variable.path}' is not known while JAX traces a "
            "training step (Keras holds it in the step's state)"
        )
    return value


def try_read_now(variable) -> np.ndarray | None:
    """The current value of ``variable`` as NumPy, or ``None`` inside ``fit``'s step.

    >>> try_read_now(keras.Variable([3.0]))
    array([3.], dtype=float32)
    """
    # Inside a traced function a Keras variable's value is the traced one;
    # `_value` is the concrete array it holds, except during `fit`, where
    # Keras' JAX trainer moves it into the step's state (then: None).
    value = getattr(variable, "_value", None)
    if value is None or isinstance(value, jax.core.Tracer):
        value = variable.value
    if isinstance(value, jax.core.Tracer):
        return None
    return np.asarray(value)


def bool_constant(array):
    """A boolean NumPy mask as a tensor of this backend.

    >>> keras.ops.convert_to_numpy(bool_constant([[True, False]]))
    array([[ True, False]])
    """
    return jnp.asarray(np.asarray(array, dtype=bool))


def batch_gradients(model, loss_of_outputs, x) -> list:
    """:func:`refimpl.backend.batch_gradients` on JAX (a stateless call)."""
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def loss(values):
        outputs, _ = model.stateless_call(values, non_trainable, x, training=False)
        return loss_of_outputs(outputs)

    return [np.asarray(g) for g in jax.grad(loss)(trainable)]


def variable_gradients(model, loss_of_outputs, x, variables) -> list:
    """:func:`refimpl.backend.variable_gradients` on JAX (a stateless call)."""
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    ids = [id(v) for v in variables]
    where = {}
    groups = (("t", model.trainable_variables), ("n", model.non_trainable_variables))
    for group, members in groups:
        for i, v in enumerate(members):
            if id(v) in ids:
                where[id(v)] = (group, i)
    missing = [v.path for v in variables if id(v) not in where]
    if missing:
        raise ValueError(f"Variables not in the model: {missing}")

    def loss(chosen):
        t, n = list(trainable), list(non_trainable)
        for v, value in zip(variables, chosen, strict=True):
            group, i = where[id(v)]
            (t if group == "t" else n)[i] = value
        outputs, _ = model.stateless_call(t, n, x, training=False)
        return loss_of_outputs(outputs)

    grads = jax.grad(loss)([v.value for v in variables])
    return [np.asarray(g) for g in grads]


def is_symbolic(value) -> bool:
    """Whether ``value`` has no value yet: a JAX tracer, inside a traced function.

    >>> seen = []
    >>> _ = jax.jit(lambda x: seen.append(is_symbolic(x)) or x)(1.0)
    >>> is_symbolic(jnp.ones(2)), seen
    (False, [True])
    """
    return isinstance(value, jax.core.Tracer)


def in_xla_context() -> bool:
    """Always: JAX compiles every traced function with XLA."""
    return True
