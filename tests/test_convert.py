"""Between refimpl layers and plain Keras: ``to_dense``, ``from_dense``, ``merge``.

``layer.to_dense()`` returns the ``keras.layers.Dense`` a trained layer stands
for; ``Layer.from_dense(dense, ...)`` starts a refimpl layer from a trained
Dense; :func:`refimpl.merge` folds a whole Sequential or functional model back
into Keras' own classes, so it serves and loads without refimpl.
"""

import json
import zipfile

import keras
import numpy as np
import pytest

import refimpl
from refimpl import BandedDense, BlockDense, DiagonalDense, PartialDense

pytestmark = pytest.mark.every_backend

N = 6
EYE3 = np.eye(3)
SEED_BLOCKS = [[None, -0.2 * EYE3], [0.35 * EYE3, "trainable"]]
MASK = np.random.default_rng(3).random((N, 4)) < 0.4
DENSE_MASK = np.random.default_rng(4).random((N, 4)) < 0.8
X = np.random.default_rng(0).normal(size=(16, N)).astype("float32")

# name: factory of an unbuilt layer on N inputs
LAYERS = {
    "partial_delta": lambda: PartialDense(4, MASK, activation="relu"),
    "partial_select": lambda: PartialDense(4, DENSE_MASK, mode="select"),
    "diagonal": lambda: DiagonalDense(use_bias=True, activation="tanh"),
    "band_fixed_diag": lambda: BandedDense(1, 2, fixed_diagonal=[0.5] * N),
    "band": lambda: BandedDense(2, 0, use_bias=True),
    "block": lambda: BlockDense(SEED_BLOCKS),
    "block_sizes": lambda: BlockDense(
        [["trainable", None], [np.ones((2, 2)), "trainable"]],
        row_sizes=[4, 2],
        col_sizes=[2, 3],
        use_bias=True,
    ),
}
# Layers whose product is x @ kernel itself, so outputs match bit for bit.
EXACT = {"partial_delta", "partial_select", "diagonal"}


def _trained(name):
    """The layer, built, with every trainable weight moved off its start."""
    layer = LAYERS[name]()
    layer.build((None, N))
    rng = np.random.default_rng(1)
    for weight in layer.trainable_weights:
        weight.assign(rng.normal(size=weight.shape))
    return layer


def _bits(array):
    array = np.ascontiguousarray(keras.ops.convert_to_numpy(array))
    return array.view(np.uint32)


# --- to_dense --------------------------------------------------------------------


@pytest.mark.parametrize("name", list(LAYERS))
def test_to_dense_copies_the_kernel_and_bias_bit_for_bit(name):
    layer = _trained(name)
    dense = layer.to_dense()
    assert type(dense) is keras.layers.Dense
    assert dense.name == layer.name
    assert dense.activation is layer.activation
    assert dense.use_bias == layer.use_bias
    assert dense.dtype_policy.name == layer.dtype_policy.name
    np.testing.assert_array_equal(_bits(dense.kernel), _bits(layer.kernel))
    if layer.use_bias:
        np.testing.assert_array_equal(_bits(dense.bias), _bits(layer.bias))
    assert refimpl.testing.count_free_parameters(dense) == dense.count_params()


@pytest.mark.parametrize("name", list(LAYERS))
def test_to_dense_outputs_match(name):
    layer = _trained(name)
    dense = layer.to_dense()
    if name in EXACT:
        np.testing.assert_array_equal(_bits(dense(X)), _bits(layer(X)))
    else:
        np.testing.assert_allclose(dense(X), layer(X), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["partial_delta", "diagonal", "band", "block"])
