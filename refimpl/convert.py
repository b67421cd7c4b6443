"""A model in and out: :func:`partialize` converts, :func:`merge` folds back.

A converted model saved and loaded back (:ref:`Saving and loading
<api-saving>` says what a fresh process needs):

>>> import os, tempfile
>>> import refimpl
>>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")])
>>> converted = refimpl.partialize(model, {"d": [[0, 0], [2, 1]]})
>>> path = os.path.join(tempfile.mkdtemp(), "converted.keras")
>>> converted.save(path)
>>> loaded = keras.saving.load_model(path)
>>> type(loaded.get_layer("d")).__name__, loaded.get_layer("d").partial_weight.num_free
('PartialDense', 2)
>>> x = np.ones((1, 3), "float32")
>>> before, after = converted.predict(x, verbose=0), loaded.predict(x, verbose=0)
>>> bool(np.array_equal(before, after))  # the same weights, bit for bit
True
"""

from __future__ import annotations

import gc

import keras
import numpy as np

from refimpl import _compat, quantized
from refimpl.layers.partial import (
    PartialWeightMixin,
    _check_layout,
    _is_container,
    _is_quantized_kernel,
    _is_supported,
    _mark_hosts,
    _supported_names,
    _target_weight,
    _unmark_hosts,
    _weight_names,
    _weight_shape,
    enable_partial,
)
from refimpl.masks import _describe, _variable_path, to_mask
from refimpl.ops import _LAYER_MODES, _check_mode
from refimpl.partial import partial_weights

__all__ = ["merge", "partialize", "trainable_summary"]


