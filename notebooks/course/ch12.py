"""Checks for chapter 12, gradient accumulation and the global batch (notebooks/course_12_*.ipynb)."""

from __future__ import annotations

import math

import workbench as wb
from workbench.core.units import format_bytes

from .common import call, close, data_inputs, ok, require, unanswered


def _split(program, axis: str, n: int) -> wb.Session:
    return wb.Session(program, wb.Mesh({axis: n}), [wb.BP(axis)])


def _batch(program, mesh, s=None) -> tuple[int, int]:
    """(examples in the step's data input, examples per device) read from the anatomy: the
    data input's dims up to its batch dim hold the examples (micro-batches x micro-batch)."""
    name, dim = next((n, d) for n, d in data_inputs(program) if d is not None)
    shape = program.value(name).shape
    local = shape if s is None else s.sharding(name).local_shape(mesh)
    return math.prod(shape[: dim + 1]), local[dim]


def accumulation(programs: dict, global_batch, activations, axis: str = "data") -> None:
    """Exercise 12.1: ``global_batch(micro, k, dp)`` is the examples per optimizer step, and
    ``activations(per_example, micro)`` the activation bytes at the peak per device, for the
    accumulation steps ``programs`` ({k: program}) on 2, 4 and 8 devices."""
    from workbench.core import hardware as hw

    unanswered(global_batch, "a function global_batch(micro, k, dp)")
    unanswered(activations, "a function activations(per_example, micro)")
    base = _split(programs[min(programs)], axis, 8)
    _, micro0 = _batch(programs[min(programs)], base.mesh, base)
    per_example = base.estimate(hw.H100).memory.at_peak["activations"] / micro0
    rows = []
    for k, program in sorted(programs.items()):
        for dp in (2, 4, 8):
            s = _split(program, axis, dp)
            total, micro = _batch(program, s.mesh, s)
            mine = call(global_batch, micro, k, dp)
            require(
                mine == total,
                f"k={k} micro-batches of {micro} examples per device on {dp} devices: your "
                f"global_batch gives {mine!r}, the step's data input holds {total} examples. "
                "Count who sees which examples before the one optimizer update.",
            )
            got = s.estimate(hw.H100).memory.at_peak["activations"]
            act = call(activations, per_example, micro)
            require(
                isinstance(act, int | float) and close(act, got, 0.1),
                f"k={k}, {dp} devices: your activations give {format_bytes(act)}, the engine "
                f"{format_bytes(got)} at the peak. Whose activations are live at once: the "
                "whole global batch's, or one micro-batch's on this device?",
            )
            rows.append((k, dp))
    ok(f"both functions agree with the engine for {len(rows)} (k, devices) pairs")


def choose_k(programs: dict, k, limit: float, axis: str = "data", n: int = 8) -> None:
    """Exercise 12.2: the fewest micro-batches whose step fits ``limit`` per device at the
    fixed global batch (the largest micro-batch that fits)."""
    from workbench.core import hardware as hw

    unanswered(k, "a number of micro-batches")
    require(
        k in programs,
        f"k={k!r}: the notebook built the step for k in {sorted(programs)}; pick one of those.",
    )
    peak = _split(programs[k], axis, n).estimate(hw.H100).memory.peak
    require(
        peak <= limit,
        f"with k={k} the peak is {format_bytes(peak)} per device, over the limit of "
        f"{format_bytes(limit)}. More micro-batches of fewer examples each: which memory shrinks?",
    )
    fewer = [j for j in programs if j < k]
    if fewer:
        j = max(fewer)
        other = _split(programs[j], axis, n).estimate(hw.H100).memory.peak
        require(
            other > limit,
            f"k={k} fits ({format_bytes(peak)}), but so does k={j} ({format_bytes(other)}): "
            "each extra micro-batch is another pass in sequence; take the fewest that fit.",
        )
    ok(f"k={k} fits {format_bytes(limit)} ({format_bytes(peak)} at the peak) and no smaller k does")


def own_micro(program, devices, limit: float, axis: str = "data") -> None:
    """Exercise 12.3: the mesh size under BP that gives the largest micro-batch per device
    (the fewest devices) whose step fits ``limit``."""
    from workbench.core import hardware as hw

    unanswered(devices, "a number of devices")
    total, _ = _batch(program, None)
    require(
        isinstance(devices, int) and devices >= 1 and total % devices == 0 and devices <= 8,
        f"devices={devices!r}: give a whole number of devices, at most 8, that divides the "
        f"batch of {total} examples.",
    )
    s = _split(program, axis, devices)
    peak = s.estimate(hw.H100).memory.peak
    require(
        peak <= limit,
        f"on {devices} devices the peak is {format_bytes(peak)}, over {format_bytes(limit)}: "
        "each device holds the activations of its share of the batch.",
    )
    smaller = [d for d in range(1, devices) if total % d == 0]
    if smaller:
        d = max(smaller)
        other = _split(program, axis, d).estimate(hw.H100).memory.peak
        require(
            other > limit,
            f"{devices} devices fit, but {d} do too ({format_bytes(other)}), with a larger "
            "micro-batch per device; which is the largest that fits?",
        )
    _, micro = _batch(program, s.mesh, s)
    ok(
        f"{micro} examples per device on {devices} devices fit ({format_bytes(peak)}), and more do not"
    )
