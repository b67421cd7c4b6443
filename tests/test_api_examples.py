"""Every public function and class on the API page has a ``>>>`` example.

The public names are ``refimpl.__all__`` and the ``__all__`` (with the
``:members:``) of every module the page (``appendices/api.md``) documents with
``automodule``, and of the submodules ``refimpl.__all__`` names. The examples
themselves run as doctests (``pytest --doctest-modules refimpl``). Under JAX
or PyTorch the TensorFlow-level modules are not imported: their names are read
from the source and their tests skipped, as the rest of the TensorFlow level is.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import keras
import pytest

import refimpl

pytestmark = pytest.mark.every_backend

ROOT = Path(__file__).resolve().parents[1]
API_PAGE = ROOT / "appendices" / "api.md"
BACKENDS = ("tensorflow", "jax", "torch")
_DIRECTIVE = re.compile(r"\.\. automodule:: (\S+)\n((?:[ \t]+:[^\n]*\n)*)")


def documented_modules() -> dict[str, list[str]]:
    """Each module of the API page's ``automodule`` directives (and each
    submodule in ``refimpl.__all__``), with the members its directive names."""
    modules = {"refimpl": []}
    for module, options in _DIRECTIVE.findall(API_PAGE.read_text()):
        listed = re.search(r":members:(.*)", options)
        names = listed.group(1) if listed else ""
        modules[module] = [n.strip() for n in names.split(",") if n.strip()]
    for name in refimpl.__all__:
        if inspect.ismodule(getattr(refimpl, name)):
            modules.setdefault(f"refimpl.{name}", [])
    return modules


def _tensorflow_level(module: str) -> bool:
    return module == "refimpl.tf" or module.startswith("refimpl.tf.")


def _source_all(module: str) -> list[str]:
    """``__all__`` of a module, read from its source without importing it."""
    # (importlib.util.find_spec would import refimpl.tf, which refuses.)
    path = ROOT.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{module} has no __all__")


def public_names() -> list:
    """One ``pytest.param`` per public name: ``(module, name)``."""
    params = []
    skipped = keras.backend.backend() != "tensorflow"
    for module, members in documented_modules().items():
        tf_level = _tensorflow_level(module)
        if tf_level and skipped:
            names = _source_all(module)
        else:
            names = list(importlib.import_module(module).__all__)
        marks = [pytest.mark.tensorflow_only] if tf_level else []
        for name in dict.fromkeys(names + members):
            params.append(
                pytest.param(module, name, marks=marks, id=f"{module}.{name}")
            )
    return params


PUBLIC = public_names()


def test_the_page_is_read():
    modules = documented_modules()
    assert {"refimpl.masks", "refimpl.backend", "refimpl.tf.stop_gradient"} <= set(
        modules
    )
    assert "_is_container" in modules["refimpl.layers.partial"]
    assert len(PUBLIC) > 80


@pytest.mark.parametrize(("module", "name"), PUBLIC)
def test_public_name_has_an_example(module, name):
    obj = getattr(importlib.import_module(module), name)
    if not (inspect.isclass(obj) or inspect.isroutine(obj)):
        return  # a constant (a version, a threshold, a mapping) or a module
    doc = inspect.getdoc(obj) or ""
    assert ">>>" in doc, (
        f"{module}.{name} has no `>>>` example in its docstring: add a short one "
        "that runs as a doctest on every backend"
    )


def _backend_functions() -> list[str]:
    """The names refimpl.backend takes from the active backend's module
    (``read_now = _impl.read_now``)."""
    tree = ast.parse((ROOT / "refimpl" / "backend" / "__init__.py").read_text())
    return [
        node.targets[0].id
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Attribute)
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "_impl"
    ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_module_has_the_examples(backend):
    # refimpl.backend takes the active backend's functions, so each backend's
    # module documents each of them: the backends not installed here too.
    path = ROOT / "refimpl" / "backend" / f"_{backend}.py"
    docs = {
        node.name: ast.get_docstring(node) or ""
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.FunctionDef)
    }
    names = _backend_functions()
    assert all(callable(getattr(refimpl.backend, n)) for n in names)
    assert not set(names) & set(refimpl.backend.__all__)  # internal, not public
    assert len(names) > 5
    missing = [name for name in names if ">>>" not in docs.get(name, "")]
    assert not missing, f"{path.name}: no `>>>` example in {missing}"