def partialize(
    model,
    layer_masks,
    *,
    train=None,
    in_place: bool = False,
    mode: str = "delta",
    summary: bool = False,
):
    """Return a model whose chosen weights are trainable only at some entries.

    Each chosen layer gets a partially trainable weight
    (:mod:`refimpl.layers.partial`): a ``Dense``, ``EinsumDense`` (attention
    projections), convolution (transposed, depthwise and separable too),
    ``SimpleRNN``, ``LSTM`` or ``GRU`` cell, ``Embedding`` or keras-hub embedding
    (:func:`refimpl.layers.partial.supported_classes`); a ``Dense`` or
    ``EinsumDense`` that Keras quantized (``model.quantize("int8")`` or
    ``"int4"``) keeps its codes and scales and gets float free values
    (:mod:`refimpl.quantized`; quantizing the converted model instead gives
    the same layers). **Everything else is
    frozen**, as PEFT and keras-hub's ``enable_lora`` do: every other layer and
    the chosen layers' biases (:func:`trainable_summary` lists what trains),
    unless ``train``
    names them. Weights and structure are unchanged: before training, the
    outputs equal the original's bit for bit (under PyTorch, an ``LSTM`` or
    ``GRU`` layer that is frozen but not converted is the exception: PyTorch
    rounds a frozen one's product by its inputs differently, as it does for
    ``layer.trainable = False`` in plain Keras). An elementwise kernel regularizer
    (L1, L2) now penalizes the free entries alone. The free entries' gradients
    are unchanged; the loss that ``fit`` reports is lower by the frozen
    entries' share of the penalty.

    A key (of ``layer_masks`` or ``train``) matches a layer by its name, its
    weight's path, or the end of the path (``"query/kernel"``, ``"query"``), at
    any depth (inside attention layers and transformer blocks too); a key of
    ``layer_masks`` converts every layer it matches (:func:`trainable_summary`
    lists them). A key naming an RNN layer converts its cell's kernel, and
    one naming a wrapper (``Bidirectional``, ``TimeDistributed``, any
    ``keras.layers.Wrapper``) the layer it wraps (both directions'); a weight
    path picks a layer's other weight (``"lstm/recurrent_kernel"``,
    ``"sep/pointwise_kernel"``).

    Args:
        model: a built Keras model, copied: ``Sequential``, functional, or a
            subclass of the functional model that rebuilds from its config
            (every keras-hub model); with ``in_place=True``, any model.
        layer_masks: a dict from a key (a layer name, or a weight path such as
            ``"dense/kernel"``) to the trainable entries of that layer's
            kernel (embeddings for ``Embedding``): a boolean mask, an index
            list, or a policy, a callable that takes the weight's values (a
            NumPy array) and returns the mask, such as
            ``lambda w: refimpl.selection.magnitude_mask(w, fraction=0.01)``.
        train: layers that stay as they were, like PEFT's ``modules_to_save``:
            a list of keys (``["head", "layer_norm"]``; a converted layer named
            here trains its bias too), or ``"all"`` (nothing else frozen). A
            frozen ``BatchNormalization`` runs in inference mode, as in Keras'
            fine-tuning guide.
        in_place: convert ``model``'s own layers (as Keras' ``enable_lora``
            does) instead of a copy's.
        mode: the form of every partial weight (see :ref:`the forms <api-forms>`;
            which layers take ``"sparse"`` and ``"slices"``:
            :func:`refimpl.enable_partial <refimpl.layers.partial.enable_partial>`).
            The default, ``"delta"``, is the one form in which the merged
            model predicts what the trained one does bit for bit, on every
            layer type; ``"auto"`` is faster where it picks the sparse or
            slices form (whole rows or columns of a kernel), which compute the
            product in pieces, so the merged model agrees to rounding.
        summary: print :func:`trainable_summary` of the
            result: what trains, weight by weight, and the totals.

    Returns:
        The converted ``keras.Model`` (``model`` itself with ``in_place=True``),
        not compiled (its old optimizer knew the old variables): compile it
        before training.

    Raises:
        TypeError: for a model that is not a Keras model, a subclassed model
            without ``in_place=True``, ``layer_masks`` that is not a dict, or a
            chosen layer of a type this cannot convert (the message names the
            layer and its type).
        ValueError: for a model that is not built, a key that names no layer
            or weight, a mask that does not fit, a ``LayoutMap`` entry for a
            partial weight that does not fit it, or a chosen layer quantized in
            a way a partial weight does not combine with (float8, gptq, awq, a
            quantized ``Embedding``; the ``"select"`` form over int8 or int4),
            named in the message, before anything is copied.

    On many devices (``keras.distribution``, ``tf.distribute``), the section
    :ref:`Many devices <api-many-devices>` says how to convert, lay out and
    train.

    >>> from refimpl import partialize
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")])
    >>> converted = partialize(model, {"d": [[0, 0], [2, 1]]})
    >>> [(w.name, tuple(w.shape)) for w in converted.trainable_weights]  # bias frozen
    [('partial_free', (2,))]
    """
    _check_model(model, "partialize", allow_subclassed=in_place)
    if not isinstance(layer_masks, dict):
        raise TypeError(
            "`layer_masks` must be a dict from a layer name or weight path to a mask "
            f"or a policy. Received: layer_masks={_describe(layer_masks)}"
        )
    if not isinstance(summary, bool):
        raise TypeError(
            f"`summary` must be True or False. Received: {_describe(summary)}"
        )
    if not isinstance(in_place, bool):
        raise TypeError(
            f"`in_place` must be True or False. Received: {_describe(in_place)}"
        )
    _check_mode(mode, allowed=_LAYER_MODES)
    train = _check_train(train)
    keep = (
        []
        if train == "all"
        else [layer for _, layer in _match_keys(model, train, "train")]
    )
    # Every mask is computed and checked before anything is converted.
    chosen = [
        (layer, weight, _policy_mask(layer, mask, f"layer_masks[{key!r}]", weight))
        for key, layer, weight, mask in _resolve(model, layer_masks)
    ]
    for layer, weight, mask in chosen:
        _check_layout(layer, _target_weight(layer, weight), mask, mode, weight)
    target = model if in_place else _copy(model, "partialize")
    _compat.resolve_policy_maps(target)  # so that it saves and quantizes
    if target is not model:
        # The copy has the same layers in the same order, at every depth.
        place = {id(layer): i for i, layer in enumerate(_compat.sub_layers(model))}
        after = _compat.sub_layers(target)
        chosen = [(after[place[id(layer)]], w, mask) for layer, w, mask in chosen]
        keep = [after[place[id(layer)]] for layer in keep]
    for layer, weight, mask in chosen:
        enable_partial(layer, mask, mode=mode, weight=weight)
    if train != "all":
        _freeze_others(target, keep)
    _mark_hosts(target)
    _compat.dispatch_quantize(target)  # refimpl's check before Keras' quantize
    if summary:
        trainable_summary(target, print_fn=print)
    _uncompile(target)
    return target


