"""Checks for chapter 9, Rooflines and the communication/compute crossover
(notebooks/course_09_*.ipynb), and the measurements they share with the notebook: where the
simulator's communication meets the compute it can hide behind."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

import workbench as wb
from workbench.core.hardware import PRESETS

from .common import CheckFailed, call, ok, require, unanswered

#: the accelerator presets (the host CPU has no bfloat16 rate of its own)
ACCELERATORS = [h for h in PRESETS.values() if "bfloat16" in h.flops]


# -- measurements -------------------------------------------------------------------------
def tokens_per_device(program, n: int) -> int:
    """Tokens each of ``n`` devices gets when the batch is split: the elements of the
    integer data input with a batch dim (the token ids), over ``n``."""
    for v, dim in program.anatomy().data:
        value = program.values[v]
        if dim is not None and np.issubdtype(np.dtype(value.dtype), np.integer):
            return math.prod(value.shape) // n
    raise CheckFailed(
        "this program has no integer data input with a batch dimension (the token ids), so "
        "tokens per device are not defined for it; check program.anatomy().data."
    )


def compute_bound_s(program, estimate, hardware) -> float:
    """Seconds of the forward and backward ops that run at the compute roof: those whose
    flop time exceeds the time to move their bytes (the matmuls above the ridge)."""
    hw = wb.hardware.resolve(hardware)
    return sum(
        o.total_s
        for o in estimate.ops
        if program.ops[o.op].phase in ("forward", "backward")
        and o.seconds > 1.0001 * o.cost.bytes_accessed / hw.hbm_bandwidth
    )


def dp_crossing(program, n: int, hardware, overlap="prefetch") -> dict:
    """Data parallelism over ``n`` devices of one node: the step's tokens per device, the
    communication, the compute-bound seconds, and the tokens per device where the two meet
    (compute grows in proportion to the tokens, communication does not)."""
    s = wb.Session(program, wb.Mesh({"batch": n}), [wb.BP("batch")])
    e = s.estimate(hardware, overlap=overlap)
    tokens, bound = tokens_per_device(program, n), compute_bound_s(program, e, hardware)
    require(
        bound > 0,
        f"no op of this step runs at the compute roof of {e.hardware}: every matmul is "
        "memory-bound at these sizes, so there is no crossover to find. Use a wider model.",
    )
    return dict(tokens=tokens, comm=e.communication_s, bound=bound,
                crossing=tokens * e.communication_s / bound, estimate=e)  # fmt: skip


# -- 9.1 ------------------------------------------------------------------------------------
def critical_intensity(fn) -> None:
    """Exercise 9.1: ``fn(hardware)`` is the bfloat16 FLOPs per byte of HBM traffic above
    which an op is compute-bound, on every accelerator preset and on made-up chips."""
    unanswered(None if fn is ... else fn, "a function of a Hardware spec")
    require(callable(fn), f"critical_intensity should be a function; got {fn!r}.")
    for h in ACCELERATORS:
        got, want = call(fn, h), h.peak_flops("bfloat16") / h.hbm_bandwidth
        require(
            isinstance(got, int | float) and math.isclose(got, want, rel_tol=0.01),
            f"on {h.name} your function gives {got!r} FLOPs per byte. The ridge of the "
            "roofline is where reading an op's bytes from HBM takes as long as doing its "
            "FLOPs: which two figures of the spec (hardware.peak_flops('bfloat16'), "
            "hardware.hbm_bandwidth, the links) set those two times?",
        )
    h = ACCELERATORS[0]
    faster = dataclasses.replace(h, hbm_bandwidth=2 * h.hbm_bandwidth)
    require(
        math.isclose(call(fn, faster), call(fn, h) / 2, rel_tol=0.01),
        "doubling the memory bandwidth should halve the critical intensity (twice the bytes "
        "per second: half the FLOPs per byte are needed to keep the chip busy); yours does not.",
    )
    names = ", ".join(f"{h.name} {call(fn, h):.0f}" for h in ACCELERATORS)
    ok(f"critical intensities in FLOPs per byte: {names}")


# -- 9.2 ------------------------------------------------------------------------------------
def dp_critical_tokens(fn, programs, hardware) -> None:
    """Exercise 9.2: ``fn(hardware, n, dtype)`` is the tokens per device at which DP's gradient
    all-reduce over ``n`` devices of a node takes as long as the forward and backward
    matmuls: exact in its constants, and within 25% of the simulator on ``programs``."""
    unanswered(None if fn is ... else fn, "a function of (hardware, n, dtype)")
    require(callable(fn), f"dp_critical_tokens should be a function; got {fn!r}.")
    hw = wb.hardware.resolve(hardware)
    base = call(fn, hw, 8, "bfloat16")
    require(
        isinstance(base, int | float) and base > 0,
        f"dp_critical_tokens({hw.name}, 8, 'bfloat16') gave {base!r}; it should be a positive "
        "number of tokens per device.",
    )
    fast = dataclasses.replace(hw, links=(dataclasses.replace(hw.links[0], bandwidth=2 * hw.links[0].bandwidth), *hw.links[1:]))  # fmt: skip
    require(
        math.isclose(call(fn, fast, 8, "bfloat16"), base / 2, rel_tol=0.02),
        "with twice the link bandwidth the all-reduce takes half as long, so half the tokens "
        "per device should hide it; your function does not halve. Which link does a ring "
        "inside one node use (hardware.links[0])?",
    )
    two = call(fn, hw, 2, "bfloat16")
    require(
        math.isclose(base / two, (7 / 8) / (1 / 2), rel_tol=0.02),
        f"your value for 2 devices is {two:.0f} and for 8 is {base:.0f}. A ring all-reduce "
        "sends a share of the bytes that depends on the ring's size: reread the ring formula "
        "(workbench/core/hardware/collectives.py).",
    )
    f32 = call(fn, hw, 8, "float32")
    require(
        math.isclose(f32, base, rel_tol=0.02),
        f"in float32 your function gives {f32:.0f} against {base:.0f} in bfloat16. Both the "
        "bytes each gradient value sends and the peak FLOP/s change with the dtype "
        "(np.dtype(dtype).itemsize, hardware.peak_flops(dtype)): on this chip they cancel.",
    )
    for label, program in programs.items():
        m = dp_crossing(program, 8, hw)
        require(
            0.75 < base / m["crossing"] < 1.25,
            f"on the {label} model the simulator crosses over at {m['crossing']:.0f} tokens "
            f"per device and you predict {base:.0f}. Compute per token: 6 FLOPs per parameter "
            "(forward 2, backward 4); communication: the ring all-reduce of 2 bytes per "
            "parameter. Which constant is off?",
        )
    ok(
        f"{base:.0f} tokens per device on {hw.name}; the simulator agrees within 25% on "
        f"{len(programs)} model sizes, and your formula scales right with the link, the ring "
        "and the dtype"
    )


# -- 9.3 ------------------------------------------------------------------------------------
def own_critical_tokens(answer, program, hardware) -> None:
    """Exercise 9.3: the tokens per device at which ``program`` under 8-way DP on one node
    turns compute-bound, within 25% of the simulator's crossover."""
    unanswered(answer, "a number of tokens per device")
    m = dp_crossing(program, 8, hardware)
    require(
        isinstance(answer, int | float) and 0.75 < answer / m["crossing"] < 1.25,
        f"you predict {answer!r} tokens per device; the simulator puts this model's crossover "
        f"{'above' if not isinstance(answer, int | float) or answer < m['crossing'] else 'below'}"
        " that by more than 25%. Which dtype are its gradients in (program.anatomy(), "
        "program.values[...].dtype)? Both the bytes per value and the peak FLOP/s depend on it.",
    )
    ok(
        f"the simulator crosses over at {m['crossing']:.0f} tokens per device and you said "
        f"{answer:.0f}: below that, the gradient all-reduce cannot hide behind the matmuls"
    )
