"""Collection rules shared by the tests and the doctests of both packages.

``refimpl/backend`` holds one module per Keras backend; only the active
backend's module is imported (and doctested). Under JAX or PyTorch only the
Keras-level code is collected: the test modules marked ``every_backend``
(``pytestmark``), less their ``tensorflow_only`` tests, and the doctests of
refimpl's Keras-level modules. Those carry the ``every_backend`` mark under
every backend, so ``pytest -m every_backend`` selects the same set anywhere.
"""

import importlib.util
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402

_BACKEND = keras.backend.backend()
_BACKENDS = ("tensorflow", "jax", "torch")

import pytest  # noqa: E402

_TENSORFLOW_LEVEL = (
    "refimpl/tf",
    "evidence",
)

collect_ignore = [f"refimpl/backend/_{b}.py" for b in _BACKENDS if b != _BACKEND]

collect_ignore_glob = [f"refimpl/backend/*_{b}.py" for b in _BACKENDS if b != _BACKEND]
if _BACKEND != "tensorflow":
    collect_ignore += list(_TENSORFLOW_LEVEL)
if importlib.util.find_spec("torch") is None:
    collect_ignore.append("evidence/torch_recipes.py")


def pytest_ignore_collect(collection_path: Path, config):
    # A test module that is not Keras-level may import TensorFlow, which a
    # JAX-only machine does not have: under another backend it is not even
    # imported.
    if _BACKEND == "tensorflow" or collection_path.suffix != ".py":
        return None
    if collection_path.name.startswith("test_"):
        if "pytest.mark.every_backend" not in collection_path.read_text():
            return True
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    every = pytest.mark.every_backend
    skip = pytest.mark.skip(reason=f"TensorFlow-level; Keras runs on {_BACKEND}")
    for item in items:
        if isinstance(item, pytest.DoctestItem) and str(item.path).startswith(
            str(Path(__file__).parent / "refimpl")
        ):
            item.add_marker(every)  # the TensorFlow-level modules are ignored
        if _BACKEND != "tensorflow" and (
            "every_backend" not in item.keywords or "tensorflow_only" in item.keywords
        ):
            item.add_marker(skip)