def _uncompile(model) -> None:
    """Mark a model whose variables changed as not compiled.

    Its optimizer and traced steps know the old variables: training on them
    would move the frozen base and no free value, so ``fit`` must ask for a
    new ``compile``. (``clone_model`` compiles a copy of a compiled model.)
    """
    if getattr(model, "compiled", False):
        model.compiled = False
        model.optimizer = None
        model.train_function = model.test_function = None
        model.predict_function = None


def _check_model(model, what: str, *, allow_subclassed: bool = False) -> None:
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"`model` must be a Keras model. Received: model={_describe(model)}"
        )
    if (
        not allow_subclassed
        and not isinstance(model, keras.Sequential)
        and not _compat.is_functional(model)
    ):
        extra = (
            " Pass `in_place=True` to convert its layers themselves."
            if what == "partialize"
            else " Pass `in_place=True` to fold its layers themselves."
        )
        raise TypeError(
            "`model` must be a Sequential or functional model; a subclassed "
            f"model's structure is Python code that {what} cannot copy.{extra} "
            f"Received: {type(model).__name__}"
        )
    if not model.built:
        raise ValueError(
            f"`model` must be built. Received: model={_describe(model.name)}"
        )


def merge(model, *, in_place: bool = False, requantize: bool = False):
    """Return the plain Keras model: every partial weight folded back, at every depth.

    Each partial layer becomes its plain Keras class again, with the trained
    weight as its own variable (``fold()``, in place on a copy);
    each layer that held partial sub-layers gets its plain class back; a
    ``DiagonalDense``, ``BandedDense`` or ``BlockDense`` of a functional or
    ``Sequential`` model becomes the ``keras.layers.Dense`` its ``to_dense()``
    gives. The result uses only Keras' (and keras-hub's) own classes, so it
    serves, exports and loads without ``refimpl``, and predicts what
    ``model`` predicts: bit for bit where the layer's product is a plain
    matmul (the delta and select forms, a diagonal), to rounding otherwise.
    Each converted layer's weights train again, its bias too; every other
    layer keeps the trainable status it had in ``model`` (frozen, if
    ``partialize`` froze it).

    Args:
        model: a built model that :func:`partialize` accepts: ``Sequential``,
            functional or a subclass of it that rebuilds from its config
            (every keras-hub model), or any model with ``in_place=True``.
        in_place: fold ``model``'s own layers instead of a copy's (as for a
            subclassed model converted in place).
        requantize: for a layer whose base Keras quantized (int8, int4:
            :mod:`refimpl.quantized`), quantize the merged kernel again, in
            the same mode and config, with Keras' own quantizer. By default
            (``False``) such a layer becomes the float plain layer, whose
            kernel is exactly the trained one (the dequantized base with the
            free values). Quantizing again rounds the free values to the grid
            (and may change their channels' scales): it moves the outputs by
            what quantizing the float merged model moves them, measured
            (``tests/test_quantized_base.py``; a Dense and an EinsumDense, 5%
            random trained by Adam) at 0.4% of the outputs' largest value for
            int8, 1.6% for int4 per channel and 2.3% for Keras' default int4
            (groups of 128), and at 0.7% of the logits of a tiny keras-hub
            GPT-2 in int8 with 1% trained.

    Returns:
        The merged ``keras.Model`` (``model`` itself with ``in_place=True``),
        not compiled.

    Raises:
        TypeError: for an object that is not a Keras model, or a subclassed
            model without ``in_place=True``.
        ValueError: for a model that is not built, or a refimpl object that
            has no plain Keras form where it sits (named in the message).

    >>> from refimpl import merge, partialize
    >>> keras.utils.set_random_seed(0)
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")])
    >>> converted = partialize(model, {"d": [[0, 0], [2, 1]]})
    >>> converted.compile(optimizer="adam", loss="mse")
    >>> _ = converted.fit(np.ones((8, 3)), np.ones((8, 2)), epochs=2, verbose=0)
    >>> merged = merge(converted)
    >>> type(merged.get_layer("d")).__name__
    'Dense'
    >>> composed = keras.ops.convert_to_numpy(converted.get_layer("d").kernel)
    >>> kernel = keras.ops.convert_to_numpy(merged.get_layer("d").kernel)
    >>> bool(np.array_equal(kernel, composed))  # the trained kernel, bit for bit
    True
    """
    _check_model(model, "merge", allow_subclassed=in_place)
    if not isinstance(in_place, bool):
        raise TypeError(
            f"`in_place` must be True or False. Received: {_describe(in_place)}"
        )
    if not isinstance(requantize, bool):
        raise TypeError(
            f"`requantize` must be True or False. Received: {_describe(requantize)}"
        )
    own = [
        pw.owner
        for pw in partial_weights(model)
        if not isinstance(pw.owner, PartialWeightMixin)
    ]
    if own:  # refused before any change, as every refusal here
        raise ValueError(
            f"`model` holds a PartialVariable, {_where(own[0])}, in a layer of "
            "your own: merge folds partial layers into Keras' own classes, and "
            "your layer's code reads the PartialVariable. Read its trained "
            "tensor with `.value()` and give it to a plain weight of your "
            f"layer, or use a partial layer (`refimpl.partialize`). Received: "
            f"{len(own)} PartialVariable(s)"
        )
    structured = [
        layer
        for layer in _compat.sub_layers(model)
        if hasattr(layer, "to_dense") and not isinstance(layer, PartialWeightMixin)
    ]
    top = {id(layer) for layer in getattr(model, "layers", ())}
    if in_place or not _is_container(model):
        # Only a functional or Sequential model's own layers can be replaced.
        top = set()
    top &= {id(layer) for layer in structured}
    misplaced = [layer for layer in structured if id(layer) not in top]
    if misplaced:
        raise ValueError(
            f"`model` holds {', '.join(_where(layer) for layer in misplaced)} "
            f"({type(misplaced[0]).__name__}), whose weights are not a Keras "
            "layer's own: merge replaces such a layer only among the layers of "
            "a functional or Sequential model, and not with `in_place=True`. "
            "Call its `to_dense()` and put the Dense layer in its place"
        )
    if in_place:
        merged = model
    elif _is_container(model):
        merged = _clone(
            model,
            replace=lambda layer: layer.to_dense if id(layer) in top else None,
        )
    else:
        merged = _copy(model, "merge")
    _compat.resolve_policy_maps(merged)  # so that it quantizes again and saves
    for layer in _compat.sub_layers(merged):
        if isinstance(layer, PartialWeightMixin):
            base = layer.partial_weight.quantized
            again = None
            if requantize and base is not None:
                again = (base.mode, layer.quantization_config)
            layer._fold()
            if again is not None:  # Keras' own quantizer, on the merged kernel
                layer.quantize(again[0], config=again[1], type_check=False)
    gc.collect()  # once, for the variables every fold removed
    _unmark_hosts(merged)
    _uncompile(merged)
    left = [
        layer
        for layer in [merged, *_compat.sub_layers(merged)]
        if type(layer).__module__.split(".")[0] == "refimpl"
    ]
    if left:
        raise ValueError(
            "`model` holds refimpl layers that have no plain Keras form: "
            f"{[f'{_where(layer)} ({type(layer).__name__})' for layer in left]}"
        )
    return merged


