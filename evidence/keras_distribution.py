"""A converted model under ``keras.distribution``, on 8 simulated JAX devices.

``python -m evidence.keras_distribution OUT.json`` (JAX backend; it sets the
8 host devices itself, before JAX starts) writes what the distributed
chapter shows:

* ``"layouts"``: for each distribution, the sharding of every weight of a
  converted two-layer model, of its composed kernels, and whether its direct
  calls, ``predict`` and ``fit`` give the plain model's results (bit for bit;
  frozen entries kept; one device's result to rounding);
* ``"rules"``: what three ``LayoutMap`` keys do to a layer's partial weights
  (a key for every weight of the layer, a key that names them, and one that
  names them with a count its axis does not divide);
* ``"memory"``: the bytes each device holds for the variables and Adam's
  state of a 512 → 2048 → 512 block sharded as in Megatron-style model
  parallelism (the first kernel by columns, the second by rows), for full
  fine-tuning and for partial models at several densities, with the free
  values replicated or sharded by a ``LayoutMap`` key that names them.

The tests in ``tests/test_keras_distribution.py`` check the same promises on
every converted layer type.
"""

from __future__ import annotations

import json
import os
import sys

DEVICES = 8


def _setup():
    os.environ.setdefault("KERAS_BACKEND", "jax")
    flag = f"--xla_force_host_platform_device_count={DEVICES}"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()


def _spec(tensor) -> list:
    value = getattr(tensor, "value", tensor)
    axes = list(value.sharding.spec)
    return axes + [None] * (len(value.shape) - len(axes))


def _bytes_per_device(variables) -> int:
    """The most bytes any one device holds of ``variables``."""
    held: dict = {}
    for variable in variables:
        for shard in variable.value.addressable_shards:
            held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
    return max(held.values())


def _distributions(keras):
    dist = keras.distribution
    devices = dist.list_devices()
    square = dist.DeviceMesh((2, 4), ["batch", "model"], devices)
    flat = dist.DeviceMesh((8,), ["model"], devices)

    def model_parallel(mesh, layouts, batch="batch"):
        layout_map = dist.LayoutMap(mesh)
        for key, axes in layouts.items():
            layout_map[key] = axes
        return dist.ModelParallel(layout_map=layout_map, batch_dim_name=batch)

    return {
        "DataParallel 8": dist.DataParallel(devices=devices),
        "ModelParallel 2×4, columns then rows": model_parallel(
            square, {"d1/kernel": (None, "model"), "d2/kernel": ("model", None)}
        ),
        "ModelParallel 8, rows then columns": model_parallel(
            flat, {"d1/kernel": ("model", None), "d2/kernel": (None, "model")}, "model"
        ),
        "ModelParallel 2×4, both axes": model_parallel(
            square, {"d1/kernel": ("batch", "model"), "d2/kernel": ("model", "batch")}
        ),
    }


