"""Masks that change during training: drop the entries that moved least, grow new ones.

SpIEL (Ansell et al., ICML 2024) fine-tunes about 1 % of a model's entries
and re-chooses them while it trains: every few steps it drops the active
entries whose change from the pretrained value is smallest and grows as many
new ones where the gradient is largest. :class:`DropAndGrow` does this for
every partial layer of a model (:func:`refimpl.partialize <refimpl.convert.partialize>`,
the partial classes, :class:`refimpl.PartialDense
<refimpl.layers.partial.PartialDense>`), as a Keras
callback;
:func:`regrow` is one such update, for a custom training loop.

Choices, each tested:

* **A dropped entry reverts to its base value**, as in SpIEL: the base is the
  pretrained weight, never written, so the entry reads it again; what it
  learned is discarded. (Folding it into the base would make the base drift
  from the checkpoint, and the trained-entries file would no longer restore the
  model from the checkpoint alone.)
* **A grown entry starts from its base value with fresh optimizer state**:
  zero moments for Adam, AdamW, Nadam, Adamax, Lamb, Lion, RMSprop, SGD and
  Adadelta, the initial accumulator for Adagrad and Ftrl, the new value for an
  exponential moving average of the weights. An optimizer whose per-entry state
  this module cannot reset (Adafactor, Muon, schedule-free AdamW, or an
  optimizer it does not know, a subclass of one of the above included) is
  refused. The state sits in private Keras attributes; a Keras release that
  renamed one fails naming the optimizer and the attribute, never leaving the
  state stale.
* **The growth score** is the squared gradient of the loss with respect to
  the frozen base, summed over a few *probe* batches (``batches``) taken in
  turn from ``data``, at each update only: one extra forward and backward
  pass per probe batch once every ``every`` training steps, and no dense
  gradient in the training steps in between. The candidates are the entries
  not active before the update, so a dropped entry is not grown back at once.
* **No update in a fit's last** ``every`` **steps** (``train_after``): an
  entry grown there would not train, and the final mask would hold it at its
  base value. The steps are the optimizer's ``iterations``, so a second
  ``fit``, or one of a reloaded model, continues the schedule.
* ``k``, the number of free entries of each layer, stays the same, and so do
  the optimizer's state sizes (``k`` values per slot). The positions are kept
  sorted, with the free values and their optimizer state moved along.

The positions are a variable of the layer, so ``.keras`` files and
:func:`refimpl.save_partial_weights
<refimpl.trained_entries.save_partial_weights>` hold the current ones, and
training continues from them after loading.
"""

from __future__ import annotations

import keras
import numpy as np

from refimpl import _compat, backend
from refimpl.masks import _check_int, _describe, _input_arrays
from refimpl.partial import partial_weights

__all__ = ["DropAndGrow", "regrow"]


def _partial_layers(model):
    """The layers that hold a trainable partial weight: the partial layers and
    each ``PartialVariable`` (in a layer of your own too)."""
    layers = [pw.owner for pw in partial_weights(model) if pw.free.trainable]
    for layer in layers:
        if layer.partial_weight.quantized is not None:
            raise ValueError(
                f"Layer {layer.name!r} holds its kernel as "
                f"{layer.partial_weight.quantized.mode} codes (Keras' "
                "`quantize`), which have no gradient to score entries by and no "
                "float values to grow from: drop and grow needs a float base. "
                "Drop and grow on the float model, then quantize it "
                "(`model.quantize(...)` keeps the free values)."
            )
        if layer.partial_weight.mode == "slices":
            raise ValueError(
                f"Layer {layer.name!r} trains whole slices of its kernel "
                "(mode='slices'), which drop and grow would break into single "
                "entries. Convert it with mode='delta' to drop and grow its entries."
            )
    return layers


def _scores(model, layers, data, loss, batches, batch_size, start):
    """The squared gradient on each layer's base, summed over probe batches."""
    x, y = data
    rows = len(y)
    bases = [layer.partial_weight.base for layer in layers]
    totals = [np.zeros(tuple(b.shape), np.float64) for b in bases]
    for b in range(batches):
        first = (start + b * batch_size) % rows
        picks = (np.arange(batch_size) + first) % rows
        xb = keras.tree.map_structure(lambda a, p=picks: a[p], x)
        yb = y[picks]

        def batch_loss(outputs, yb=yb):
            return keras.ops.mean(loss(yb, outputs))

        for total, grad in zip(
            totals,
            backend.variable_gradients(model, batch_loss, xb, bases),
            strict=True,
        ):
            if grad is not None:
                total += np.square(grad, dtype=np.float64)
    return totals


