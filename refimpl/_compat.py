"""Every private Keras access refimpl makes, and the one protocol for shells.

refimpl follows Keras' public API wherever one exists. A few things it needs
have no public form; each sits here, behind a check against the running
version, so an upgrade that removes one fails here with a message that says
what is missing, never as a deep ``AttributeError`` in a user's model:

* :data:`KerasSaveable`, the base class Keras' saver walks (a constraint
  whose arrays go into the weights file);
* :func:`unlocked`, adding weights to a built layer (Keras' own
  ``enable_lora`` does the same);
* :func:`sub_layers`, every layer of a model at any depth;
* :func:`is_functional`, whether a model is a graph of layers that
  ``clone_model`` can rebuild (keras-hub's models subclass it).

The shell protocol: an object rebuilt from a config alone (``from_config``,
as ``load_model`` does before it loads the weights) has the right shapes but
none of the arrays that come with the weights. :func:`require_loaded` makes
every such object refuse to run with the same clear message until they are
loaded.
"""

from __future__ import annotations

import contextlib

import keras

__all__ = [
    "KERAS_FLOOR",
    "KerasSaveable",
    "Functional",
    "NotLoadedError",
    "is_functional",
    "register_under",
    "require_loaded",
    "sub_layers",
    "unlocked",
    "variable_layout",
]

#: The oldest Keras release refimpl is tested on (``pyproject.toml`` says the same).
KERAS_FLOOR = (3, 15)


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


if _version(keras.__version__) < KERAS_FLOOR:
    raise ImportError(
        f"refimpl needs Keras >= {'.'.join(map(str, KERAS_FLOOR))}, the oldest "
        f"release it is tested on. Received: keras {keras.__version__}. "
        "Upgrade with `pip install -U keras`."
    )


def _private(what: str, getter):
    try:
        return getter()
    except (AttributeError, ImportError) as err:  # pragma: no cover - upgrades
        raise ImportError(
            f"refimpl needs {what} from Keras {keras.__version__}, which no "
            "longer has it. Install a Keras release refimpl is tested on "
            f"(>= {'.'.join(map(str, KERAS_FLOOR))}) or a newer refimpl."
        ) from err


def _saveable():
    from keras.src.saving.keras_saveable import KerasSaveable

    return KerasSaveable


#: The class Keras' saver walks for ``save_own_variables``/``load_own_variables``.
KerasSaveable = _private("keras.src.saving.keras_saveable.KerasSaveable", _saveable)

#: What a :data:`KerasSaveable` that is not a layer tells the saver it is, so
#: that the saver walks no attributes of it (a loss has none to walk).
SAVEABLE_KIND = "Loss"


def _functional():
    from keras.src.models.functional import Functional

    return Functional


#: Keras' functional model class (``keras.Model(inputs, outputs)`` makes one).
Functional = _private("keras.src.models.functional.Functional", _functional)
for _name in ("_flatten_layers",):
    _private(f"Layer.{_name}", lambda n=_name: getattr(keras.layers.Layer, n))


def variable_layout(variable):
    """The ``keras.distribution.TensorLayout`` a variable was created with, or ``None``.

    Keras keeps it as ``Variable._layout`` and reads it the same way when an
    optimizer lays out its slots like their variable
    (``add_variable_from_reference``); there is no public accessor.
    """
    return getattr(variable, "_layout", None)


@contextlib.contextmanager
def unlocked(layer):
    """Let a built layer add weights (Keras locks its tracker after ``build``)."""
    tracker = getattr(layer, "_tracker", None)
    if tracker is None:
        raise ImportError(
            f"refimpl adds weights to built layers through `Layer._tracker`, "
            f"which Keras {keras.__version__} does not have."
        )
    tracker.unlock()
    try:
        yield
    finally:
        tracker.lock()


def sub_layers(model) -> list:
    """Every layer inside ``model``, at any depth, in Keras' order."""
    return list(model._flatten_layers(include_self=False, recursive=True))


def is_functional(model) -> bool:
    """Whether ``model`` is a graph of layers (``Functional`` or a subclass)."""
    return isinstance(model, (Functional, keras.Sequential))


def register_under(cls, name: str, loader) -> None:
    """Serialize ``cls`` under the registered ``name``; load that name with ``loader``.

    Many classes made at run time (one per plain class, such as
    ``PartialMultiHeadAttention``) share one registered name, so a fresh
    process that has not made them yet can load them: ``loader.from_config``
    rebuilds each from what its config says. Only public Keras calls:
    registering sets both directions, then the name is pointed at the loader.
    """
    keras.saving.register_keras_serializable(
        package=name.split(">")[0], name=name.split(">")[1]
    )(cls)
    keras.saving.get_custom_objects()[name] = loader


class NotLoadedError(ValueError):
    """An object rebuilt from a config was used before its weights were loaded."""


def require_loaded(what: str) -> NotLoadedError:
    """The one error of the shell protocol: ``raise require_loaded(...)``.

    Args:
        what: the object, as the user knows it (``"Layer 'dense'"``).
    """
    return NotLoadedError(
        f"{what} was rebuilt from a config without its weights, and its "
        "arrays (free positions, frozen values, masks) come with them. Load "
        "the model with `keras.saving.load_model`, or call `load_weights` "
        "(or `set_weights`) before using it."
    )
