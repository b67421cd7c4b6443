"""Every public name is on the API page, and every public function and class
there has a ``>>>`` example.

The public names are ``refimpl.__all__`` and the ``__all__`` (with the
``:members:``) of every module the page (``appendices/api.md``) documents with
``automodule``, and of the submodules ``refimpl.__all__`` names. A module's
directive with ``:members:`` and no names documents its whole ``__all__``; a
module that only gathers names from its submodules (``refimpl``,
``refimpl.layers``, ``refimpl.tf``) has no ``:members:``, and each of its names
must be documented in the module it comes from. The examples themselves run as
doctests (``pytest --doctest-modules refimpl``). Under JAX or PyTorch the
TensorFlow-level modules are not imported: their names are read from the
source and their tests skipped, as the rest of the TensorFlow level is.
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
# A class documented on its own, with the signature the page writes for it
# (a Keras layer's own signature reads ``(*args, **kwargs)`` to autodoc).
_CLASS = re.compile(r"^\.\. autoclass:: ([\w.]+)(?:\((.*)\))?$", re.M)


def _directives() -> dict[str, str]:
    """Each module of the API page's ``automodule`` directives, with its
    options' text."""
    return dict(_DIRECTIVE.findall(API_PAGE.read_text()))


def _names(options: str, option: str) -> list[str] | None:
    """The names an option lists (``[]`` for none), or None without it."""
    listed = re.search(rf":{option}:(.*)", options)
    if listed is None:
        return None
    return [n.strip() for n in listed.group(1).split(",") if n.strip()]


def documented_modules() -> dict[str, list[str]]:
    """Each module of the API page's ``automodule`` directives (and each
    submodule in ``refimpl.__all__``), with the members its directive names."""
    modules = {"refimpl": []}
    for module, options in _directives().items():
        modules[module] = _names(options, "members") or []
    for name in refimpl.__all__:
        if inspect.ismodule(getattr(refimpl, name)):
            modules.setdefault(f"refimpl.{name}", [])
    return modules


def _module_names(module: str) -> list[str]:
    if _tensorflow_level(module) and keras.backend.backend() != "tensorflow":
        return _source_all(module)
    return list(importlib.import_module(module).__all__)


def documented_names() -> set[tuple[str, str]]:
    """``(module, name)`` of every name an ``automodule`` directive of the page
    documents: its ``__all__`` for ``:members:`` alone, else the names listed."""
    found = set()
    for module, options in _directives().items():
        members = _names(options, "members")
        if members is None:
            continue
        excluded = set(_names(options, "exclude-members") or [])
        for name in members or _module_names(module):
            if name not in excluded:
                found.add((module, name))
    for path, _ in _CLASS.findall(API_PAGE.read_text()):
        found.add(tuple(path.rsplit(".", 1)))
    return found


def _home(module: str, name: str) -> tuple[str, str]:
    """Where a name is defined: ``(module, qualified name)`` of a function or
    class; ``(module, name)`` of a constant, or of a module not imported here."""
    if _tensorflow_level(module) and keras.backend.backend() != "tensorflow":
        return module, name
    obj = getattr(importlib.import_module(module), name)
    if inspect.isclass(obj) or inspect.isroutine(obj):
        return obj.__module__, obj.__qualname__
    return module, name


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
    for module, members in documented_modules().items():
        tf_level = _tensorflow_level(module)
        names = _module_names(module)
        marks = [pytest.mark.tensorflow_only] if tf_level else []
        for name in dict.fromkeys(names + members):
            params.append(
                pytest.param(module, name, marks=marks, id=f"{module}.{name}")
            )
    return params


PUBLIC = public_names()


MODULES = {
    "refimpl",
    "refimpl.partial",
    "refimpl.variable",
    "refimpl.layers",
    "refimpl.layers.partial",
    "refimpl.layers.structured_dense",
    "refimpl.convert",
    "refimpl.trained_entries",
    "refimpl.quantized",
    "refimpl.adapters",
    "refimpl.optimizers",
    "refimpl.constraints",
    "refimpl.callbacks",
    "refimpl.masks",
    "refimpl.ops",
    "refimpl.structured",
    "refimpl.selection",
    "refimpl.testing",
    "refimpl.plotting",
    "refimpl.backend",
    "refimpl.tf",
    "refimpl.tf.stop_gradient",
    "refimpl.tf.scipy_optimize",
}


def test_the_page_is_read():
    assert set(documented_modules()) == MODULES
    names = documented_names()
    assert ("refimpl.layers.partial", "enable_partial") in names
    assert ("refimpl.partial", "partial_weights") in names
    assert ("refimpl.layers.partial", "PartialDense") in names  # an autoclass
    assert ("refimpl", "partialize") not in names  # documented in its module
    assert len(PUBLIC) > 80


