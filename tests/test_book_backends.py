"""What chapters/08_backends.ipynb states without a cell of its own.

The page runs the exact optax recipes; the ways that are not exact, which it
names in a sentence, are checked here. It shows a PyTorch recipe it cannot run
(PyTorch is not among the book's requirements); the test below runs that very
code block, read from the page, wherever PyTorch is installed.
"""

import json
import pathlib
import re

import numpy as np
import pytest

PAGE = pathlib.Path(__file__).resolve().parents[1] / "chapters" / "08_backends.ipynb"


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
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
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
