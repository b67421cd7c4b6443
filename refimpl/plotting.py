"""Draw masks and "which entries moved" maps with matplotlib.

Matplotlib is imported when a function is called, so `import refimpl` does not
need it.
"""

from __future__ import annotations

import numpy as np

from refimpl.masks import to_mask

__all__ = ["plot_mask"]

_COLORS = {"frozen": "#d9d9d9", "trainable": "#2b8cbe", "moved": "#e34a33"}


def plot_mask(mask, *, ax=None, title: str | None = None, values=None, moved=None):
    """Draw a rank-1 or rank-2 mask as a grid of cells.

    Trainable cells are blue, frozen cells grey. With ``moved``, frozen cells
    that changed are drawn red, so a broken promise is visible at a glance.

    Args:
        mask: a boolean mask (``True`` = trainable) of rank 1 or 2, or anything
            :func:`refimpl.masks.to_mask` accepts together with ``values``.
        ax: the matplotlib axes to draw into; a new figure when ``None``.
        title: the axes title.
        values: optional array of the mask's shape, printed in the cells.
        moved: optional boolean array, ``True`` where an entry changed.

    Returns:
        The ``matplotlib.axes.Axes`` drawn into.

    After training a converted model, draw its kernel's mask and the frozen
    entries that moved (none here: a partial layer keeps them exact):

    >>> import keras
    >>> from refimpl import partialize
    >>> from refimpl.plotting import plot_mask
    >>> from refimpl.selection import band_mask
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, name="d")])
    >>> before = keras.ops.convert_to_numpy(model.get_layer("d").kernel)
    >>> mask = band_mask((4, 4), 1, 0)
    >>> tuned = partialize(model, {"d": mask})
    >>> tuned.compile(optimizer="adam", loss="mse")
    >>> rng = np.random.default_rng(0)
    >>> _ = tuned.fit(rng.normal(size=(8, 4)), rng.normal(size=(8, 4)), verbose=0)
    >>> moved = keras.ops.convert_to_numpy(tuned.get_layer("d").kernel) != before
    >>> ax = plot_mask(mask, title="d/kernel", moved=moved)
    >>> int((moved & ~mask).sum())  # red cells: frozen entries that moved
    0
    >>> import matplotlib.pyplot as plt
    >>> plt.close(ax.figure)  # after ax.figure.savefig(...), say
    """
    shape = np.shape(values) if values is not None else np.shape(mask)
    grid = to_mask(mask, shape)
    if grid.ndim == 1:
        grid = grid[None, :]
    if grid.ndim != 2:
        raise ValueError(
            f"`mask` must have rank 1 or 2 to be drawn. Received shape {shape}"
        )
    import matplotlib.pyplot as plt  # after the checks: a bad mask says so first
    from matplotlib.colors import ListedColormap

    codes = grid.astype(int)
    if moved is not None:
        moved = np.asarray(moved, dtype=bool).reshape(grid.shape)
        codes = np.where(moved & ~grid, 2, codes)
    cmap = ListedColormap([_COLORS["frozen"], _COLORS["trainable"], _COLORS["moved"]])
    if ax is None:
        _, ax = plt.subplots(
            figsize=(0.45 * grid.shape[1] + 1, 0.45 * grid.shape[0] + 1)
        )
    ax.imshow(codes, cmap=cmap, vmin=0, vmax=2)
    ax.set_xticks(np.arange(grid.shape[1] + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(grid.shape[0] + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="both", length=0, labelbottom=False, labelleft=False)
    if values is not None:
        vals = np.asarray(values).reshape(grid.shape)
        for (i, j), v in np.ndenumerate(vals):
            ax.text(j, i, f"{v:g}", ha="center", va="center", fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return ax
