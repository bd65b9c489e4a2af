"""What a training loop plugs in: the plan as PartitionSpec trees shaped like the user's own
arguments, and as Flax-style logical axis rules.

``specs`` mirrors each argument's pytree exactly as it was passed (params, optimizer state,
batch), so ``jax.jit(step, in_shardings=...)`` and ``jax.device_put`` take it as it is.
``logical_rules`` says the same plan as ``(logical name, mesh axes)`` rules, in the model's
own logical names where it has partitioning metadata and in names read from the anatomy's
dimension classes where it has none; a plan that splits one logical name two ways cannot
be said as rules, and the result names the values that disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
from jax.sharding import NamedSharding, PartitionSpec

from workbench.core.errors import WorkbenchError
from workbench.core.lowering.explicit import spec


def specs(session, *, mesh=None, outputs: bool = False):
    """A tuple with one PartitionSpec pytree per argument (the outputs' pytree with
    ``outputs``), mirroring it exactly; with ``mesh`` (a ``jax.sharding.Mesh``) NamedShardings."""
    program, state = session.program, session.state
    if outputs:
        leaves = [
            spec(state.shardings[v]) if isinstance(v, int) else PartitionSpec()
            for v in program.outputs
        ]
        tree = program.out_tree
    else:
        leaves = [spec(state.shardings[v]) for v in program.inputs]
        tree = program.in_tree
    if mesh is not None:
        leaves = [NamedSharding(mesh, s) for s in leaves]
    if tree is None:
        return tuple(leaves)
    return jax.tree_util.tree_unflatten(tree, leaves)


@dataclass(frozen=True)
class LogicalRules:
    """Flax-style rules, ``(logical name, mesh axes or None)``, and the names a plan splits
    more than one way (``name -> {mesh axes: values split so}``); the rules hold only when
    that is empty."""

    rules: tuple[tuple[str, str | tuple[str, ...] | None], ...]
    split: dict[str, dict[tuple[str, ...], tuple[str, ...]]]

    @property
    def ok(self) -> bool:
        return not self.split

    def __str__(self) -> str:
        lines = [f"  ({name!r}, {axes!r})," for name, axes in self.rules]
        text = "rules = (\n" + "\n".join(lines) + "\n)"
        if self.split:
            text += "\nnot expressible as rules; these logical names are split more than one way:"
            for name, ways in self.split.items():
                for axes, values in ways.items():
                    how = f"over {','.join(axes)}" if axes else "whole"
                    more = f" and {len(values) - 3} more" if len(values) > 3 else ""
                    text += f"\n  {name!r} {how} in {', '.join(values[:3])}{more}"
            text += "\nuse session.specs() (a PartitionSpec per value) instead."
        return text


def anatomy_names(program) -> dict[int, str]:
    """A name per dimension class the anatomy has a role for."""
    a = program.anatomy()
    layers = a.layers
    names: dict[int, str] = {}
    for table, dim in layers.embeddings + layers.heads_out:
        names.setdefault(a.classes.of(table, dim), "vocab")
    for cls, kind in layers.hidden.items():
        names.setdefault(cls, kind)
    if layers.model_class is not None:
        names.setdefault(layers.model_class, "embed")
    for p in layers.stacked:
        if program.values[p].shape:
            names.setdefault(a.classes.of(p, 0), "layers")
    if a.batch_class is not None:
        names.setdefault(a.batch_class, "batch")
    if a.sequence_class is not None:
        names.setdefault(a.sequence_class, "sequence")
    return names


def _is_axes(x) -> bool:
    return x is None or isinstance(x, tuple)


def logical_leaves(part, arg) -> list:
    """Per leaf of argument ``arg`` (a treedef), its logical names from ``part`` (a tree like
    it, as ``nnx.get_partition_spec`` gives one); a clear error when the shapes differ."""
    leaves = jax.tree_util.tree_leaves(part, is_leaf=_is_axes)
    if len(leaves) != arg.num_leaves:
        raise WorkbenchError(
            f"logical axes with {len(leaves)} leaves for an argument with {arg.num_leaves} "
            "arrays; pass a tree shaped like the argument (e.g. nnx.get_partition_spec(state)), "
            "or None."
        )
    return leaves


def spec_entry(axes: tuple[str, ...]):
    """Mesh axes as one entry of a PartitionSpec or a rule: None, an axis, or a tuple."""
    return None if not axes else axes[0] if len(axes) == 1 else tuple(axes)


def logical_rules(session, axes=None) -> LogicalRules:
    """The plan as rules over logical names. ``axes``: per argument, a pytree like it whose
    leaves are its logical names per dim (a tuple or a PartitionSpec of names, as
    ``nnx.get_partition_spec`` / ``flax.linen.get_partition_spec`` give them), or None for an
    argument without metadata, whose dims are named by class: the name the user gave another
    dim of the same class (optimizer state mirrors the parameters), else the anatomy's."""
    program, state = session.program, session.state
    arguments = program.in_tree.children() if program.in_tree is not None else ()
    given = tuple(axes) if axes is not None else (None,) * len(arguments)
    if len(given) != len(arguments):
        raise WorkbenchError(
            f"logical_rules got logical axes for {len(given)} arguments but the step takes "
            f"{len(arguments)}; pass one entry per argument (None where it has no metadata)."
        )
    classes = program.anatomy().classes
    given_leaves: dict[int, tuple] = {}  # input position -> the user's names for its dims
    start = 0
    for tree, ax in zip(arguments, given):
        if ax is not None:
            for k, leaf in enumerate(logical_leaves(ax, tree)):
                given_leaves[start + k] = tuple(leaf) if leaf is not None else ()
        start += tree.num_leaves
    # a class takes the name the user gave one of its dims, else the anatomy's
    named: dict[int, str] = {}
    for i, names in given_leaves.items():
        v = program.inputs[i]
        for c, name in zip(classes.dims_of(v, len(program.values[v].shape)), names):
            if name is not None:
                named.setdefault(c, name)
    for c, name in anatomy_names(program).items():
        named.setdefault(c, name)
    per_leaf = [
        given_leaves.get(i)
        or tuple(named.get(c) for c in classes.dims_of(v, len(program.values[v].shape)))
        for i, v in enumerate(program.inputs)
    ]
    uses: dict[str, dict[tuple[str, ...], list[str]]] = {}
    for v, names in zip(program.inputs, per_leaf):
        sharding = state.shardings[v]
        for d, name in enumerate(names):
            if name is None or d >= len(sharding.dims):
                continue
            uses.setdefault(name, {}).setdefault(tuple(sharding.dims[d]), []).append(
                program.values[v].name
            )
    rules, split = [], {}
    for name, ways in uses.items():
        if len(ways) > 1:
            split[name] = {axes: tuple(values) for axes, values in ways.items()}
        rules.append((name, spec_entry(next(iter(ways)))))
    return LogicalRules(tuple(rules), split)
