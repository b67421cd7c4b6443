"""Mask the gradients in a custom loop: :func:`mask_gradients` and one whole step.

:func:`apply_masked_gradients` is one training step of
:class:`refimpl.MaskedOptimizer <refimpl.optimizers.MaskedOptimizer>` for a custom loop,
on the same code;
:func:`mask_gradients` only masks.
"""

from __future__ import annotations

import keras

from refimpl import backend
from refimpl._checks import describe, variable_path
from refimpl._pairs import pair_masks, variable_pairs
from refimpl.masks import mask_constant


def mask_gradients(grads_and_vars, masks) -> list[tuple]:
    """Zero the gradient of every frozen entry.

    Args:
        grads_and_vars: ``(gradient, variable)`` pairs, as passed to
            ``optimizer.apply_gradients``.
        masks: a list of ``(variable, mask)`` pairs (``True`` = trainable);
            variables that no pair names keep their gradient.

    Returns:
        A new list of ``(gradient, variable)`` pairs, each gradient equal to
        the original at trainable entries and exactly ``0.0`` at frozen ones
        (even where it was NaN).

    Raises:
        TypeError: for pairs that are not pairs, or a non-variable.
        ValueError: for a ``None`` gradient of a masked variable, a mask that
            does not fit, or a masked variable that is not in
            ``grads_and_vars``.

    >>> from refimpl.optimizers import mask_gradients
    >>> w = keras.Variable([1.0, 2.0])
    >>> grad = keras.ops.array([3.0, 4.0])
    >>> [(g, _)] = mask_gradients([(grad, w)], [(w, [True, False])])
    >>> keras.ops.convert_to_numpy(g)
    array([3., 0.], dtype=float32)
    """
    grads, variables = _split(grads_and_vars)
    arrays = pair_masks(masks, variables)
    _check_gradients(grads, variables, arrays)
    return [
        (grad if mask is None else _mask_one(grad, mask_constant(mask)), variable)
        for grad, variable, mask in zip(grads, variables, arrays, strict=True)
    ]


def _check_gradients(grads, variables, arrays) -> None:
    """Refuse a ``None`` gradient for a masked variable (it would not train)."""
    for i, (grad, variable, mask) in enumerate(
        zip(grads, variables, arrays, strict=True)
    ):
        if mask is not None and grad is None:
            raise ValueError(
                f"The gradient of the masked variable '{variable_path(variable)}' "
                f"(`grads_and_vars[{i}]`) is None: the loss does not depend on "
                "it. Compute the loss from the variable inside the tape. "
                f"Received: grads_and_vars[{i}]=(None, {variable_path(variable)!r})"
            )


def apply_masked_gradients(
    optimizer, grads_and_vars, masks, *, restore_frozen: bool = False
) -> None:
    """Mask the gradients, apply them, and optionally restore frozen entries.

    One step of :class:`MaskedOptimizer`, for a custom loop with an optimizer
    you already have. Works eagerly on every backend, and on TensorFlow
    also in ``tf.function`` and under
    `tf.distribute <https://www.tensorflow.org/api_docs/python/tf/distribute>`__
    (in :term:`replica context`).

    Args:
        optimizer: a Keras optimizer.
        grads_and_vars: ``(gradient, variable)`` pairs.
        masks: a list of ``(variable, mask)`` pairs; a floating-point mask in
            [0, 1] scales each entry's update.
        restore_frozen: write the frozen entries back after the update, which
            keeps them exact under every optimizer. Under Adafactor, where a
            fully frozen row meets a fully frozen column, the free entries
            still become NaN: the update is already NaN at every entry, and
            writing the frozen values back cannot repair the free ones
            (:doc:`/chapters/03_mask_the_gradient`).

    Returns:
        ``None``; the variables change in place.

    Raises:
        TypeError: for an optimizer that is not a Keras optimizer, pairs that
            are not pairs, a non-variable, or a non-bool ``restore_frozen``.
        ValueError: for a ``None`` gradient of a masked variable, or a mask
            that does not fit.

    >>> from refimpl.optimizers import apply_masked_gradients
    >>> x = keras.Variable([3.0, 2.0])
    >>> apply_masked_gradients(
    ...     keras.optimizers.SGD(0.1), [(keras.ops.array([2.0, 10.0]), x)],
    ...     [(x, [True, False])])
    >>> keras.ops.convert_to_numpy(x)
    array([2.8, 2. ], dtype=float32)
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "`optimizer` must be a Keras optimizer, such as "
            f"keras.optimizers.SGD(0.1). Received: optimizer={describe(optimizer)}"
        )
    if not isinstance(restore_frozen, bool):
        raise TypeError(
            "`restore_frozen` must be True or False. "
            f"Received: restore_frozen={describe(restore_frozen)}"
        )
    grads, variables = _split(grads_and_vars)
    if not variables:
        return
    arrays = pair_masks(masks, variables, scales=True)
    _check_gradients(grads, variables, arrays)
    tensors = [None if a is None else keras.ops.convert_to_tensor(a) for a in arrays]
    scaled = [a is not None and bool(((a > 0) & (a < 1)).any()) for a in arrays]
    _masked_step(optimizer, grads, variables, tensors, scaled, restore_frozen)


def _masked_step(optimizer, grads, variables, masks, scaled, restore) -> None:
    """Mask, apply with ``optimizer``, then restore or scale: the shared step."""
    grads = [
        g if m is None or g is None else _mask_one(g, m > 0)
        for g, m in zip(grads, masks, strict=True)
    ]
    saved = [
        keras.ops.copy(keras.ops.convert_to_tensor(v))
        if m is not None and (restore or s)
        else None
        for v, m, s in zip(variables, masks, scaled, strict=True)
    ]
    optimizer.apply(grads, variables)
    for variable, mask, old, scale in zip(variables, masks, saved, scaled, strict=True):
        if old is None:
            continue
        new = keras.ops.convert_to_tensor(variable)
        if scale:
            fraction = keras.ops.cast(mask, new.dtype)
            partial = old + fraction * (new - old)
            value = keras.ops.where(mask >= 1, new, partial)
            value = keras.ops.where(mask > 0, value, old)
        else:
            value = keras.ops.where(mask > 0, new, old)
        backend.assign_on_every_replica(variable, value)


def _mask_one(grad, keep):
    """Zero ``grad`` where ``keep`` is False, with a ``where`` (NaN-safe)."""
    sparse = backend.mask_sparse_gradient(grad, keep)
    if sparse is not None:
        return sparse
    grad = keras.ops.convert_to_tensor(grad)
    return keras.ops.where(keep, grad, keras.ops.zeros_like(grad))


def _split(grads_and_vars) -> tuple[list, list]:
    if not isinstance(grads_and_vars, (list, tuple)) and hasattr(
        grads_and_vars, "__iter__"
    ):
        grads_and_vars = list(grads_and_vars)  # zip(grads, vars) is fine
    pairs = variable_pairs(
        grads_and_vars, name="grads_and_vars", slot=1, kind="(gradient, variable)"
    )
    variables = []
    for i, (grad, variable) in enumerate(pairs):
        if any(variable is v for v in variables):
            raise ValueError(
                f"`grads_and_vars[{i}]` gives a second gradient for the variable "
                f"{variable_path(variable)!r}: give each variable once (add its "
                f"gradients first). Received: grads_and_vars[{i}]="
                f"({type(grad).__name__}, {variable_path(variable)!r})"
            )
        variables.append(variable)
    return [grad for grad, _ in pairs], variables