def _copy(model, what: str):
    """A copy of ``model`` with copies of its weights, rebuilt from its config."""
    if _is_container(model):
        return _clone(model)
    try:
        config = keras.saving.serialize_keras_object(model)
        config.pop("compile_config", None)
        copy = keras.saving.deserialize_keras_object(config)
    except (NotImplementedError, TypeError, ValueError) as err:
        raise TypeError(
            f"`model` ({type(model).__name__}) could not be rebuilt from its "
            f"config, so {what} cannot copy it ({err}). Pass `in_place=True` to "
            "convert its own layers."
        ) from None
    lost = sorted({v.path for v in model.weights} - {v.path for v in copy.weights})
    if len(copy.weights) != len(model.weights) and lost:
        raise ValueError(
            f"`model` ({type(model).__name__}) rebuilt from its config lacks "
            f"weights it has: {lost[:5]}, so {what} cannot copy it (a layer "
            "Keras quantized outside what the config records, such as a "
            "keras-hub task's head). Pass `in_place=True` to convert its own "
            f"layers. Received: {len(model.weights)} weights, "
            f"{len(copy.weights)} rebuilt"
        )
    _copy_weights(model, copy)
    return copy


def _copy_weights(source, target) -> None:
    """Set ``target``'s weights to copies of ``source``'s (a layer or model
    rebuilt from its config).

    Paired by path where both have the same paths, each once: a layer that
    Keras quantized (float8) makes its variables in another order when it is
    rebuilt from its config. Otherwise in order, as ``set_weights`` pairs them.
    """
    old, new = source.weights, target.weights
    paths = [v.path for v in old]
    if len(set(paths)) == len(paths) and sorted(paths) == sorted(v.path for v in new):
        by_path = dict(zip(paths, old))
        values = [keras.ops.convert_to_numpy(by_path[v.path]) for v in new]
    else:
        values = source.get_weights()
    # Copies: JAX's trainer donates a model's buffers to its step.
    target.set_weights([np.array(w) for w in values])


