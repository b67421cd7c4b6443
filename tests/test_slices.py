"""The "slices" form: whole rows, columns, blocks or heads, through dense sub-products.

For ``Dense`` and ``EinsumDense`` (a Keras ``MultiHeadAttention``'s
projections), convolutions (whole filters, whole input channels) and
``Embedding`` rows, with masks of whole slices:

* before training, the outputs equal the plain model's bit for bit;
* ``fit`` keeps every frozen entry's bits, and trains as ``"delta"`` does to
  rounding (the same gradient, summed in another order);
* ``mode="auto"`` picks the form for such a mask and only for one;
* ``.keras`` files, the trained-entries file and ``merge`` work as for every
  form; a mask that is not whole slices, a layer without the product, and
  drop and grow are refused with a ``ValueError``.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import refimpl
from refimpl import ops
from refimpl.testing import assert_frozen
from tests.models import X, Y
from tests.models import attention_model as _model
from tests.models import partial_layers as _partial

pytestmark = pytest.mark.every_backend


def _masks():
    rows = np.zeros((16, 32), bool)
    rows[[1, 5]] = True  # two input features
    columns = np.zeros((32, 4), bool)
    columns[:, 2] = True  # one unit
    head = np.zeros((32, 4, 8), bool)
    head[:, 1] = True  # the query of one head
    block = np.zeros((4, 8, 32), bool)
    block[2, :, 3:7] = True  # one head's part of four output features
    return {"d1": rows, "d2": columns, "mha/query": head, "mha/attention_output": block}


def _numpy(value):
    return np.array(keras.ops.convert_to_numpy(value))


def _fit(model):
    model.compile(optimizer=keras.optimizers.AdamW(0.01), loss="mse")
    model.fit(X, Y, batch_size=3, epochs=3, shuffle=False, verbose=0)
    return model


def _assert_trained_as_delta(layers, references, start):
    """Frozen bits kept, free entries moved, as the "delta" form moved them."""
    for layer, reference, before in zip(layers, references, start):
        after = _numpy(layer.kernel)
        assert_frozen(before, after, layer.partial_weight.mask)
        assert not np.array_equal(after, before)
        np.testing.assert_allclose(
            after, _numpy(reference.kernel), rtol=1e-4, atol=1e-5
        )


@pytest.mark.parametrize(
    "positions, shape, expected",
    [
        ([2, 3], (2, 2), (np.array([1]), None)),  # a row
        ([1, 3], (2, 2), (None, np.array([1]))),  # a column
        ([1, 2, 5, 6], (2, 4), (None, np.array([1, 2]))),
        ([5, 6, 9, 10], (3, 4), (np.array([1, 2]), np.array([1, 2]))),  # a block
        ([0, 3], (2, 2), None),  # a diagonal
        ([0, 1, 2], (2, 2), None),  # a row and a half
        ([], (2, 2), None),
    ],
)
def test_rectangle_finds_whole_slices_and_nothing_else(positions, shape, expected):
    found = ops._rectangle(positions, shape)
    if expected is None:
        assert found is None
        return
    assert len(found) == len(expected)
    for a, b in zip(found, expected):
        assert (a is None and b is None) or np.array_equal(a, b)


@pytest.mark.parametrize(
    "equation, expected",
    [
        ("abc,cde->abde", (("in", -1), ("out", -2), ("out", -1))),
        ("abcd,cde->abe", (("in", -2), ("in", -1), ("out", -1))),
        ("...b,bc->...c", (("in", -1), ("out", -1))),
        ("abc,bc->ac", None),  # c is in the input, the kernel and the output
    ],
)
def test_kernel_axes_of_einsum_equations(equation, expected):
    assert ops._kernel_axes(equation) == expected


@pytest.mark.parametrize("mode", ["slices", "auto"])
def test_outputs_bit_identical_fit_exact_and_as_delta(mode):
    model = _model()
    converted = refimpl.partialize(model, _masks(), mode=mode)
    layers = _partial(converted)
    assert len(layers) == 4
    assert {layer.partial_weight.mode for layer in layers} == {"slices"}
    np.testing.assert_array_equal(_numpy(converted(X)), _numpy(model(X)))
    start = [_numpy(layer.kernel) for layer in layers]
    delta = refimpl.partialize(model, _masks(), mode="delta")
    _fit(converted)
    _fit(delta)
    _assert_trained_as_delta(layers, _partial(delta), start)


def test_auto_picks_slices_only_for_whole_slices():
    model = _model()
    masks = _masks()
    masks["d1"] = refimpl.selection.random_mask((16, 32), k=64, seed=0)
    converted = refimpl.partialize(model, masks, mode="auto")
    modes = {layer.path: layer.partial_weight.mode for layer in _partial(converted)}
    assert modes.pop("d1") != "slices"
    assert set(modes.values()) == {"slices"}


def test_files_merge_and_the_trained_entries(tmp_path):
    model = _model()
    converted = _fit(refimpl.partialize(model, _masks(), mode="slices"))
    expected = _numpy(converted(X))
    converted.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert {layer.partial_weight.mode for layer in _partial(loaded)} == {"slices"}
    np.testing.assert_array_equal(_numpy(loaded(X)), expected)
    refimpl.save_partial_weights(converted, tmp_path / "entries.npz")
    again = refimpl.partialize(model, _masks(), mode="slices")
    refimpl.load_partial_weights(again, tmp_path / "entries.npz")
    np.testing.assert_array_equal(_numpy(again(X)), expected)
    merged = refimpl.merge(converted)
    assert not _partial(merged)
    # The plain layers multiply by the composed kernel: equal to rounding.
    np.testing.assert_allclose(_numpy(merged(X)), expected, rtol=1e-5, atol=1e-6)


def _cnn(padding="same"):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(6, 3, padding=padding, activation="relu", name="c1")(inputs)
    h = keras.layers.Conv2D(4, 3, strides=2, name="c2")(h)
    s = keras.layers.Conv1D(3, 3, padding="causal", name="c3")(
        keras.layers.Reshape((8, 24))(inputs)
    )
    h = keras.layers.Concatenate()(
        [keras.layers.Flatten()(h), keras.layers.Flatten()(s)]
    )
    return keras.Model(inputs, keras.layers.Dense(2, name="d")(h))


def _cnn_masks():
    filters = np.zeros((3, 3, 3, 6), bool)
    filters[..., [1, 4]] = True  # two filters, every tap and input channel
    channels = np.zeros((3, 3, 6, 4), bool)
    channels[:, :, [0, 5]] = True  # two input channels of every filter
    causal = np.zeros((3, 24, 3), bool)
    causal[..., 2] = True
    return {"c1": filters, "c2": channels, "c3": causal}


def test_convolutions_whole_filters_and_channels():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 8, 8, 3)).astype("float32")
    y = rng.normal(size=(5, 2)).astype("float32")
    model = _cnn()
    converted = refimpl.partialize(model, _cnn_masks(), mode="slices")
    layers = _partial(converted)
    assert [layer.partial_weight.mode for layer in layers] == ["slices"] * 3
    np.testing.assert_array_equal(_numpy(converted(x)), _numpy(model(x)))
    delta = refimpl.partialize(model, _cnn_masks(), mode="delta")
    start = [_numpy(layer.kernel) for layer in layers]
    for trained in (converted, delta):
        trained.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        trained.fit(x, y, batch_size=5, epochs=3, verbose=0)
    _assert_trained_as_delta(layers, _partial(delta), start)
    # auto keeps the composed forms for a convolution (not measured faster)
    auto = refimpl.partialize(model, _cnn_masks(), mode="auto")
    assert "slices" not in {layer.partial_weight.mode for layer in _partial(auto)}


def test_embedding_rows_are_looked_up_exactly(tmp_path):
    keras.utils.set_random_seed(0)
    ids = np.random.default_rng(0).integers(0, 20, (6, 7)).astype("int32")
    target = np.random.default_rng(1).normal(size=(6, 3)).astype("float32")
    inputs = keras.Input((7,), dtype="int32")
    h = keras.layers.Embedding(20, 4, name="e")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(h)))
    rows = np.zeros((20, 4), bool)
    rows[[2, 3, 17]] = True  # ids 3 and 17 appear in the batch, 2 does not
    assert np.isin([3, 17], ids).all() and not np.isin(2, ids)
    converted = refimpl.partialize(model, {"e": rows}, mode="slices")
    delta = refimpl.partialize(model, {"e": rows}, mode="delta")
    table = converted.get_layer("e")
    assert table.partial_weight.mode == "slices"
    np.testing.assert_array_equal(_numpy(converted(ids)), _numpy(model(ids)))
    before = _numpy(table.embeddings)
    for trained in (converted, delta):
        trained.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        trained.fit(ids, target, epochs=3, verbose=0)
    after = _numpy(table.embeddings)
    assert_frozen(before, after, rows)
    assert not np.array_equal(after[[3, 17]], before[[3, 17]])
    # Trained as "delta" trains, to rounding (the gradient summed in another
    # order on JAX); and the lookup is the composed table's, bit for bit.
    np.testing.assert_allclose(
        after, _numpy(delta.get_layer("e").embeddings), rtol=1e-5, atol=1e-7
    )
    merged = refimpl.merge(converted)
    np.testing.assert_array_equal(_numpy(merged(ids)), _numpy(converted(ids)))
    converted.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert loaded.get_layer("e").partial_weight.mode == "slices"
    np.testing.assert_array_equal(_numpy(loaded(ids)), _numpy(converted(ids)))


def test_refusals():
    model = _model()
    masks = {"d2": _masks()["d2"], "d1": np.eye(16, 32, dtype=bool)}
    with pytest.raises(ValueError, match="needs a mask of whole slices"):
        refimpl.partialize(model, masks, mode="slices", in_place=True)
    assert not _partial(model)  # refused before anything was converted
    conv = keras.Sequential([keras.Input((6, 6, 2)), keras.layers.Conv2D(3, 3)])
    tap = np.zeros((3, 3, 2, 3), bool)
    tap[1, :, :, 0] = True  # one filter's middle row of taps only
    with pytest.raises(ValueError, match="over the whole kernel window"):
        refimpl.partialize(conv, {conv.layers[0].name: tap}, mode="slices")
    grouped = keras.Sequential(
        [keras.Input((6, 6, 4)), keras.layers.Conv2D(4, 3, groups=2)]
    )
    mask = np.zeros((3, 3, 2, 4), bool)
    mask[..., 0] = True
    with pytest.raises(ValueError, match="groups=2"):
        refimpl.partialize(grouped, {grouped.layers[0].name: mask}, mode="slices")
    table = keras.Sequential(
        [keras.Input((3,), dtype="int32"), keras.layers.Embedding(5, 4)]
    )
    part = np.zeros((5, 4), bool)
    part[2, :2] = True  # half a row
    with pytest.raises(ValueError, match="whole rows of the embedding table"):
        refimpl.partialize(table, {table.layers[0].name: part}, mode="slices")
    depthwise = keras.Sequential(
        [keras.Input((6, 6, 2)), keras.layers.DepthwiseConv2D(3)]
    )
    mask = np.zeros((3, 3, 2, 1), bool)
    mask[..., 0, :] = True
    with pytest.raises(ValueError, match="of type DepthwiseConv2D"):
        refimpl.partialize(depthwise, {depthwise.layers[0].name: mask}, mode="slices")
    converted = refimpl.partialize(model, _masks(), mode="slices")
    converted.compile(optimizer="adam", loss="mse")
    callback = refimpl.DropAndGrow((X, Y), every=1, fraction=0.5)
    with pytest.raises(ValueError, match="mode='slices'"):
        converted.fit(X, Y, epochs=1, verbose=0, callbacks=[callback])
