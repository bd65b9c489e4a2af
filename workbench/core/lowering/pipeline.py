"""The pipeline lowering: a captured training step run as a pipeline over one mesh axis.

``lower_pipeline(program, mesh, axis, cuts, schedule)`` cuts the differentiated step into
per-stage segments (`pipeline_segments`), unrolls the schedule's table into ticks, and
builds one ``shard_map`` program: in each tick every device along ``axis`` runs its work
item (``lax.switch`` on its index), then ``ppermute`` moves activations to the next stage
and cotangents to the previous one. Interleaved, the cuts hold S*v virtual stages, chunk c
of device s being c*S + s: device S-1 sends chunk c's activations to device 0's chunk c+1.
A segment runs at one microbatch's local shapes, interpreted like the explicit lowering
with the microbatches as a mesh axis walked in time: the session's state (its layouts on
the other axes) with the batch tiled further over a "microbatch" axis, so a segment performs
the plan's collectives over the other axes and takes its microbatch's block where the plan
would slice the microbatch axis. What a stage keeps between its passes lives in slots a
device's chunks share, reused once a microbatch is done (GPipe holds M in flight, 1F1B at
most S, interleaved its warmup). Sums over the batch accumulate over microbatches (still
pending over the other axes); what runs once before and after the pipeline (a token count,
the update) runs as the explicit lowering runs it. Blocks under a loop (scanned layers):
each (virtual) stage runs its range of the loop's iterations (`pipeline_loops`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec

from workbench.core.dtypes import is_extended
from workbench.core.errors import InputError, TacticError, given
from workbench.core.ir.program import Lit
from workbench.core.layout.mesh import Mesh
from workbench.core.layout.redistribute import as_layout, layout_key, redistribute
from workbench.core.layout.state import State
from workbench.core.lowering.explicit import _Explicit, in_mesh, jax_mesh, spec
from workbench.core.lowering.interpret import literal
from workbench.core.lowering.pipeline_buffers import POOLS, Pack, slots_of, zeros
from workbench.core.lowering.pipeline_loops import (
    check_layouts,
    resized,
    run_range,
    stack_fetches,
)
from workbench.core.lowering.pipeline_segments import Parts, reads_of, split_parts, ticks
from workbench.core.lowering.steps import run_step
from workbench.core.plan.plan import build_plan

#: The mesh axis the microbatches form while a segment is interpreted (walked in time).
MICROBATCH = "microbatch"


@dataclass
class LoweredPipeline:
    """A pipelined step: call it with the program's flat inputs. ``ticks``: the unrolled
    schedule; ``emitted[s]``: the work items stage s's code runs, in order (filled when
    traced); ``slots``: how many buffers each pool holds per device; ``micro``: the state
    a segment runs in (the step's layouts, the batch tiled further over the microbatches)."""

    fn: object
    mesh: jax.sharding.Mesh
    ticks: tuple
    slots: dict
    parts: Parts
    micro: State
    emitted: list = field(default_factory=list)

    def __call__(self, *flat):
        return self.fn(*flat)


class _Part(_Explicit):
    """The explicit interpreter of a part of the step. ``layout_of(v)``: the layout a part
    holds ``v`` in when it starts; a fetch from a layout another part made (not here) is
    made again from that one."""

    def __init__(self, program, mesh, plan, state, layout_of):
        super().__init__(program, mesh, plan, state)
        self.again, self.layout_of = False, layout_of

    def fetch(self, env, fetch, v):
        if isinstance(v, Lit):
            return literal(v)
        versions = env[v]
        steps = fetch.steps
        if layout_key(fetch.src) not in versions:
            src = self.layout_of(v)
            x, steps = versions[layout_key(src)], redistribute(src, fetch.dst, self.mesh)
        else:
            x = versions[layout_key(fetch.src)]
        self.again = fetch.copy > 0
        for step in steps:
            x = self.step(x, step)
        versions = dict(versions)
        versions[layout_key(fetch.dst)] = x
        env[v] = versions
        return x

    def step(self, x, step):
        return run_step(x, step, self.mesh, again=self.again)


class _Micro(_Part):
    """A segment's interpreter on the microbatch mesh, at microbatch ``m`` of stage ``s``
    (static); ``loop``: the loops it runs over the stage's range of iterations."""

    def __init__(self, program, mesh, plan, state, layout_of, loop=None):
        super().__init__(program, mesh, plan, state, layout_of)
        self.m, self.s, self.op, self.loop = 0, 0, None, loop
        self.stacks, self.stacking = stack_fetches(program, loop), False

    def region_output(self, env, op, v, slot):
        self.stacking = self.loop is not None and op.id == self.loop.backward
        self.stacking = self.stacking and slot in self.stacks
        try:
            return super().region_output(env, op, v, slot)
        finally:
            self.stacking = False

    def region(self, env, op, args):
        if self.loop is not None and op.id in (self.loop.forward, self.loop.backward):
            return run_range(self, env, op, args, self.loop, self.s)
        return super().region(env, op, args)

    def read(self, env, v, op, slot):
        self.op = op
        return super().read(env, v, op, slot)

    def step(self, x, step):
        if is_extended(x.dtype):
            impl = jax.random.key_impl(x)
            return jax.random.wrap_key_data(self.step(jax.random.key_data(x), step), impl=impl)
        if MICROBATCH not in step.axes:
            return run_step(x, step, self.mesh, again=self.again)
        if step.kind == "slice":  # this microbatch's block among the axes' blocks
            n, k = step.after.local_shape(self.mesh)[step.dim], 0
            for a in step.axes:
                k = k * self.mesh.axis_size(a) + (self.m if a == MICROBATCH else lax.axis_index(a))
            return lax.dynamic_slice_in_dim(x, k * n, n, axis=step.dim)
        if self.stacking and step.kind == "all-reduce":  # a stacked gradient's sum: the
            others = tuple(a for a in step.axes if a != MICROBATCH)  # other axes' here,
            return run_step(x, replace(step, axes=others), self.mesh) if others else x  # ours
        if step.kind == "mask":  # the other axes' part masks on devices; ours in time
            others = tuple(a for a in step.axes if a != MICROBATCH)
            if others:
                x = run_step(x, replace(step, axes=others), self.mesh)
            zero = step.reduction == "sum" and self.m > 0
            return jnp.zeros_like(x) if zero else x
        raise _coupled(self.program, self.op, step)  # pragma: no cover - checked before


def _coupled(program, op, step) -> TacticError:
    where = f" ({op.source})" if op.source else ""
    return TacticError(
        f"op {op.id} ({op.primitive}, {op.phase}{where}) needs a {step.kind} over the batch "
        "inside a pipeline stage: it couples the examples of different microbatches (a "
        "batch normalisation's statistics?), which a stage cannot compute one microbatch "
        "at a time. Compute it per example, or do not pipeline this step."
    )


def _check_coupling(program, plan, parts) -> None:
    """Refuse, before anything traces, a segment op whose operand needs a collective over
    the microbatches (anything but taking one microbatch's block, or a scanned step's
    stacked gradient summed over the batch in its loop: summed over microbatches after)."""
    stacks = stack_fetches(program, parts.loop)
    backward = parts.loop.backward if parts.loop is not None else None
    for ids in parts.segments.values():
        for op in program.walk(ids):
            for i, f in enumerate(plan.ops[op.id].fetches):
                for step in f.steps if f is not None else ():
                    stacked = op.id == backward and i in stacks and step.kind == "all-reduce"
                    ok = step.kind in ("slice", "mask") or (stacked and step.reduction == "sum")
                    if MICROBATCH in step.axes and not ok:
                        raise _coupled(program, op, step)


def localize(x, layout, m: int, mesh: Mesh):
    """Microbatch ``m``'s local block of ``x``, a device's block of the whole batch, laid
    out as ``layout`` (the microbatch axis minor-most where it tiles)."""
    d = layout.dim_of(MICROBATCH)
    if d is not None:
        n = layout.local_shape(mesh)[d]
        return lax.slice_in_dim(x, m * n, (m + 1) * n, axis=d)
    if layout.reduction_of(MICROBATCH) == "sum" and m > 0:
        return jnp.zeros_like(x)
    return x


def lower_pipeline(program, mesh: Mesh, axis: str, cuts, schedule, devices=None, state=None):
    """A jitted function of ``program``'s flat inputs computing its outputs as a pipeline
    over ``axis`` of ``mesh``: stage s of ``cuts`` (`anatomy.stages.stage_cuts`) on the
    devices at index s of ``axis``, in the order ``schedule`` (`plan.schedule`) gives (with
    v chunks per stage, ``cuts`` holds S*v virtual stages, stage g on index g % S).
    ``state``: the layouts on the other axes (a `State` of ``mesh`` leaving ``axis`` unused;
    default: every value whole), the inputs placed and the outputs returned as it says.
    Returns a `LoweredPipeline`."""
    S, M, nchunks = _check(program, mesh, axis, cuts, schedule)
    V = S * nchunks  # virtual stages: chunk c of device s is c*S + s
    state = State.initial(program) if state is None else state
    tiled = [v for v, sh in state.shardings.items() if sh.uses(axis)]
    if tiled:
        raise InputError(
            f"the state lays out {len(tiled)} value(s) over {axis!r} (value {tiled[0]}: "
            f"{state.shardings[tiled[0]]}), the pipeline's stage axis, which carries no "
            "tile; give a state whose tactics use the other axes only."
        )
    mb = _micro_mesh(mesh, axis, M)
    plan = build_plan(program, mesh, state)
    micro = _micro_state(program, mb, state)
    mplan = build_plan(program, mb, micro)
    parts = split_parts(program, cuts, micro, MICROBATCH, schedule.split_backward, mplan)
    _check_coupling(program, mplan, parts)
    grid = ticks(schedule)
    slot, nslots = slots_of(grid, S, schedule.split_backward, nchunks)
    layout_of, real_of = _layouts(program, mplan, micro), _layouts(program, plan, state)
    lp = parts.loop
    check_layouts(program, lp, mplan, layout_of, real_of)
    interp = _Micro(program, mb, mplan, micro, layout_of, lp)
    whole = _Part(program, mesh, plan, state, real_of)  # what runs once: before, after
    reads = {key: reads_of(program, ids) for key, ids in parts.segments.items()}
    outside = {v for rs in reads.values() for v in rs if v not in parts.home}
    summed = {v for vs in parts.accumulated.values() for v in vs}
    _check_crossing(program, sorted(outside | summed), layout_of, real_of)

    def pack(vs, g=0):  # virtual stage g's loop stacks hold its range of iterations
        return Pack(vs, resized(layout_of, lp, g), mb)

    fin = [pack(parts.fwd[g - 1]) if g else pack(()) for g in range(V)]
    bin_ = [pack(parts.bwd[g]) if g < V - 1 else pack(()) for g in range(V)]
    saved = [pack(parts.saved[g], g) for g in range(V)]
    wsaved = [pack(parts.wsaved[g], g) for g in range(V)]
    acc = [pack(parts.accumulated.get(g, ()), g) for g in range(V)]
    sends = lp.sends if lp is not None else {}  # a stage sends its carry out for its in
    segment_ops = {key: set(ids) for key, ids in parts.segments.items()}
    packs = {"fin": fin, "saved": saved, "bin": bin_, "wsaved": wsaved}
    lowered = LoweredPipeline(None, None, grid, nslots, parts, micro)

    def run_work(st, g, w, genv):  # work item w of virtual stage g
        m, kind = w.microbatch, w.kind
        env = {}
        for v in reads[g, kind]:
            if v in genv:
                x = genv[v][layout_key(real_of(v))]
                env[v] = {layout_key(layout_of(v)): localize(x, layout_of(v), m, mb)}

        def load(pool, p):
            for v, a in p.unpack(st[pool][slot[pool, g, m]]).items():
                env[v] = {layout_key(layout_of(v)): a}

        def get(vs, rename=None):
            rename = rename or {}
            return {v: env[rename.get(v, v)][layout_key(layout_of(rename.get(v, v)))] for v in vs}

        if kind == "F" and g > 0:
            load("fin", fin[g])
        if kind in "BW":
            load("saved", saved[g])
        if kind == "B" and g < V - 1:
            load("bin", bin_[g])
        if kind == "W":
            load("wsaved", wsaved[g])
        interp.m, interp.s = m, g
        interp.run(env, parts.segments[g, kind])
        st = {k: (list(b) if isinstance(b, list) else b) for k, b in st.items()}
        if kind == "F":
            k = slot["saved", g, m]
            st["saved"][k] = saved[g].pack(get(saved[g].values), st["saved"][k])
            if g < V - 1:
                st["out_f"] = fin[g + 1].pack(get(fin[g + 1].values, sends), st["out_f"])
        if kind == "B":
            if g > 0:
                st["out_b"] = bin_[g - 1].pack(get(bin_[g - 1].values, sends), st["out_b"])
            if schedule.split_backward:
                k = slot["wsaved", g, m]
                st["wsaved"][k] = wsaved[g].pack(get(wsaved[g].values), st["wsaved"][k])
        mine = segment_ops[g, kind]
        made = [v for v in acc[g].values if program.values[v].producer in mine]
        st["acc"][w.chunk] = acc[g].add(get(made), st["acc"][w.chunk])
        return st

    def branch(s, tick, genv):
        def run(st):
            st = {k: (list(b) if isinstance(b, list) else b) for k, b in st.items()}
            for pool, g, m in tick.stores[s]:
                st[pool][slot[pool, g, m]] = st["in_f" if pool == "fin" else "in_b"]
            w = tick.work[s]
            if w is not None:
                lowered.emitted[s].append(w)
                st = run_work(st, w.chunk * S + s, w, genv)
            return st

        return run

    def links(tick, kind, step):  # the (device, device) pairs sending in this tick
        out = []
        for s, w in enumerate(tick.work):
            if w is not None and w.kind == kind and 0 <= w.chunk * S + s + step < V:
                out.append((s, (s + step) % S))
        return out

    def per_device(*flat):
        lowered.emitted[:] = [[] for _ in range(S)]
        genv = whole.start(flat)
        whole.run(genv, parts.pre)
        st = {p: [zeros(packs[p])] * nslots[p] for p in POOLS}
        st["acc"] = [zeros(acc)] * nchunks  # per chunk: its virtual stage's sums
        st["out_f"] = st["in_f"] = zeros(fin)
        st["out_b"] = st["in_b"] = zeros(bin_)
        index = lax.axis_index(axis)
        for tick in grid:
            busy = [tick.work[s] is not None or tick.stores[s] for s in range(S)]
            if any(busy):
                st = lax.switch(index, [branch(s, tick, genv) for s in range(S)], st)
            if forward := links(tick, "F", 1):
                st["in_f"] = _send(st["out_f"], axis, forward)
            if backward := links(tick, "B", -1):
                st["in_b"] = _send(st["out_b"], axis, backward)
        gathered = [{dt: lax.all_gather(b, axis) for dt, b in c.items()} for c in st["acc"]]
        ranges = {}  # a loop's stacked sums: each virtual stage's range, in order
        for g in range(V):
            c, s = divmod(g, S)
            for v, a in acc[g].unpack({dt: x[s] for dt, x in gathered[c].items()}).items():
                if lp is not None and v in lp.local:
                    ranges.setdefault(v, []).append(a)
                else:
                    genv[v] = {layout_key(real_of(v)): a}
        for v, pieces in ranges.items():
            genv[v] = {layout_key(real_of(v)): jnp.concatenate(pieces, axis=0)}
        whole.run(genv, parts.post)
        return tuple(whole.outputs(genv))

    if devices is None:  # the first devices the mesh spans
        devices = jax.devices()[: math.prod(mesh.sizes)]
    jmesh = jax_mesh(mesh, devices, state.placement)
    mapped = jax.shard_map(
        per_device,
        mesh=jmesh,
        in_specs=tuple(spec(state.shardings[v]) for v in program.inputs),
        out_specs=tuple(spec(f.dst) if f is not None else PartitionSpec() for f in plan.outputs),
        check_vma=False,
    )
    lowered.fn, lowered.mesh = jax.jit(in_mesh(mapped, jmesh)), jmesh
    return lowered


def _layouts(program, plan, state):
    """A value's layout as ``plan`` makes it (an input's: as ``state`` places it)."""

    def layout_of(v):
        val = program.values[v]
        if val.producer is not None:
            op = program.ops[val.producer]
            return as_layout(plan.ops[op.id].results[op.results.index(v)])
        if v in program.consts:
            return val.type_sharding()
        return as_layout(state.shardings[v])

    return layout_of


def _micro_mesh(mesh: Mesh, axis: str, M: int) -> Mesh:
    """The mesh a segment is interpreted on: the other axes of ``mesh``, then the
    microbatches (minor-most: a device's block of the batch splits into M)."""
    if MICROBATCH in mesh.names:
        raise InputError(
            f"the mesh {mesh} has an axis named {MICROBATCH!r}, the name the pipeline "
            "lowering gives its microbatches; rename that axis."
        )
    return Mesh({**{a: mesh.axis_size(a) for a in mesh.names if a != axis}, MICROBATCH: M})


def _micro_state(program, mb: Mesh, state: State) -> State:
    """``state`` with the batch tiled further over the microbatches (minor-most)."""
    from workbench.core.propagate.tactics import apply_tactic
    from workbench.core.strategies.data import BP

    if getattr(state, "pipeline", None) is not None:  # its stage axis is not on ``mb``
        state = replace(state, pipeline=None)
    return apply_tactic(program, mb, state, BP(MICROBATCH))


def without(layout, axis: str):
    """``layout`` with ``axis`` taken out of its tiles and pending reductions."""
    dims = tuple(tuple(a for a in axes if a != axis) for axes in layout.dims)
    return replace(layout, dims=dims, partial=tuple(p for p in layout.partial if p[0] != axis))


def _check_crossing(program, values, micro_of, real_of) -> None:
    """Each value moving between a segment and what runs once (an input, a value made
    before the pipeline, a sum over microbatches) has the same layout on the other axes in
    both, the microbatches its minor-most tile: a device's block is M microbatch blocks."""
    for v in values:
        m, r = micro_of(v), real_of(v)
        d = m.dim_of(MICROBATCH)
        if layout_key(without(m, MICROBATCH)) != layout_key(r) or (
            d is not None and m.dims[d][-1] != MICROBATCH
        ):
            val = program.values[v]
            raise TacticError(
                f"value {v} ({val.name or 'unnamed'}) is {r} in the step but {m} in one "
                "microbatch's pipeline stage: tiling the batch over the microbatches moved "
                "its layout on the other axes, so a stage cannot take its microbatch from "
                "the step's block. Tile the batch over the other axes as the pipeline does "
                "(BP), or pipeline this step alone."
            )


def _send(bufs: dict, axis: str, perm) -> dict:
    return {dt: lax.ppermute(b, axis, perm) for dt, b in bufs.items()}


def _check(program, mesh: Mesh, axis: str, cuts, schedule) -> tuple[int, int, int]:
    """(stages, microbatches, chunks per stage), checked against each other and the
    program's batch."""
    if not isinstance(mesh, Mesh) or axis not in mesh.names:
        names = list(mesh.names) if isinstance(mesh, Mesh) else None
        raise InputError(
            f"axis={given(axis)} is not an axis of the mesh {given(mesh)}; give the name of "
            f"the stages' axis, one of {names}."
        )
    S, C = mesh.axis_size(axis), schedule.virtual_stages
    if len(cuts.stages) != S * C or schedule.stages != S:
        each = f" of {C} model chunks each" if C > 1 else ""
        raise InputError(
            f"the pipeline over {axis!r} has {S} devices{each}, but the cuts have "
            f"{len(cuts.stages)} stages and the schedule {schedule.stages}; cut the step "
            f"into {S * C} stages (stage_cuts(program, {S * C})) and schedule {S} stages."
        )
    M = schedule.microbatches
    for v, d in program.anatomy().data:
        if d is not None and program.values[v].shape[d] % M:
            n = program.values[v].shape[d]
            ok = [k for k in range(1, n + 1) if n % k == 0]
            raise InputError(
                f"the batch of {n} examples (data input {v}, dim {d}) does not split into "
                f"{M} equal microbatches; give a number of microbatches dividing it: {ok}."
            )
    return S, M, C
