"""Drop and grow: when the updates fall, and what they refuse.

No update falls in a fit's last ``train_after`` steps (``every`` by
default), so the final mask holds no entry that never trained; the steps are
the optimizer's, so a second ``fit``, or a ``fit`` of a reloaded model,
continues the schedule. An unbuilt model is a ``ValueError``. The optimizer
state a grown entry gets fresh sits in private Keras attributes: a Keras that
renamed one fails loudly, naming the optimizer and the attribute, and an
optimizer drop and grow does not know is refused.
"""

import keras
import numpy as np
import pytest

import refimpl
from refimpl import _compat
from refimpl.callbacks import regrow

pytestmark = pytest.mark.every_backend

X, Y = np.ones((8, 4), "float32"), np.zeros((8, 3), "float32")


def _numpy(value):
    return np.asarray(keras.ops.convert_to_numpy(value))


def _model(optimizer=None):
    """The docstring's setup: one Dense(3) on 4 inputs, 3 free entries."""
    keras.utils.set_random_seed(0)
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="d")])
    model = refimpl.partialize(plain, {"d": np.eye(4, 3, dtype=bool)})
    model.compile(optimizer or keras.optimizers.Adam(0.01), "mse")
    return model


def _steps(grow):
    return [h["step"] for h in grow.history]


def _allowed(total, every, train_after):
    """The steps the documented rule updates at, in a fit of ``total`` steps."""
    return [s for s in range(every, total + 1, every) if total - s >= train_after]


# -- no update the last steps could not train ---------------------------------


def test_no_update_falls_in_the_last_every_steps_so_every_final_entry_trained():
    # The docstring's setup (4 steps, every=2), with a learning rate that
    # decays to 0 by the end.
    schedule = keras.optimizers.schedules.PolynomialDecay(0.01, 4, 0.0)
    model = _model(keras.optimizers.Adam(schedule))
    layer = model.get_layer("d")
    base = _numpy(layer.partial_weight.base)
    grow = refimpl.DropAndGrow((X, Y), every=2, fraction=0.34)
    model.fit(X, Y, batch_size=2, epochs=1, verbose=0, callbacks=[grow])
    assert _steps(grow) == _allowed(4, 2, 2)
    # Every entry of the final mask trained: none reads its base value.
    final = layer.partial_weight.mask
    moved = refimpl.testing.moved(base, _numpy(layer.kernel))
    np.testing.assert_array_equal(moved[final], True)


@pytest.mark.parametrize(
    ("every", "train_after", "epochs"), [(3, None, 1), (2, 3, 2), (4, 1, 3)]
)
def test_no_update_falls_in_the_last_train_after_steps(every, train_after, epochs):
    model = _model()
    grow = refimpl.DropAndGrow((X, Y), every=every, fraction=0.34,
                               train_after=train_after)  # fmt: skip
    model.fit(X, Y, batch_size=1, epochs=epochs, verbose=0, callbacks=[grow])
    total = 8 * epochs
    assert _steps(grow) == _allowed(total, every, train_after or every)
    assert grow.history  # the rule leaves some updates


def test_train_after_zero_lets_the_final_step_update():
    model = _model()
    grow = refimpl.DropAndGrow((X, Y), every=2, fraction=0.34, train_after=0)
    model.fit(X, Y, batch_size=2, epochs=1, verbose=0, callbacks=[grow])
    assert _steps(grow) == [2, 4]


@pytest.mark.parametrize(
    ("value", "error"), [(-1, ValueError), (1.5, TypeError), (True, TypeError)]
)
def test_a_bad_train_after_is_refused(value, error):
    with pytest.raises(
        error,
        match=rf"`train_after` must be (an int|at least 0)\. "
        rf"Received: train_after={value}",
    ):
        refimpl.DropAndGrow((X, Y), train_after=value)


@pytest.mark.skipif(
    keras.backend.backend() == "torch",
    reason="Keras refuses steps_per_execution > 1 on the PyTorch backend",
)
def test_steps_per_execution_updates_after_the_execution_that_reaches_a_multiple():
    model = _model()
    model.compile(keras.optimizers.Adam(0.01), "mse", steps_per_execution=2)
    grow = refimpl.DropAndGrow((X, Y), every=3, fraction=0.34)
    model.fit(X, Y, batch_size=1, epochs=1, verbose=0, callbacks=[grow])
    # Executions end at steps 2, 4, 6, 8: step 3 is reached in the one that
    # ends at 4; step 6 leaves 2 steps, fewer than every=3.
    assert _steps(grow) == [4]


