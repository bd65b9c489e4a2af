"""Communication of one step per device: per collective of the plan
``hardware.collective_time`` times its count, with the transposed copies a runtime makes
around a gather or scatter along a dimension that is not leading (``layout_copies``); the
gradient all-reduces a runtime combines run as one (``buckets``); and which collectives the
"prefetch" overlap hides (``hidden``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from workbench.core.estimate.static import PlannedStep
from workbench.core.hardware.collectives import priced
from workbench.core.hardware.synthesis import Synthesis
from workbench.core.layout.collectives import Collective
from workbench.core.layout.mesh import Mesh
from workbench.core.layout.sharding import Sharding

#: The most all-reduces a runtime combines into one (XLA's combiners: 256 operands).
COMBINE_COUNT = 256


@dataclass(frozen=True, slots=True)
class CollectiveEstimate:
    collective: Collective
    seconds: float  # per run, with the copies around it
    copy_s: float = 0.0  # per run: the part spent in those copies (see ``layout_copies``)
    hidden: bool = False  # the "prefetch" policy hides it behind compute (`Communication.hidden`)
    #: a reduction whose group spans levels: the program of per-level steps it is priced as
    #: (its bucket's, where it runs combined), and the default it beat (``hardware/synthesis``)
    synthesis: Synthesis | None = None
    behind_s: float = 0.0  # per run: the part a ring attention's blocks hide (``rings.py``)

    @property
    def total_s(self) -> float:
        """Seconds per step the step waits for it."""
        return (self.seconds - self.behind_s) * self.collective.count


def relaid(
    kind: str, dim: int | None, src: Sharding, dst: Sharding, mesh: Mesh, lead: int = 0
) -> bool:
    """Whether a ``kind`` collective over ``dim`` runs on a transposed copy: collectives
    move contiguous blocks, so a gather or scatter whose dimension has a non-trivial
    dimension before it (in the local shape) runs on a copy laid out with that dimension
    leading: its input is transposed into that layout and its output back (XLA's layout
    assignment, checked on CPU). ``lead``: leading dimensions left out (one slice's)."""
    if kind not in ("all-gather", "reduce-scatter") or dim is None or dim < lead:
        return False
    shape = (dst if kind == "all-gather" else src).local_shape(mesh)
    return math.prod(shape[lead:dim]) > 1


def layout_copies(c: Collective, mesh: Mesh, slices: int = 1) -> tuple[float, int]:
    """``(bytes, kernels)`` of the transposed copies the runtime makes around collective
    ``c`` (bytes read plus written; see `relaid`): the gathered or scattered array plus
    its 1/n shard, each read and written once; run as ``slices`` collectives, one per
    index of its leading dimension (`Communication.slices`), each its own copies."""
    lead = 0 if slices == 1 else 1
    if relaid(c.kind, c.dim, c.src, c.dst, mesh, lead):
        n = math.prod(mesh.axis_size(a) for a in c.axes)
        return 2.0 * c.bytes * (1 + 1 / n), 2 * slices
    return 0.0, 0


class Communication(PlannedStep):
    """The collectives of one plan: their times, how a runtime combines them, which hide."""

    def collective_estimates(self) -> list[CollectiveEstimate]:
        """Per collective of the plan, its time with the copies around it. The gradient
        all-reduces a runtime combines (``buckets``, and a loop step's ``step_end``) run
        as one collective over the same axes, up to the runtime's threshold (``combined``):
        its time (one latency, the bytes of all) is shared among them by bytes. A program
        output's all-reduce (a loss, needed only at the end) joins the last bucket. A
        collective on a stack of a loop's per-step slices runs as one per slice (``slices``).
        """
        hw, mesh = self.hw, self.mesh
        groups: dict[tuple, list[int]] = {}  # (bucket, axes, reduction) -> collective indices
        buckets = self.buckets
        bucket_of = {o_id: b for b, members in enumerate(buckets) for _, o_id in members}
        if buckets:
            bucket_of[None] = len(buckets) - 1
        collectives = self.plan.collectives
        seconds, slices = [], []
        chosen: dict[int, Synthesis] = {}  # collective index -> its synthesised program
        for i, c in enumerate(collectives):
            b = None
            if c.kind == "all-reduce":
                if c.count == 1:
                    b = bucket_of.get(c.op)
                elif (c.op, c.value) in self.step_end:
                    b = ("step", c.op)
            k = self.slices(c) if b is None else 1
            slices.append(k)
            if b is None:
                t, s = priced(c.kind, c.bytes / k, c.axes, mesh, hw)
                if s is not None:
                    chosen[i] = s
                seconds.append(t * k)
            else:  # priced with its bucket below
                groups.setdefault((b, c.axes, c.reduction), []).append(i)
                seconds.append(0.0)
        for (b, axes, _), members in groups.items():
            if isinstance(b, tuple):  # a loop step's: in the order its body makes them
                members = sorted(members, key=lambda i: self._made_at(collectives[i].value))
            for chunk in combined([collectives[i].bytes for i in members], hw):
                chunk = [members[j] for j in chunk]
                total = sum(collectives[i].bytes for i in chunk)
                t, s = priced("all-reduce", total, axes, mesh, hw)
                for i in chunk:
                    seconds[i] = t * collectives[i].bytes / total
                    if s is not None:
                        chosen[i] = s
        out = []
        for i, (c, t, k) in enumerate(zip(collectives, seconds, slices)):
            nbytes, kernels = layout_copies(c, mesh, k)
            copy = nbytes / hw.copy_bandwidth(c.bytes / k) + kernels * hw.op_overhead
            out.append(CollectiveEstimate(c, t + copy, copy, self.hidden(c), chosen.get(i)))
        return out

    def _made_at(self, v: int | None) -> int:
        """Where value ``v`` is made in program order (ops are numbered in it)."""
        producer = self.program.values[v].producer if v is not None else None
        return -1 if producer is None else producer

    def slices(self, c: Collective) -> int:
        """How many collectives ``c`` runs as: one per step of a loop for a stack of the
        loop's per-step slices that it moves outside the loop along another dimension (a
        parameter stacked over a ``scan``'s layers, or its update fed back in its place,
        gathered by ZeRO-2 after the update), as the unrolled step moves each layer's; else
        one. ``stacked``: which values are such stacks."""
        if c.count != 1 or c.dim == 0 or c.value is None:
            return 1
        return self.stacked.get(c.value, 1)

    @cached_property
    def stacked(self) -> dict[int, int]:
        """Value -> the steps of the loop that reads it one slice per step: the parameters
        a loop's body reads a slice of (``anatomy.loop_slices``) and the outputs a training
        loop feeds back in their place (``anatomy.feedback``)."""
        return self.program.cache.get("estimate.stacked", lambda: _stacked(self.program))

    def hidden(self, c: Collective) -> bool:
        """Whether the "prefetch" policy hides ``c`` behind compute: a gather of a value made
        from the step's inputs alone, or the reduction of a gradient (read by the update,
        or returned by a backward loop's step)."""
        if c.kind == "all-gather":
            return c.value in self.static.from_inputs
        if c.kind not in ("reduce-scatter", "all-reduce") or c.op is None:
            return False
        phase = self.program.ops[c.op].phase
        return phase == "optimizer" or (phase == "backward" and (c.op, c.value) in self.step_end)

    @cached_property
    def step_end(self) -> frozenset[tuple[int, int]]:
        """``(loop op, value)`` for each value a loop's body returns: what the body reduces at
        the end of each step is independent, and a runtime combines it into one all-reduce
        per step, as it combines the update's gradients (``buckets``)."""
        return frozenset(
            (op.id, v)
            for op in self.program.ops
            for region in op.regions
            for v in region.outputs
            if isinstance(v, int)
        )

    @cached_property
    def buckets(self) -> list[list[tuple[int, int]]]:
        """The combined gradient all-reduces: per bucket, ``(position, op id)`` of each
        optimizer op whose operands it reduces (buckets of one op combine nothing and are
        left out).

        Runtimes combine independent all-reduces into one (XLA's all-reduce combiner, the
        gradient buckets of data-parallel frameworks) of up to
        ``hardware.all_reduce_combine_bytes`` and ``COMBINE_COUNT`` operands: a bucket
        closes when full or when an op needs the result of one of its own members.
        """
        limit = self.hw.all_reduce_combine_bytes
        plan_ops, steps = self.plan.ops, self.static.optimizer_steps
        buckets: list[list[tuple[int, int]]] = []
        size = 0.0
        bucket_of: dict[int, int] = {}  # value -> the last bucket it depends on
        for o_id, at, operands, results in steps:
            o = plan_ops[o_id]
            if o is None:
                continue
            after = max([bucket_of.get(v, -1) for v in operands], default=-1)
            reduced = 0
            for f in o.fetches:
                if f is not None and f.steps:
                    reduced += sum(st.bytes for st in f.steps if st.kind == "all-reduce")
            if reduced:
                full = not buckets or size + reduced > limit or len(buckets[-1]) >= COMBINE_COUNT
                if full or after == len(buckets) - 1:  # full, or it needs the open bucket
                    buckets.append([])
                    size = 0.0
                buckets[-1].append((at, o_id))
                size += reduced
                after = len(buckets) - 1
            if after >= 0:
                for v in results:
                    bucket_of[v] = after
        return [b for b in buckets if len(b) > 1]


def combined(sizes: list[float], hw) -> list[list[int]]:
    """The all-reduces a runtime combines, of these ``sizes`` in order: consecutive ones up
    to ``hardware.all_reduce_combine_bytes`` and ``COMBINE_COUNT`` operands (indices)."""
    chunks: list[list[int]] = [[]]
    size = 0.0
    for i, nbytes in enumerate(sizes):
        full = size + nbytes > hw.all_reduce_combine_bytes or len(chunks[-1]) >= COMBINE_COUNT
        if chunks[-1] and full:
            chunks.append([])
            size = 0.0
        chunks[-1].append(i)
        size += nbytes
    return chunks


def _stacked(program) -> dict[int, int]:
    anatomy = program.anatomy()
    values, slices = program.values, anatomy.loop_slices
    out = {
        p: values[p].shape[0]
        for p in anatomy.parameters
        if any(dropped == 1 for _, dropped in slices.get(p, ()))
    }
    for o, i in anatomy.feedback.items():
        if i in out and values[o].shape == values[i].shape:
            out[o] = out[i]
    return out
