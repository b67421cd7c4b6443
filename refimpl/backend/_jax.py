"""The JAX backend's pieces (see :mod:`refimpl.backend`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import keras
import numpy as np


def read_now(variable) -> np.ndarray:
    value = try_read_now(variable)
    if value is None:
        raise ValueError(
            f"The value of '{variable.path}' is not known while JAX traces a "
            "training step (Keras holds it in the step's state)"
        )
    return value


def try_read_now(variable) -> np.ndarray | None:
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
    return jnp.asarray(np.asarray(array, dtype=bool))


def mask_sparse_gradient(grad, keep):
    return None  # JAX gradients are dense arrays


def assign_on_every_replica(var, value) -> None:
    var.assign(value)


def batch_gradients(model, loss_of_outputs, x) -> list:
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def loss(values):
        outputs, _ = model.stateless_call(values, non_trainable, x, training=False)
        return loss_of_outputs(outputs)

    return [np.asarray(g) for g in jax.grad(loss)(trainable)]


def variable_gradients(model, loss_of_outputs, x, variables) -> list:
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


def is_variable(value) -> bool:
    return isinstance(value, keras.Variable)


def is_symbolic(value) -> bool:
    return isinstance(value, jax.core.Tracer)
