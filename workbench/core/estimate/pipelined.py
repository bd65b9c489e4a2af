"""A pipeline priced: stage cuts, a schedule and the simulator's op prices -> a timeline.

`price_pipeline(program, stages, microbatches, hardware, schedule=, ...)` cuts the step
(`anatomy.stages.stage_cuts`), prices every op of the unpartitioned program on one device
(`Compute`: the roofline plus `op_overhead` per kernel, and the transposed operand copies)
and adds up each stage's forward, backward and optimizer ops. One microbatch: an op that
touches the batch dimension takes its roofline / M and its kernel's whole overhead (no
slower small kernels); one that does not (a cast of a weight) runs whole on every
microbatch. Ops under a loop the stages split count on each by its share of the blocks.

Zero-bubble splits a stage's backward into B (input gradient) and W (weight gradient): W
is the backward ops whose results flow only into parameter gradients (`anatomy.gradients`),
found from the last backward op up; a loop's backward stays in B.

Point-to-point: one microbatch's boundary bytes (a value with the batch dimension / M)
over the link between neighbouring stages, stage s on device s: the innermost level
whose group holds both (`permute_time`). Step: the timeline's makespan plus the slowest
stage's optimizer (once, after the flush). Memory per stage: model state (its parameters,
their optimizer state, the gradients its optimizer ops read; a tied parameter counts on
every stage holding it) + peak in flight x the activations its backward reads.

Interleaved (v chunks per stage): chunk c of stage s is virtual stage c*S + s, priced as a
stage; a stage's state is its chunks' together, its peak the most chunk-microbatches in
flight x its largest chunk's activations; link s -> (s+1) % S (S-1 -> 0 too) carries the
largest chunk boundary crossing it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from workbench.core.anatomy.stages import StageCuts, stage_cuts
from workbench.core.errors import InputError
from workbench.core.estimate.breakdown import attention_ops
from workbench.core.estimate.communication import Communication
from workbench.core.estimate.compute import Compute
from workbench.core.estimate.fused import NONE, fused
from workbench.core.estimate.overlap import check_overlap
from workbench.core.estimate.timeline import Timeline, simulate
from workbench.core.hardware.collectives import permute_time
from workbench.core.hardware.names import resolve
from workbench.core.hardware.placement import row_major
from workbench.core.layout.mesh import Mesh
from workbench.core.layout.state import State
from workbench.core.ops import traits
from workbench.core.plan.plan import build_plan
from workbench.core.plan.schedule import Schedule
from workbench.core.plan.schedule import schedule as build_schedule
from workbench.core.plan.sends import batched_values
from workbench.core.strategies.pipeline import check_chunks, check_microbatches

STATE = ("parameters", "gradients", "optimizer")


@dataclass(frozen=True)
class PipelineEstimate:
    """One pipelined step, per stage (seconds; bytes).

    ``forward``/``backward``/``weight``: one microbatch's F, B and W (W is 0 unless the
    schedule splits the backward, then B is the input gradient alone), over all its
    chunks; ``p2p``: one send per link s -> s+1 (with chunks S links, the last S-1 -> 0);
    ``optimizer``: once per step; ``state``: model state by category; ``activations``: one
    microbatch's bytes the backward reads; ``peak``: state + peak in flight x activations.
    ``cuts`` holds the S*v virtual stages; ``chunks``: per stage, per chunk (F, B, W,
    activation bytes); ``link_sends``: per link, one microbatch's sends over it one way
    (seconds, every chunk boundary crossing it)."""

    hardware: str
    schedule: Schedule
    cuts: StageCuts
    timeline: Timeline
    forward: tuple[float, ...]
    backward: tuple[float, ...]
    weight: tuple[float, ...]
    p2p: tuple[float, ...]
    links: tuple[str, ...]
    optimizer: tuple[float, ...]
    state: tuple[dict[str, int], ...]
    activations: tuple[int, ...]
    peak: tuple[int, ...]
    flops: tuple[float, ...] = ()  # per stage per step
    kernels: tuple[int, ...] = ()
    chunks: tuple[tuple[tuple[float, float, float, int], ...], ...] = ()
    link_sends: tuple[float, ...] = ()
    #: per stage, per step: the other axes' collectives by kind (seconds, part of its passes)
    collectives: tuple[dict[str, float], ...] = ()
    #: per stage, per step: (matmul, attention) seconds of its passes (`Breakdown`'s kinds)
    kinds: tuple[tuple[float, float], ...] = ()

    def sends_s(self, stage: int) -> float:
        """Seconds of sends stage ``stage`` takes part in per step: per microbatch, one
        permute over the link out of it (the activation; it receives one meanwhile) and one
        over the link into it (the gradient back)."""
        S, M, n = self.schedule.stages, self.schedule.microbatches, len(self.link_sends)
        links = {k for k in (stage - 1, stage) if n == S or 0 <= k < n}
        return M * sum(self.link_sends[k % S] for k in links)

    def busy(self, stage: int) -> float:
        """Seconds stage ``stage`` works in a step: M times its passes, and its optimizer."""
        M = self.schedule.microbatches
        return (
            M * (self.forward[stage] + self.backward[stage] + self.weight[stage])
            + (self.optimizer[stage])
        )

    @property
    def busiest(self) -> int:
        """The stage that works longest in a step (`busy`)."""
        return max(range(self.schedule.stages), key=self.busy)

    @property
    def step_s(self) -> float:
        return self.timeline.makespan + max(self.optimizer, default=0.0)

    @property
    def bubble_s(self) -> float:
        """Seconds the stages stand idle in the pipelined part, added over the stages (the
        share: of the stages' time together)."""
        return self.timeline.bubble

    @property
    def bubble_share(self) -> float:
        return self.timeline.bubble_share

    def __str__(self) -> str:
        s = self.schedule
        v = f" v={s.virtual_stages}" if s.virtual_stages > 1 else ""
        rows = [
            f"{s.kind} pipeline on {self.hardware}: S={s.stages} M={s.microbatches}{v}: step "
            f"{self.step_s:.4g} s, bubble {self.bubble_s:.4g} s over the {s.stages} stages "
            f"(share {self.bubble_share:.3f})"
        ]
        for i in range(s.stages):
            rows.append(
                f"  stage {i}: F {self.forward[i]:.3g} s, B {self.backward[i]:.3g} s, W "
                f"{self.weight[i]:.3g} s, optimizer {self.optimizer[i]:.3g} s, peak "
                f"{self.peak[i] / 2**20:.4g} MiB"
            )
        return "\n".join(rows)


def price_pipeline(
    program,
    stages: int,
    microbatches: int,
    hardware,
    *,
    schedule: str = "1f1b",
    virtual_stages: int = 1,
    layers=None,
    overlap="none",
) -> PipelineEstimate:
    """Price ``program``'s step as a pipeline with nothing else partitioned (see the module
    docstring). ``overlap``: "none" (each send delays its reader), "full" (sends hide) or
    the fraction that hides. ``layers``: where stages (virtual stages, with
    ``virtual_stages`` > 1 and schedule "interleaved") start (`stage_cuts`)."""
    hw = resolve(hardware)
    hide = _hidden(overlap)
    whole = isinstance(microbatches, int) and not isinstance(microbatches, bool)
    if whole and microbatches >= 1:  # other values: the schedule says what it takes
        check_microbatches(program, microbatches)
    sched = build_schedule(schedule, stages, microbatches, virtual_stages)
    check_chunks(program, stages, virtual_stages)
    cuts = stage_cuts(program, stages * virtual_stages, layers=layers)
    mesh = Mesh({"d": 1})
    state = State.initial(program)
    priced = _Priced(program, hw, cuts, microbatches, mesh, state, build_plan(program, mesh, state))
    return _timeline(priced, sched, hw, hide, list(range(stages)))


def price_planned(program, mesh, state, plan, hardware, pipeline, overlap="none"):
    """Price a session's pipelined step: ``pipeline`` (`strategies.pipeline.Pipeline`) over
    its stage axis, every op at the local shapes ``plan`` gives it on the other axes, and
    their collectives beside it: a forward or backward op's per microbatch (1/M of the
    bytes when the value has the batch dimension: a Megatron all-reduce; whole when not: a
    ZeRO-3 gather runs once per microbatch), an optimizer op's once per step."""
    hw = resolve(hardware)
    hide = _hidden(overlap)
    priced = _Priced(program, hw, pipeline.cuts, pipeline.microbatches, mesh, state, plan)
    priced.add_collectives(Communication(program, mesh, state, plan, hw).collective_estimates())
    return _timeline(priced, pipeline.schedule, hw, hide, stage_devices(mesh, hw, pipeline.axis))


def stage_devices(mesh, hw, axis: str) -> list[int]:
    """The device id of each stage along ``axis`` (every other axis at 0): where the
    hardware's placement puts it, else ``s`` times the axis's stride in the mesh order."""
    placement = hw.placement or row_major(mesh, hw.links)
    at = mesh.names.index(axis)
    if placement is not None:
        return [
            placement.device_of([s if i == at else 0 for i in range(len(mesh.names))])
            for s in range(mesh.axis_size(axis))
        ]
    stride = math.prod(mesh.sizes[at + 1 :])
    return [s * stride for s in range(mesh.axis_size(axis))]


def _hidden(overlap) -> float:
    overlap = check_overlap(overlap)
    if overlap == "prefetch":
        raise InputError(
            "overlap='prefetch' hides gathers of weights and gradient reductions, which a "
            "pipeline's sends are not; give 'none', 'full' or a fraction in [0, 1]"
        )
    return {"none": 0.0, "full": 1.0}.get(overlap, overlap)


def _timeline(priced, sched, hw, hide: float, devices: list[int]) -> PipelineEstimate:
    S, v, split = sched.stages, sched.virtual_stages, sched.split_backward
    virtual = priced.cuts.stages  # chunk c of stage s: virtual stage c*S + s
    chunks = [[virtual[c * S + s] for c in range(v)] for s in range(S)]
    times = [[priced.stage_times(st) for st in row] for row in chunks]
    per = {  # per stage, per chunk
        "F": [[f for f, _, _, _ in row] for row in times],
        "B": [[b if split else b + w for _, b, w, _ in row] for row in times],
        "W": [[w if split else 0.0 for _, _, w, _ in row] for row in times],
    }
    opt = [sum(o for *_, o in row) + priced.once_per_stage() for row in times]
    work = [[priced.stage_work(st) for st in row] for row in chunks]
    kinds = tuple(
        tuple(sum(x) * sched.microbatches for x in zip(*map(priced.stage_kinds, row), strict=True))
        for row in chunks
    )
    collectives = tuple(priced.stage_collectives(row) for row in chunks)
    links, p2p, link_sends = priced.sends(devices, S, v)
    durations = {k: [x[0] for x in rows] if v == 1 else rows for k, rows in per.items()}
    timeline = simulate(
        sched, durations["F"], durations["B"], durations["W"], [t * (1 - hide) for t in p2p] or 0.0
    )
    state = [priced.model_state(row) for row in chunks]
    acts = [[priced.activation_bytes(st) for st in row] for row in chunks]
    peak = tuple(
        sum(state[s].values()) + round(timeline.peak_chunks[s] * max(acts[s])) for s in range(S)
    )
    detail = tuple(
        tuple(zip(per["F"][s], per["B"][s], per["W"][s], acts[s], strict=True)) for s in range(S)
    )
    total = {k: tuple(sum(row) for row in rows) for k, rows in per.items()}
    return PipelineEstimate(
        hw.name, sched, priced.cuts, timeline, total["F"], total["B"], total["W"], tuple(p2p),
        tuple(links), tuple(opt), tuple(state), tuple(sum(a) for a in acts), peak,
        tuple(sum(f for f, _ in row) for row in work),
        tuple(sum(k for _, k in row) for row in work), detail, tuple(link_sends), collectives,
        kinds,
    )  # fmt: skip


class _Priced:
    """The program's ops priced per device (at the local shapes of ``plan``), and what a
    stage reads of them."""

    def __init__(self, program, hw, cuts: StageCuts, microbatches: int, mesh, state, plan):
        self.program, self.hw, self.cuts, self.M = program, hw, cuts, microbatches
        self.mesh, self.shardings = mesh, state.shardings
        compute = Compute(program, mesh, state, plan, hw)
        self.categories = compute.static.categories
        anatomy = program.anatomy()
        self.anatomy = anatomy
        self.batched = batched_values(program)  # 1/M of each per microbatch
        self.time: dict[int, tuple[float, float]] = {}  # op -> (scaled s, whole s) per step
        self.stage_at = cuts.holders()
        #: the program's outputs' collectives, once per step, by kind (seconds): per virtual
        #: stage whose ops make the output, None for those every stage runs
        self.outputs: dict[int | None, dict[str, float]] = defaultdict(dict)
        self.kinds: dict[int, dict[str, tuple[float, float]]] = {}  # op -> kind -> as time
        self.work: dict[int, tuple[float, int]] = {}  # op -> (FLOPs, kernels) per step
        self.attention = attention_ops(program)
        self.compute: dict[int, float] = {}  # op -> its own kernels' s, one microbatch
        estimates = compute.op_estimates()
        kernels = fused(program, mesh, state, plan, hw, estimates) if hw.fused_attention else NONE
        self.inside = kernels.inside  # values fused attention kernels keep on chip
        for e in kernels.replace(estimates):
            over = hw.op_overhead if e.kernel else 0.0
            self._add(e.op, e.seconds - over, over, e.count)
            self.compute[e.op] = self.time[e.op][0]
            self.work[e.op] = (
                (e.cost.flops + e.cost.transcendentals) * e.count,
                e.kernel * e.count,
            )
        for o_id, ks in compute.static.copies:  # transposed operand copies, with their op
            for k in ks:
                read, written = compute.copy_bytes(o_id, k)
                rate = compute.copy_rate(o_id, k, read)
                repeats = compute.plan.ops[o_id].repeats
                self._add(o_id, (read + written) / rate, hw.op_overhead, repeats)
        self.top = program.top_level
        self.n_blocks = sum(len(s.blocks) for s in cuts.stages)
        self.weight_ops = self._weight_ops()

    def _add(self, op_id: int, roofline: float, over: float, count: int) -> None:
        op = self.program.ops[op_id]
        tensors = [v for v in (*op.operands, *op.results) if isinstance(v, int)]
        scaled = any(v in self.batched for v in tensors)
        per_mb = roofline / self.M if scaled else roofline
        s, w = self.time.get(op_id, (0.0, 0.0))
        self.time[op_id] = (s + count * (per_mb + over), w + count * (roofline + over))

    def add_collectives(self, collectives) -> None:
        """Each collective's time on the op that needs it (see `price_planned`)."""
        for c in collectives:
            op, kind = c.collective.op, c.collective.kind
            if op is None:  # an output's: on the stage whose ops make it, else every stage's
                v = c.collective.value
                made = self.program.values[v].producer if v is not None else None
                by = self.outputs[self.stage_at.get(self.top[made]) if made is not None else None]
                by[kind] = by.get(kind, 0.0) + c.total_s
                continue
            per_mb = c.total_s / self.M if c.collective.value in self.batched else c.total_s
            s, w = self.time.get(op, (0.0, 0.0))
            self.time[op] = (s + per_mb, w + c.total_s)
            by = self.kinds.setdefault(op, {})
            s, w = by.get(kind, (0.0, 0.0))
            by[kind] = (s + per_mb, w + c.total_s)

    def stage_collectives(self, chunks) -> dict[str, float]:
        """Seconds per step of the collectives a stage's ``chunks`` run, by kind: a forward
        or backward op's M times a microbatch's, an optimizer op's once, as `stage_times`
        adds them; and those every stage runs once (`once_per_stage`)."""
        out = dict(self.outputs.get(None, {}))
        for o, _ in self.cuts.unplaced:
            for kind, (_, whole) in self.kinds.get(o, {}).items():
                out[kind] = out.get(kind, 0.0) + whole
        for st in chunks:
            for kind, seconds in self.outputs.get(st.index, {}).items():
                out[kind] = out.get(kind, 0.0) + seconds
            for o, phase, part in self._placed(st):
                for kind, (per_mb, whole) in self.kinds.get(o, {}).items():
                    add = part * (whole if phase == "optimizer" else self.M * per_mb)
                    out[kind] = out.get(kind, 0.0) + add
        return out

    def nbytes(self, v: int) -> int:
        return self.shardings[v].local_nbytes(self.mesh)

    def _weight_ops(self) -> set[int]:
        """Top-level backward ops whose results lack the batch dimension and flow only into
        parameter gradients (x^T dy and what sums or casts it; dx keeps the batch)."""
        p, gradients = self.program, set(self.anatomy.gradients.values())
        w: set[int] = set()
        for o in reversed(p.body):
            op = p.ops[o]
            if op.phase != "backward" or op.regions or not op.results:
                continue
            if all(
                r not in self.batched
                and (r in gradients or p.users[r])
                and all(self.top[u] in w or p.ops[u].phase == "optimizer" for u in p.users[r])
                for r in op.results
            ):
                w.add(o)
        return w

    def _placed(self, st):
        """(op, phase, part) for each op stage ``st`` runs: its forward, backward (a
        recomputation is there) and optimizer ops whole, and each loop the stages split by
        the stage's share of the blocks, under the loop's phase."""
        for ops, phase in (
            (st.forward, "forward"),
            (st.backward, "backward"),
            (st.optimizer, "optimizer"),
        ):
            for o in ops:
                yield o, phase, 1.0
        share = len(st.blocks) / self.n_blocks
        for o in self.cuts.looped:
            yield o, self.program.ops[self.top[o]].phase, share

    def stage_times(self, st) -> tuple[float, float, float, float]:
        """One microbatch's F, B (input gradient), W seconds on (virtual) stage ``st``, and
        its optimizer ops' per step."""
        f = b = w = o = 0.0
        for op_id, phase, part in self._placed(st):
            per_mb, whole = self.time.get(op_id, (0.0, 0.0))
            if phase == "forward":
                f += per_mb * part
            elif phase == "optimizer":
                o += whole * part
            elif self.top[op_id] in self.weight_ops:
                w += per_mb * part
            else:
                b += per_mb * part
        return f, b, w, o + sum(self.outputs.get(st.index, {}).values())

    def stage_kinds(self, st) -> tuple[float, float]:
        """One microbatch's matmul and attention seconds on (virtual) stage ``st``, forward
        and backward (as `breakdown.breakdown` sorts an unpipelined step's ops)."""
        matmul = attention = 0.0
        for op_id, phase, part in self._placed(st):
            seconds = self.compute.get(op_id, 0.0) * part
            if phase == "optimizer" or not seconds:
                continue
            if op_id in self.attention:
                attention += seconds
            elif (t := traits(self.program.ops[op_id].primitive)).contraction or t.convolution:
                matmul += seconds
        return matmul, attention

    def once_per_stage(self) -> float:
        """What every stage runs once a step beside its chunks' optimizers: the ops reading
        several stages' values (`StageCuts.unplaced`), the collectives for the outputs."""
        unplaced = sum(self.time.get(o, (0.0, 0.0))[1] for o, _ in self.cuts.unplaced)
        return unplaced + sum(self.outputs.get(None, {}).values())

    def stage_work(self, st) -> tuple[float, int]:
        """The stage's FLOPs and kernels per step (a forward or backward kernel launches once
        per microbatch)."""
        share = len(st.blocks) / self.n_blocks
        flops, kernels = 0.0, 0.0
        for ops, part in (
            (st.forward + st.backward + st.optimizer, 1.0),
            (self.cuts.looped, share),
        ):
            for o in ops:
                f, k = self.work.get(o, (0.0, 0))
                per_mb = self.program.ops[self.top[o]].phase != "optimizer"
                flops += part * f
                kernels += part * k * (self.M if per_mb else 1)
        return flops, round(kernels)

    def nbytes_per_mb(self, v: int) -> float:
        n = self.nbytes(v)
        return n / self.M if v in self.batched else n

    def sends(
        self, devices: list[int], S: int, v: int
    ) -> tuple[list[str], list[float], list[float]]:
        """Per link s -> (s+1) % S (S-1 links; S with chunks): the level it runs on, the
        largest one-microbatch send of the chunk boundaries crossing it, and their sum.
        Stage s runs on device ``devices[s]`` (`stage_devices`)."""
        n = S if v > 1 else S - 1
        largest, total = [0.0] * n, [0.0] * n
        for b in self.cuts.boundaries:
            nbytes = sum(self.nbytes_per_mb(x) for x in b.values)
            bw, lat = self._link(b.after % S, S, devices).figures_for("collective-permute")
            t = permute_time(nbytes, bw, lat) if nbytes and S > 1 else 0.0  # S=1: no send
            k = b.after % S
            largest[k], total[k] = max(largest[k], t), total[k] + t
        return [self._link(k, S, devices).name for k in range(n)], largest, total

    def _link(self, s: int, S: int, devices: list[int]):
        """The innermost level whose group holds stage s's device and stage (s+1) % S's."""
        a, z = devices[s], devices[(s + 1) % S]
        groups = self.hw.group_devices
        level = next(
            (i for i, g in enumerate(groups) if g is None or a // g == z // g), len(groups) - 1
        )
        return self.hw.links[level]

    def model_state(self, chunks) -> dict[str, int]:
        """Parameters, their optimizer state, and the gradients the optimizer reads, of a
        stage's ``chunks`` together (a parameter two chunks read counts once)."""
        p, cat = self.program, self.categories
        out = dict.fromkeys(STATE, 0)
        for q in dict.fromkeys(q for st in chunks for q in st.parameters):
            out["parameters"] += self.nbytes(q)
            out["optimizer"] += sum(self.nbytes(x) for x in self.anatomy.state.get(q, ()))
        owned = {x for q in self.anatomy.parameters for x in self.anatomy.state.get(q, ())}
        out["optimizer"] += sum(  # a step counter: each stage keeps its own
            self.nbytes(x) for x in self.anatomy.optimizer_state if x not in owned
        )
        looped = [o for o in self.cuts.looped if p.ops[o].phase == "optimizer"]
        grads = {
            v
            for o in (*(o for st in chunks for o in st.optimizer), *looped)
            for v in p.ops[o].operands
            if isinstance(v, int) and cat[v] == "gradients"
        }
        out["gradients"] = sum(self.nbytes(v) for v in grads)
        return out

    def activation_bytes(self, st) -> int:
        """One microbatch's bytes the stage's backward ops read of what the forward saved."""
        p, cat = self.program, self.categories
        share = len(st.blocks) / self.n_blocks
        total = 0.0
        backward = {*st.backward, *self.cuts.looped}  # a recomputation's results are not held
        for ops, part in ((st.backward, 1.0), (self.cuts.looped, share)):
            read = {
                v
                for o in ops
                if o == self.top[o] and (o in st.backward or p.ops[o].phase == "backward")
                for v in p.ops[o].operands
                if isinstance(v, int) and cat[v] == "activations" and v not in self.inside
                and (p.values[v].producer is None or self.top[p.values[v].producer] not in backward)
            }  # fmt: skip
            total += part * sum(self.nbytes_per_mb(v) for v in read)
        return round(total)
