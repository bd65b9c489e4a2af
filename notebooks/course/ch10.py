"""Checks for chapter 10, activation recomputation (notebooks/course_10_*.ipynb)."""

from __future__ import annotations

import workbench as wb
from workbench.core import hardware as hw
from workbench.core.units import format_bytes

from .common import call, ok, require, unanswered
from .common import fits as fits  # the memory exercises' check


def saved_bytes(s: wb.Session) -> int:
    """Bytes per device the backward pass reads from the forward pass: the values an op of
    the forward pass makes and an op of the backward pass reads, in their planned layouts."""
    p = s.program
    total = 0
    for v in p.values:
        if v.producer is None or p.ops[v.producer].phase != "forward":
            continue
        if any(p.ops[u].phase == "backward" for u in p.users[v.id]):
            total += s.state.shardings[v.id].local_nbytes(s.mesh)
    return total


def _bp(program, devices: int) -> wb.Session:
    return wb.Session(program, wb.Mesh({"batch": devices}), [wb.BP("batch")])


def kept_by_blocks(formula, make_step, abstract_args, configs, policy) -> None:
    """Exercise 10.1: the bytes per device that full recomputation keeps for the blocks, as
    a function of the config and the devices the batch is split over, on several sizes."""
    unanswered(None if formula is ... else formula, "a function of (cfg, devices)")
    require(callable(formula), f"expected a function of (cfg, devices); got {formula!r}.")
    for cfg, devices in configs:
        saved = []
        for layers in (cfg.n_layers, 1):
            c = cfg.replace(n_layers=layers)
            saved.append(
                saved_bytes(_bp(wb.capture(make_step(policy), *abstract_args(c)), devices))
            )
        expected = (saved[0] - saved[1]) * cfg.n_layers // (cfg.n_layers - 1)
        size = (
            f"batch {cfg.batch} over {devices} devices, seq_len {cfg.seq_len}, "
            f"d_model {cfg.d_model}, d_ff {cfg.d_ff}, {cfg.n_layers} layers"
        )
        got = call(formula, cfg, devices, what=size)
        number = isinstance(got, int | float)
        side = "not" if not number else "more than" if got > expected else "less than"
        require(
            number and got == expected,
            f"for {size} you said {got!r} bytes: {side} what the blocks keep per device. "
            "Hint: jax.checkpoint keeps only the inputs of the function it wraps; what is a "
            "block's input, what shape and dtype, and which dim does BP split?",
        )
    ok(f"your formula matches the blocks' saved bytes on {len(configs)} sizes")


def policy_within(make_step, args, mesh, policy, budget: int, max_flops: float) -> None:
    """Exercise 10.2: a policy whose saved activations fit ``budget`` bytes per device and
    whose step costs at most ``max_flops`` per device."""
    unanswered(policy, "a policy from jax.checkpoint_policies")
    require(
        callable(policy), f"a policy is a function (jax.checkpoint_policies.*); got {policy!r}."
    )
    s = _bp(wb.capture(make_step(policy), *args), mesh.shape["batch"])
    e = s.estimate(hw.H100)
    saved = saved_bytes(s)
    require(
        saved <= budget,
        f"your policy keeps {format_bytes(saved)} per device for the backward pass, over the "
        f"{format_bytes(budget)} budget. Which saved results grow fastest with the sequence?",
    )
    require(
        e.flops <= max_flops,
        f"it fits, but the step costs {e.flops:.3g} flops, over the {max_flops:.3g} allowed: "
        "it recomputes too much. Which ops are expensive to redo but cheap to keep?",
    )
    ok(f"keeps {format_bytes(saved)} (budget {format_bytes(budget)}), {e.flops:.3g} flops")