def test_to_dense_keeps_a_mixed_precision_policy(name):
    layer = LAYERS[name]()
    layer.dtype_policy = keras.DTypePolicy("mixed_float16")
    layer.build((None, N))
    dense = layer.to_dense()
    assert dense.dtype_policy.name == "mixed_float16"
    assert dense.kernel.dtype == "float32"
    dtypes = {keras.backend.standardize_dtype(m(X).dtype) for m in (dense, layer)}
    assert dtypes == {"float16"}
    if name in EXACT:
        np.testing.assert_array_equal(dense(X), layer(X))
    else:
        np.testing.assert_allclose(dense(X), layer(X), rtol=1e-2, atol=1e-2)


def test_to_dense_carries_the_bias_and_activity_options():
    layer = DiagonalDense(
        use_bias=True,
        bias_regularizer=keras.regularizers.L2(0.25),
        bias_constraint=keras.constraints.NonNeg(),
        activity_regularizer=keras.regularizers.L1(0.5),
    )
    layer.build((None, N))
    dense = layer.to_dense()
    assert dense.bias_regularizer.get_config() == {"l2": 0.25}
    assert isinstance(dense.bias_constraint, keras.constraints.NonNeg)
    assert dense.activity_regularizer.get_config() == {"l1": 0.5}
    assert dense.kernel_regularizer is None and dense.kernel_constraint is None


def test_to_dense_of_an_unbuilt_layer_raises():
    with pytest.raises(ValueError, match="Build the layer"):
        DiagonalDense().to_dense()


# --- from_dense ------------------------------------------------------------------


def _structure(name):
    """Layer name -> (from_dense call, the kernel entries the layer can hold)."""
    rows, cols = np.indices((N, N))
    band = (cols - rows >= -1) & (cols - rows <= 2)
    block = np.zeros((N, N), bool)
    block[:3, 3:] = block[3:, :3] = block[3:, 3:] = True
    return {
        "partial": (
            lambda d, **kw: PartialDense.from_dense(d, MASK),
            np.ones((N, 4), bool),
        ),
        "diagonal": (lambda d, **kw: DiagonalDense.from_dense(d, **kw), np.eye(N) > 0),
        "band": (lambda d, **kw: BandedDense.from_dense(d, 1, 2, **kw), band),
        "block": (
            lambda d, **kw: BlockDense.from_dense(
                d,
                [[None, "fixed"], ["fixed", "trainable"]],
                row_sizes=[3, 3],
                col_sizes=[3, 3],
                **kw,
            ),
            block,
        ),
    }[name]


FROM_DENSE = ["partial", "diagonal", "band", "block"]


def _dense(units, kernel=None, **kwargs):
    dense = keras.layers.Dense(units, bias_initializer="ones", **kwargs)
    dense.build((None, N))
    if kernel is not None:
        dense.kernel.assign(kernel)
    return dense


def _fitting_kernel(keep):
    kernel = np.random.default_rng(2).normal(size=keep.shape).astype("float32")
    return np.where(keep, kernel, 0.0).astype("float32")


@pytest.mark.parametrize("name", FROM_DENSE)
def test_from_dense_gives_the_dense_layers_kernel_and_outputs(name):
    make, keep = _structure(name)
    dense = _dense(keep.shape[1], _fitting_kernel(keep), activation="relu")
    layer = make(dense)
    assert layer.name == dense.name
    assert layer.activation is dense.activation
    np.testing.assert_array_equal(_bits(layer.kernel), _bits(dense.kernel))
    np.testing.assert_array_equal(_bits(layer.bias), _bits(dense.bias))
    if name in ("partial", "diagonal"):
        np.testing.assert_array_equal(_bits(layer(X)), _bits(dense(X)))
    else:
        np.testing.assert_allclose(layer(X), dense(X), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(_bits(layer.to_dense().kernel), _bits(dense.kernel))


@pytest.mark.parametrize("name", ["diagonal", "band", "block"])
@pytest.mark.parametrize(
    "option",
    [
        {"kernel_regularizer": keras.regularizers.L2(0.1)},
        {"kernel_constraint": keras.constraints.NonNeg()},
    ],
    ids=["kernel_regularizer", "kernel_constraint"],
)
def test_structured_from_dense_refuses_kernel_regularizers_and_constraints(
    name, option
):
    make, keep = _structure(name)
    dense = _dense(keep.shape[1], _fitting_kernel(keep), **option)
    with pytest.raises(ValueError, match=next(iter(option))):
        make(dense)


def test_partial_from_dense_moves_an_l2_kernel_regularizer_to_the_free_values():
    kernel = np.random.default_rng(2).normal(size=(N, 4)).astype("float32")
    dense = _dense(4, kernel, kernel_regularizer=keras.regularizers.L2(0.1))
    layer = PartialDense.from_dense(dense, MASK)
    # Only the free entries are penalized: the frozen part is a constant.
    (loss,) = layer.losses
    expected = 0.1 * np.sum(kernel[MASK].astype("float64") ** 2)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loss), expected, rtol=1e-6)
    # The plain layer still penalizes its whole kernel.
    (dense_loss,) = dense.losses
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(dense_loss),
        0.1 * np.sum(kernel.astype("float64") ** 2),
        rtol=1e-6,
    )


