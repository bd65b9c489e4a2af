"""Hold our collective plan against what XLA compiles for the same shardings."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import jax
from jax.sharding import NamedSharding

from workbench.core.estimate import donations
from workbench.core.layout.collectives import KINDS
from workbench.core.lowering.explicit import lower_explicit, spec
from workbench.core.xla.hlo import HloCollective, normalize_cpu, parse_collectives


def abstract_inputs(session, jmesh) -> list[jax.ShapeDtypeStruct]:
    """The program's inputs as shapes and dtypes laid out as the session's state decides:
    what a lowering is compiled for without data."""
    return [
        jax.ShapeDtypeStruct(
            v.shape, v.dtype, sharding=NamedSharding(jmesh, spec(session.state.shardings[v.id]))
        )
        for v in session.program.input_values
    ]


def compiled_text(session, lowering: str = "explicit", devices=None) -> str:
    """The per-device HLO XLA compiles for one lowering of the session's current state."""
    fn, jmesh = session.lower(lowering, devices=devices)
    return fn.lower(*abstract_inputs(session, jmesh)).compile().as_text()


def compiled_memory(session, *, donate: bool = True) -> tuple[int, int]:
    """XLA's temporaries and peak per device (arguments + outputs - aliased + temporaries)
    for the explicit lowering of the session's plan; with ``donate``, the inputs the
    simulator assumes a training loop donates are donated (``estimate.memory.donations``)."""
    s = session
    donated = sorted(donations(s.program, s.state).values()) if donate else ()
    fn, jmesh = lower_explicit(s.program, s.mesh, s.state, s.plan(), donate=donated)
    m = fn.lower(*abstract_inputs(s, jmesh)).compile().memory_analysis()
    peak = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
    return m.temp_size_in_bytes, peak + m.temp_size_in_bytes


def compiled_collectives(session, lowering: str = "explicit", devices=None) -> list[HloCollective]:
    """The collectives in that HLO, with CPU's all-reduce + dynamic-slice read as reduce-scatter."""
    text = compiled_text(session, lowering, devices)
    return normalize_cpu(parse_collectives(text, session.mesh.axes), text)


@dataclass(frozen=True)
class CrossCheck:
    """Ours and XLA's collectives for one state: bytes per device per kind, and what differs.

    Collectives are matched on kind, mesh axes (the HLO's replica groups read back as axes;
    None where they are no product of axes), bytes and count. Bytes are per device as
    executed: a collective inside a loop counts once per iteration (our plan's ``count``;
    the HLO's loop trip counts)."""

    ours: dict[str, int]
    xla: dict[str, int]
    only_ours: Counter  # (kind, axes, bytes, count) our plan has and the HLO lacks
    only_xla: Counter

    @property
    def identical(self) -> bool:
        return not self.only_ours and not self.only_xla

    def __str__(self) -> str:
        rows = [f"{k:>20}: ours {self.ours[k]:>10} B  xla {self.xla[k]:>10} B" for k in KINDS]
        verdict = (
            "identical"
            if self.identical
            else f"differ: ours only {dict(self.only_ours)}, xla only {dict(self.only_xla)}"
        )
        return "\n".join([*rows, verdict])


def executed_bytes(collectives) -> dict[str, int]:
    """Per kind, bytes per device times the times each runs."""
    out = dict.fromkeys(KINDS, 0)
    for c in collectives:
        out[c.kind] += c.bytes * c.count
    return out


def executed_by_axes(collectives) -> Counter:
    """Per (kind, mesh axes), bytes per device times the times each runs."""
    out: Counter = Counter()
    for c in collectives:
        out[c.kind, c.axes] += c.bytes * c.count
    return out


def executed_wire_bytes(collectives, mesh) -> float:
    """Bytes each device sends, as executed (ring algorithms; see ``redistribute.WIRE``)."""
    from workbench.core.layout.redistribute import wire_bytes

    total = 0.0
    for c in collectives:
        n = 1
        for axis in c.axes or mesh.names:
            n *= mesh.axis_size(axis)
        total += wire_bytes(c.kind, c.bytes, n) * c.count
    return total


def _key(c) -> tuple:
    return c.kind, None if c.axes is None else tuple(c.axes), c.bytes, c.count


def compare(plan_collectives, hlo: list[HloCollective]) -> CrossCheck:
    ours = Counter(_key(c) for c in plan_collectives)
    theirs = Counter(_key(c) for c in hlo)
    return CrossCheck(
        executed_bytes(plan_collectives), executed_bytes(hlo), ours - theirs, theirs - ours
    )


def crosscheck(session, lowering: str = "explicit", devices=None) -> CrossCheck:
    """Ours (the plan's collectives, and those it compiles on a branch it rarely takes:
    ``Plan.fallback``) against the compiled program's."""
    ours = [*session.collectives(), *session.plan().fallback]
    return compare(ours, compiled_collectives(session, lowering, devices))
