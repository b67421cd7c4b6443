"""Different optimizers for different groups of variables.

TF 1 code trained groups of variables with separate optimizers by calling
``minimize(loss, var_list=...)`` once per group. :class:`MultiOptimizer` is
that idea as one Keras optimizer, so it works both in a custom loop and in
``model.compile(optimizer=...)`` / ``fit``, and it is saved with the model.

Each group is an optimizer and a *selector* of the variables it updates. A
selector is a Keras layer (all of its variables), a variable, a regular
expression, or a list of those. Every trainable variable must be claimed by
exactly one group: a variable claimed by none or by two is an error, never a
silent fallback.

Regular expressions are matched against the variable's path *and each of its
trailing parts*: ``"head/.*"`` claims ``"sequential/head/kernel"``. This
matters because Keras paths change prefix when a model is reloaded
(``"sequential/head/kernel"`` becomes ``"head/kernel"``); a selector that is
a layer is stored as its name, which does not change.
"""

from __future__ import annotations

import copy
import re

import keras
import tensorflow as tf

__all__ = ["MultiOptimizer"]


def _path(variable) -> str:
    path = getattr(variable, "path", None)
    return str(path) if path else str(variable.name).removesuffix(":0")


def _suffixes(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[i:]) for i in range(len(parts))]


class _SavedPath(str):
    """A variable's path read back from a config (matched like the variable)."""


class _Group:
    """One optimizer and what it claims: patterns, paths and objects."""

    def __init__(self, optimizer, selector, index: int):
        self.optimizer = optimizer
        self.patterns: list[str] = []
        self.paths: list[str] = []  # matched by path (from a saved config)
        self.object_paths: list[str] = []  # matched by identity; saved by path
        self.ids: set[int] = set()
        items = selector if isinstance(selector, (list, tuple)) else [selector]
        if not items:
            raise ValueError(f"`groups[{index}]` selects nothing: its list is empty")
        for item in items:
            if isinstance(item, _SavedPath):
                self.paths.append(str(item))
            elif isinstance(item, str):
                try:
                    re.compile(item)
                except re.error as err:
                    raise ValueError(
                        f"`groups[{index}]` holds an invalid regular expression "
                        f"({err}). Received: {item!r}"
                    ) from err
                self.patterns.append(item)
            elif isinstance(item, keras.layers.Layer):
                self.patterns.append(re.escape(item.name) + "/.*")
            elif isinstance(item, (tf.Variable, keras.Variable)):
                self.ids.add(id(item))
                self.object_paths.append(_path(item))
            else:
                raise TypeError(
                    f"`groups[{index}]` must select variables with a layer, a "
                    f"variable, a regular expression, or a list of those. "
                    f"Received a {type(item).__name__}: {item!r}"
                )

    def claims(self, variable) -> bool:
        if id(variable) in self.ids:
            return True
        tails = _suffixes(_path(variable))
        if any(re.fullmatch(p, t) for p in self.patterns for t in tails):
            return True
        # Paths stored by a saved config: either may carry an extra prefix.
        path = _path(variable)
        return any(p in _suffixes(path) or path in _suffixes(p) for p in self.paths)

    def describe(self) -> str:
        selects = self.patterns + self.paths + self.object_paths
        return f"{self.optimizer.name} ({', '.join(selects)})"


