"""Memory per device: the `Memory` an estimate reports, the categories of training memory a
value belongs to, and the inputs a training loop donates. The liveness sweep that finds the
peak is `liveness.py`'s."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from workbench.core.units import format_bytes

CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "temporaries")

#: Bytes per element of the table of pointers a tuple of outputs carries (XLA's output tuple).
TUPLE_POINTER_BYTES = 8


@dataclass(frozen=True)
class Memory:
    """Per-device bytes: the peak and what is live at it, by category."""

    peak: int
    at_peak: Mapping[str, int]  # category -> bytes live at the peak
    arguments: int  # the inputs, held throughout
    outputs: int  # the outputs (with the pointer table of their tuple)
    temporaries: int  # the largest live total of everything but inputs and outputs
    capacity: float
    # model state held per device: parameters and optimizer state as stored, gradients in
    # the layout the optimizer reads them (what the ZeRO stages divide)
    states: Mapping[str, int] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return self.peak <= self.capacity

    def __str__(self) -> str:
        parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in self.at_peak.items() if v)
        verdict = "fits" if self.fits else "DOES NOT FIT"
        return (
            f"peak {format_bytes(self.peak)} of {format_bytes(self.capacity)} ({verdict}): {parts}"
        )


def category(program, vid: int) -> str:
    """Which part of training memory a value belongs to, from its role in the program's
    anatomy (parameters, gradients, optimizer state) and where it is used."""
    v = program.values[vid]
    role = program.anatomy().role_of(vid)
    if role == "parameter":
        return "parameters"
    if role == "optimizer_state":
        return "optimizer"
    if role == "gradient":
        return "gradients"
    if v.kind == "input":
        return "activations"  # the batch
    producer = program.ops[v.producer] if v.producer is not None else None
    if producer is None:
        return "temporaries"
    users = [program.ops[u].phase for u in program.users[vid]]
    if producer.phase == "forward" and "backward" in users:
        return "activations"  # saved for the backward pass
    if producer.phase == "backward" and "optimizer" in users:
        return "gradients"
    return "temporaries"


def donations(program, state) -> dict[int, int]:
    """Output value -> index of the input it replaces: an output the anatomy sees fed back as
    an input (a parameter's update, its optimizer state), in the same layout. A training
    loop donates those inputs (``jax.jit(..., donate_argnums=...)``), as the simulator's
    memory assumes."""
    sh = state.shardings
    position = {v: i for i, v in enumerate(program.inputs)}
    out = {}
    for o, v in program.anatomy().feedback.items():
        if sh[v].dims == sh[o].dims:
            out[o] = position[v]
    return out