def _unknown_length():
    """Four batches, a length ``fit`` cannot know before the end."""
    for start in range(0, 8, 2):
        yield X[start : start + 2], Y[start : start + 2]


def test_data_of_unknown_length_is_refused_unless_the_end_is_known():
    model = _model()
    grow = refimpl.DropAndGrow((X, Y), every=2, fraction=0.34)
    with pytest.raises(ValueError, match="steps_per_epoch.*Received: steps=None"):
        model.fit(_unknown_length(), verbose=0, shuffle=False, callbacks=[grow])
    model.fit(
        _unknown_length(), steps_per_epoch=4, verbose=0, shuffle=False, callbacks=[grow]
    )
    assert _steps(grow) == [2]


# -- a resumed fit continues the schedule -------------------------------------


def test_a_second_fit_continues_the_schedule():
    model = _model()
    grow = refimpl.DropAndGrow((X, Y), every=2, fraction=0.34)
    model.fit(X, Y, batch_size=2, epochs=1, verbose=0, callbacks=[grow])
    model.fit(X, Y, batch_size=2, epochs=1, verbose=0, callbacks=[grow])
    # Steps 1-4, then 5-8: 4 and 8 each end a fit.
    assert _steps(grow) == [2, 6]


def test_a_reloaded_model_continues_the_schedule_and_stop_after(tmp_path):
    model = _model()
    first = refimpl.DropAndGrow((X, Y), every=2, fraction=0.34)
    model.fit(X, Y, batch_size=2, epochs=1, verbose=0, callbacks=[first])
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    again = refimpl.DropAndGrow((X, Y), every=2, fraction=0.34)
    loaded.fit(X, Y, batch_size=2, epochs=2, verbose=0, callbacks=[again])
    # Steps 5-12 of the training: 6, 8 and 10 leave at least 2 steps.
    assert _steps(first) == [2] and _steps(again) == [6, 8, 10]
    # stop_after counts from the start of training too.
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    stopped = refimpl.DropAndGrow((X, Y), every=2, fraction=0.34, stop_after=7)
    loaded.fit(X, Y, batch_size=2, epochs=2, verbose=0, callbacks=[stopped])
    assert _steps(stopped) == [6]


# -- an unbuilt model ----------------------------------------------------------


def _unbuilt():
    model = keras.Sequential([refimpl.PartialDense(3, np.eye(4, 3, dtype=bool))])
    assert not model.built
    return model


def test_an_unbuilt_model_is_a_value_error_in_regrow_and_the_callback():
    with pytest.raises(ValueError, match="`model` must be built.*not built"):
        regrow(_unbuilt(), (X, Y), fraction=0.5, loss="mse")
    grow = refimpl.DropAndGrow((X, Y), every=2, fraction=0.5, loss="mse")
    grow.set_model(_unbuilt())
    with pytest.raises(ValueError, match="`model` must be built.*not built"):
        grow.on_train_begin()


# -- the private Keras attributes of the optimizer state -----------------------


@pytest.fixture
def fresh_check():
    """The slot check runs once per process: let each test run it again."""
    check = _compat.check_optimizer_slots
    check.cache_clear()
    yield
    check.cache_clear()


def test_the_optimizer_slot_check_passes_on_the_installed_keras(fresh_check):
    _compat.check_optimizer_slots()
    # And each slot it names is found for a model's variable, settings on.
    variable = keras.Variable(np.ones((2, 3), "float32"))
    settings = {"amsgrad": True, "momentum": 0.5, "centered": True, "use_ema": True}
    for name, table in _compat.OPTIMIZER_SLOTS.items():
        cls = getattr(keras.optimizers, name)
        wanted = {s for _, s in table.values() if s} | {"use_ema"}
        optimizer = cls(**{s: settings[s] for s in wanted})
        optimizer.build([variable])
        found = [a for a, _, _ in _compat.optimizer_slots(optimizer, variable)]
        assert found == [*table, "_model_variables_moving_average"], name