def test_partial_from_dense_honours_a_non_neg_kernel_constraint_on_the_free_values():
    kernel = np.random.default_rng(2).normal(size=(N, 4)).astype("float32")
    assert (kernel[~MASK] < 0).any()  # frozen negatives, which must stay
    dense = _dense(
        4,
        np.where(MASK, np.abs(kernel), kernel),
        kernel_constraint=keras.constraints.NonNeg(),
        use_bias=False,
    )
    start = keras.ops.convert_to_numpy(dense.kernel)
    layer = PartialDense.from_dense(dense, MASK)
    model = keras.Sequential([keras.Input((N,)), layer])
    model.compile(optimizer=keras.optimizers.SGD(10.0), loss="mse")
    # Targets far below the outputs push the free values negative.
    positive = np.abs(X)
    model.fit(positive, np.full((16, 4), -100.0, "float32"), epochs=1, verbose=0)
    after = keras.ops.convert_to_numpy(layer.kernel)
    assert (after[MASK] == 0.0).any(), "the constraint never acted"
    assert (after[MASK] >= 0.0).all()
    refimpl.testing.assert_frozen(start, after, MASK)


@pytest.mark.parametrize(
    "constraint",
    [
        keras.constraints.MaxNorm(1.0),
        keras.constraints.UnitNorm(),
        keras.constraints.MinMaxNorm(0.5, 1.0),
    ],
    ids=["max_norm", "unit_norm", "min_max_norm"],
)
def test_partial_from_dense_refuses_a_kernel_constraint_that_is_not_elementwise(
    constraint,
):
    dense = _dense(4, kernel_constraint=constraint)
    with pytest.raises(ValueError, match="kernel_constraint"):
        PartialDense.from_dense(dense, MASK)


def test_partial_from_dense_refuses_a_kernel_regularizer_that_is_not_elementwise():
    dense = _dense(4, kernel_regularizer=keras.regularizers.OrthogonalRegularizer())
    with pytest.raises(ValueError, match="kernel_regularizer"):
        PartialDense.from_dense(dense, MASK)


@pytest.mark.parametrize("name", ["diagonal", "band", "block"])
def test_from_dense_refuses_entries_outside_the_structure_unless_projected(name):
    make, keep = _structure(name)
    kernel = _fitting_kernel(keep)
    kernel[~keep] = 1e-3  # small, but not zero
    dense = _dense(keep.shape[1], kernel)
    with pytest.raises(ValueError, match="project=True"):
        make(dense)
    layer = make(dense, project=True)
    np.testing.assert_array_equal(layer.kernel, np.where(keep, kernel, 0.0))


def test_partial_dense_from_dense_keeps_every_entry_whatever_the_mask():
    kernel = np.random.default_rng(2).normal(size=(N, 4)).astype("float32")
    dense = _dense(4, kernel)
    for mode in ("delta", "select"):
        layer = PartialDense.from_dense(dense, MASK, mode=mode)
        assert layer.partial_weight.mode == mode
        np.testing.assert_array_equal(_bits(layer.kernel), _bits(kernel))
        np.testing.assert_array_equal(layer.partial_weight.mask, MASK)


