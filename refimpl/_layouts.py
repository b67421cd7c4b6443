"""How a partial layer's weights are laid out under ``keras.distribution``.

The rules, for ``DataParallel`` and ``ModelParallel`` alike:

* the base is the layer's own variable: it keeps its path (``d1/kernel``), so
  a ``LayoutMap`` written for the plain model lays it out as before;
* the composed weight (``layer.kernel``) is constrained to the base's layout,
  so the layer's ``call`` sees the tensor it saw before conversion, laid out
  alike, and computes the same bits;
* ``partial_free`` and ``partial_positions`` are replicated (in the
  ``"select"`` form the free tensor has the base's shape and takes its
  layout). A ``LayoutMap`` entry reaches them only if its key names them:
  a key that matches every weight of a layer (``d1/.*``) does not catch them
  by accident. A named entry must be 1-D, and its mesh axes must divide the
  number of free values; anything else is refused with a ``ValueError``.
"""

from __future__ import annotations

import contextlib
import math

import keras

from refimpl import _compat

# A weight name no LayoutMap key names: a key that matches it matches every
# weight of the layer, so it does not name the partial weights.
_PROBE = "x"


def constrained(value, base):
    """``value`` laid out like the variable ``base`` (unchanged if it has no layout)."""
    layout = _compat.variable_layout(base)
    if layout is None:
        return value
    return keras.distribution.distribute_tensor(value, layout)


def _tensor_layout(distribution, path):
    try:
        return distribution.get_tensor_layout(path)
    except NotImplementedError:  # a distribution that lays out no tensors
        return None


def named_layout(distribution, path):
    """The layout a ``LayoutMap`` gives ``path`` because one of its keys names it."""
    layout = _tensor_layout(distribution, path)
    if layout is None:
        return None
    head = path.rpartition("/")[0]
    if _tensor_layout(distribution, f"{head}/{_PROBE}" if head else _PROBE):
        return None
    return layout


def _check(layout, path, shape, layer_name, mesh):
    axes = tuple(layout.axes)
    name = path.rpartition("/")[2]
    sizes = dict(zip(mesh.axis_names, mesh.shape))
    fits = len(axes) == len(shape)
    for axis, dim in zip(axes, shape):
        names = () if axis is None else (axis,) if isinstance(axis, str) else axis
        fits = fits and dim % math.prod(sizes.get(n, 1) for n in names) == 0
    if not fits:
        raise ValueError(
            f"The LayoutMap entry for {path!r} gives the layout "
            f"{axes} on the mesh {sizes}; `{name}` of layer "
            f"{layer_name!r} has the shape {shape}. Expected one entry per "
            f"dimension ({len(shape)}), each a mesh axis whose size divides "
            "that dimension or None, or no LayoutMap entry (replicated)."
        )
    return layout


class _PartialWeights(keras.distribution.ModelParallel):
    """The current distribution, but with the layouts of the partial weights.

    (A ``ModelParallel`` because Keras exports no base class of its
    distributions; its own layout map is empty and never read.)
    """

    def __init__(self, outer, layer, base, select, free_name="partial_free"):
        super().__init__(
            layout_map=keras.distribution.LayoutMap(outer.device_mesh),
            batch_dim_name=outer.batch_dim_name,
            auto_shard_dataset=outer.auto_shard_dataset,
        )
        self._outer, self._layer, self._base, self._select = outer, layer, base, select
        self._free_name = free_name

    def get_data_layout(self, data_shape):
        return self._outer.get_data_layout(data_shape)

    def get_tensor_layout(self, path):
        return self._outer.get_tensor_layout(path)

    def get_variable_layout(self, variable):
        mesh = self._outer.device_mesh
        layout = named_layout(self._outer, variable.path)
        if layout is not None:
            shape = tuple(variable.shape)
            return _check(layout, variable.path, shape, self._layer.name, mesh)
        if self._select and variable.name == self._free_name:
            base = _compat.variable_layout(self._base)
            if base is not None:
                return base
        axes = [None] * len(variable.shape)
        return keras.distribution.TensorLayout(axes, mesh)


def check_named(layer, base, num_free: int, *, select: bool) -> None:
    """Refuse, before any conversion, a named layout that will not fit.

    Raises:
        ValueError: as :func:`partial_weights` would, for the same entry.
    """
    outer = keras.distribution.distribution()
    if outer is None:
        return
    head = layer.path or layer.name
    shapes = {
        "partial_free": tuple(base.shape) if select else (num_free,),
        "partial_positions": (num_free,),
    }
    for name, shape in shapes.items():
        layout = named_layout(outer, f"{head}/{name}")
        if layout is not None:
            _check(layout, f"{head}/{name}", shape, layer.name, outer.device_mesh)


@contextlib.contextmanager
def partial_weights(layer, base, *, select: bool, free_name: str = "partial_free"):
    """Create the free values and positions with the layouts above."""
    outer = keras.distribution.distribution()
    if outer is None:
        yield
        return
    with _PartialWeights(outer, layer, base, select, free_name).scope():
        yield
