"""What chapters/08_backends.ipynb states without a cell of its own.

The page runs the exact optax recipes; the ways that are not exact, which it
names in a sentence, are checked here. It shows a PyTorch recipe it cannot run
(PyTorch is not among the book's requirements); the test below runs that very
code block, read from the page, wherever PyTorch is installed. The page says
that its fine-tune runs under ``KERAS_BACKEND=torch`` too: a test runs the
page's own cells in a process on that backend. ``make backends`` installs
PyTorch and sets ``REFIMPL_TORCH_TESTS=required``, where a missing PyTorch
fails these tests instead of skipping them.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "chapters" / "08_backends.ipynb"


def _torch():
    if os.environ.get("REFIMPL_TORCH_TESTS") == "required":
        import torch

        return torch
    return pytest.importorskip("torch", reason="PyTorch is not installed")


def _setup():
    jnp = pytest.importorskip("jax.numpy")
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(64, 6)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(64, 4)), jnp.float32)
    params = {"w": jnp.asarray(rng.normal(size=(6, 4)), jnp.float32), "b": jnp.ones(4)}
    trainable = np.zeros((6, 4), bool)
    trainable[:2] = True

    def loss(p):
        return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)

    return params, trainable, loss


def _train(optimizer, params, loss, steps=5):
    jax = pytest.importorskip("jax")
    optax = pytest.importorskip("optax")
    state = optimizer.init(params)
    for _ in range(steps):
        updates, state = optimizer.update(jax.grad(loss)(params), state, params)
        params = optax.apply_updates(params, updates)
    return params


def test_optax_zeroing_the_gradient_before_adamw_moves_every_frozen_entry():
    optax = pytest.importorskip("optax")
    jnp = pytest.importorskip("jax.numpy")
    params, trainable, loss = _setup()
    zero_grads = optax.stateless(
        lambda g, _: {"w": jnp.where(trainable, g["w"], 0.0), "b": g["b"]}
    )
    after = _train(
        optax.chain(zero_grads, optax.adamw(0.05, weight_decay=0.1)), params, loss
    )
    moved = np.asarray(after["w"]) != np.asarray(params["w"])
    assert moved[~trainable].all()


def test_optax_masked_with_false_passes_the_raw_gradient_through():
    optax = pytest.importorskip("optax")
    params, _, loss = _setup()
    masked = optax.masked(optax.adamw(0.05, weight_decay=0.1), {"w": True, "b": False})
    after = _train(masked, params, loss)
    assert (np.asarray(after["b"]) != np.asarray(params["b"])).all()


def test_optax_multi_transform_with_set_to_zero_freezes_a_whole_array():
    optax = pytest.importorskip("optax")
    params, _, loss = _setup()
    labelled = optax.multi_transform(
        {"train": optax.adamw(0.05, weight_decay=0.1), "freeze": optax.set_to_zero()},
        {"w": "train", "b": "freeze"},
    )
    after = _train(labelled, params, loss)
    np.testing.assert_array_equal(after["b"], params["b"])
    assert (np.asarray(after["w"]) != np.asarray(params["w"])).all()


def _shown_python_blocks() -> list[str]:
    cells = json.loads(PAGE.read_text())["cells"]
    text = "\n".join(
        "".join(c["source"]) for c in cells if c["cell_type"] == "markdown"
    )
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def test_the_page_shows_one_pytorch_recipe():
    (block,) = _shown_python_blocks()
    assert "register_parametrization" in block


def test_the_pytorch_parametrization_keeps_the_fixed_entries_under_adamw_decay():
    torch = _torch()
    torch.manual_seed(0)
    namespace: dict = {}
    exec(_shown_python_blocks()[0], namespace)
    layer, mask, optimizer = (
        namespace["layer"],
        namespace["mask"],
        namespace["optimizer"],
    )
    before = layer.weight.detach().clone()
    x, y = torch.randn(24, 6), torch.randn(24, 4)
    for _ in range(3):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(layer(x), y).backward()
        optimizer.step()
    moved = layer.weight.detach() != before
    assert not moved[~mask].any()
    assert moved[mask].all()


def _cells() -> list[dict]:
    return json.loads(PAGE.read_text())["cells"]


def _fine_tune_code() -> str:
    """The page's setup cell and the code cells of its fine-tune section."""
    cells = _cells()
    setup = next(
        c
        for c in cells
        if c["cell_type"] == "code" and "KERAS_BACKEND" in "".join(c["source"])
    )
    start = next(
        i
        for i, c in enumerate(cells)
        if "".join(c["source"]).startswith("## Train a partially trainable model")
    )
    section = []
    for cell in cells[start + 1 :]:
        if cell["cell_type"] != "code":
            break
        section.append("".join(cell["source"]))
    assert len(section) >= 2, "the fine-tune section has lost its code"
    return "\n".join(["".join(setup["source"]), *section])


def test_the_page_says_its_fine_tune_runs_under_pytorch():
    text = "".join(_cells()[1]["source"])
    assert "KERAS_BACKEND=torch" in text and "does not run" not in text


def test_the_pages_fine_tune_runs_under_pytorch_and_keeps_the_frozen_entries():
    _torch()
    # The page sets KERAS_BACKEND=jax itself; the process runs it on torch.
    code = _fine_tune_code().replace('"jax"  #', '"torch"  #')
    assert 'os.environ["KERAS_BACKEND"] = "torch"' in code
    done = subprocess.run(
        [sys.executable, "-c", code + "\nprint(keras.backend.backend())"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.split("\n")
    assert "frozen entries kept their bits" in done.stdout
    assert [line for line in lines if line][-1] == "torch"
