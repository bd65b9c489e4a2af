"""Checks for chapter 15, placement (notebooks/course_15_*.ipynb): how much slower a plan's
slowest placement is than its fastest, and the program synthesis picks for a reduce-scatter
over two levels."""

from __future__ import annotations

import math
import numbers

import workbench as wb
from workbench.core import hardware as hw
from workbench.core.hardware.collectives import synthesised
from workbench.core.hardware.synthesis import default, programs
from workbench.core.units import format_bytes, format_seconds

from .common import no_conflicts, ok, require, unanswered

#: The hardware of 15.1: H100s in NVLink nodes of 8, InfiniBand between the nodes.
HARDWARE = hw.H100
#: 15.2: bytes per device of the reduce-scatter, and the mesh of its group (2 nodes of 8).
RS_BYTES = 64 * 2**20
RS_MESH = {"data": 16}
#: How close a ratio must come to the simulator's (relative).
TOLERANCE = 0.01


def plan() -> tuple[wb.Mesh, list]:
    """The mesh of 15.1 (32 GPUs, 4 nodes of 8) and its plan: the batch over "data",
    Megatron over "model"."""
    return wb.Mesh({"data": 8, "model": 4}), [wb.BP("data"), wb.MP("model")]


def ranked(program):
    """The placements of `plan` for ``program`` on `HARDWARE`, fastest first."""
    mesh, tactics = plan()
    s = wb.Session(program, mesh, tactics)
    no_conflicts(s)
    return s.placements(HARDWARE)


def _number(x, what: str) -> float:
    __tracebackhide__ = True
    unanswered(x, what)
    real = isinstance(x, numbers.Real) and not isinstance(x, bool)
    require(real and math.isfinite(x), f"{x!r} is not a number; give {what}.")
    return float(x)


def _near(x: float, y: float) -> bool:
    return math.isclose(x, y, rel_tol=TOLERANCE)


def _model_axis(r) -> float:
    """Seconds a step spends in collectives over "model" alone under ``r``'s placement."""
    return sum(s for (_, axes), s in r.by_axes().items() if axes == ("model",))


def slowdown(x, program) -> None:
    """Exercise 15.1: ``x`` is how many times longer the estimated step of ``program`` under
    `plan` is in its slowest placement on `HARDWARE` than in its fastest."""
    x = _number(x, "the slowest placement's step over the fastest's, a number")
    table = ranked(program)
    require(len(table) > 1, "this mesh has one placement on H100: nothing to compare.")
    best, worst = table[0], table[-1]
    expected = worst.estimate.step_s / best.estimate.step_s
    at = f"your {x:.3g}"
    if _near(x, expected):
        ok(
            f"{expected:.2f}x: the slowest ({worst.placement}) takes "
            f"{format_seconds(worst.estimate.step_s)}, the fastest ({best.placement}) "
            f"{format_seconds(best.estimate.step_s)}"
        )
        return
    require(
        not _near(x, 1 / expected),
        f"{at} is below 1: that is the fastest step over the slowest. How many times longer "
        "does the slowest take?",
    )
    require(
        x >= 1,
        f"{at} is below 1, but the slowest step is the longer one: divide it by the fastest.",
    )
    require(
        not _near(x, worst.estimate.communication_s / best.estimate.communication_s),
        f"{at} compares the communication alone. The step also computes, and a placement "
        "moves no compute: compare the whole steps (.estimate.step_s).",
    )
    model = _model_axis(best)
    require(
        not (model > 0 and _near(x, _model_axis(worst) / model)),
        f"{at} is how much longer the model axis's collectives take. In the same placement "
        "the data axis's all-reduce gets cheaper and the compute does not change: compare "
        "the whole steps (.estimate.step_s).",
    )
    require(
        not any(_near(x, r.estimate.step_s / best.estimate.step_s) for r in table[1:-1]),
        f"{at} is another placement's step over the fastest's; the slowest is the last of "
        f"the {len(table)} that session.placements(...) ranks, fastest first.",
    )
    require(
        False,
        f"{at} is not the slowest step over the fastest. Rank the placements of the plan "
        "(check.plan()) with session.placements(hw.H100) and divide the last one's "
        ".estimate.step_s by the first one's.",
    )