def regrow(model, data, *, fraction, loss=None, batches=1, batch_size=32, start=0):
    """Drop and grow the free entries of every partial layer of ``model``, once.

    Args:
        model: a model with partial layers
            (:func:`refimpl.partialize <refimpl.convert.partialize>`), built.
        data: ``(x, y)``, the probe data of the growth score (x an array, or a
            dict or list of arrays, as the model takes).
        fraction: the share of each layer's free entries to drop and grow, in
            (0, 1); ``round(fraction * k)`` entries per layer.
        loss: the loss of the score; by default the model's compiled loss.
        batches: how many probe batches the score takes.
        batch_size: the rows of each probe batch.
        start: the row of ``data`` the first probe batch starts at.

    Returns:
        One record per partial layer, with its ``path``, ``dropped`` and
        ``grown`` (flat positions, NumPy arrays).

    Raises:
        TypeError: for a ``model`` that is not a Keras model, ``data``
            that is not an ``(x, y)`` pair of arrays, a ``fraction`` that is
            not a number, or a ``batches`` or ``batch_size`` that is not an int.
        ValueError: for a ``model`` that is not built, a ``fraction`` outside
            (0, 1), a ``batches`` or ``batch_size`` below 1, an ``x`` and a
            ``y`` of different numbers of rows (or none), no ``loss`` given or
            compiled, or one loss per output; a model with no trainable
            partial layer, or one in the ``"slices"`` form; or an optimizer
            whose state cannot be reset per entry (one not named in
            :mod:`refimpl.callbacks`' choices, such as Adafactor or a
            subclass of your own).

    >>> from refimpl.callbacks import regrow
    >>> import refimpl
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="d")])
    >>> model = refimpl.partialize(model, {"d": np.eye(4, 3, dtype=bool)})
    >>> data = np.ones((8, 4)), np.zeros((8, 3))
    >>> [record] = regrow(model, data, fraction=0.34, loss="mse")
    >>> pw = model.get_layer("d").partial_weight
    >>> len(record["dropped"]), len(record["grown"]), pw.num_free
    (1, 1, 3)
    """
    fraction = _check_fraction(fraction)
    batches, batch_size = (
        _check_int(batches, "batches", minimum=1),
        _check_int(batch_size, "batch_size", minimum=1),
    )
    x, y = _check_data(data)
    layers = _require_layers(model)
    loss = _loss_of(model, loss)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        for layer in layers:
            _check_optimizer(optimizer, layer.partial_weight.free)
    scores = _scores(model, layers, (x, y), loss, batches, batch_size, start)
    return [
        _swap(layer, score, fraction, optimizer)
        for layer, score in zip(layers, scores, strict=True)
    ]


def _require_layers(model):
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"`model` must be a built Keras model. Received: model={_describe(model)}"
        )
    if not model.built:
        raise ValueError(
            "`model` must be built: drop and grow reads the weights of its "
            "partial layers. Build it first (call it on a batch, or "
            "`model.build(input_shape)`). "
            f"Received: model={_describe(model.name)}, not built"
        )
    layers = _partial_layers(model)
    if not layers:
        raise ValueError(
            "`model` has no trainable partial layer to drop and grow entries of: "
            "convert it with `refimpl.partialize` first. "
            f"Received: model={_describe(model.name)}"
        )
    return layers


def _fresh(kind, values):
    """A grown entry's fresh optimizer state: zero, a constant, or its value."""
    return values if kind == "value" else (0.0 if kind == "zero" else kind)