@keras.saving.register_keras_serializable(package="refimpl")
class MultiOptimizer(keras.optimizers.Optimizer):
    """Update each group of variables with its own optimizer.

    Use it like any Keras optimizer: ``apply_gradients`` in a custom loop, or
    ``model.compile(optimizer=MultiOptimizer(...))``. Each inner optimizer
    keeps its own learning rate (a float or a schedule), its own state and
    its own ``iterations``; ``.optimizers`` lists them. The wrapper has no
    learning rate of its own, so callbacks that set
    ``model.optimizer.learning_rate`` (``ReduceLROnPlateau``) do not apply;
    use schedules, or set ``optimizer.optimizers[i].learning_rate``. It is
    serializable (``get_config`` / ``from_config``) and is restored with its
    state by ``.keras`` files.

    Keras 3.15 has a ``keras.optimizers.MultiOptimizer`` of its own; this one
    differs in refusing unclaimed variables instead of sending them to a
    default optimizer, and in matching paths so that a reloaded model (whose
    variable paths lose their model prefix) keeps its groups and state.

    Args:
        groups: a list of ``(optimizer, selector)`` pairs. ``optimizer`` is a
            Keras optimizer or its string name (``"adam"``); ``selector`` is a
            Keras layer, a variable, a regular expression on variable paths,
            or a list of those (see the module docstring).
        name: the optimizer's name.

    Raises:
        TypeError: for a group that is not an ``(optimizer, selector)`` pair,
            or a selector of the wrong type.
        ValueError: for no groups, one optimizer in two groups, a nested
            ``MultiOptimizer``; and, when the optimizer is built, for a
            variable claimed by no group or by two.

    >>> w, b = tf.Variable([1.0, 1.0]), tf.Variable(0.0)
    >>> opt = MultiOptimizer([(keras.optimizers.SGD(0.5), w), ("sgd", b)])
    >>> _ = opt.apply_gradients([(tf.constant([1.0, 2.0]), w), (1.0, b)])
    >>> w.numpy().tolist(), round(float(b.numpy()), 4)  # SGD(0.5); SGD(0.01)
    ([0.5, 0.0], -0.01)
    """

    def __init__(self, groups, *, name: str | None = None, **kwargs):
        super().__init__(learning_rate=0.0, name=name, **kwargs)
        if not isinstance(groups, (list, tuple)) or not groups:
            raise ValueError(
                "`groups` must be a non-empty list of (optimizer, selector) "
                f"pairs. Received: groups={groups!r}"
            )
        built = []
        for i, pair in enumerate(groups):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise TypeError(
                    f"`groups[{i}]` must be an (optimizer, selector) pair. "
                    f"Received: groups[{i}]={pair!r}"
                )
            optimizer = keras.optimizers.get(pair[0])
            if isinstance(optimizer, MultiOptimizer):
                raise ValueError(
                    f"`groups[{i}]` holds a MultiOptimizer; list its groups here "
                    "instead of nesting them"
                )
            if any(optimizer is g.optimizer for g in built):
                raise ValueError(
                    f"`groups[{i}]` reuses the optimizer {optimizer.name!r} of an "
                    "earlier group; give it a selector list instead, or a "
                    "separate optimizer"
                )
            built.append(_Group(optimizer, pair[1], i))
        self._groups = built
        self._optimizers = [g.optimizer for g in built]
        self._group_of: dict[int, int] = {}

    @property
    def optimizers(self) -> list:
        """The inner optimizers, in the order of ``groups``."""
        return list(self._optimizers)

    def group_of(self, variable) -> int:
        """Return the index of the group that claims ``variable``.

        Raises:
            ValueError: if no group or more than one group claims it.
        """
        owners = [i for i, g in enumerate(self._groups) if g.claims(variable)]
        if len(owners) != 1:
            shown = owners or range(len(self._groups))
            groups = "; ".join(f"{i}: {self._groups[i].describe()}" for i in shown)
            raise ValueError(
                f"Every variable must belong to exactly one group. The variable "
                f"'{_path(variable)}' of shape {tuple(variable.shape)} is claimed "
                f"by {len(owners)} groups ("
                + ("" if owners else "the groups are ")
                + f"{groups})"
            )
        return owners[0]

    def build(self, variables):
        if self.built:
            return
        variables = list(variables)
        per_group = [[] for _ in self._groups]
        for variable in variables:
            index = self.group_of(variable)
            self._group_of[self._var_key(variable)] = index
            per_group[index].append(variable)
        for optimizer, group_vars in zip(self._optimizers, per_group, strict=True):
            if group_vars:
                with keras.name_scope(optimizer.name, caller=optimizer):
                    optimizer.build(group_vars)
        super().build(variables)

    @property
    def variables(self) -> list:
        own = self._variables[:]
        return own + [v for opt in self._optimizers for v in opt.variables]

    @property
    def learning_rate(self):
        raise AttributeError(
            "A MultiOptimizer has one learning rate per group; read or set it "
            "on `optimizer.optimizers[i].learning_rate`"
        )

    @learning_rate.setter
    def learning_rate(self, value):
        raise AttributeError(
            "A MultiOptimizer has one learning rate per group; set it on "
            "`optimizer.optimizers[i].learning_rate`"
        )

    def apply(self, grads, trainable_variables=None):
        if trainable_variables is None:
            if not self.built:
                raise ValueError(
                    "Pass the variables with the first gradients, or call "
                    "`optimizer.build(variables)` first"
                )
            trainable_variables = self._trainable_variables
        grads, trainable_variables = list(grads), list(trainable_variables)
        if len(grads) != len(trainable_variables):
            raise ValueError(
                f"Received {len(grads)} gradients for "
                f"{len(trainable_variables)} variables"
            )
        if not grads:
            return
        if not self.built:
            self.build(trainable_variables)
        per_group = [([], []) for _ in self._groups]
        for grad, variable in zip(grads, trainable_variables, strict=True):
            index = self._group_of.get(self._var_key(variable))
            if index is None:
                raise ValueError(
                    f"The variable '{_path(variable)}' was not among the "
                    "variables this MultiOptimizer was built with"
                )
            per_group[index][0].append(grad)
            per_group[index][1].append(variable)
        for optimizer, (group_grads, group_vars) in zip(
            self._optimizers, per_group, strict=True
        ):
            if group_vars:
                optimizer.apply(group_grads, group_vars)
        self._iterations.assign_add(1)

    def finalize_variable_values(self, var_list):
        for index, optimizer in enumerate(self._optimizers):
            mine = [
                v for v in var_list if self._group_of.get(self._var_key(v)) == index
            ]
            if mine:
                optimizer.finalize_variable_values(mine)

    def get_config(self) -> dict:
        groups = []
        for group in self._groups:
            groups.append(
                {
                    "optimizer": keras.optimizers.serialize(group.optimizer),
                    "patterns": list(group.patterns),
                    "paths": group.paths + group.object_paths,
                }
            )
        return {"name": self.name, "groups": groups}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = copy.deepcopy(config)  # Keras' deserialize edits its input
        pairs = []
        for group in config.pop("groups"):
            if isinstance(group, dict):
                optimizer = keras.optimizers.deserialize(
                    group["optimizer"], custom_objects=custom_objects
                )
                selector = list(group["patterns"]) + [
                    _SavedPath(p) for p in group["paths"]
                ]
                pairs.append((optimizer, selector))
            else:
                pairs.append(tuple(group))
        return cls(pairs, **config)
