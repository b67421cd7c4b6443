"""Mask gradients, apply them, and optionally restore the frozen entries.

The "restrict the update" family in its plainest form: keep one full
variable, zero the gradient of its frozen entries, and let the optimizer
apply it. With plain SGD, momentum SGD and Adam a zero gradient means no
update, so frozen entries keep their bits. Optimizers that move an entry
whose gradient is zero (weight decay, Ftrl, Adafactor) break that promise;
``restore_frozen=True`` writes the frozen values back after every update,
which is exact under any optimizer at the cost of one copy of each masked
variable and one select per step.

Masks are static (NumPy values known when a graph is traced) and use this
package's convention: ``True`` marks a trainable entry. ``None`` in place of
a mask means "every entry trainable".
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from refimpl.masks import mask_constant, normalize_shape, to_mask

__all__ = ["mask_gradients", "apply_masked_gradients", "MaskedGradientModel"]


def _var_name(variable) -> str:
    return str(getattr(variable, "path", None) or variable.name).removesuffix(":0")


def _check_list(value, name: str) -> list:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"`{name}` must be a list or tuple. Received: {name}={value!r}")
    return list(value)


def _static_shape(grad, name: str) -> tuple[int, ...]:
    if isinstance(grad, tf.IndexedSlices):
        shape = tf.get_static_value(grad.dense_shape)
        if shape is None:
            raise ValueError(
                f"`{name}` is a tf.IndexedSlices of unknown dense shape; a "
                f"mask needs a static shape. Received: {name}={grad!r}"
            )
        return tuple(int(d) for d in shape)
    return normalize_shape(tf.TensorShape(grad.shape), name=f"{name}.shape")


def _mask_one(grad, mask: np.ndarray | None):
    if mask is None:
        return grad
    if isinstance(grad, tf.IndexedSlices):
        rows = tf.gather(mask_constant(mask), grad.indices)
        values = tf.where(rows, grad.values, tf.zeros_like(grad.values))
        return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
    grad = tf.convert_to_tensor(grad)
    # A select, not a product: 0 * inf and 0 * nan would leak NaN.
    return tf.where(mask_constant(mask), grad, tf.zeros_like(grad))


def mask_gradients(grads, masks) -> list:
    """Zero the gradient of every frozen entry.

    Args:
        grads: a list of gradients (tensors or ``tf.IndexedSlices``), as
            returned by ``tape.gradient(loss, variables)``.
        masks: a list of the same length; each a mask of its gradient's shape
            in any form :func:`refimpl.masks.to_mask` accepts (``True`` =
            trainable), or ``None`` to leave that gradient untouched.

    Returns:
        A new list of gradients: equal to ``grads`` at trainable entries and
        exactly ``0.0`` at frozen ones (even where the gradient was NaN).

    Raises:
        TypeError: if ``grads`` or ``masks`` is not a list.
        ValueError: if the lengths differ, a gradient is ``None``, or a mask
            does not fit its gradient.

    >>> g = mask_gradients([tf.constant([1.0, 2.0])], [[True, False]])
    >>> g[0].numpy()
    array([1., 0.], dtype=float32)
    """
    grads = _check_list(grads, "grads")
    masks = _check_list(masks, "masks")
    if len(grads) != len(masks):
        raise ValueError(
            f"`grads` and `masks` must have the same length, one mask per "
            f"gradient. Received {len(grads)} gradients and {len(masks)} masks"
        )
    out = []
    for i, (grad, mask) in enumerate(zip(grads, masks, strict=True)):
        if grad is None:
            raise ValueError(
                f"`grads[{i}]` is None: the loss does not depend on that "
                f"variable, so there is nothing to mask. Received: grads[{i}]=None"
            )
        if mask is not None:
            mask = to_mask(mask, _static_shape(grad, f"grads[{i}]"), name=f"masks[{i}]")
        out.append(_mask_one(grad, mask))
    return out


def _check_pairs(grads_and_vars, masks) -> tuple[list, list, list]:
    if isinstance(grads_and_vars, (str, bytes)) or not hasattr(
        grads_and_vars, "__iter__"
    ):
        raise TypeError(
            "`grads_and_vars` must be a list of (gradient, variable) pairs. "
            f"Received: grads_and_vars={grads_and_vars!r}"
        )
    pairs = list(grads_and_vars)
    masks = _check_list(masks, "masks")
    if len(pairs) != len(masks):
        raise ValueError(
            f"`masks` must hold one mask per (gradient, variable) pair. "
            f"Received {len(pairs)} pairs and {len(masks)} masks"
        )
    grads, variables, checked = [], [], []
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise TypeError(
                f"`grads_and_vars[{i}]` must be a (gradient, variable) pair. "
                f"Received: grads_and_vars[{i}]={pair!r}"
            )
        grad, var = pair
        if not isinstance(var, (tf.Variable, keras.Variable)):
            raise TypeError(
                f"`grads_and_vars[{i}]` must hold a tf.Variable or a "
                f"keras.Variable; an optimizer can only update variables (a "
                f"slice such as X[0] is a new tensor, not a view). Received an "
                f"object of type {type(var).__name__}: {var!r}"
            )
        name = _var_name(var)
        if grad is None:
            raise ValueError(
                f"The gradient of variable '{name}' (grads_and_vars[{i}]) is "
                f"None: the loss does not depend on it. Compute the loss from "
                f"the variable inside the tape, or leave the variable out."
            )
        shape = normalize_shape(tf.TensorShape(var.shape), name=f"'{name}'.shape")
        mask = masks[i]
        if mask is not None:
            mask = to_mask(mask, shape, name=f"masks[{i}]")
        grads.append(grad)
        variables.append(var)
        checked.append(mask)
    return grads, variables, checked


def apply_masked_gradients(
    optimizer, grads_and_vars, masks, *, restore_frozen: bool = False
) -> None:
    """Mask the gradients, apply them, and optionally restore frozen entries.

    Works eagerly and inside ``tf.function`` (masks are static).

    Args:
        optimizer: a Keras optimizer.
        grads_and_vars: a list of ``(gradient, variable)`` pairs; every
            variable a ``tf.Variable`` or ``keras.Variable``.
        masks: one mask per pair, of the variable's shape (``True`` =
            trainable), or ``None`` for a variable that trains in full.
        restore_frozen: if ``True``, copy each masked variable before the
            update and write its frozen entries back afterwards. This makes
            the frozen entries bit-exact under *any* optimizer (weight decay,
            Ftrl, Adafactor), and costs one extra copy of every masked
            variable in memory plus one ``tf.where`` and one assignment per
            step. The optimizer's own state for those entries still evolves.

    Raises:
        TypeError: for an optimizer that is not a Keras optimizer, a pair
            that is not a pair, or a "variable" that is not a variable.
        ValueError: for a ``None`` gradient (naming the variable), a length
            mismatch, or a mask that does not fit its variable.

    >>> x = tf.Variable([3.0, 2.0])
    >>> apply_masked_gradients(
    ...     keras.optimizers.SGD(0.1), [(tf.constant([2.0, 10.0]), x)], [[True, False]]
    ... )
    >>> x.numpy()
    array([2.8, 2. ], dtype=float32)
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"`optimizer` must be a Keras optimizer, such as "
            f"keras.optimizers.SGD(0.1). Received: optimizer={optimizer!r}"
        )
    if not isinstance(restore_frozen, bool):
        raise TypeError(
            f"`restore_frozen` must be True or False. "
            f"Received: restore_frozen={restore_frozen!r}"
        )
    grads, variables, masks = _check_pairs(grads_and_vars, masks)
    if not variables:
        return
    masked = [_mask_one(g, m) for g, m in zip(grads, masks, strict=True)]
    snapshots = []
    if restore_frozen:
        # tf.identity makes a copy that later in-place updates cannot touch.
        snapshots = [
            None if m is None else tf.identity(tf.convert_to_tensor(v))
            for v, m in zip(variables, masks, strict=True)
        ]
    optimizer.apply_gradients(zip(masked, variables, strict=True))
    for var, mask, saved in zip(variables, masks, snapshots, strict=False):
        if saved is not None:
            value = tf.where(mask_constant(mask), tf.convert_to_tensor(var), saved)
            _assign_on_every_replica(var, value)