def _swap(layer, score, fraction, optimizer) -> dict:
    pw = layer.partial_weight
    positions = np.asarray(backend.read_now(pw.positions)).astype(np.int64)
    base = np.asarray(keras.ops.convert_to_numpy(pw.base)).reshape(-1)
    free = np.asarray(keras.ops.convert_to_numpy(pw.free))
    select = pw.mode == "select"
    values = free.reshape(-1)[positions] if select else free
    count = int(round(fraction * len(positions)))
    record = {"path": layer.path or layer.name, "dropped": np.zeros(0, np.int64)}
    record["grown"] = record["dropped"]
    if count == 0:
        return record
    change = np.abs(values.astype(np.float64) - base[positions])
    drop = np.argsort(change, kind="stable")[:count]  # slots, smallest change first
    candidates = score.reshape(-1).copy()
    candidates[positions] = -np.inf  # active before the update
    grown = np.argsort(-candidates, kind="stable")[:count]
    record["dropped"], record["grown"] = np.sort(positions[drop]), np.sort(grown)
    new_positions = positions.copy()
    new_positions[drop] = grown
    order = np.argsort(new_positions, kind="stable")
    states = _slots(optimizer, pw.free) if optimizer is not None else []
    if select:  # the free values and the state are the weight's shape
        free = free.reshape(-1).copy()
        free[grown] = base[grown]
        for state, fresh in states:
            value = np.asarray(keras.ops.convert_to_numpy(state)).reshape(-1).copy()
            value[grown] = _fresh(fresh, base[grown])
            state.assign(value.reshape(tuple(state.shape)))
        pw.free.assign(free.reshape(tuple(pw.free.shape)))
    else:
        free = free.copy()
        free[drop] = base[grown]
        for state, fresh in states:
            value = np.asarray(keras.ops.convert_to_numpy(state)).copy()
            value[drop] = _fresh(fresh, base[grown])
            state.assign(value[order])
        pw.free.assign(free[order])
    pw.positions.assign(new_positions[order].astype(pw.positions.dtype))
    return record


