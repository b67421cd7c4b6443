"""Minimise a loss with SciPy over the free entries of some variables.

This is the TensorFlow 2 replacement for TF 1's
``tf.contrib.opt.ScipyOptimizerInterface``, restricted to a mask: only the
trainable entries become SciPy's parameter vector, so SciPy never sees (and
never moves) a frozen entry. The variables are updated in place with
``scatter_nd_update`` at the free positions only, so frozen entries keep their
exact bits under every SciPy method.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.optimize

from refimpl import backend

# The TensorFlow-level code: a clear error, before TensorFlow is imported.
backend.require_tensorflow("refimpl.tf.scipy_optimize")

import tensorflow as tf  # noqa: E402

from refimpl.masks import _describe, _normalize_shape, mask_to_indices, to_mask  # noqa: E402  # noqa: E402

__all__ = ["minimize"]

# SciPy methods that need a gradient only (we provide it) or nothing at all.
_GRADIENT_METHODS = ("cg", "bfgs", "newton-cg", "l-bfgs-b", "tnc", "slsqp")
_GRADIENT_METHODS += ("trust-constr",)
_GRADIENT_FREE_METHODS = ("nelder-mead", "powell", "cobyla", "cobyqa")
# SciPy methods that also need the Hessian, which this function does not build.
_HESSIAN_METHODS = ("dogleg", "trust-ncg", "trust-exact", "trust-krylov")


def minimize(
    loss_fn: Callable[[], tf.Tensor],
    variables,
    mask=None,
    *,
    method: str = "L-BFGS-B",
    options: dict | None = None,
) -> scipy.optimize.OptimizeResult:
    """Minimise ``loss_fn()`` with SciPy, changing only the free entries.

    The free entries of all ``variables`` are flattened into one float64
    vector; SciPy gets the loss and its gradient (from ``tf.GradientTape``)
    as functions of that vector. After every evaluation and at the end, the
    free entries are written back into the variables, cast to their dtype.

    Args:
        loss_fn: a function of no arguments that reads the variables and
            returns a scalar loss tensor (wrap it in ``tf.function`` for
            speed).
        variables: one ``tf.Variable`` or a list of them, of floating dtype.
            Their ``trainable`` flag is ignored: every listed variable is
            optimised at its free entries.
        mask: which entries are free. ``None``: every entry. With one variable,
            one mask in any form :func:`refimpl.masks.to_mask` accepts. With a
            list of variables, a list of the same length holding one mask (or
            ``None``) per variable.
        method: a SciPy ``minimize`` method name, for example ``"L-BFGS-B"``,
            ``"BFGS"`` or ``"Nelder-Mead"`` (not the methods that need a
            Hessian).
        options: passed to ``scipy.optimize.minimize`` as ``options``, for
            example ``{"maxiter": 100}``.

    Returns:
        SciPy's ``OptimizeResult``; ``result.x`` holds the free values, in the
        order of the variables and, within each, row-major. The variables hold
        the result too.

    Raises:
        TypeError: if ``loss_fn`` is not callable, a variable is not a floating
            ``tf.Variable``, or ``options`` is not a dict.
        ValueError: for a bad mask, an unknown method, a loss that is not a
            scalar or not finite at the start, or a mask that leaves no entry free.

    >>> from refimpl.tf import minimize
    >>> X = tf.Variable([1.0, 2.0])
    >>> Y = tf.constant([2.0, -3.0])
    >>> result = minimize(lambda: tf.reduce_sum((X - Y) ** 2), X, [True, False])
    >>> bool(result.success), X.numpy()
    (True, array([2., 2.], dtype=float32))
    """
    if not callable(loss_fn):
        raise TypeError(
            "`loss_fn` must be a function of no arguments that returns the loss. "
            f"Received: loss_fn={_describe(loss_fn)}"
        )
    variables, masks = _variables_and_masks(variables, mask)
    method_key = _check_method(method)
    if options is not None and not isinstance(options, dict):
        raise TypeError(
            f"`options` must be a dict or None. Received: {_describe(options)}"
        )
    indices = [tf.constant(mask_to_indices(m), tf.int64) for m in masks]
    sizes = [int(m.sum()) for m in masks]
    if sum(sizes) == 0:
        raise ValueError(
            "`mask` leaves no entry free, so there is nothing to minimise. "
            f"Received masks with {sizes} free entries"
        )
    splits = np.cumsum(sizes)[:-1]

    def write(theta: np.ndarray) -> None:
        for var, idx, part in zip(variables, indices, np.split(theta, splits)):
            if part.size:
                var.scatter_nd_update(idx, tf.constant(part, dtype=var.dtype))

    def loss_and_grad(theta: np.ndarray) -> tuple[float, np.ndarray]:
        write(theta)
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(variables)
            loss = _scalar_loss(loss_fn())
        grads = tape.gradient(loss, variables)
        flat = [
            tf.gather_nd(tf.convert_to_tensor(g), idx)
            if g is not None
            else tf.zeros([size], var.dtype)
            for g, idx, size, var in zip(grads, indices, sizes, variables)
        ]
        grad = np.concatenate([tf.cast(f, tf.float64).numpy() for f in flat])
        return float(loss.numpy()), grad

    def loss_only(theta: np.ndarray) -> float:
        write(theta)
        return float(_scalar_loss(loss_fn()).numpy())

    theta0 = np.concatenate(
        [
            tf.cast(tf.gather_nd(var, idx), tf.float64).numpy()
            for var, idx in zip(variables, indices)
        ]
    )
    start = float(_scalar_loss(loss_fn()).numpy())
    if not np.isfinite(start):
        raise ValueError(
            "`loss_fn` must be finite at the starting point, or SciPy stops at "
            f"once without saying why. Received: loss_fn()={start}; check the "
            "variables (and any frozen entry) for NaN or inf."
        )
    if method_key in _GRADIENT_FREE_METHODS:
        result = scipy.optimize.minimize(
            loss_only, theta0, method=method, options=options
        )
    else:
        result = scipy.optimize.minimize(
            loss_and_grad, theta0, jac=True, method=method, options=options
        )
    write(np.asarray(result.x, dtype=np.float64))
    return result


def _variables_and_masks(variables, mask):
    single = isinstance(variables, tf.Variable)
    var_list = [variables] if single else variables
    if not isinstance(var_list, (list, tuple)) or not var_list:
        raise TypeError(
            "`variables` must be a tf.Variable or a non-empty list of them. "
            f"Received: variables={_describe(variables)}"
        )
    for i, var in enumerate(var_list):
        if not isinstance(var, tf.Variable) or not var.dtype.is_floating:
            name = "variables" if single else f"variables[{i}]"
            raise TypeError(
                f"`{name}` must be a tf.Variable of floating dtype. "
                f"Received: {name}={_describe(var)}"
            )
    if len({id(v) for v in var_list}) != len(var_list):
        raise ValueError("`variables` lists the same variable more than once.")
    if single or mask is None:
        mask_list = [mask] * len(var_list)
    elif isinstance(mask, (list, tuple)) and len(mask) == len(var_list):
        mask_list = list(mask)
    else:
        raise ValueError(
            f"With a list of {len(var_list)} variables, `mask` must be None or a "
            f"list of {len(var_list)} masks (one per variable, None for all "
            f"free). Received: mask={_describe(mask)}"
        )
    masks = []
    for i, (var, m) in enumerate(zip(var_list, mask_list)):
        shape = _normalize_shape(var.shape, name=f"variables[{i}].shape")
        name = "mask" if single else f"mask[{i}]"
        masks.append(
            np.ones(shape, bool) if m is None else to_mask(m, shape, name=name)
        )
    return list(var_list), masks


def _check_method(method) -> str:
    known = _GRADIENT_METHODS + _GRADIENT_FREE_METHODS
    if not isinstance(method, str) or method.lower() not in known:
        extra = ""
        if isinstance(method, str) and method.lower() in _HESSIAN_METHODS:
            extra = " It needs a Hessian, which `minimize` does not compute."
        raise ValueError(
            f"`method` must be one of SciPy's minimize methods that need at most "
            f"a gradient: {', '.join(known)}.{extra} Received: "
            f"method={_describe(method)}"
        )
    return method.lower()


def _scalar_loss(loss) -> tf.Tensor:
    loss = tf.convert_to_tensor(loss)
    if loss.shape.rank != 0:
        raise ValueError(
            "`loss_fn` must return a scalar. Received a loss of shape "
            f"{loss.shape}; reduce it, for example with tf.reduce_sum."
        )
    return loss
