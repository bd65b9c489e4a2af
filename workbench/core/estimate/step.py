"""One step's estimate: `estimate()` adds up compute, communication and memory of a plan on a
hardware spec and applies an overlap policy; `Estimate` is what it returns."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from workbench.core.estimate import rings
from workbench.core.estimate.breakdown import Breakdown, breakdown
from workbench.core.estimate.communication import CollectiveEstimate, Communication
from workbench.core.estimate.compute import Compute, OpEstimate
from workbench.core.estimate.experts import summary
from workbench.core.estimate.fused import NONE, fused
from workbench.core.estimate.fused import note as fused_note
from workbench.core.estimate.liveness import Liveness
from workbench.core.estimate.memory import Memory
from workbench.core.estimate.overlap import check_overlap, overlapped
from workbench.core.estimate.pipelined import PipelineEstimate, price_planned
from workbench.core.gcpause import without_gc
from workbench.core.hardware.names import resolve
from workbench.core.hardware.spec import Hardware
from workbench.core.layout.collectives import KINDS
from workbench.core.layout.mesh import Mesh
from workbench.core.strategies.pipeline import pipeline_of
from workbench.core.units import format_seconds


@dataclass(frozen=True)
class Estimate:
    """One step on one device, as the simulator sees it."""

    hardware: str
    compute_s: float
    communication_s: float  # every collective, in sequence
    step_s: float  # after overlap
    overlap: str | float
    by_kind: Mapping[str, float]  # collective kind -> seconds
    flops: float  # per device per step
    memory: Memory
    ops: tuple[OpEstimate, ...] = field(repr=False)
    collectives: tuple[CollectiveEstimate, ...] = field(repr=False)
    kernels: int = 0  # kernels launched per device per step (ops after fusion, local steps)
    fresh_memory_s: float = 0.0  # part of compute: first touch of fresh per-step buffers
    #: a pipelined step's stages and timeline (`PipelineEstimate`); then the figures above
    #: are the busiest stage's (communication_s: its sends and receives and its other axes'
    #: collectives, in sequence; step_s the timeline's), and memory the highest stage peak
    pipeline: PipelineEstimate | None = field(default=None, repr=False)
    #: what a reader must know about how it was priced (a session's placement that does not
    #: apply to the hardware: ``estimate.placements.placed_for``); "" when nothing
    note: str = ""
    #: under a user-given expert load (``Session.estimate(expert_load=)``): one
    #: `ExpertLayer` per MoE layer, and the load checked (``experts.expert_loads``)
    experts: tuple = field(default=(), repr=False)
    expert_load: tuple | None = field(default=None, repr=False)
    #: where the step's time goes and its MFU (``breakdown.py``)
    breakdown: Breakdown | None = field(default=None, repr=False)

    def by_tactic(self) -> dict[int | None, float]:
        """Communication seconds per tactic index (None: no tactic behind it)."""
        out: dict[int | None, float] = {}
        for c in self.collectives:
            out[c.collective.tactic] = out.get(c.collective.tactic, 0.0) + c.total_s
        return out

    def __str__(self) -> str:
        kinds = ", ".join(f"{k} {format_seconds(v)}" for k, v in self.by_kind.items() if v)
        return (
            (
                f"step {format_seconds(self.step_s)} on {self.hardware} (compute {format_seconds(self.compute_s)}, "
                f"communication {format_seconds(self.communication_s)}{': ' + kinds if kinds else ''}; "
                f"overlap {self.overlap}); memory {self.memory}"
            )
            + (f"; {self.moe}" if self.experts else "")
            + (f"; NOTE: {self.note}" if self.note else "")
        )

    @property
    def moe(self) -> str:
        """The MoE layers under the given expert load, in a line ("" without a load)."""
        return summary(self.experts, self.expert_load)

    def __repr__(self) -> str:
        from workbench.core import display as d

        m = self.memory
        kinds = "; ".join(f"{k} {format_seconds(v)}" for k, v in self.by_kind.items() if v)
        fits = "fits" if m.fits else "DOES NOT FIT"
        body = (
            [
                f"compute {format_seconds(self.compute_s)}, communication "
                f"{format_seconds(self.communication_s)} ({kinds or 'none'}), overlap {self.overlap}",
                f"peak memory {d.format_bytes(m.peak)} of {d.format_bytes(m.capacity)} ({fits})",
                "at the peak: "
                + ", ".join(f"{k} {d.format_bytes(v)}" for k, v in m.at_peak.items() if v),
                f"{self.flops:.3g} flops, {self.kernels} kernels, {len(self.collectives)} collectives",
            ]
            + ([str(self.breakdown)] if self.breakdown else [])
            + ([self.moe] if self.experts else [])
        )
        spanning = [c for c in self.collectives if c.synthesis is not None]
        if spanning:  # reductions across levels, each run as its synthesised program
            top = max(spanning, key=lambda c: c.total_s).synthesis
            body.append(f"{len(spanning)} reductions span levels; the costliest: {top}")
        body = [d.clip(b) for b in body]
        if self.note:  # whole, unclipped: it says how to read the figures
            body.insert(0, f"NOTE: {self.note}")
        head = f"Estimate on {self.hardware}: step {format_seconds(self.step_s)} per device"
        return d.lines(head, body)

    def _repr_html_(self) -> str:
        from workbench.core import display as d

        m = self.memory
        time = [("step", format_seconds(self.step_s)), ("compute", format_seconds(self.compute_s))]
        time += [(k, format_seconds(v)) for k, v in self.by_kind.items() if v]
        time += [("overlap", self.overlap), ("flops", f"{self.flops:.3g}")]
        if self.breakdown is not None:
            b = self.breakdown
            time += [("MFU", f"{b.mfu:.1%}"), ("HFU", f"{b.hfu:.1%}")]
            time += [(what, format_seconds(s)) for what, s in b.rows()]
        mem = [("peak", f"{d.format_bytes(m.peak)} of {d.format_bytes(m.capacity)}")]
        mem += [(k, d.format_bytes(v)) for k, v in m.at_peak.items() if v]
        slow = sorted(self.collectives, key=lambda c: -c.total_s)[:20]
        colls = d.table(
            ("kind", "axes", "bytes", "count", "time"),
            (
                (
                    c.collective.kind,
                    "+".join(c.collective.axes),
                    d.format_bytes(c.collective.bytes),
                    c.collective.count,
                    format_seconds(c.total_s),
                )
                for c in slow
            ),
        )
        return d.panel(
            f"Estimate on {self.hardware}: step {format_seconds(self.step_s)} per device",
            d.facts([("note", self.note)]) if self.note else "",
            d.facts([("MoE", self.moe)]) if self.experts else "",
            d.table(("time", ""), time),
            d.table(("memory at the peak", ""), mem),
            d.details(f"the {len(slow)} slowest of {len(self.collectives)} collectives", colls),
        )


@without_gc
def estimate(program, mesh: Mesh, state, plan, hardware: Hardware, *, overlap="none") -> Estimate:
    """The simulator's estimate of one step (see the package's README.md). ``hardware``: a
    `Hardware` or a preset's name (`workbench.core.hardware.resolve`); ``overlap``: a policy
    of `OVERLAPS` or a fraction in [0, 1]. Both are checked before any work."""
    hardware = resolve(hardware)
    overlap = check_overlap(overlap)
    pipeline = pipeline_of(program, mesh, state)
    if pipeline is not None:
        return _pipelined(program, mesh, state, plan, hardware, pipeline, overlap)
    compute = Compute(program, mesh, state, plan, hardware)
    communication = Communication(program, mesh, state, plan, hardware)
    ops = compute.op_estimates()
    kernels = fused(program, mesh, state, plan, hardware, ops) if hardware.fused_attention else NONE
    ops = kernels.replace(ops)
    liveness = Liveness(program, mesh, state, plan, hardware, communication, kernels.inside)
    parts = rings.fractions(program, mesh, state, plan)
    collectives = rings.hide(plan, ops, communication.collective_estimates(), parts)
    local_s, local_kernels = compute.local_steps()
    copy_s, copy_kernels = compute.operand_copies()
    memory = liveness.memory()
    fresh_s = hardware.fresh_memory_time(liveness.per_step_buffers(memory))
    compute_s = sum(o.total_s for o in ops) + local_s + copy_s + fresh_s
    ring_s = rings.recompute_s(plan, ops) - rings.skipped_s(plan, ops, parts)
    compute_s += ring_s
    by_kind, communication_s, hidden = _totals(collectives, overlap)
    e = Estimate(
        hardware=hardware.name,
        compute_s=compute_s,
        communication_s=communication_s,
        step_s=overlapped(compute_s, communication_s, overlap, hidden),
        overlap=overlap,
        by_kind=by_kind,
        flops=sum((o.cost.flops + o.cost.transcendentals) * o.count for o in ops),
        kernels=sum(o.count for o in ops if o.kernel) + local_kernels + copy_kernels,
        memory=memory,
        ops=tuple(ops),
        collectives=tuple(collectives),
        fresh_memory_s=fresh_s,
        note=joined(*plan.notes, _balance_note(plan, parts), _fused_note(program, hardware)),
    )
    return dataclasses.replace(e, breakdown=breakdown(program, mesh, hardware, e, ring_s))


def _fused_note(program, hardware) -> str:
    return fused_note(program) if hardware.fused_attention else ""


def _balance_note(plan, parts) -> str:
    """What a balanced ring skips, or that it is priced whole."""
    if plan.zigzag is None:
        return ""
    rings_ = [r for r in plan.rings.values() if r.kind != "replay"]
    if not parts:
        return (
            "the balanced rings are priced computing every block: their masks read the "
            "program's inputs (on the devices they skip what the masks hide)"
        )
    steps = [x for s in parts.values() for x in s]
    return (
        f"{len(parts)} of {len(rings_)} balanced ring passes skip the blocks their masks "
        f"hide: each step costs {sum(steps) / len(steps):.0%} of a block on its busiest device"
    )


def repriced(estimate_: Estimate, program, mesh: Mesh, state, plan, hardware: Hardware) -> Estimate:
    """``estimate_`` with its collectives priced on ``hardware`` instead: for hardware that
    differs only in where the mesh's axes lie (``Hardware.placement``), which moves no
    compute and no memory. A pipelined step is priced whole again (its timeline interleaves
    the two)."""
    if estimate_.pipeline is not None:
        return estimate(program, mesh, state, plan, hardware, overlap=estimate_.overlap)
    collectives = Communication(program, mesh, state, plan, hardware).collective_estimates()
    parts = rings.fractions(program, mesh, state, plan)
    collectives = rings.hide(plan, estimate_.ops, collectives, parts)
    by_kind, communication_s, hidden = _totals(collectives, estimate_.overlap)
    e = dataclasses.replace(
        estimate_,
        communication_s=communication_s,
        step_s=overlapped(estimate_.compute_s, communication_s, estimate_.overlap, hidden),
        by_kind=by_kind,
        collectives=tuple(collectives),
        note=joined(*plan.notes, _balance_note(plan, parts), _fused_note(program, hardware)),
    )
    ring_s = rings.recompute_s(plan, e.ops) - rings.skipped_s(plan, e.ops, parts)
    return dataclasses.replace(e, breakdown=breakdown(program, mesh, hardware, e, ring_s))


def joined(*notes: str) -> str:
    """Notes on how an estimate was priced, in one line ("" when none)."""
    return "; ".join(n for n in notes if n)


def _totals(collectives, overlap) -> tuple[dict[str, float], float, float]:
    """Seconds of ``collectives`` by kind, in all, and the part ``overlap`` "prefetch"
    hides (0 under any other policy)."""
    by_kind = dict.fromkeys(KINDS, 0.0)
    for c in collectives:
        by_kind[c.collective.kind] += c.total_s
    hidden = sum(c.total_s for c in collectives if c.hidden) if overlap == "prefetch" else 0.0
    return by_kind, sum(by_kind.values()), hidden


def placed_twin(cache: Mapping, hardware: Hardware, overlap) -> Estimate | None:
    """An estimate in ``cache`` (``(hardware, overlap) -> Estimate``) of the same overlap on
    hardware that differs from ``hardware`` only in its placement, or None."""
    bare = dataclasses.replace(hardware, placement=None)
    for (hw, o, *load), e in cache.items():
        if (
            not load  # an expert load's estimate is priced from its balanced one
            and o == overlap
            and hw.name == hardware.name
            and dataclasses.replace(hw, placement=None) == bare
        ):
            return e
    return None


def _pipelined(program, mesh, state, plan, hardware, pipeline, overlap) -> Estimate:
    """A pipelined step as an `Estimate` (see ``Estimate.pipeline``)."""
    pe = price_planned(program, mesh, state, plan, hardware, pipeline, overlap)
    S = pe.schedule.stages
    busiest = pe.busiest
    sends = pe.sends_s(busiest)
    others = pe.collectives[busiest] if pe.collectives else {}
    at = max(range(S), key=lambda s: pe.peak[s])
    held = dict(pe.state[at])
    in_flight = pe.peak[at] - sum(held.values())
    memory = Memory(
        pe.peak[at], {**held, "activations": in_flight, "temporaries": 0},
        held["parameters"] + held["optimizer"], 0, in_flight + held["gradients"],
        hardware.memory_bytes, held,
    )  # fmt: skip
    by_kind = {**dict.fromkeys(KINDS, 0.0), **others}
    by_kind["collective-permute"] = by_kind.get("collective-permute", 0.0) + sends
    e = Estimate(
        hardware=hardware.name,
        compute_s=pe.busy(busiest) - sum(others.values()),
        communication_s=sends + sum(others.values()),
        step_s=pe.step_s,
        overlap=overlap,
        by_kind=by_kind,
        flops=pe.flops[busiest],
        memory=memory,
        ops=(),
        collectives=(),
        kernels=pe.kernels[busiest],
        pipeline=pe,
        note=_fused_note(program, hardware),
    )
    return dataclasses.replace(e, breakdown=breakdown(program, mesh, hardware, e))
