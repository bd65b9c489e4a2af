"""ZeRO: ``Z2`` shards the optimizer state over an axis, ``Z3`` (FSDP) the parameters too;
what crosses into the optimizer is atomic on the axis, so the storage layout stays there."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core import ops
from workbench.core.errors import TacticError
from workbench.core.ir.selectors import exact
from workbench.core.propagate.tactics import (
    Atomic,
    Expansion,
    Replicate,
    Tactic,
    Target,
    Tile,
    _check_axis,
)
from workbench.core.strategies.base import check_fields, matches, names_of, shard_dim, strict_text
from workbench.core.strategies.named import register
from workbench.core.strategies.roles import roles


def optimizer_inputs(program) -> list[int]:
    """Values made outside the optimizer phase that optimizer ops read (parameters, gradients)."""
    out = set()
    for op in program.ops:
        if op.phase != "optimizer":
            continue
        for v in op.operands:
            if isinstance(v, int):
                producer = program.values[v].producer
                if producer is None or program.ops[producer].phase != "optimizer":
                    out.add(v)
    return sorted(out)


def stacked_gradient(program, grad: int | None) -> list[int]:
    """The gradient and the loop result it is copied from (through linear one-operand ops of
    its shape, each read once), when a loop stacks it step by step; else nothing.

    Tiled like the parameter, each step's slice is reduce-scattered inside the loop as it is
    made (as the gradients of unrolled layers are), not stacked whole and reduced after it.
    """
    if grad is None:
        return []
    values, users = program.values, program.users
    chain, v = [grad], grad
    while (producer := values[v].producer) is not None:
        op = program.ops[producer]
        if op.regions:  # a scan's stacked per-step outputs follow its carries
            control = ops.traits(op.primitive).control
            stacked = control is not None and control.stacked(op.params, op.results.index(v))
            return chain if stacked else []
        arrays = [u for u in op.operands if isinstance(u, int)]
        if len(arrays) != 1 or len(op.results) != 1 or (0,) not in program.mapping(op).linear:
            return []
        (v,) = arrays
        if values[v].shape != values[grad].shape or len(users[v]) != 1:
            return []
        chain.append(v)
    return []


def _gradient_readers(program, grad: int | None) -> list[int]:
    """What the update computes from a gradient, of its shape, one op on (a clipped gradient,
    its square for a global norm): tiled like the parameter, the gradient is
    reduce-scattered into each, never gathered whole for one of them."""
    if grad is None:
        return []
    shape, ops = program.values[grad].shape, program.ops
    return [
        r
        for o in program.users[grad]
        if ops[o].phase == "optimizer" and not ops[o].regions
        for r in ops[o].results
        if program.values[r].shape == shape
    ]


def _sharded_like_params(tactic, program, mesh, state, *, params: bool):
    """Tile each parameter's optimizer state (and, for Z3, the parameter itself) over the axis.

    First everything crossing into the optimizer (parameters, gradients) is made atomic on
    the axis, so the storage layout stays inside the optimizer: uses gather the parameter,
    and gradients are reduce-scattered (or sliced) into the sharded update.
    """
    view = roles(program, state)
    ids = view.parameters if tactic.params is None else matches(program, tactic.params)
    if not ids:
        raise TacticError(
            f"{tactic}: "
            + (
                f"the workbench sees no parameter in {program.name} (program.anatomy() shows "
                "what it sees); pass params= naming your model's parameters."
                if tactic.params is None
                else f"{tactic.params!r} matches no value of {program.name}; pass params= "
                "naming your model's parameters."
            )
        )
    boundary = optimizer_inputs(program)
    if not boundary:  # no update: the parameters and their gradients
        boundary = list(ids) + [view.gradients[p] for p in ids if p in view.gradients]
    if params:  # the parameters themselves too, when the optimizer does not read them (it
        # may update a float32 master copy and cast it back: mixed precision)
        boundary = [*boundary, *ids]
    # a gradient a loop stacks crosses from the loop's result on: tiled there (below)
    stacked = {p: stacked_gradient(program, view.gradients.get(p)) for p in ids}
    boundary += [u for chain in stacked.values() for u in chain]
    out: list[Tactic] = [Atomic(names_of(program, sorted(set(boundary))), tactic.axis)]
    tiles = []
    kept_whole = []
    targets = []
    size = mesh.axis_size(tactic.axis)
    for p in ids:
        v = program.values[p]
        d = shard_dim(v.shape, state.shardings[p], mesh, tactic.axis) if v.shape else None
        new = view.new_params.get(p)
        related = [u for u in view.companions(p) if program.values[u].shape == v.shape]
        group = [p, *related] if params else [u for u in related if u != new]
        readers = _gradient_readers(program, view.gradients.get(p))
        group = list(dict.fromkeys([*group, *stacked[p], *readers]))
        group = [u for u in group if not state.shardings[u].uses(tactic.axis)]
        if d is None and v.shape:  # a scalar has nothing to tile: no target
            cut = " as it is cut already" if any(state.shardings[p].dims) else ""
            why = f"no dim of its shape {v.shape}{cut} has a size the {size}-way axis {tactic.axis!r} divides"
            targets += [Target(u, why) for u in group]
        if d is None or not group:
            continue
        targets += [Target(u) for u in group]
        tiles.append(Tile(names_of(program, group), d, tactic.axis))
        if params:  # inside loops, each step's slice stays sharded too: gathered per step
            for u, dropped in view.loop_slices.get(p, ()):
                if d >= dropped and not state.shardings[u].uses(tactic.axis):
                    out.append(Atomic(exact(program.values[u].name), tactic.axis))
                    tiles.append(Tile(exact(program.values[u].name), d - dropped, tactic.axis))
        elif new is not None:  # ZeRO-2 keeps parameters whole: the sharded update is gathered
            kept_whole.append(new)
    if kept_whole:
        out.append(Replicate(names_of(program, kept_whole), tactic.axis))
    return Expansion(out + tiles, targets)


@register(axes="data", place=3)
@dataclass(frozen=True, slots=True)
class Z2(Tactic):
    """ZeRO-2: optimizer state sharded over ``axis`` (so gradients are reduce-scattered into
    it), parameters kept whole (the update is gathered back)."""

    axis: str
    params: str | None = None
    strict: bool = False  # any value it targets left whole is an error

    def __post_init__(self):
        check_fields(self, selectors=("params",))

    def __str__(self) -> str:
        return strict_text(
            self,
            f"Z2({self.axis!r})"
            if self.params is None
            else f"Z2({self.axis!r}, params={self.params!r})",
        )

    def expand(self, program, mesh, state):
        _check_axis(self, mesh)
        return _sharded_like_params(self, program, mesh, state, params=False)


@register(axes="data", place=4)
@dataclass(frozen=True, slots=True)
class Z3(Tactic):
    """ZeRO-3 / FSDP: every parameter and its optimizer state sharded over ``axis`` on its
    largest divisible dim; each use gathers it (the parameter is atomic on the axis, so its
    storage layout does not spread into the compute), gradients are reduce-scattered."""

    axis: str
    params: str | None = None
    strict: bool = False  # any value it targets left whole is an error

    def __post_init__(self):
        check_fields(self, selectors=("params",))

    def __str__(self) -> str:
        return strict_text(
            self,
            f"Z3({self.axis!r})"
            if self.params is None
            else f"Z3({self.axis!r}, params={self.params!r})",
        )

    def expand(self, program, mesh, state):
        _check_axis(self, mesh)
        return _sharded_like_params(self, program, mesh, state, params=True)
