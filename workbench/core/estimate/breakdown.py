"""Where a step's time goes, and how well it uses the chip.

`Breakdown` splits one device's step: compute into matmuls (contractions and convolutions
outside attention), attention (its ops from the scores dot to the context dot, every pass:
forward, a recomputation, backward, a ring's replayed blocks) and the rest (elementwise
ops, reductions, copies, local steps, first touches of fresh memory); communication by
kind, and into what the step waits for (exposed) and what runs behind compute or behind
a ring's blocks (overlapped); a pipelined step's busiest stage: its passes by kind
(``PipelineEstimate.kinds``) and its bubble.

MFU is PaLM's (Chowdhery et al. 2022, appendix B): the model's FLOPs, three times the
forward pass's at global shapes (a backward pass costs two forwards; a recomputation is
not counted), shared over every device of the mesh, against the chip's peak at the dtype
of the largest forward matmuls. HFU counts the FLOPs each device executes,
recomputations and repeated work included. A small model can show an MFU above its HFU:
its first layer needs no input gradient, which the convention counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from workbench.core import ops
from workbench.core.anatomy.attention import region
from workbench.core.anatomy.stage_costs import flops_cost, weight


@dataclass(frozen=True, slots=True)
class Breakdown:
    """One device's step by kind (seconds), and its FLOPs against the chip's peak."""

    step_s: float
    matmul_s: float
    attention_s: float
    other_s: float  # elementwise ops, reductions, copies, local steps, fresh memory
    exposed_s: float  # communication the step waits for
    overlapped_s: float  # communication behind compute (or a ring's blocks)
    bubble_s: float  # a pipelined step's idle time on its busiest stage
    model_flops: float  # per device per step: 3x the forward pass, shared over the mesh
    flops: float  # per device per step, as executed
    peak_flops: float  # the chip's FLOP/s at the forward matmuls' dtype
    collectives: Mapping[str, float] = field(default_factory=dict)  # kind -> seconds

    @property
    def compute_s(self) -> float:
        return self.matmul_s + self.attention_s + self.other_s

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: the model's FLOPs over the step at the chip's peak."""
        return self.model_flops / (self.step_s * self.peak_flops) if self.step_s else 0.0

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation: the FLOPs executed over the step at the peak."""
        return self.flops / (self.step_s * self.peak_flops) if self.step_s else 0.0

    def rows(self) -> list[tuple[str, float]]:
        """(what, seconds) for every part with time, in the order a reader wants them:
        compute by kind, then communication exposed and overlapped, then the bubble."""
        parts = [
            ("matmuls", self.matmul_s),
            ("attention", self.attention_s),
            ("elementwise and copies", self.other_s),
            ("communication, exposed", self.exposed_s),
            ("communication, overlapped", self.overlapped_s),
            ("pipeline bubble", self.bubble_s),
        ]
        return [(what, s) for what, s in parts if s > 0]

    def __str__(self) -> str:
        step = self.step_s or 1.0
        parts = ", ".join(f"{what} {s / step:.0%}" for what, s in self.rows())
        return f"MFU {self.mfu:.1%} (HFU {self.hfu:.1%}); {parts}"


def attention_ops(program) -> frozenset[int]:
    """The ops of every attention: from the scores dot to the context dot, every pass and
    the backward (its two dots where its region cannot be read)."""

    def find():
        out: set[int] = set()
        for a in program.anatomy().layers.attention:
            r = region(program, a.scores, a.context)
            if isinstance(r, str):
                out |= {a.scores, a.context}
                continue
            out |= r.forward.ops | r.backward
            if r.replay is not None:
                out |= r.replay.ops
        return frozenset(out)

    return program.cache.get("estimate.attention ops", find)


def model_flops(program) -> tuple[float, object]:
    """(three times the forward pass's FLOPs at global shapes, the dtype of its matmuls
    with the most of them)."""

    def find():
        weigh, forward, by_dtype = flops_cost(program), 0.0, {}
        for o in program.body:
            op = program.ops[o]
            if op.phase != "forward":
                continue
            w = weight(program, o, weigh)
            forward += w
            for x in _matmuls(program, o):
                dtype = program.values[program.ops[x].operands[0]].dtype
                by_dtype[dtype] = by_dtype.get(dtype, 0.0) + weigh(x)
        dtype = max(by_dtype, key=by_dtype.get) if by_dtype else None
        return 3 * forward, dtype

    return program.cache.get("estimate.model flops", find)


def _matmuls(program, o: int):
    op = program.ops[o]
    t = ops.traits(op.primitive)
    if t.contraction or t.convolution:
        yield o
    for r in op.regions:
        for x in r.ops:
            yield from _matmuls(program, x)


def breakdown(program, mesh, hardware, estimate, extra_attention_s: float = 0.0) -> Breakdown:
    """``estimate``'s step by kind; ``extra_attention_s``: attention's seconds not in its
    ops (a ring's replayed logits, less the blocks a balanced ring skips)."""
    total, dtype = model_flops(program)
    peak = hardware.peak_flops(dtype)
    pe = estimate.pipeline
    if pe is not None:  # the busiest stage's passes by kind, and its bubble
        busy = estimate.compute_s + estimate.communication_s
        matmul, attention = pe.kinds[pe.busiest] if pe.kinds else (0.0, 0.0)
        other = max(0.0, estimate.compute_s - matmul - attention)
        bubble = max(0.0, estimate.step_s - busy)
        exposed = estimate.communication_s
        behind = 0.0
    else:
        inside = attention_ops(program)
        matmul = attention = 0.0
        for o in estimate.ops:
            if o.op in inside:
                attention += o.total_s
            elif (t := ops.traits(program.ops[o.op].primitive)).contraction or t.convolution:
                matmul += o.total_s
        attention += extra_attention_s
        other = max(0.0, estimate.compute_s - matmul - attention)
        bubble = 0.0
        exposed = min(estimate.communication_s, max(0.0, estimate.step_s - estimate.compute_s))
        behind = sum(c.behind_s * c.collective.count for c in estimate.collectives)
    return Breakdown(
        step_s=estimate.step_s,
        matmul_s=matmul,
        attention_s=attention,
        other_s=other,
        exposed_s=exposed,
        overlapped_s=max(0.0, estimate.communication_s - exposed) + behind,
        bubble_s=bubble,
        model_flops=total / mesh.size,
        flops=estimate.flops,
        peak_flops=peak,
        collectives=dict(estimate.by_kind),
    )
