"""Checks for chapter 4, 2-D meshes (notebooks/course_04_*.ipynb)."""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import workbench as wb
from workbench.core.units import format_bytes, format_seconds

from .common import (
    as_list,
    blocks,
    data_inputs,
    matrices,
    no_conflicts,
    ok,
    phase,
    require,
    session,
    unanswered,
)


def block_matrices(program) -> list[str]:
    """The weight matrices of the repeated blocks (the layers), from the anatomy."""
    return matrices(program, [n for b in blocks(program) for n in b])


def two_d_zero(program, mesh, schedule, batch: str = "batch", model: str = "model") -> None:
    """Exercises 4.1 and 4.3: data parallel on ``batch``, Megatron on ``model``, and each block
    weight matrix stored once over ``batch`` on top of Megatron's split (ZeRO-3): each
    device holds 1/|batch| of what data parallelism with Megatron leaves it."""
    s = session(program, mesh, schedule)
    no_conflicts(s)
    for name, dim in data_inputs(program):
        sh = s.sharding(name)
        require(
            dim is None or sh.dim_of(batch) == dim,
            f"the data input {name} is {sh}: each row of the mesh should get its own slice "
            f"of the batch, over {batch!r}.",
        )
    megatron = wb.Session(program, mesh, [wb.BP(batch), wb.MP(model)])
    weights = block_matrices(program)
    require(bool(weights), "the anatomy finds no repeated blocks with weight matrices here.")
    shares = Counter()
    for name in weights:
        mine, theirs = s.sharding(name), megatron.sharding(name)
        share = Fraction(mine.local_nbytes(s.mesh), mine.nbytes)
        require(
            share * mesh.axis_size(batch) == Fraction(theirs.local_nbytes(mesh), theirs.nbytes),
            f"{name} is {mine}: each device holds {share} of it ({format_bytes(mine.local_nbytes(s.mesh))}); "
            f"Megatron alone ({theirs}) leaves each device {theirs.local_nbytes(mesh) / theirs.nbytes:.3g} "
            f"of it, and the {mesh.axis_size(batch)} devices of a {batch!r} group each hold a "
            "copy of that. Is Megatron's split in your schedule, and is each piece stored once "
            f"over {batch!r}?",
        )
        shares[share] += 1
    layers = len(blocks(program))
    fwd = Counter(
        (c.kind, c.axes)
        for c in s.collectives()
        if phase(s.program, c) == "forward" and model in c.axes
    )
    require(
        fwd.get(("all-reduce", (model,)), 0) == 2 * layers,
        f"forward collectives over {model!r}: {dict(fwd)}; Megatron's two all-reduces per "
        f"layer ({2 * layers} for {layers} layers) should survive. Is Megatron in your schedule?",
    )
    text = ", ".join(f"{n} at {f}" for f, n in sorted(shares.items()))
    ok(
        f"data split over {batch!r}; the {len(weights)} block weight matrices stored once over "
        f"{batch!r} on top of Megatron's split (per device: {text}); Megatron's {2 * layers} "
        f"forward all-reduces over {model!r} intact"
    )


def axis_links(program, mesh, schedule, hardware, links: dict) -> None:
    """Exercise 4.2: the reader's axis -> link mapping is valid and at least as fast as the
    other way round."""
    unanswered(None if links is ... else links, "a dict: mesh axis -> link name")
    names = [x.name for x in hardware.links]
    require(
        isinstance(links, dict) and set(links) == set(mesh.names),
        f"give a link for each mesh axis {list(mesh.names)}, e.g. "
        f"{dict(zip(mesh.names, names))}; got {links!r}.",
    )
    require(
        all(v in names for v in links.values()),
        f"links are named {names}; got {links!r}.",
    )
    fast = names[0]
    inside = [a for a, v in links.items() if v == fast]
    require(
        math.prod(mesh.axis_size(a) for a in inside) <= hardware.devices_per_node,
        f"{inside} on {fast!r} spans {math.prod(mesh.axis_size(a) for a in inside)} devices, "
        f"but a node holds {hardware.devices_per_node}: only axes that fit in a node can use it.",
    )
    s = wb.Session(program, mesh, as_list(schedule))
    mine = s.estimate(hardware.with_axis_links(links))
    other_links = {a: (names[-1] if v == fast else fast) for a, v in links.items()}
    other_fits = (
        math.prod(mesh.axis_size(a) for a, v in other_links.items() if v == fast)
        <= hardware.devices_per_node
    )
    if other_fits:
        other = s.estimate(hardware.with_axis_links(other_links))
        require(
            mine.step_s <= other.step_s,
            f"with {links} a step takes {format_seconds(mine.step_s)}; the other way round "
            f"({other_links}) takes {format_seconds(other.step_s)}. Which axis's collectives "
            "run most often and move the most bytes?",
        )
        ok(
            f"{links}: {format_seconds(mine.step_s)} per step, against "
            f"{format_seconds(other.step_s)} the other way round"
        )
    else:
        ok(f"{links}: {format_seconds(mine.step_s)} per step")