@pytest.mark.parametrize("name", FROM_DENSE)
def test_from_dense_copies_the_bias_and_activity_options(name):
    make, keep = _structure(name)
    dense = _dense(
        keep.shape[1],
        _fitting_kernel(keep),
        bias_regularizer=keras.regularizers.L2(0.25),
        bias_constraint=keras.constraints.NonNeg(),
        activity_regularizer=keras.regularizers.L1(0.5),
    )
    layer = make(dense)
    assert layer.bias_regularizer.get_config() == {"l2": 0.25}
    assert isinstance(layer.bias_constraint, keras.constraints.NonNeg)
    assert layer.activity_regularizer.get_config() == {"l1": 0.5}
    layer(X)
    dense(X)
    np.testing.assert_allclose(
        sorted(float(v) for v in layer.losses),
        sorted(float(v) for v in dense.losses),
        rtol=1e-5,
    )


@pytest.mark.parametrize("name", FROM_DENSE)
def test_from_dense_refuses_what_is_not_a_built_dense(name):
    make, _ = _structure(name)
    with pytest.raises(TypeError, match="`dense`"):
        make(keras.layers.Dense(N))
    with pytest.raises(TypeError, match="`dense`"):
        make(keras.layers.Conv1D(N, 1))


def test_from_dense_refuses_a_kernel_that_is_not_square_where_it_must_be():
    dense = _dense(4)
    for make in (
        lambda: DiagonalDense.from_dense(dense, project=True),
        lambda: BandedDense.from_dense(dense, 1, 1, project=True),
    ):
        with pytest.raises(ValueError, match="square"):
            make()
    with pytest.raises(ValueError, match="trainable_mask"):
        PartialDense.from_dense(dense, np.ones((N, 5), bool))
    with pytest.raises(ValueError, match="row_sizes"):
        BlockDense.from_dense(
            dense, [["trainable"]], row_sizes=[N], col_sizes=[5], project=True
        )


# --- merge -----------------------------------------------------------------------


def _batch_norm_with_stats(layer):
    rng = np.random.default_rng(5)
    size = layer.moving_mean.shape[0]
    layer.moving_mean.assign(rng.normal(size=size))
    layer.moving_variance.assign(rng.uniform(0.5, 2.0, size=size))
    layer.gamma.assign(rng.normal(size=size))
    layer.beta.assign(rng.normal(size=size))


def _sequential():
    model = keras.Sequential(
        [
            keras.Input((N,)),
            PartialDense(N, np.random.default_rng(6).random((N, N)) < 0.3),
            keras.layers.BatchNormalization(name="bn"),
            DiagonalDense(use_bias=True, activation="tanh"),
            keras.layers.Dropout(0.5),
            BandedDense(1, 1, fixed_diagonal=0.5),
            BlockDense(SEED_BLOCKS),
            keras.layers.Dense(3, name="head"),
        ]
    )
    _batch_norm_with_stats(model.get_layer("bn"))
    return model


def _functional():
    inputs = keras.Input((N,), name="x")
    a = PartialDense(N, np.random.default_rng(8).random((N, N)) < 0.3, name="pd")(
        inputs
    )
    a = keras.layers.BatchNormalization(name="bn")(a)
    b = keras.layers.Dense(N, activation="relu", name="plain")(inputs)
    c = keras.layers.Add()([a, b])
    c = DiagonalDense(use_bias=True, name="diag")(c)
    c = BandedDense(2, 1, name="band")(c)
    d = BlockDense(SEED_BLOCKS, name="block")(inputs)
    out = keras.layers.Dense(2, name="head")(keras.layers.Concatenate()([c, d]))
    model = keras.Model(inputs, out)
    _batch_norm_with_stats(model.get_layer("bn"))
    return model