def _assign_on_every_replica(var, value) -> None:
    """``var.assign(value)``, also correct inside ``strategy.run``.

    In replica context a plain assign to a mirrored variable is aggregated by
    the variable's ``aggregation`` (with ``SUM`` the replicas' writes add up).
    Every replica computes the same restored value for its own copy, so the
    write goes through a merge call that updates each copy with its replica's
    value, whatever the aggregation.
    """
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        var.assign(value)
        return

    # A keras.Variable wraps the strategy's distributed tf.Variable.
    tf_var = var.value if isinstance(var, keras.Variable) else var

    def merge_fn(strategy, variable, per_replica_value):
        strategy.extended.update(
            variable, lambda v, x: v.assign(x), args=(per_replica_value,)
        )

    tf.distribute.get_replica_context().merge_call(merge_fn, args=(tf_var, value))


class MaskedGradientModel(keras.Model):
    """Wrap a Keras model so that ``fit`` masks the gradients of some weights.

    Everything else of ``fit`` is unchanged: callbacks, compiled metrics,
    validation, regularization losses, ``evaluate`` and ``predict`` (they call
    the wrapped model). Save the wrapped model itself (``.model``): the masks
    are a training-time setting, not part of the network.

    Args:
        model: a built Keras model (or layer).
        masks: a list of ``(variable, mask)`` pairs, each variable one of
            ``model.trainable_variables`` and each mask of its shape
            (``True`` = trainable) or ``None``. Variables not listed train
            in full.
        restore_frozen: see :func:`apply_masked_gradients`.

    >>> inner = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> kernel = inner.layers[0].kernel
    >>> model = MaskedGradientModel(inner, [(kernel, [[True], [False]])])
    >>> model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    >>> before = kernel.numpy()
    >>> _ = model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)
    >>> bool(kernel.numpy()[1, 0] == before[1, 0])
    True
    """

    def __init__(self, model, masks, *, restore_frozen: bool = False, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(model, keras.layers.Layer):
            raise TypeError(
                f"`model` must be a Keras model or layer. Received: model={model!r}"
            )
        if not model.built:
            raise ValueError(
                "`model` must be built (its weights must exist) so that the "
                "masks can be checked against them. Call model.build(...) or "
                f"run it on a batch first. Received: model={model.name!r}"
            )
        self.model = model
        self.restore_frozen = restore_frozen
        known = {id(v): v for v in model.trainable_variables}
        pairs = _check_list(masks, "masks")
        self._mask_by_id: dict[int, np.ndarray] = {}
        for i, pair in enumerate(pairs):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise TypeError(
                    f"`masks[{i}]` must be a (variable, mask) pair. "
                    f"Received: masks[{i}]={pair!r}"
                )
            var, mask = pair
            if id(var) not in known:
                raise ValueError(
                    f"`masks[{i}]` names a variable that is not one of the "
                    f"model's trainable variables. Received: {_var_name(var)!r}; "
                    f"expected one of {[_var_name(v) for v in known.values()]}"
                )
            if id(var) in self._mask_by_id:
                raise ValueError(
                    f"`masks[{i}]` gives a second mask for {_var_name(var)!r}"
                )
            shape = normalize_shape(tf.TensorShape(var.shape))
            self._mask_by_id[id(var)] = (
                None if mask is None else to_mask(mask, shape, name=f"masks[{i}]")
            )

    def call(self, inputs, training=None):
        return self.model(inputs, training=training)

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
            )
            scaled = self.optimizer.scale_loss(loss)
        variables = self.trainable_variables
        grads = tape.gradient(scaled, variables)
        masks = [self._mask_by_id.get(id(v)) for v in variables]
        apply_masked_gradients(
            self.optimizer,
            list(zip(grads, variables, strict=True)),
            masks,
            restore_frozen=self.restore_frozen,
        )
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        for metric in self.metrics:
            if metric.name == "loss":  # Keras scales the loss per replica.
                batch = tf.shape(tf.nest.flatten(x)[0])[0]
                metric.update_state(loss * replicas, sample_weight=batch)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