def _clone(model, replace=lambda layer: None):
    """A copy of a functional or Sequential ``model`` with its weights;
    ``replace(layer)`` may give a function that returns the layer to use
    instead of a copy."""
    originals = {}

    def clone(layer):
        make = replace(layer)
        if make is not None:
            return make()
        new = layer.__class__.from_config(layer.get_config())
        originals[id(new)] = layer
        return new

    copy = keras.models.clone_model(model, clone_function=clone)
    for layer in copy.layers:
        source = originals.get(id(layer))
        if source is not None:
            _copy_weights(source, layer)
    return copy


# -- what trains: the rest frozen, and a summary of it -------------------------
def _check_train(train) -> tuple | str:
    """The ``train`` argument of
    :func:`refimpl.partialize <refimpl.convert.partialize>`, checked."""
    if train is None:
        return ()
    if train == "all":
        return "all"
    if isinstance(train, str):
        train = (train,)
    if not isinstance(train, (list, tuple)) or not all(
        isinstance(key, str) for key in train
    ):
        raise TypeError(
            "`train` must be a list of layer names or paths that stay trainable, "
            f"or 'all'. Received: train={_describe(train)}"
        )
    return tuple(train)


def _freeze_others(model, keep: list) -> None:
    """Freeze every layer of ``model`` but the partial ones and ``keep``.

    A layer is frozen with ``layer.trainable = False``, which Keras saves in
    its config (a host records the frozen sub-layers it rebuilds); as Keras'
    fine-tuning guide says, a frozen ``BatchNormalization`` runs in inference
    mode. A partial layer keeps its free values trainable and freezes its
    other weights (:meth:`~refimpl.layers.partial.PartialWeightMixin.freeze_rest`).
    """
    kept = {id(layer) for layer in keep}
    for layer in keep:
        kept.update(id(sub) for sub in _compat.sub_layers(layer))
    for layer in _compat.sub_layers(model):
        if id(layer) in kept:
            continue
        if isinstance(layer, PartialWeightMixin):
            layer.freeze_rest()
            continue
        children = _compat.child_layers(layer)
        if not list(children):
            # A leaf: its own weights. (A parent is frozen through its leaves,
            # so that a partial layer inside it keeps training.)
            layer.trainable = False


def _fully_trainable(model) -> list:
    """The weights of ``model`` that train whole: every trainable weight but
    the free values of its partial layers."""
    free = {id(pw.free) for pw in partial_weights(model)}
    return [v for v in model.trainable_weights if id(v) not in free]