def _rename_adam_momentums(monkeypatch):
    """Make Keras' Adam keep its first moments under another name."""
    build = keras.optimizers.Adam.build

    def renamed(self, variables):
        build(self, variables)
        self.__dict__["_first_moments"] = self.__dict__.pop("_momentums")

    monkeypatch.setattr(keras.optimizers.Adam, "build", renamed)


def test_a_renamed_slot_fails_the_check_naming_the_optimizer_and_attribute(
    monkeypatch, fresh_check
):
    _rename_adam_momentums(monkeypatch)
    with pytest.raises(ImportError, match=r"`Adam\._momentums` from Keras"):
        _compat.check_optimizer_slots()


def test_a_table_entry_keras_lacks_fails_the_check(monkeypatch, fresh_check):
    monkeypatch.setitem(_compat.OPTIMIZER_SLOTS, "Lion", {"_momenta": ("zero", None)})
    with pytest.raises(ImportError, match=r"`Lion\._momenta` from Keras"):
        _compat.check_optimizer_slots()


def test_a_renamed_slot_is_never_silently_left_unreset(monkeypatch, fresh_check):
    model = _model()
    model.fit(X, Y, batch_size=2, epochs=1, verbose=0)  # builds Adam first
    _rename_adam_momentums(monkeypatch)
    model.optimizer.__dict__["_first_moments"] = model.optimizer.__dict__.pop(
        "_momentums"
    )
    _compat.check_optimizer_slots.cache_clear()
    with pytest.raises(ImportError, match=r"`Adam\._momentums`"):
        regrow(model, (X, Y), fraction=0.34)
    # Even past the check (a Keras whose fresh Adam still has it).
    monkeypatch.setattr(_compat, "check_optimizer_slots", lambda: None)
    with pytest.raises(ImportError, match=r"`Adam\._momentums`"):
        regrow(model, (X, Y), fraction=0.34)


class Adam(keras.optimizers.SGD):
    """A user's own optimizer that shares a Keras optimizer's name."""


class TunedAdam(keras.optimizers.Adam):
    """A user's subclass of a Keras optimizer, whose state it may extend."""


UNKNOWN = {
    "adafactor": lambda: keras.optimizers.Adafactor(),
    "a_subclass": lambda: TunedAdam(0.01),
    "same_name_as_keras": lambda: Adam(0.01, momentum=0.9),
    "wrapped_unknown": lambda: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adafactor()
    ),
}


@pytest.mark.parametrize("name", list(UNKNOWN))
def test_an_optimizer_drop_and_grow_does_not_know_is_refused(name):
    model = _model(UNKNOWN[name]())
    grow = refimpl.DropAndGrow((X, Y), every=2, fraction=0.34)
    with pytest.raises(ValueError, match="`optimizer` must keep one state value"):
        model.fit(X, Y, batch_size=2, epochs=1, verbose=0, callbacks=[grow])
    model.fit(X, Y, batch_size=2, epochs=1, verbose=0)  # built, then alone
    with pytest.raises(ValueError, match="`optimizer` must keep one state value"):
        regrow(model, (X, Y), fraction=0.34)


def test_a_multi_optimizer_is_looked_through():
    adam = keras.optimizers.Adam(0.01)
    model = _model(keras.optimizers.MultiOptimizer(lambda variable: adam))
    model.fit(X, Y, batch_size=2, epochs=1, verbose=0)
    layer = model.get_layer("d")
    [record] = regrow(model, (X, Y), fraction=0.34)
    positions = _numpy(layer.partial_weight.positions)
    grown = np.isin(positions, record["grown"])
    state = _compat.optimizer_slots(adam, layer.partial_weight.free)
    for attribute, value, _ in state:
        np.testing.assert_array_equal(_numpy(value)[grown], 0.0, err_msg=attribute)
        assert (_numpy(value)[~grown] != 0).all(), attribute


def test_an_unknown_loss_is_refused_when_the_callback_is_made():
    with pytest.raises(ValueError, match="`loss` must be a Keras loss.*nope"):
        refimpl.DropAndGrow((X, Y), loss="nope")