@pytest.mark.parametrize(("module", "name"), PUBLIC)
def test_public_name_is_on_the_page(module, name):
    documented = documented_names()
    if (module, name) in documented:
        return
    if _tensorflow_level(module) and keras.backend.backend() != "tensorflow":
        assert any(m.startswith(module + ".") and n == name for m, n in documented), (
            f"{module}.{name} is documented nowhere on the API page"
        )
        return
    homes = {_home(m, n) for m, n in documented}
    assert _home(module, name) in homes, (
        f"{module}.{name} is not on the API page: give its module's automodule "
        "`:members:` (it documents the module's __all__), or document the "
        "module it comes from"
    )


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


# Arguments a class takes only when Keras loads it from a config.
_LOADER_ONLY = {"shape", "num_free", "auto"}


def _written_signatures() -> list:
    return [
        pytest.param(path, written, id=path)
        for path, written in _CLASS.findall(API_PAGE.read_text())
        if written
    ]


@pytest.mark.parametrize(("path", "written"), _written_signatures())
def test_a_written_signature_is_the_class_own(path, written):
    module, name = path.rsplit(".", 1)
    real = inspect.signature(getattr(importlib.import_module(module), name))
    params = ast.parse(f"def f({written}): pass").body[0].args
    kinds = {a.arg: "positional" for a in params.args}
    kinds |= {a.arg: "keyword" for a in params.kwonlyargs}
    kinds |= {params.kwarg.arg: "kwargs"} if params.kwarg else {}
    defaults = dict(zip([a.arg for a in params.args][::-1], params.defaults[::-1]))
    defaults |= {
        a.arg: d for a, d in zip(params.kwonlyargs, params.kw_defaults) if d is not None
    }
    kind_of = {
        inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
        inspect.Parameter.KEYWORD_ONLY: "keyword",
        inspect.Parameter.VAR_KEYWORD: "kwargs",
    }
    real_kinds = {p.name: kind_of.get(p.kind) for p in real.parameters.values()}
    assert {n: real_kinds.get(n) for n in kinds} == kinds, (
        f"api.md writes {name}({written}), but the class takes {real}"
    )
    assert set(real_kinds) - set(kinds) <= _LOADER_ONLY, (
        f"api.md leaves out arguments of {name}{real}"
    )
    for arg, default in defaults.items():
        assert real.parameters[arg].default == ast.literal_eval(default), (
            f"api.md gives {name}'s `{arg}` another default than {real}"
        )


def _backend_pieces() -> dict[str, str | None]:
    """The pieces refimpl.backend takes from the active backend's module, each
    with its default in ``refimpl/backend/__init__.py`` (``None``: every
    backend's module must have it): ``read_now = getattr(_impl, "read_now",
    _read_now)``, or a function that calls ``_impl.batch_gradients``."""
    tree = ast.parse((ROOT / "refimpl" / "backend" / "__init__.py").read_text())
    pieces = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id == "getattr"
            and isinstance(node.value.args[0], ast.Name)
            and node.value.args[0].id == "_impl"
        ):
            pieces[node.targets[0].id] = node.value.args[2].id
        elif isinstance(node, ast.FunctionDef) and any(
            isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name)
            and n.value.id == "_impl"
            for n in ast.walk(node)
        ):
            pieces[node.name] = None
    return pieces


def _docstrings(path: Path) -> dict[str, str]:
    return {
        node.name: ast.get_docstring(node) or ""
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.FunctionDef)
    }


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_module_has_the_examples(backend):
    # refimpl.backend takes the active backend's functions, or a default where
    # a backend does not differ, so each backend's module documents the ones
    # it has (the backends not installed here too), and each default its own.
    path = ROOT / "refimpl" / "backend" / f"_{backend}.py"
    docs = _docstrings(path)
    defaults = _docstrings(ROOT / "refimpl" / "backend" / "__init__.py")
    pieces = _backend_pieces()
    assert all(callable(getattr(refimpl.backend, n)) for n in pieces)
    assert not set(pieces) & set(refimpl.backend.__all__)  # internal, not public
    assert len(pieces) > 5
    missing = [n for n, default in pieces.items() if default is None and n not in docs]
    assert not missing, f"{path.name} has no {missing}"
    # A piece's example: in the backend's module, or in refimpl.backend's
    # default, or, for a function every backend has, in refimpl.backend's
    # function that calls it.
    no_example = [
        name
        for name, default in pieces.items()
        if ">>>" not in docs.get(name, "")
        and ">>>" not in defaults[name if default is None else default]
    ]
    assert not no_example, f"{path.name}: no `>>>` example in {no_example}"