def trainable_summary(model, *, print_fn=None) -> list[dict]:
    """What trains in ``model``: one row per weight that has a trainable entry.

    With ``print_fn`` (``print``, say), it also prints the rows as a table
    with the totals.

    Returns:
        A list of dicts, one per weight, with ``"path"`` (str), ``"kind"``
        (str, ``"partial"`` for a partial weight, its free values over its
        base, or ``"full"`` for a weight that trains whole), ``"trainable"``
        (int, its trainable entries) and ``"size"`` (int, all its entries).

    >>> import keras
    >>> import refimpl
    >>> from refimpl.convert import trainable_summary
    >>> layers = [keras.Input((3,)), keras.layers.Dense(2, name="d")]
    >>> model = keras.Sequential(layers, name="net")
    >>> converted = refimpl.partialize(model, {"d": [[0, 0]]})
    >>> trainable_summary(converted)
    [{'path': 'net/d/kernel', 'kind': 'partial', 'trainable': 1, 'size': 6}]
    """
    if print_fn is not None and not callable(print_fn):
        raise TypeError(
            "`print_fn` must be callable, such as print. "
            f"Received: print_fn={_describe(print_fn)}"
        )
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"`model` must be a Keras model. Received: model={_describe(model)}"
        )
    if not model.built:
        raise ValueError(f"`model` must be built. Received: {model.name!r}, not built")
    rows = []
    for pw in partial_weights(model):
        if pw.free.trainable:
            rows.append(
                {
                    "path": _variable_path(pw.base),
                    "kind": "partial",
                    "trainable": pw.num_free,
                    "size": int(np.prod(pw.shape)),
                }
            )
    for variable in _fully_trainable(model):
        size = int(np.prod(variable.shape))
        path = _variable_path(variable)
        rows.append({"path": path, "kind": "full", "trainable": size, "size": size})
    if print_fn is not None:
        width = max([len(row["path"]) for row in rows] + [6])
        print_fn(f"{'weight':<{width}}  {'kind':<7}  {'trainable':>10}  {'of':>10}")
        for row in rows:
            print_fn(
                f"{row['path']:<{width}}  {row['kind']:<7}  "
                f"{row['trainable']:>10,}  {row['size']:>10,}"
            )
        extra = {
            id(v) for pw in partial_weights(model) for v in (pw.free, pw.positions)
        }
        # The model's own values: a partial weight counts once, as its base (a
        # quantized one as the kernel its codes stand for, int4 packs two).
        quantized = [pw for pw in partial_weights(model) if pw.quantized is not None]
        extra |= {id(v) for pw in quantized for v in (pw.base, *pw.scales)}
        total = sum(int(np.prod(v.shape)) for v in model.weights if id(v) not in extra)
        total += sum(int(np.prod(pw.shape)) for pw in quantized)
        trained = sum(row["trainable"] for row in rows)
        print_fn(f"trainable values: {trained:,} of {total:,} ({trained / total:.4%})")
    return rows


# -- keys: which layers and weights a key names -------------------------------
# How a key of :func:`refimpl.partialize <refimpl.convert.partialize>` names the layers
# and weights it means.
#
# A key is a layer's name, its path, or the end of a path (``"query"``,
# ``"query/kernel"``), matched at any depth; a key that names an RNN layer means
# its cell, and one that names a wrapper (``Bidirectional``, ``TimeDistributed``,
# any ``keras.layers.Wrapper``) the layer it wraps; a weight's path picks which
# weight of a layer with two (``"lstm/recurrent_kernel"``).


def _resolve(model, masks):
    """The (layer, mask) pairs that ``masks`` names, each layer checked."""
    layers = _compat.sub_layers(model)
    seen: set = set()
    for key, mask in masks.items():
        if not isinstance(key, str):
            raise TypeError(
                "`layer_masks` keys must be layer names or weight paths. "
                f"Received: {key!r}"
            )
        found = [layer for _, layer in _match_keys(model, [key], "layer_masks", layers)]
        found = list(
            {id(x): x for layer in found for x in _weight_layers(layer)}.values()
        )
        for layer in found:
            if id(layer) in seen:
                raise ValueError(
                    f"`layer_masks[{key!r}]` names layer {_where(layer)}, which "
                    "another key names too: give each layer one mask"
                )
            seen.add(id(layer))
            if isinstance(layer, PartialWeightMixin):
                raise ValueError(
                    f"`layer_masks[{key!r}]` names layer {_where(layer)}, which "
                    "is already partially trainable"
                )
            _check_plain(key, layer)
            if not _is_supported(type(layer)):
                raise TypeError(
                    f"`layer_masks[{key!r}]` names layer {_where(layer)} "
                    "of type "
                    f"{type(layer).__name__}, which partialize cannot convert; it "
                    f"converts {_supported_names()}"
                )
            yield key, layer, _weight_of(layer, key), mask