def build(keras, refimpl, masks):
    """The plain two-layer model and its conversion (call it in a scope)."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16,))
    hidden = keras.layers.Dense(32, activation="relu", name="d1")(inputs)
    plain = keras.Model(inputs, keras.layers.Dense(8, name="d2")(hidden))
    return plain, refimpl.partialize(plain, masks)


def train(keras, model, x, y):
    """Three epochs of ``fit`` with AdamW, whose decay moves any entry it holds."""
    optimizer = keras.optimizers.AdamW(learning_rate=0.05, weight_decay=0.1)
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)


def _layouts(keras, np, refimpl):
    from refimpl import selection

    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 16)).astype("float32")
    y = rng.normal(size=(32, 8)).astype("float32")
    masks = {
        "d1": selection.random_mask((16, 32), fraction=0.125, seed=1),
        "d2": selection.random_mask((32, 8), fraction=0.125, seed=2),
    }

    def kernels(model):
        return {n: keras.ops.convert_to_numpy(model.get_layer(n).kernel) for n in masks}

    alone = build(keras, refimpl, masks)[1]
    train(keras, alone, x, y)
    one_device = kernels(alone)
    results = {}
    for name, distribution in _distributions(keras).items():
        with distribution.scope():
            plain, converted = build(keras, refimpl, masks)
            direct = np.array_equal(converted(x), plain(x))
            predict = np.array_equal(
                converted.predict(x, batch_size=16, verbose=0),
                plain.predict(x, batch_size=16, verbose=0),
            )
            start = kernels(converted)
            train(keras, converted, x, y)
            trained = kernels(converted)
        base = converted.get_layer("d1").partial_weight.base
        results[name] = {
            "mesh": dict(
                zip(distribution.device_mesh.axis_names, distribution.device_mesh.shape)
            ),
            "batch_axis": distribution.batch_dim_name,
            "plain": {v.path: _spec(v) for v in plain.weights},
            "weights": {v.path: _spec(v) for v in converted.weights},
            "composed": {n: _spec(converted.get_layer(n).kernel) for n in masks},
            "d1_kernel_shard": list(base.value.addressable_shards[0].data.shape),
            "direct_bit_identical": bool(direct),
            "predict_bit_identical": bool(predict),
            "frozen_moved": int(
                sum((start[n] != trained[n])[~masks[n]].sum() for n in masks)
            ),
            "free_moved": bool(
                all((start[n] != trained[n])[masks[n]].any() for n in masks)
            ),
            "max_difference_from_one_device": float(
                max(np.abs(trained[n] - one_device[n]).max() for n in masks)
            ),
        }
    return results


def _rules(keras, np, refimpl):
    """What three LayoutMap keys do to the partial weights of ``d1``."""
    from refimpl import selection

    dist = keras.distribution
    mesh = dist.DeviceMesh((2, 4), ["batch", "model"], dist.list_devices())
    mask = selection.random_mask((16, 32), k=64, seed=1)
    keys = {
        "every weight of d1": {"d1/.*": (None, "model")},
        "names the free values": {
            "d1/kernel": ("model", None),
            ".*/partial_free": ("model",),
        },
        "names them, 62 free": {".*/partial_free": ("model",)},
    }
    found = {}
    for name, layouts in keys.items():
        layout_map = dist.LayoutMap(mesh)
        for key, axes in layouts.items():
            layout_map[key] = axes
        with dist.ModelParallel(layout_map=layout_map, batch_dim_name="batch").scope():
            keras.utils.set_random_seed(0)
            inputs = keras.Input((16,))
            d1 = keras.layers.Dense(32, use_bias=False, name="d1")
            plain = keras.Model(inputs, d1(inputs))
            count = 62 if "62" in name else 64
            chosen = mask.copy()
            chosen.flat[np.flatnonzero(chosen)[count:]] = False
            row = {"keys": {k: list(v) for k, v in layouts.items()}}
            try:
                converted = refimpl.partialize(plain, {"d1": chosen})
            except ValueError as error:
                row["error"] = str(error)
            else:
                layer = converted.get_layer("d1")
                optimizer = keras.optimizers.Adam()
                optimizer.build(converted.trainable_variables)
                row["weights"] = {v.path: _spec(v) for v in converted.weights}
                row["adam"] = {
                    v.path.rpartition("/")[2]: _spec(v)
                    for v in optimizer.variables
                    if "partial_free" in v.path
                }
                row["composed"] = _spec(layer.kernel)
        found[name] = row
    return found


def _memory(keras, np, refimpl):
    from refimpl import selection

    dist = keras.distribution
    mesh = dist.DeviceMesh((2, 4), ["batch", "model"], dist.list_devices())
    kernels = {"up/kernel": (None, "model"), "down/kernel": ("model", None)}

    def block(distribution, density=None):
        with distribution.scope():
            keras.utils.set_random_seed(0)
            inputs = keras.Input((512,))
            hidden = keras.layers.Dense(2048, name="up")(inputs)
            model = keras.Model(inputs, keras.layers.Dense(512, name="down")(hidden))
            if density is not None:
                # A count the 4 devices of the "model" axis divide, so that
                # the free values can also be sharded.
                k = 4 * round(density * 512 * 2048 / 4)
                masks = {
                    name: selection.random_mask(shape, k=k, seed=i)
                    for i, (name, shape) in enumerate(
                        [("up", (512, 2048)), ("down", (2048, 512))]
                    )
                }
                model = refimpl.partialize(model, masks)
            optimizer = keras.optimizers.Adam()
            optimizer.build(model.trainable_variables)
        return {
            "variables": _bytes_per_device(model.weights),
            "optimizer": _bytes_per_device(optimizer.variables),
            "values_trained": int(
                sum(np.prod(v.shape) for v in model.trainable_variables)
            ),
        }

    def distribution(shard_free):
        layout_map = dist.LayoutMap(mesh)
        for key, axes in kernels.items():
            layout_map[key] = axes
        if shard_free:
            layout_map[".*/partial_free"] = ("model",)
        return dist.ModelParallel(layout_map=layout_map, batch_dim_name="batch")

    rows = [{"model": "full fine-tuning", **block(distribution(False))}]
    for density in (0.01, 0.0625, 0.25):
        for shard_free in (False, True):
            where = "sharded by 'model'" if shard_free else "replicated"
            rows.append(
                {
                    "model": f"partial {density:.2%}, free values {where}",
                    "density": density,
                    **block(distribution(shard_free), density),
                }
            )
    return {"model_axis": 4, "rows": rows}


def main(argv: list[str]) -> int:
    """Write the layouts and the memory per device to ``argv[0]`` (JSON)."""
    _setup()
    import keras
    import numpy as np

    import refimpl

    keras.config.disable_interactive_logging()
    results = {
        "devices": len(keras.distribution.list_devices()),
        "layouts": _layouts(keras, np, refimpl),
        "rules": _rules(keras, np, refimpl),
        "memory": _memory(keras, np, refimpl),
    }
    with open(argv[0], "w") as out:
        json.dump(results, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