def _perturb(model):
    rng = np.random.default_rng(7)
    for weight in model.trainable_weights:
        weight.assign(rng.normal(scale=0.5, size=weight.shape))


MODELS = {"sequential": _sequential, "functional": _functional}


def _only_keras_classes(model):
    return all(type(layer).__module__.startswith("keras.") for layer in model.layers)


@pytest.mark.parametrize(
    "kind",
    [
        k if k == "functional" else pytest.param(k, marks=pytest.mark.slow)
        for k in MODELS
    ],
)
def test_merge_gives_a_plain_keras_model_with_the_same_predictions(kind):
    model = MODELS[kind]()
    _perturb(model)
    expected = model.predict(X, verbose=0)
    merged = refimpl.merge(model)
    assert merged is not model
    assert _only_keras_classes(merged)
    assert [layer.name for layer in merged.layers] == [
        layer.name for layer in model.layers
    ]
    for old, new in zip(model.layers, merged.layers, strict=True):
        if hasattr(old, "to_dense"):
            assert type(new) is keras.layers.Dense
            np.testing.assert_array_equal(_bits(new.kernel), _bits(old.kernel))
        else:
            assert type(new) is type(old)
            for a, b in zip(old.weights, new.weights, strict=True):
                np.testing.assert_array_equal(_bits(a), _bits(b))
    np.testing.assert_allclose(
        merged.predict(X, verbose=0), expected, rtol=1e-5, atol=1e-5
    )
    # The original model is left as it was.
    assert not _only_keras_classes(model)
    np.testing.assert_array_equal(model.predict(X, verbose=0), expected)


def _unregister_refimpl(monkeypatch):
    """Take every refimpl class out of Keras' registry for this test."""
    registry = keras.saving.get_custom_objects()
    names = [name for name in registry if name.startswith("refimpl>")]
    assert "refimpl>PartialDense" in names
    for name in names:
        monkeypatch.delitem(registry, name)


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(MODELS))
def test_a_merged_model_saves_and_loads_without_refimpl(kind, tmp_path, monkeypatch):
    model = MODELS[kind]()
    _perturb(model)
    merged = refimpl.merge(model)
    path = tmp_path / "merged.keras"
    merged.save(path)
    with zipfile.ZipFile(path) as archive:
        config = archive.read("config.json").decode()
    assert "refimpl" not in config
    json.loads(config)  # a plain JSON document

    _unregister_refimpl(monkeypatch)
    loaded = keras.saving.load_model(path)
    assert _only_keras_classes(loaded)
    np.testing.assert_array_equal(
        loaded.predict(X, verbose=0), merged.predict(X, verbose=0)
    )


def test_the_unmerged_model_does_need_refimpl_to_load(tmp_path, monkeypatch):
    # The check above can fail: without the registry entries, a model with
    # refimpl layers does not load.
    model = _sequential()
    model.save(tmp_path / "m.keras")
    with zipfile.ZipFile(tmp_path / "m.keras") as archive:
        assert "refimpl>PartialDense" in archive.read("config.json").decode()
    _unregister_refimpl(monkeypatch)
    with pytest.raises(TypeError, match="PartialDense"):
        keras.saving.load_model(tmp_path / "m.keras")


def test_merge_refuses_a_subclassed_model():
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.inner = PartialDense(2, np.ones((N, 2), bool))

        def call(self, x):
            return self.inner(x)

    model = Subclassed()
    model(X)
    with pytest.raises(TypeError, match="subclassed"):
        refimpl.merge(model)


def test_merge_refuses_what_is_not_a_model():
    with pytest.raises(TypeError, match="`model`"):
        refimpl.merge(PartialDense(2, np.ones((N, 2), bool)))


def test_merge_refuses_an_unbuilt_model():
    model = keras.Sequential([PartialDense(2, np.ones((N, 2), bool))])
    with pytest.raises(ValueError, match="built"):
        refimpl.merge(model)