def _check_plain(key, layer) -> None:
    """Refuse, before anything is converted, a layer that LoRA has changed, or
    that Keras quantized in a way a partial weight does not combine with
    (:mod:`refimpl.quantized`: int8 and int4 of a Dense or EinsumDense do)."""
    if getattr(layer, "lora_enabled", False):
        raise ValueError(
            f"`layer_masks[{key!r}]` names layer {_where(layer)} of type "
            f"{type(layer).__name__}, which uses LoRA (`enable_lora`): a partial "
            "weight does not combine with it. Convert the model without LoRA, "
            "or leave this layer out"
        )
    mode = getattr(layer, "quantization_mode", None)
    if mode and not quantized.combines(layer, mode):
        raise quantized.refusal(
            layer, mode, argument=f"layer_masks[{key!r}]", order="partialize"
        )


def _match_keys(model, keys, name: str, layers=None):
    """The (key, layer) pairs that each key names; a key that names none raises."""
    layers = _compat.sub_layers(model) if layers is None else layers
    for key in keys:
        found = [layer for layer in layers if _names(layer, key)]
        if not found:
            raise ValueError(
                f"`{name}[{key!r}]` names no layer or weight of the model. Its "
                f"layers: {[layer.name for layer in layers][:12]}"
            )
        yield from ((key, layer) for layer in found)


def _where(layer) -> str:
    return repr(layer.path or layer.name)


def _names(layer, key: str) -> bool:
    path = layer.path or layer.name
    if layer.name == key or path == key or path.endswith("/" + key):
        return True
    return _weight_of(layer, key) is not None


def _weight_layers(layer) -> list:
    """The layers that hold the weights a key naming ``layer`` means: an RNN's
    cell, both directions of a ``Bidirectional``, the layer a wrapper
    (``TimeDistributed``, any ``keras.layers.Wrapper``) wraps; else ``layer``
    itself."""
    if isinstance(layer, keras.layers.Bidirectional):
        return [
            *_weight_layers(layer.forward_layer),
            *_weight_layers(layer.backward_layer),
        ]
    if isinstance(layer, keras.layers.Wrapper) and not _is_supported(type(layer)):
        return _weight_layers(layer.layer)
    if isinstance(layer, keras.layers.RNN) and _is_supported(type(layer.cell)):
        return [layer.cell]
    return [layer]


def _weight_of(layer, key: str) -> str | None:
    """The weight of ``layer`` that ``key`` names by its path, if any.

    An RNN cell's weights are also named through the RNN layer
    (``"lstm/recurrent_kernel"`` for ``"lstm/lstm_cell/recurrent_kernel"``).
    """
    if not _is_supported(type(layer)):
        return None
    for weight in _weight_names(layer):
        path = _target_weight(layer, weight).path
        short = None
        if hasattr(layer, "state_size") and "/" in (layer.path or ""):  # a cell
            parent = (layer.path or "").rsplit("/", 1)[0]
            short = f"{parent}/{weight}"
        for candidate in (path, short):
            if candidate and (candidate == key or candidate.endswith("/" + key)):
                return weight
    return None


def _policy_mask(layer, mask, name: str, weight: str | None = None) -> np.ndarray:
    weight = _target_weight(layer, weight)
    if callable(mask):
        values = weight
        if _is_quantized_kernel(layer, weight):  # a policy reads the float kernel
            values = _compat.dequantized_kernel(layer)
        mask = mask(np.array(keras.ops.convert_to_numpy(values)))
    return to_mask(mask, _weight_shape(layer, weight), name=name)
