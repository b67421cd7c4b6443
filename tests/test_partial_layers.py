"""Every weight-bearing Keras layer, partially trainable: refimpl.partialize.

For each supported type (Dense, EinsumDense, Conv1D/2D/3D, Embedding), a
small model is converted and checked for what the library promises:

* the converted model's outputs equal the original's bit for bit;
* only the free values are trainable, and the optimizer state is one value
  per free value and slot;
* under optimizers that move entries at a zero gradient (AdamW's decay,
  Adafactor, Lion), frozen entries keep their bits in ``fit``;
* ``.keras`` round trip; the original model's ``.weights.h5`` is refused by
  the converted one (its classes have other names) and loads into the
  original before ``partialize`` and into ``merge``'s plain layers; and
  ``merge``/``to_dense`` give plain layers with the same outputs.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import refimpl
from refimpl import selection
from refimpl.layers.partial import _PARTIAL_CLASSES, partial_class

pytestmark = pytest.mark.every_backend

RNG = np.random.default_rng(0)
SLOW = pytest.mark.slow


def _dense():
    return keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(5, name="target"), keras.layers.Dense(2)]
    ), RNG.normal(size=(8, 6))


def _einsum():
    return keras.Sequential(
        [
            keras.Input((3, 4)),
            keras.layers.EinsumDense(
                "abc,cd->abd", (3, 5), bias_axes="d", name="target"
            ),
            keras.layers.Flatten(),
            keras.layers.Dense(2),
        ]
    ), RNG.normal(size=(8, 3, 4))


def _conv(rank):
    conv = {1: keras.layers.Conv1D, 2: keras.layers.Conv2D, 3: keras.layers.Conv3D}
    shape = (6,) * rank + (2,)
    return keras.Sequential(
        [
            keras.Input(shape),
            conv[rank](3, 3, name="target"),
            keras.layers.Flatten(),
            keras.layers.Dense(2),
        ]
    ), RNG.normal(size=(8, *shape))


def _embedding():
    return keras.Sequential(
        [
            keras.Input((5,), dtype="int32"),
            keras.layers.Embedding(10, 4, name="target"),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(2),
        ]
    ), RNG.integers(0, 10, size=(8, 5))


def _transpose(rank):
    layer = {
        1: keras.layers.Conv1DTranspose,
        2: keras.layers.Conv2DTranspose,
        3: keras.layers.Conv3DTranspose,
    }[rank]
    shape = (4,) * rank + (2,)
    return keras.Sequential(
        [
            keras.Input(shape),
            layer(3, 3, name="target"),
            keras.layers.Flatten(),
            keras.layers.Dense(2),
        ]
    ), RNG.normal(size=(8, *shape))


def _depthwise(rank):
    layer = {1: keras.layers.DepthwiseConv1D, 2: keras.layers.DepthwiseConv2D}[rank]
    shape = (6,) * rank + (3,)
    return keras.Sequential(
        [
            keras.Input(shape),
            layer(3, depth_multiplier=2, name="target"),
            keras.layers.Flatten(),
            keras.layers.Dense(2),
        ]
    ), RNG.normal(size=(8, *shape))


def _reversible_embedding():
    # The tied table: the free entries serve the lookup and the output logits.
    tokens = keras.Input((5,), dtype="int32")
    table = keras.layers.ReversibleEmbedding(10, 4, name="target")
    logits = table(table(tokens), reverse=True)  # (batch, 5, 10)
    pooled = keras.layers.GlobalAveragePooling1D()(logits)
    return keras.Model(tokens, keras.layers.Dense(2)(pooled)), RNG.integers(
        0, 10, size=(8, 5)
    )


MODELS = {
    "dense": _dense,
    "einsum_dense": _einsum,
    "conv1d": lambda: _conv(1),
    "conv2d": lambda: _conv(2),
    "conv3d": lambda: _conv(3),
    "conv1d_transpose": lambda: _transpose(1),
    "conv2d_transpose": lambda: _transpose(2),
    "conv3d_transpose": lambda: _transpose(3),
    "depthwise_conv1d": lambda: _depthwise(1),
    "depthwise_conv2d": lambda: _depthwise(2),
    "embedding": _embedding,
    "reversible_embedding": _reversible_embedding,
}
EMBEDDINGS = ("embedding", "reversible_embedding")


# Every type runs in `make test`; `make check` keeps one of each family.
FAST = ("dense", "conv2d", "embedding")
SOME_SLOW = [
    name if name in FAST else pytest.param(name, marks=pytest.mark.slow)
    for name in MODELS
]


def _setup(name, seed=0):
    keras.utils.set_random_seed(seed)
    model, x = MODELS[name]()
    x = x.astype("int32" if name in EMBEDDINGS else "float32")
    y = np.random.default_rng(1).normal(size=(len(x), 2)).astype("float32")
    return model, x, y


def _weight(layer):
    return (
        layer.embeddings if isinstance(layer, keras.layers.Embedding) else layer.kernel
    )


def _mask(model, fraction=0.3):
    shape = tuple(_weight(model.get_layer("target")).shape)
    return selection.random_mask(shape, fraction=fraction, seed=3)


def _numpy(x):
    return np.array(keras.ops.convert_to_numpy(x))


@pytest.mark.parametrize("name", MODELS)
def test_outputs_are_bit_exact_and_only_the_free_values_train(name):
    model, x, y = _setup(name)
    mask = _mask(model)
    converted = refimpl.partialize(model, {"target": mask})
    np.testing.assert_array_equal(
        converted.predict(x, verbose=0), model.predict(x, verbose=0)
    )
    layer = converted.get_layer("target")
    assert isinstance(layer, partial_class(type(model.get_layer("target"))))
    np.testing.assert_array_equal(layer.partial_weight.mask, mask)
    # The rest is frozen by default: only the free values train, in the model.
    assert [w.path for w in converted.trainable_weights] == [
        layer.partial_weight.free.path
    ]
    assert layer.partial_weight.free.shape == (mask.sum(),)
    # Named in `train`, the converted layer trains its bias too.
    kept = refimpl.partialize(model, {"target": mask}, train=["target"])
    own = kept.get_layer("target").trainable_weights
    assert sum(int(np.prod(w.shape)) for w in own) == mask.sum() + (
        0 if name in EMBEDDINGS else int(np.prod(layer.bias.shape))
    )
    # The original model is untouched.
    assert not isinstance(model.get_layer("target"), tuple(_PARTIAL_CLASSES.values()))


@pytest.mark.slow
@pytest.mark.parametrize("name", SOME_SLOW)
@pytest.mark.parametrize(
    "optimizer",
    [
        pytest.param(
            lambda: keras.optimizers.AdamW(0.05, weight_decay=0.5), id="adamw"
        ),
        pytest.param(
            lambda: keras.optimizers.Adafactor(0.05), id="adafactor", marks=SLOW
        ),
        pytest.param(lambda: keras.optimizers.Lion(0.01), id="lion", marks=SLOW),
        pytest.param(
            lambda: keras.optimizers.Ftrl(0.05, l1_regularization_strength=0.1),
            id="ftrl",
            marks=SLOW,
        ),
    ],
)
def test_fit_keeps_frozen_entries_bit_exact(name, optimizer):
    model, x, y = _setup(name)
    mask = _mask(model)
    converted = refimpl.partialize(model, {"target": mask})
    layer = converted.get_layer("target")
    before = _numpy(_weight(layer))
    converted.compile(optimizer=optimizer(), loss="mse")
    converted.fit(x, y, epochs=3, batch_size=4, verbose=0)
    after = _numpy(_weight(layer))
    refimpl.testing.assert_frozen(before, after, mask)
    assert refimpl.testing.moved(before, after)[mask].any()
    assert np.isfinite(after).all()


@pytest.mark.slow
@pytest.mark.parametrize("name", SOME_SLOW)
def test_adam_state_is_two_values_per_free_value(name):
    model, x, y = _setup(name)
    mask = _mask(model)
    converted = refimpl.partialize(model, {"target": mask})
    optimizer = keras.optimizers.Adam(0.01)
    converted.compile(optimizer=optimizer, loss="mse")
    converted.fit(x, y, epochs=1, batch_size=8, verbose=0)
    slots = [
        v
        for v in optimizer.variables
        if "partial_free" in v.path and v.path.split("/")[-1] != "iteration"
    ]
    assert sum(int(np.prod(v.shape)) for v in slots) == 2 * int(mask.sum())
    kernel_slots = [v for v in optimizer.variables if v.path.endswith("target_kernel")]
    assert not kernel_slots


@pytest.mark.slow
@pytest.mark.parametrize("name", SOME_SLOW)
def test_keras_file_round_trip_and_training_again(name, tmp_path):
    model, x, y = _setup(name)
    mask = _mask(model)
    converted = refimpl.partialize(model, {"target": mask})
    converted.compile(optimizer=keras.optimizers.AdamW(0.05), loss="mse")
    converted.fit(x, y, epochs=1, batch_size=4, verbose=0)
    path = tmp_path / "model.keras"
    converted.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(
        loaded.predict(x, verbose=0), converted.predict(x, verbose=0)
    )
    layer = loaded.get_layer("target")
    np.testing.assert_array_equal(layer.partial_weight.mask, mask)
    before = _numpy(_weight(layer))
    loaded.fit(x, y, epochs=1, batch_size=4, verbose=0)
    refimpl.testing.assert_frozen(before, _weight(layer), mask)
    # The config holds the count of free values, never the mask.
    assert "num_free" in layer.get_config()
    assert len(str(layer.get_config())) < 2000


@pytest.mark.slow
@pytest.mark.parametrize("name", SOME_SLOW)
def test_original_weights_file_and_the_converted_model(name, tmp_path):
    # A partial class has its own name (PartialConv2D), and Keras names a
    # weights file's groups after the class: the original's file does not
    # load into the converted model, and says so. The supported paths: load
    # it into the original model, then partialize; and the plain layout of
    # `merge`, which reads it bit for bit.
    model, x, _ = _setup(name)
    mask = _mask(model)
    expected = model.predict(x, verbose=0)
    originals = [_numpy(w).copy() for w in model.weights]
    path = tmp_path / "original.weights.h5"
    model.save_weights(path)

    other, _, _ = _setup(name, seed=1)  # the same model, other starting weights
    converted = refimpl.partialize(other, {"target": mask})
    assert not np.array_equal(converted.predict(x, verbose=0), expected)
    with pytest.raises(ValueError, match="could not be loaded"):
        converted.load_weights(path)
    assert not np.array_equal(converted.predict(x, verbose=0), expected)

    merged = refimpl.merge(converted)
    assert not np.array_equal(merged.predict(x, verbose=0), expected)
    merged.load_weights(path)
    assert len(merged.weights) == len(originals)
    for w, original in zip(merged.weights, originals, strict=True):
        np.testing.assert_array_equal(_numpy(w), original, err_msg=w.path)
    np.testing.assert_array_equal(merged.predict(x, verbose=0), expected)

    fresh, _, _ = _setup(name, seed=1)
    fresh.load_weights(path)
    again = refimpl.partialize(fresh, {"target": mask})
    np.testing.assert_array_equal(again.predict(x, verbose=0), expected)
    np.testing.assert_array_equal(again.get_layer("target").partial_weight.mask, mask)


@pytest.mark.slow
@pytest.mark.parametrize("name", SOME_SLOW)
def test_merge_and_to_dense_give_plain_layers_with_the_same_outputs(name):
    model, x, y = _setup(name)
    converted = refimpl.partialize(model, {"target": _mask(model)})
    converted.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    converted.fit(x, y, epochs=1, batch_size=4, verbose=0)
    merged = refimpl.merge(converted)
    plain = type(model.get_layer("target"))
    assert type(merged.get_layer("target")) is plain
    np.testing.assert_array_equal(
        merged.predict(x, verbose=0), converted.predict(x, verbose=0)
    )
    layer = converted.get_layer("target").to_dense()
    assert type(layer) is plain
    np.testing.assert_array_equal(
        _numpy(_weight(layer)), _numpy(_weight(converted.get_layer("target")))
    )


def test_train_all_keeps_trainable_status_batchnorm_and_regularizers():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((4, 4, 1)),
            keras.layers.Conv2D(2, 3, name="conv", kernel_regularizer="l2"),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.Flatten(),
            keras.layers.Dense(3, name="head"),
        ]
    )
    x = np.random.default_rng(0).normal(size=(4, 4, 4, 1)).astype("float32")
    model.get_layer("bn").trainable = False
    model.get_layer("conv").trainable = False
    converted = refimpl.partialize(
        model, {"head/kernel": [[0, 0], [5, 2]]}, train="all"
    )
    assert converted.get_layer("bn").trainable is False
    assert converted.get_layer("conv").trainable is False
    assert converted.get_layer("conv").kernel_regularizer is not None
    np.testing.assert_array_equal(
        converted(x, training=True), model(x, training=True)
    )  # BatchNorm frozen: inference mode even in training
    assert [w.path.split("/")[-1] for w in converted.trainable_weights] == [
        "bias",
        "partial_free",
    ]


def test_the_rest_is_frozen_by_default_and_train_keeps_named_layers():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((4, 4, 1)),
            keras.layers.Conv2D(2, 3, name="conv"),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.Flatten(),
            keras.layers.Dense(3, name="head"),
        ]
    )
    x = np.random.default_rng(0).normal(size=(4, 4, 4, 1)).astype("float32")
    converted = refimpl.partialize(model, {"conv": [[0, 0, 0, 1]]})
    assert [w.path.split("/")[-1] for w in converted.trainable_weights] == [
        "partial_free"
    ]
    assert not converted.get_layer("bn").trainable  # inference mode, as Keras says
    np.testing.assert_array_equal(converted(x), model(x))
    kept = refimpl.partialize(model, {"conv": [[0, 0, 0, 1]]}, train=["bn", "head"])
    assert [w.path for w in kept.trainable_weights] == [
        kept.get_layer("conv").partial_weight.free.path,
        *(w.path for w in kept.get_layer("bn").trainable_weights),
        *(w.path for w in kept.get_layer("head").trainable_weights),
    ]
    rows = refimpl.convert.trainable_summary(kept)
    assert [(r["kind"], r["trainable"]) for r in rows] == [
        ("partial", 1),
        ("full", 2),
        ("full", 2),
        ("full", 8 * 3),
        ("full", 3),
    ]
    with pytest.raises(ValueError, match=r"`train\['nope'\]` names no layer"):
        refimpl.partialize(model, {"conv": [[0, 0, 0, 1]]}, train=["nope"])
    with pytest.raises(TypeError, match="`train` must be a list"):
        refimpl.partialize(model, {"conv": [[0, 0, 0, 1]]}, train=3)


@pytest.mark.slow
def test_multi_head_attention_projection_by_weight_path():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4, 6))
    attended = keras.layers.MultiHeadAttention(2, 3, name="mha")(inputs, inputs)
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Flatten()(attended)))
    x = np.random.default_rng(0).normal(size=(5, 4, 6)).astype("float32")
    y = np.zeros((5, 1), "float32")
    converted = refimpl.partialize(
        model, {"mha/query/kernel": lambda w: selection.magnitude_mask(w, k=7)}
    )
    np.testing.assert_array_equal(
        converted.predict(x, verbose=0), model.predict(x, verbose=0)
    )
    query = next(x for x in converted._flatten_layers() if x.name == "query")
    before = _numpy(query.kernel)
    converted.compile(
        optimizer=keras.optimizers.AdamW(0.05, weight_decay=0.5), loss="mse"
    )
    converted.fit(x, y, epochs=2, verbose=0)
    mask = query.partial_weight.mask
    assert mask.sum() == 7
    refimpl.testing.assert_frozen(before, query.kernel, mask)
    np.testing.assert_array_equal(mask, selection.magnitude_mask(before, k=7))


@pytest.mark.slow
def test_subclassed_model_in_place():
    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.body = keras.layers.Dense(4, name="body")
            self.head = keras.layers.Dense(1, name="head")

        def call(self, x):
            return self.head(self.body(x))

    keras.utils.set_random_seed(0)
    model = Net()
    x = np.random.default_rng(0).normal(size=(6, 3)).astype("float32")
    expected = _numpy(model(x))
    mask = np.zeros((3, 4), bool)
    mask[0] = True
    assert refimpl.partialize(model, {"body": mask}, in_place=True) is model
    np.testing.assert_array_equal(_numpy(model(x)), expected)
    before = _numpy(model.body.kernel)
    model.compile(optimizer=keras.optimizers.AdamW(0.05, weight_decay=0.5), loss="mse")
    model.fit(x, np.zeros((6, 1), "float32"), epochs=2, verbose=0)
    refimpl.testing.assert_frozen(before, model.body.kernel, mask)


@pytest.mark.slow
def test_trainable_tokens_only_new_rows_train_under_adamw():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((5,), dtype="int32"),
            keras.layers.Embedding(13, 4, name="embed"),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(1),
        ]
    )
    new_rows = [10, 11, 12]
    converted = refimpl.partialize(
        model, {"embed": selection.rows_mask((13, 4), new_rows)}
    )
    converted.layers[-1].trainable = False
    x = np.random.default_rng(0).integers(0, 13, size=(16, 5)).astype("int32")
    x[:, 0] = 11
    before = _numpy(converted.get_layer("embed").embeddings)
    converted.compile(
        optimizer=keras.optimizers.AdamW(0.05, weight_decay=0.5), loss="mse"
    )
    converted.fit(x, np.ones((16, 1), "float32"), epochs=2, verbose=0)
    after = _numpy(converted.get_layer("embed").embeddings)
    np.testing.assert_array_equal(after[:10], before[:10])
    assert (after[11] != before[11]).all()
    assert refimpl.testing.count_free_parameters(converted) == 3 * 4


def test_a_shell_refuses_to_run_before_its_weights_are_loaded():
    model, x, _ = _setup("conv2d")
    converted = refimpl.partialize(model, {"target": _mask(model)})
    layer = converted.get_layer("target")
    shell = type(layer).from_config(layer.get_config())
    shell.build((None, 6, 6, 2))
    with pytest.raises(
        refimpl._compat.NotLoadedError,
        match="was rebuilt from a config without its weights",
    ):
        shell(x)
    shell.set_weights(layer.get_weights())
    np.testing.assert_array_equal(shell(x), layer(x))


def test_enable_partial_refuses_a_layer_twice_and_lora():
    layer = keras.layers.Dense(3)
    layer.build((None, 3))
    refimpl.enable_partial(layer, np.eye(3, dtype=bool))
    with pytest.raises(ValueError, match="already"):
        refimpl.enable_partial(layer, np.eye(3, dtype=bool))
    lora = keras.layers.Dense(3)
    lora.build((None, 3))
    lora.enable_lora(1)
    with pytest.raises(ValueError, match="LoRA"):
        refimpl.enable_partial(lora, np.eye(3, dtype=bool))


# -- selection ----------------------------------------------------------------


@pytest.mark.parametrize("fraction", [0.0, 0.001, 0.01, 0.1, 0.5, 1.0])
def test_random_mask_has_exactly_the_asked_count_and_is_seeded(fraction):
    shape = (40, 25)
    mask = selection.random_mask(shape, fraction=fraction, seed=7)
    assert mask.shape == shape and mask.dtype == bool
    assert mask.sum() == round(fraction * 1000)
    np.testing.assert_array_equal(
        mask, selection.random_mask(shape, fraction=fraction, seed=7)
    )
    if 0 < fraction < 1:
        assert (mask != selection.random_mask(shape, fraction=fraction, seed=8)).any()


def test_magnitude_mask_takes_the_largest_and_breaks_ties_by_index():
    w = np.array([[0.1, -5.0, 2.0], [2.0, 0.0, -2.0]])
    mask = selection.magnitude_mask(w, k=3)
    np.testing.assert_array_equal(mask, [[False, True, True], [True, False, False]])


def test_fisher_scores_are_accumulated_squared_gradients():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, use_bias=False)])
    x = np.random.default_rng(0).normal(size=(8, 3)).astype("float32")
    y = np.random.default_rng(1).normal(size=(8, 2)).astype("float32")
    scores = selection.fisher_scores(model, x, y, loss="mse", batch_size=4, batches=2)
    [(path, score)] = scores.items()
    kernel = _numpy(model.layers[0].kernel)
    expected = np.zeros_like(kernel, dtype=np.float64)
    for xb, yb in ((x[:4], y[:4]), (x[4:], y[4:])):
        # d/dW mean((xW - y)^2) = 2 x^T (xW - y) / (rows * columns)
        residual = xb @ kernel - yb
        expected += (2 * xb.T @ residual / residual.size) ** 2
    np.testing.assert_allclose(score, expected, rtol=1e-4)
    mask = selection.fisher_mask(score, k=2)
    assert mask.sum() == 2
    assert score[mask].min() >= score[~mask].max()


def test_fisher_scores_take_a_dict_of_inputs_as_a_keras_hub_model_does():
    keras.utils.set_random_seed(0)
    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    joined = keras.layers.Concatenate()([a, b])
    model = keras.Model({"a": a, "b": b}, keras.layers.Dense(2, name="d")(joined))
    rng = np.random.default_rng(0)
    x = {"a": rng.normal(size=(8, 3)), "b": rng.normal(size=(8, 2))}
    y = rng.normal(size=(8, 2))
    scores = selection.fisher_scores(model, x, y, loss="mse", batch_size=4, batches=2)
    stacked = np.concatenate([x["a"], x["b"]], axis=1)
    concatenated = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
    concatenated.set_weights(model.get_layer("d").get_weights())
    expected = selection.fisher_scores(
        concatenated, stacked, y, loss="mse", batch_size=4, batches=2
    )
    for path, score in zip(scores, expected.values(), strict=True):
        np.testing.assert_allclose(scores[path], score, rtol=1e-5)
    short = {"a": x["a"], "b": x["b"][:6]}
    with pytest.raises(ValueError, match="same number of rows.*6, 8 and 8"):
        selection.fisher_scores(model, short, y, loss="mse")


def test_structured_masks():
    np.testing.assert_array_equal(
        selection.diagonal_mask((3, 3)), np.eye(3, dtype=bool)
    )
    band = selection.band_mask((4, 4), 1, 0)
    np.testing.assert_array_equal(
        band, np.tril(np.triu(np.ones((4, 4)), -1)).astype(bool)
    )
    assert selection.rows_mask((4, 2), [1, 3]).sum() == 4
    assert selection.columns_mask((2, 3, 5), [4]).sum() == 6
    blocks = selection.block_mask((4, 4), [2, 2], [1, 3], [(0, 1), (1, 0)])
    assert blocks.sum() == 2 * 3 + 2 * 1


@pytest.mark.tensorflow_only
def test_a_kernel_regularizer_penalizes_the_free_values_with_the_plain_gradient():
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3, name="d", kernel_regularizer="l2")]
    )
    mask = np.zeros((4, 3), bool)
    mask[0, 0] = mask[2, 1] = True
    converted = refimpl.partialize(model, {"d": mask})
    layer = converted.get_layer("d")
    kernel = _numpy(layer.kernel)
    # The penalty counts the free values only ...
    [penalty] = converted.losses
    np.testing.assert_allclose(_numpy(penalty), 0.01 * np.sum(kernel[mask] ** 2))
    # ... and its gradient on them is the plain layer's.
    plain = model.get_layer("d")
    with tf.GradientTape() as tape:
        [plain_penalty] = model.losses
    [plain_grad] = tape.gradient(plain_penalty, [plain.kernel])
    with tf.GradientTape() as tape:
        [penalty] = converted.losses
    [grad] = tape.gradient(penalty, [layer.partial_weight.free])
    np.testing.assert_allclose(_numpy(grad), _numpy(plain_grad)[mask], rtol=1e-6)


def test_a_regularizer_that_is_not_elementwise_is_refused():
    layer = keras.layers.Dense(
        3, kernel_regularizer=keras.regularizers.OrthogonalRegularizer()
    )
    layer.build((None, 3))
    with pytest.raises(ValueError, match="not elementwise"):
        refimpl.enable_partial(layer, np.eye(3, dtype=bool))


def test_an_all_false_mask_freezes_the_whole_weight():
    model, x, y = _setup("conv2d")
    shape = tuple(_weight(model.get_layer("target")).shape)
    converted = refimpl.partialize(model, {"target": np.zeros(shape, bool)})
    layer = converted.get_layer("target")
    assert layer.partial_weight.num_free == 0
    assert layer.partial_weight.base.path.endswith("target/kernel")
    assert not layer.partial_weight.base.trainable
    before = _numpy(layer.kernel)
    converted.compile(optimizer=keras.optimizers.AdamW(0.05), loss="mse")
    converted.fit(x, y, epochs=1, verbose=0)
    np.testing.assert_array_equal(_numpy(layer.kernel), before)


def test_a_refused_conversion_leaves_the_layer_plain():
    # The mode is checked after the class is chosen; a refusal must undo it,
    # so that the layer is still plain and a valid call converts it.
    conv = keras.layers.Conv2D(4, 3, name="conv")
    conv.build((None, 8, 8, 3))
    mask = np.zeros((3, 3, 3, 4), bool)
    mask[0, 0, 0, 0] = True
    with pytest.raises(ValueError, match="of type Conv2D"):
        refimpl.enable_partial(conv, mask, mode="sparse")
    assert type(conv) is keras.layers.Conv2D
    assert [w.name for w in conv.weights] == ["kernel", "bias"]
    refimpl.enable_partial(conv, mask)
    assert type(conv).__name__ == "PartialConv2D" and conv.partial_weight.num_free == 1


def test_partial_dense_refuses_a_regularizer_it_cannot_split():
    regularizer = keras.regularizers.OrthogonalRegularizer()
    with pytest.raises(ValueError, match="`kernel_regularizer` must be elementwise"):
        refimpl.PartialDense(2, [[0, 0]], kernel_regularizer=regularizer)
