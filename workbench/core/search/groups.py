"""The decisions an automatic search makes: groups of inputs decided together on one axis.

A group is the inputs that must be sharded alike: a parameter with its optimizer state, the
same weight in every repeated block (``params/layers/*/attn/wq``), and the data inputs
alike in shape and batch dim (decided together, as BP decides them). Read from the
program's anatomy, never from names: the names only label the groups.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from workbench.core.ir.selectors import select
from workbench.core.layout.mesh import Mesh
from workbench.core.layout.state import State


@dataclass(frozen=True, slots=True)
class Group:
    """Inputs decided together on one axis, and the dims they may be tiled on."""

    key: str  # e.g. "layers/*/attn/wq"
    axis: str
    members: tuple[int, ...]  # value ids
    dims: tuple[int, ...]  # tileable dims (each member has the same rank and sizes)
    nbytes: int = 0  # the members' bytes, whole
    prior: int | None = None  # the dim tried first: the data inputs' batch dim
    data: bool = False  # data inputs (never left out as small)


def _group_key(program, anatomy, v: int) -> str:
    """A group's label: for the same place in repeated blocks, the first member's name with
    its layer numbers starred. Display only: the anatomy's blocks decide the groups."""
    name = program.values[v].name
    return _starred(name) if v in anatomy.layers.slots else name


def _starred(name: str) -> str:
    """``params/layers/3/attn/wq`` -> ``params/layers/*/attn/wq``, for display."""
    return re.sub(r"(?<=/)\d+(?=/|$)|^\d+(?=/)", "*", name)


def decision_groups(program, mesh: Mesh, state: State, axis: str, inputs="**") -> list[Group]:
    """The groups of inputs still open on ``axis``: the data inputs alike in shape and batch
    dim first (the anatomy's data roles), then the rest, largest first."""
    size = mesh.axis_size(axis)
    anatomy = program.anatomy()
    layers = anatomy.layers
    state_inputs = set(anatomy.optimizer_state)
    batch = dict(anatomy.data)
    params: dict[tuple, list[int]] = {}
    taken: set[int] = set()
    for v in select(program, inputs, required=False):
        value = program.values[v]
        if value.kind != "input" or not value.shape or v in taken or v in state_inputs:
            continue
        members = [v] + [u for u in anatomy.companions(v) if program.values[u].kind == "input"]
        taken.update(members)
        slot = layers.slots.get(v) if (len(layers.blocks) > 1) else None
        if v in batch:  # the data inputs, decided as BP decides them: together
            key = ("data", value.shape, batch[v])
        elif slot is not None:
            key = ("slot", slot, value.shape, value.dtype)
        else:
            key = ("value", v)
        params.setdefault(key, []).extend(members)
    groups = []
    for members in params.values():
        key = _group_key(program, anatomy, members[0])
        if len(members) > 1 and members[0] in batch:
            key = ", ".join(dict.fromkeys(program.values[m].name for m in members))
        shape = program.values[members[0]].shape
        open_members = tuple(
            m
            for m in members
            if not state.shardings[m].uses(axis) and axis not in state.shardings[m].replicated
        )
        if not open_members:
            continue
        dims = tuple(
            d
            for d, n in enumerate(shape)
            if all(n % (state.shardings[m].shards(d, mesh) * size) == 0 for m in open_members)
        )
        if dims:
            prior = batch.get(members[0])
            nbytes = sum(program.values[m].nbytes for m in open_members)
            prior = prior if prior in dims else None
            groups.append(Group(key, axis, open_members, dims, nbytes, prior, members[0] in batch))

    # the data first: tiling it spreads through the whole step and settles most weights;
    # then the weights (they carry optimizer state), largest first
    def order(g):
        has_state = any(m in state_inputs for m in g.members)
        return (has_state, -g.nbytes)

    groups.sort(key=order)
    return groups
