"""Drop and grow: the masks change during training, and stay exact.

One update (``regrow``) drops the free entries that moved least (they read
their base value again) and grows as many where the squared gradient on the
base is largest, among the entries not active before; a grown entry starts
from its base value with fresh optimizer state, and ``k`` and the optimizer's
state sizes stay. The callback does it every ``every`` steps inside ``fit``;
entries never chosen keep their bits under AdamW's weight decay, on every
backend; the current positions save and load (``.keras`` and the entries
file), and training continues from them.
"""

import keras
import numpy as np
import pytest

import refimpl
from refimpl import selection
from refimpl.callbacks import regrow

pytestmark = pytest.mark.every_backend

RNG = np.random.default_rng(0)
X = RNG.normal(size=(32, 6)).astype("float32")
Y = RNG.normal(size=(32, 4)).astype("float32")


def _numpy(value):
    return np.asarray(keras.ops.convert_to_numpy(value))


def _model(mode="delta", k=6, optimizer=None):
    keras.utils.set_random_seed(0)
    plain = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, name="d")])
    mask = selection.random_mask((6, 4), k=k, seed=0)
    model = refimpl.partialize(plain, {"d": mask}, mode=mode)
    model.compile(optimizer or keras.optimizers.AdamW(0.05, weight_decay=0.5), "mse")
    return plain, model


class _Record(keras.callbacks.Callback):
    """Appends layer ``d``'s mask to ``masks`` after every step."""

    def __init__(self, masks):
        super().__init__()
        self.masks = masks

    def on_train_batch_end(self, batch, logs=None):
        self.masks.append(self.model.get_layer("d").partial_weight.mask)


def _state(model, name):
    layer = model.get_layer("d")
    index = model.optimizer._get_variable_index(layer.partial_weight.free)
    return _numpy(getattr(model.optimizer, name)[index])


@pytest.mark.parametrize("mode", ["delta", "select"])
def test_one_update_drops_the_least_moved_and_grows_the_largest_gradient(mode):
    plain, model = _model(mode)
    model.fit(X, Y, batch_size=8, epochs=2, verbose=0)
    layer = model.get_layer("d")
    base = _numpy(layer.partial_weight.base).ravel()
    kernel = _numpy(layer.kernel).ravel()
    positions = np.sort(np.flatnonzero(layer.partial_weight.mask))
    change = np.abs(kernel[positions] - base[positions])
    # The score, by hand: the squared gradient of the batch loss on the plain
    # kernel holding the current values (the base's gradient off the mask).
    probe = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4)])
    probe.set_weights([kernel.reshape(6, 4), _numpy(layer.bias)])
    score, _ = selection.fisher_scores(
        probe, X[:8], Y[:8], loss="mse", batch_size=8, batches=1
    ).values()
    score = score.ravel().copy()
    score[positions] = -np.inf
    moments = dict(
        zip(
            positions,
            _state(model, "_momentums").ravel()[
                positions if mode == "select" else slice(None)
            ],
        )
    )

    [record] = regrow(model, (X, Y), fraction=0.5, batch_size=8)

    assert len(record["dropped"]) == len(record["grown"]) == 3
    np.testing.assert_array_equal(
        record["dropped"], np.sort(positions[np.argsort(change, kind="stable")[:3]])
    )
    np.testing.assert_array_equal(
        record["grown"], np.sort(np.argsort(-score, kind="stable")[:3])
    )
    after = _numpy(layer.kernel).ravel()
    new_positions = np.flatnonzero(layer.partial_weight.mask)
    assert len(new_positions) == layer.partial_weight.num_free == 6
    np.testing.assert_array_equal(
        _numpy(layer.partial_weight.positions), new_positions
    )  # sorted
    # Dropped entries read their base again; grown ones start from it.
    np.testing.assert_array_equal(after[record["dropped"]], base[record["dropped"]])
    np.testing.assert_array_equal(after[record["grown"]], base[record["grown"]])
    kept = np.setdiff1d(positions, record["dropped"])
    np.testing.assert_array_equal(after[kept], kernel[kept])
    untouched = np.setdiff1d(np.arange(24), np.union1d(positions, record["grown"]))
    np.testing.assert_array_equal(after[untouched], base[untouched])
    # Fresh moments for the grown entries, the kept ones moved along.
    m = _state(model, "_momentums").ravel()
    v = _state(model, "_velocities").ravel()
    slot = {p: (p if mode == "select" else i) for i, p in enumerate(new_positions)}
    for p in record["grown"]:
        assert m[slot[p]] == 0 and v[slot[p]] == 0
    for p in kept:
        assert m[slot[p]] == moments[p]
    model.fit(X, Y, batch_size=8, epochs=1, verbose=0)  # the traced step follows
    assert refimpl.testing.moved(after, _numpy(layer.kernel).ravel())[
        record["grown"]
    ].all()


def test_fit_with_the_callback_keeps_never_chosen_entries_and_k():
    plain, model = _model()
    layer = model.get_layer("d")
    base = _numpy(layer.partial_weight.base)
    chosen = [layer.partial_weight.mask]

    grow = refimpl.DropAndGrow((X, Y), every=3, fraction=0.34, batch_size=8)
    model.fit(
        X, Y, batch_size=8, epochs=3, verbose=0, callbacks=[grow, _Record(chosen)]
    )
    # 12 steps: none at step 12, the last, whose grown entries could not train.
    assert [h["step"] for h in grow.history] == [3, 6, 9]
    [weight] = refimpl.partial.partial_weights(model)
    assert all(h[weight.owner.path] == 2 for h in grow.history)
    assert all(mask.sum() == 6 for mask in chosen)
    ever = np.logical_or.reduce(chosen)
    assert ever.sum() > 6  # the mask did change
    refimpl.testing.assert_frozen(
        base, layer.kernel, ever
    )  # AdamW decays only free values
    assert refimpl.testing.count_optimizer_state(model.optimizer) == 2 * 6


OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(0.05, weight_decay=0.1),
    "adamw": lambda: keras.optimizers.AdamW(0.05, weight_decay=0.5),
    "nadam": lambda: keras.optimizers.Nadam(0.05, weight_decay=0.1),
    "adamax": lambda: keras.optimizers.Adamax(0.05, weight_decay=0.1),
    "lamb": lambda: keras.optimizers.Lamb(0.05, weight_decay=0.1),
    "lion": lambda: keras.optimizers.Lion(0.01, weight_decay=0.1),
    "sgd": lambda: keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=0.1),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.01, momentum=0.5, weight_decay=0.1),
    "adadelta": lambda: keras.optimizers.Adadelta(1.0, weight_decay=0.1),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1, weight_decay=0.1),
    "ftrl": lambda: keras.optimizers.Ftrl(0.1, l2_regularization_strength=0.1),
    "loss_scale": lambda: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adam(0.05)
    ),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_never_chosen_entries_keep_their_bits_under_every_optimizer(name):
    _, model = _model(optimizer=OPTIMIZERS[name]())
    layer = model.get_layer("d")
    base = _numpy(layer.partial_weight.base)
    masks = [layer.partial_weight.mask]

    grow = refimpl.DropAndGrow((X, Y), every=2, fraction=0.5, batch_size=8)
    model.fit(X, Y, batch_size=8, epochs=2, verbose=0, callbacks=[grow, _Record(masks)])
    ever = np.logical_or.reduce(masks)
    assert len(grow.history) == 3 and ever.sum() > 6  # steps 2, 4, 6 of 8
    refimpl.testing.assert_frozen(base, layer.kernel, ever)
    np.testing.assert_array_equal(_numpy(layer.partial_weight.base), base)


def test_stop_after_ends_the_updates():
    _, model = _model()
    grow = refimpl.DropAndGrow((X, Y), every=2, fraction=0.5, stop_after=4)
    model.fit(X, Y, batch_size=4, epochs=2, verbose=0, callbacks=[grow])
    assert [h["step"] for h in grow.history] == [2, 4]


@pytest.mark.parametrize(
    ("optimizer", "attribute", "fresh"),
    [
        (keras.optimizers.SGD(0.1, momentum=0.9), "momentums", 0.0),
        (
            keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.25),
            "_accumulators",
            0.25,
        ),
        (keras.optimizers.RMSprop(0.01, momentum=0.5), "_momentums", 0.0),
    ],
    ids=["sgd", "adagrad", "rmsprop"],
)
def test_every_per_entry_optimizer_state_starts_fresh(optimizer, attribute, fresh):
    _, model = _model(optimizer=optimizer)
    model.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    [record] = regrow(model, (X, Y), fraction=0.5)
    state = _state(model, attribute)
    positions = _numpy(model.get_layer("d").partial_weight.positions)
    grown = np.isin(positions, record["grown"])
    np.testing.assert_array_equal(state[grown], fresh)
    assert (state[~grown] != fresh).all()


def test_a_moving_average_of_the_weights_takes_the_grown_entries_value():
    _, model = _model(optimizer=keras.optimizers.Adam(0.05, use_ema=True))
    model.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    [record] = regrow(model, (X, Y), fraction=0.5)
    layer = model.get_layer("d")
    average = _state(model, "_model_variables_moving_average")
    positions = _numpy(layer.partial_weight.positions)
    grown = np.isin(positions, record["grown"])
    base = _numpy(layer.partial_weight.base).ravel()
    np.testing.assert_array_equal(average[grown], base[positions[grown]])
    assert (average[~grown] != base[positions[~grown]]).all()


@pytest.mark.slow
def test_the_current_positions_save_load_and_train_on(tmp_path):
    plain, model = _model()
    grow = refimpl.DropAndGrow((X, Y), every=2, fraction=0.5, batch_size=8)
    model.fit(X, Y, batch_size=8, epochs=1, verbose=0, callbacks=[grow])
    layer = model.get_layer("d")
    mask = layer.partial_weight.mask
    assert (mask != selection.random_mask((6, 4), k=6, seed=0)).any()
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(loaded.get_layer("d").partial_weight.mask, mask)
    np.testing.assert_array_equal(
        _numpy(loaded.predict(X, verbose=0)), _numpy(model.predict(X, verbose=0))
    )
    # Both continue alike (Adam's state travels in the file).
    for m in (model, loaded):
        m.fit(X, Y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    np.testing.assert_array_equal(
        _numpy(loaded.get_layer("d").kernel), _numpy(layer.kernel)
    )
    # The entries file holds the current positions.
    refimpl.save_partial_weights(model, tmp_path / "e.npz")
    keras.utils.set_random_seed(0)
    fresh = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, name="d")])
    fresh.set_weights(plain.get_weights())
    refimpl.load_partial_weights(fresh, tmp_path / "e.npz")
    np.testing.assert_array_equal(
        _numpy(fresh.predict(X, verbose=0)), _numpy(model.predict(X, verbose=0))
    )


def test_evaluate_inside_fit_is_fine_and_alone_is_refused():
    _, model = _model()
    grow = refimpl.DropAndGrow((X, Y), every=2, fraction=0.5)
    model.fit(
        X,
        Y,
        batch_size=8,
        epochs=1,
        verbose=0,
        validation_data=(X, Y),
        callbacks=[grow],
    )
    assert grow.history
    with pytest.raises(ValueError, match="`callbacks` of `evaluate`"):
        model.evaluate(X, Y, verbose=0, callbacks=[grow])