def _normal(text: str) -> str:
    """A program's text as ``describe`` prints it, spacing and case aside."""
    steps = []
    for part in text.split(","):
        words = part.replace("+", " + ").split()
        steps.append(" ".join(words).replace(" + ", "+").lower())
    return ", ".join(steps)


def reduce_scatter(program, speedup) -> None:
    """Exercise 15.2: ``program`` is the program synthesis picks for a reduce-scatter of
    `RS_BYTES` a device over a data axis of 16 on two H100 nodes of 8, as ``describe`` prints
    it with the levels' names, and ``speedup`` how many times faster it is than one ring."""
    unanswered(program, "the program, a string as describe() prints it")
    require(
        isinstance(program, str),
        f"{program!r}: give the program as a string, as Synthesis.program.describe(level "
        "names) prints it, e.g. 'AR nvlink+infiniband'.",
    )
    mesh = wb.Mesh(RS_MESH)
    syn = synthesised("reduce-scatter", RS_BYTES, ("data",), mesh, HARDWARE)
    names = [n for n, _ in syn.levels]
    want = syn.program.describe(names)
    mine = _normal(program)
    group = " x ".join(f"{n} {k}" for n, k in syn.levels)
    what = f"a reduce-scatter of {format_bytes(RS_BYTES)} a device over {group}"
    if mine != _normal(want):
        shapes = {_normal(p.describe(names)) for p in programs("reduce-scatter", len(names))}
        ars = {_normal(p.describe(names)) for p in programs("all-reduce", len(names))}
        flat = _normal(default("reduce-scatter", len(names)).describe(names))
        require(
            mine != flat,
            f"{program!r} is the default: one ring over all {mesh.size} GPUs, every hop at "
            "InfiniBand's bandwidth. Synthesis finds a cheaper program for " + what + ".",
        )
        require(
            mine not in ars,
            f"{program!r} computes an all-reduce: it ends with the whole sum on every device. "
            f"A reduce-scatter ends with each device holding 1/{mesh.size} of it.",
        )
        require(
            mine != _normal(want.removeprefix("permute blocks, ")),
            f"{program!r}: these are the steps, but scattering in this order leaves the "
            "result's blocks out of place; describe() names what the program does about it "
            "first. Give its whole text.",
        )
        inner, outer = names
        require(
            mine != _normal(f"RS {outer}, RS {inner}"),
            f"{program!r} scatters in the result's order and needs no copy, but its first "
            f"step sends the whole {format_bytes(RS_BYTES)} over {outer}, the second only "
            f"half of it over {inner}. Which order puts the slow link on the smaller piece?",
        )
        require(
            mine in shapes,
            f"{program!r} is none of the grammar's programs for a reduce-scatter over "
            f"{len(names)} levels (synthesis.programs('reduce-scatter', {len(names)}) lists "
            f"them; describe() them with the level names {names}).",
        )
        require(False, f"{program!r} is not the cheapest program for {what}.")
    x = _number(speedup, "how many times faster than the default the program is, a number")
    at = f"speedup {x:.3g}"
    if not _near(x, syn.speedup):
        require(
            not _near(x, 1 / syn.speedup),
            f"{at} is below 1: that is the program's time over the default's. How many times "
            "faster is the program?",
        )
        require(
            x >= 0.01,
            f"{at} looks like a time in seconds; give the default's time over the program's.",
        )
        require(
            x >= 1,
            f"{at} is below 1, but the program is the faster: divide the default's time by it.",
        )
        ar = synthesised("all-reduce", RS_BYTES, ("data",), mesh, HARDWARE)
        require(
            not _near(x, ar.speedup),
            f"{at} is the all-reduce's speedup over the same group; the exercise asks for the "
            "reduce-scatter's.",
        )
        require(
            False,
            f"the program is right; {at} is not how many times faster it is than the default "
            "(one ring over the whole group): the Synthesis holds both times.",
        )
    ok(
        f"{what}: {want}, {format_seconds(syn.seconds)}; {syn.speedup:.2f}x one ring's "
        f"{format_seconds(syn.default_s)}"
    )
