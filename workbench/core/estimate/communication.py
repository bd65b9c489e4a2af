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


def relaid(kind: str, dim: int | None, src: Sharding, dst: Sharding, mesh: Mesh) -> bool:
    """Whether a ``kind`` collective over ``dim`` runs on a transposed copy: collectives
    move contiguous blocks, so a gather or scatter whose dimension has a non-trivial
    dimension before it (in the local shape) runs on a copy laid out with that dimension
    leading: its input is transposed into that layout and its output back (XLA's layout
    assignment, checked on CPU)."""
    if kind not in ("all-gather", "reduce-scatter") or dim is None:
        return False
    shape = (dst if kind == "all-gather" else src).local_shape(mesh)
    return math.prod(shape[:dim]) > 1


def layout_copies(c: Collective, mesh: Mesh) -> tuple[float, int]:
    """``(bytes, kernels)`` of the transposed copies the runtime makes around collective
    ``c`` (bytes read plus written; see `relaid`): the gathered or scattered array plus
    its 1/n shard, each read and written once."""
    if relaid(c.kind, c.dim, c.src, c.dst, mesh):
        n = math.prod(mesh.axis_size(a) for a in c.axes)
        return 2.0 * c.bytes * (1 + 1 / n), 2
    return 0.0, 0


class Communication(PlannedStep):
    """The collectives of one plan: their times, how a runtime combines them, which hide."""

    def collective_estimates(self) -> list[CollectiveEstimate]:
        """Per collective of the plan, its time with the copies around it. The gradient
        all-reduces a runtime combines (``buckets``, and a loop step's ``step_end``) run
        as one collective over the same axes, up to the runtime's threshold: its time (one
        latency, the bytes of all) is shared among them by bytes. A program output's
        all-reduce (a loss, needed only at the end) joins the last bucket."""
        hw, mesh = self.hw, self.mesh
        combined: dict[tuple, list[int]] = {}  # (bucket, axes, reduction) -> collective indices
        buckets = self.buckets
        bucket_of = {o_id: b for b, members in enumerate(buckets) for _, o_id in members}
        if buckets:
            bucket_of[None] = len(buckets) - 1
        collectives = self.plan.collectives
        seconds = []
        chosen: dict[int, Synthesis] = {}  # collective index -> its synthesised program
        for i, c in enumerate(collectives):
            b = None
            if c.kind == "all-reduce":
                if c.count == 1:
                    b = bucket_of.get(c.op)
                elif (c.op, c.value) in self.step_end:
                    b = ("step", c.op)
            if b is None:
                t, s = priced(c.kind, c.bytes, c.axes, mesh, hw)
                if s is not None:
                    chosen[i] = s
                seconds.append(t)
            else:  # priced with its bucket below
                combined.setdefault((b, c.axes, c.reduction), []).append(i)
                seconds.append(0.0)
        limit = hw.all_reduce_combine_bytes
        for (_, axes, _), members in combined.items():
            chunks, size = [[]], 0.0  # a runtime combines up to its threshold
            for i in members:
                if chunks[-1] and (
                    size + collectives[i].bytes > limit or len(chunks[-1]) >= COMBINE_COUNT
                ):
                    chunks.append([])
                    size = 0.0
                chunks[-1].append(i)
                size += collectives[i].bytes
            for chunk in chunks:
                total = sum(collectives[i].bytes for i in chunk)
                t, s = priced("all-reduce", total, axes, mesh, hw)
                for i in chunk:
                    seconds[i] = t * collectives[i].bytes / total
                    if s is not None:
                        chosen[i] = s
        out = []
        for i, (c, t) in enumerate(zip(collectives, seconds)):
            nbytes, kernels = layout_copies(c, mesh)
            copy = nbytes / hw.copy_bandwidth(c.bytes) + kernels * hw.op_overhead
            out.append(CollectiveEstimate(c, t + copy, copy, self.hidden(c), chosen.get(i)))
        return out

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