class DropAndGrow(keras.callbacks.Callback):
    """Re-choose the partial layers' free entries once every ``every`` training steps.

    A Keras callback for ``fit``; :mod:`refimpl.callbacks` lists its
    choices (what a dropped and a grown entry start from, the growth score).
    Each time the optimizer's step count (``optimizer.iterations``) reaches a
    multiple of ``every``, at the end of that step, each trainable partial
    layer drops ``round(fraction * k)`` of its ``k`` free entries, those that
    moved least from their base value, and grows as many where the growth
    score, the squared gradient on the base over ``batches`` probe batches of
    ``data``, is largest.

    The steps are the optimizer's, counted from the start of training, so a
    second ``fit``, or a ``fit`` of a model saved and loaded again, continues
    the schedule (and ``stop_after``) where the last one ended, with this
    callback or a new one (a model loaded without its optimizer's state, as a
    keras-hub task whose ``compile`` Keras does not restore, starts again
    from step 0, with its optimizer). No update falls in the last
    ``train_after`` steps of a ``fit`` (by default ``every``): the entries an
    update grows train at least that many steps before the fit ends, and the
    final mask holds no entry that never trained. A ``fit`` stopped early
    (``EarlyStopping``, ``model.stop_training``) ends sooner than this rule
    can know.

    Args:
        data: ``(x, y)``, the probe data (a slice of the training data serves).
        every: the optimizer steps between two updates (at least 1). With
            ``steps_per_execution`` above 1, an update falls at the end of the
            execution whose steps reach a multiple of ``every``; with
            ``gradient_accumulation_steps``, a step is one update of the
            weights.
        fraction: the share of each layer's free entries swapped, in (0, 1).
        batches: how many probe batches each update scores.
        batch_size: the rows of each probe batch.
        loss: the score's loss; by default the model's compiled loss.
        stop_after: no update after this optimizer step, counted from the
            start of training (``None``: no limit).
        train_after: the fewest steps of the ``fit`` that must follow an
            update (at least 0; ``None``: ``every``), so no update falls in a
            fit's last ``train_after`` steps; 0 lets the final step update.
            Above 0 it needs the fit's length: for data of unknown length,
            pass ``steps_per_epoch`` to ``fit``, or set ``stop_after``.

    Attributes:
        history: one dict per update: its ``step`` (the optimizer's) and, per
            layer path, the number of entries swapped.

    Four steps with ``every=2``: an update after step 2, none after step 4,
    whose entries could not train; a second ``fit`` goes on from step 4.

    >>> import keras, numpy as np, refimpl
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="d")])
    >>> model = refimpl.partialize(model, {"d": np.eye(4, 3, dtype=bool)})
    >>> model.compile(keras.optimizers.Adam(0.01), "mse")
    >>> x, y = np.ones((8, 4)), np.zeros((8, 3))
    >>> grow = refimpl.DropAndGrow((x, y), every=2, fraction=0.34)
    >>> _ = model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[grow])
    >>> [h["step"] for h in grow.history], model.get_layer("d").partial_weight.num_free
    ([2], 3)
    >>> _ = model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[grow])
    >>> [h["step"] for h in grow.history]
    [2, 6]
    """

    def __init__(self, data, *, every=100, fraction=0.1, batches=1, batch_size=32,
                 loss=None, stop_after=None, train_after=None):  # fmt: skip
        super().__init__()
        self.data = _check_data(data)
        self.every = _check_int(every, "every", minimum=1)
        self.fraction = _check_fraction(fraction)
        self.batches = _check_int(batches, "batches", minimum=1)
        self.batch_size = _check_int(batch_size, "batch_size", minimum=1)
        if stop_after is not None:
            stop_after = _check_int(stop_after, "stop_after", minimum=1)
        self.train_after = (
            self.every
            if train_after is None
            else _check_int(train_after, "train_after")
        )
        self.stop_after, self.loss = stop_after, loss
        if loss is not None:
            _loss_of(None, loss)  # a loss Keras does not know: refused now
        self.history, self._seen, self._epoch, self._fitting = [], 0, 0, False

    def _step(self) -> int:
        """The optimizer's step count now."""
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def _steps_left(self, batch):
        """The optimizer steps of this ``fit`` after the current one, at least."""
        steps = (self.params or {}).get("steps")
        if steps is None:
            return None
        epochs = (self.params or {}).get("epochs", 1)
        batches = (epochs - self._epoch) * steps - (batch + 1)
        optimizer = self.model.optimizer
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            optimizer = optimizer.inner_optimizer  # whose `iterations` it shows
        return batches // (getattr(optimizer, "gradient_accumulation_steps", 0) or 1)

    def on_train_begin(self, logs=None):
        model = self.model
        _require_layers(model)
        _loss_of(model, self.loss)
        for layer in _partial_layers(model):
            _check_optimizer(model.optimizer, layer.partial_weight.free)
        steps = (self.params or {}).get("steps")
        if self.train_after and self.stop_after is None and steps is None:
            raise ValueError(
                "`fit` does not know how many steps it runs (data of unknown "
                "length, no `steps_per_epoch`), so DropAndGrow cannot keep its "
                "updates out of the last `train_after` steps, whose grown "
                "entries would not train. Pass `steps_per_epoch` to `fit`, or "
                "`stop_after` (the last step an update may fall on) or "
                "`train_after=0` to DropAndGrow. Received: steps=None, "
                f"train_after={self.train_after}, stop_after=None"
            )
        self._seen, self._epoch, self._fitting = self._step(), 0, True

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_end(self, logs=None):
        self._fitting = False

    def _outside_fit(self, what):
        raise ValueError(
            f"`callbacks` of `{what}` holds a DropAndGrow, which changes masks "
            "during `fit` only: pass it in `model.fit(..., callbacks=[...])`, or "
            "call `refimpl.callbacks.regrow(model, data, fraction=...)` in a "
            f"custom loop. Received: callbacks=[DropAndGrow] in {what}"
        )

    def on_test_begin(self, logs=None):
        if not self._fitting:  # `fit`'s own validation is fine
            self._outside_fit("evaluate")

    def on_predict_begin(self, logs=None):
        self._outside_fit("predict")

    def on_train_batch_end(self, batch, logs=None):
        if not self._fitting:
            raise ValueError(
                "`callbacks` of `fit` is where a DropAndGrow acts: pass it in "
                "`model.fit(..., callbacks=[...])`. Received: a call of "
                "on_train_batch_end outside fit"
            )
        step = self._step()
        before, self._seen = self._seen, step
        if step // self.every <= before // self.every:
            return  # no multiple of `every` reached
        if self.stop_after is not None and step > self.stop_after:
            return
        left = self._steps_left(batch)
        if left is not None and left < self.train_after:
            return  # the entries grown would train too few steps, or none
        records = regrow(
            self.model, self.data, fraction=self.fraction, loss=self.loss,
            batches=self.batches, batch_size=self.batch_size,
            start=(step // self.every - 1) * self.batches * self.batch_size,
        )  # fmt: skip
        entry = {"step": step}
        entry.update({r["path"]: len(r["grown"]) for r in records})
        self.history.append(entry)


# -- argument checks ------------------------------------------------------------
def _check_fraction(fraction) -> float:
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise TypeError(
            "`fraction` must be a number in (0, 1). "
            f"Received: fraction={_describe(fraction)}"
        )
    if not 0 < fraction < 1:
        raise ValueError(
            "`fraction` must be in (0, 1): the share of each layer's free entries "
            f"that is dropped and grown. Received: fraction={fraction!r}"
        )
    return float(fraction)


def _check_data(data):
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise TypeError(
            "`data` must be a tuple (x, y) of probe inputs and targets, from which "
            f"the growth score is computed. Received: data={_describe(data)}"
        )
    return _input_arrays(
        *data, "data", "`data` must hold as many rows of x as of y, at least one."
    )


def _loss_of(model, loss):
    loss = loss if loss is not None else getattr(model, "loss", None)
    if loss is None:
        raise ValueError(
            "`loss` is needed for the growth score: pass it, or compile the model "
            "with a loss. Received: loss=None"
        )
    if isinstance(loss, (dict, list, tuple)):
        raise ValueError(
            "`loss` must be one loss for the model's output: pass it explicitly "
            f"for a model with several outputs. Received: loss={_describe(loss)}"
        )
    try:
        return keras.losses.get(loss)
    except (ValueError, TypeError):
        raise ValueError(
            "`loss` must be a Keras loss: a name such as 'mse', a loss object "
            f"or a function. Received: loss={_describe(loss)}"
        ) from None


# -- the optimizer's state of one variable, entry by entry ------------------
def _updater(optimizer, variable):
    """The optimizer that updates ``variable`` (through Keras' wrappers)."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return _updater(optimizer.inner_optimizer, variable)
    multi = getattr(keras.optimizers, "MultiOptimizer", None)
    if multi is not None and isinstance(optimizer, multi):
        return _updater(_compat.multi_optimizer_part(optimizer, variable), variable)
    return optimizer


def _known(optimizer) -> bool:
    """Whether ``optimizer`` is one of the Keras optimizers of the table: that
    class itself, or the backend's own form of it that Keras makes (under
    PyTorch, ``keras.optimizers.Adam`` builds a ``torch_adam.Adam``), never a
    class of another package that shares the name."""
    cls = type(optimizer)
    public = getattr(keras.optimizers, cls.__name__, None)
    return (
        cls.__name__ in _compat.OPTIMIZER_SLOTS
        and isinstance(public, type)
        and issubclass(cls, public)
        and cls.__module__.split(".")[0] == "keras"
    )


def _check_optimizer(optimizer, variable) -> None:
    inner = _updater(optimizer, variable)
    if not _known(inner):
        raise ValueError(
            "`optimizer` must keep one state value per entry, which drop and grow "
            "resets for a grown entry: one of "
            f"{', '.join(sorted(_compat.OPTIMIZER_SLOTS))} (Keras' own classes, "
            "or these wrapped in `LossScaleOptimizer` or `MultiOptimizer`). "
            f"Received: optimizer={_describe(inner)}"
        )
    _compat.check_optimizer_slots()  # once: this Keras keeps the state we reset


def _slots(optimizer, variable):
    """``(state variable, fresh kind)`` for each per-entry state of ``variable``."""
    inner = _updater(optimizer, variable)
    _check_optimizer(optimizer, variable)
    if not inner.built:
        return []
    found = []
    for attribute, state, fresh in _compat.optimizer_slots(inner, variable):
        if tuple(state.shape) != tuple(variable.shape):  # pragma: no cover
            raise ValueError(
                f"{type(inner).__name__}'s state {attribute!r} of '{variable.path}' "
                f"has shape {tuple(state.shape)}, not one value per entry"
            )
        if fresh == "initial":
            fresh = float(inner.initial_accumulator_value)
        found.append((state, fresh))
    return found
