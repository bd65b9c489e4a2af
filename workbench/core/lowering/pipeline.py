"""The pipeline lowering: a captured training step run as a pipeline over one mesh axis.

``lower_pipeline(program, mesh, axis, cuts, schedule)`` cuts the differentiated step into
per-stage segments (`pipeline_segments`), unrolls the schedule's table into ticks, and
builds one ``shard_map`` program: in each tick every device along ``axis`` runs its stage's
work item (``lax.switch`` on its index), then ``ppermute`` moves the activations sent to the
next stage and the cotangents sent to the previous one. A segment runs at one
microbatch's local shapes, interpreted like the explicit lowering with the microbatches as
a mesh axis walked in time. What a stage keeps between its passes lives in slots reused
once a microbatch is done (GPipe holds M in flight, 1F1B at most S). Sums over the batch
accumulate over microbatches; the update then runs once, as unpartitioned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec

from workbench.core.dtypes import is_extended
from workbench.core.errors import InputError, TacticError, given
from workbench.core.ir.program import Lit
from workbench.core.layout.mesh import Mesh
from workbench.core.layout.redistribute import as_layout, layout_key
from workbench.core.layout.state import State
from workbench.core.lowering.explicit import _Explicit, in_mesh, jax_mesh
from workbench.core.lowering.interpret import Interpreter, literal
from workbench.core.lowering.pipeline_segments import Parts, reads_of, split_parts, ticks
from workbench.core.plan.plan import build_plan

#: The mesh axis the microbatches form while a segment is interpreted (walked in time).
MICROBATCH = "microbatch"
POOLS = ("fin", "saved", "bin", "wsaved")


@dataclass
class LoweredPipeline:
    """A pipelined step: call it with the program's flat inputs. ``ticks``: the unrolled
    schedule; ``emitted[s]``: the work items stage s's code runs, in order (filled when
    traced); ``slots``: how many buffers each pool holds per device."""

    fn: object
    mesh: jax.sharding.Mesh
    ticks: tuple
    slots: dict
    parts: Parts
    emitted: list = field(default_factory=list)

    def __call__(self, *flat):
        return self.fn(*flat)


class _Micro(_Explicit):
    """The explicit interpreter on the microbatch mesh, at microbatch ``m`` (static)."""

    def __init__(self, program, mesh, plan, state):
        super().__init__(program, mesh, plan, state)
        self.m, self.op = 0, None

    def read(self, env, v, op, slot):
        self.op = op
        return super().read(env, v, op, slot)

    def fetch(self, env, fetch, v):
        if isinstance(v, Lit):
            return literal(v)
        versions = env[v]
        x = versions[layout_key(fetch.src)]
        for step in fetch.steps:
            x = self.step(x, step)
        versions = dict(versions)
        versions[layout_key(fetch.dst)] = x
        env[v] = versions
        return x

    def step(self, x, step):
        if is_extended(x.dtype):
            impl = jax.random.key_impl(x)
            return jax.random.wrap_key_data(self.step(jax.random.key_data(x), step), impl=impl)
        if step.kind == "slice":
            n = step.after.local_shape(self.mesh)[step.dim]
            return lax.slice_in_dim(x, self.m * n, (self.m + 1) * n, axis=step.dim)
        if step.kind == "mask":
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
    the microbatches (anything but taking one microbatch's block)."""
    for ids in parts.segments.values():
        for op in program.walk(ids):
            for f in plan.ops[op.id].fetches:
                for step in f.steps if f is not None else ():
                    if step.kind not in ("slice", "mask"):
                        raise _coupled(program, op, step)


def localize(x, layout, m: int, mesh: Mesh):
    """Microbatch ``m``'s local block of the global array ``x`` laid out as ``layout``."""
    d = layout.dim_of(MICROBATCH)
    if d is not None:
        n = layout.local_shape(mesh)[d]
        return lax.slice_in_dim(x, m * n, (m + 1) * n, axis=d)
    if layout.reduction_of(MICROBATCH) == "sum" and m > 0:
        return jnp.zeros_like(x)
    return x


class _Pack:
    """Values packed into one flat buffer per dtype (``sizes``: elements per dtype)."""

    def __init__(self, values, layouts, mesh):
        self.values, self.where, self.sizes = tuple(values), {}, {}
        for v in self.values:
            layout = layouts(v)
            if is_extended(layout.dtype):
                raise InputError(
                    f"value {v} {layout} (a PRNG key) would cross pipeline stages; the "
                    "pipeline lowering moves arrays of numbers only: derive keys per stage."
                )
            shape, dt = layout.local_shape(mesh), str(layout.dtype)
            n = 1
            for k in shape:
                n *= k
            self.where[v] = (dt, self.sizes.get(dt, 0), shape, layout.dtype)
            self.sizes[dt] = self.sizes.get(dt, 0) + n

    def pack(self, arrays: dict, into: dict) -> dict:
        out = dict(into)
        for v in self.values:
            dt, off, _, _ = self.where[v]
            out[dt] = lax.dynamic_update_slice(out[dt], jnp.ravel(arrays[v]), (off,))
        return out

    def unpack(self, bufs: dict) -> dict:
        out = {}
        for v in self.values:
            dt, off, shape, _ = self.where[v]
            n = 1
            for k in shape:
                n *= k
            out[v] = lax.slice(bufs[dt], (off,), (off + n,)).reshape(shape)
        return out

    def add(self, arrays: dict, into: dict) -> dict:
        out = dict(into)
        for v, a in arrays.items():
            dt, off, _, _ = self.where[v]
            n = a.size
            cur = lax.slice(out[dt], (off,), (off + n,))
            out[dt] = lax.dynamic_update_slice(out[dt], cur + jnp.ravel(a), (off,))
        return out


def _zeros(packs) -> dict:
    sizes, dtypes = {}, {}
    for p in packs:
        for dt, _, _, dtype in p.where.values():
            dtypes[dt] = dtype
        for dt, n in p.sizes.items():
            sizes[dt] = max(sizes.get(dt, 0), n)
    return {dt: jnp.zeros((n,), dtypes[dt]) for dt, n in sizes.items()}


def _slots(grid, S: int, split: bool) -> tuple[dict, dict]:
    """Static slot numbers per (pool, stage, microbatch), reusing freed ones; and per pool
    the most any stage uses."""
    free = {(p, s): [] for p in POOLS for s in range(S)}
    count = {(p, s): 0 for p in POOLS for s in range(S)}
    slot = {}

    def take(p, s, m):
        if free[p, s]:
            k = free[p, s].pop(0)
        else:
            k, count[p, s] = count[p, s], count[p, s] + 1
        slot[p, s, m] = k

    def give(p, s, m):
        free[p, s].append(slot[p, s, m])
        free[p, s].sort()

    for tick in grid:
        for s in range(S):
            for pool, m in tick.stores[s]:
                take(pool, s, m)
            w = tick.work[s]
            if w is None:
                continue
            m = w.microbatch
            if w.kind == "F":
                if s > 0:
                    give("fin", s, m)
                take("saved", s, m)
            elif w.kind == "B":
                if s < S - 1:
                    give("bin", s, m)
                if split:
                    take("wsaved", s, m)
                else:
                    give("saved", s, m)
            else:
                give("saved", s, m)
                give("wsaved", s, m)
    return slot, {p: max(count[p, s] for s in range(S)) for p in POOLS}


def lower_pipeline(program, mesh: Mesh, axis: str, cuts, schedule, devices=None):
    """A jitted function of ``program``'s flat inputs (global arrays) computing its outputs
    as a pipeline over ``axis`` of ``mesh``: stage s of ``cuts`` (`anatomy.stages.stage_cuts`)
    on the devices at index s of ``axis``, in the order ``schedule`` (`plan.schedule`) gives.
    The other axes of ``mesh`` run the same (replicated). Returns a `LoweredPipeline`."""
    S, M = _check(program, mesh, axis, cuts, schedule)
    mb = Mesh({MICROBATCH: M})
    from workbench.core.propagate.tactics import apply_tactic
    from workbench.core.strategies.data import BP

    state = apply_tactic(program, mb, State.initial(program), BP(MICROBATCH))
    plan = build_plan(program, mb, state)
    parts = split_parts(program, cuts, state, MICROBATCH, schedule.split_backward)
    _check_coupling(program, plan, parts)
    grid = ticks(schedule)
    slot, nslots = _slots(grid, S, schedule.split_backward)
    interp = _Micro(program, mb, plan, state)

    def layout_of(v):
        val = program.values[v]
        if val.producer is not None:
            op = program.ops[val.producer]
            return as_layout(plan.ops[op.id].results[op.results.index(v)])
        if v in program.consts:
            return val.type_sharding()
        return as_layout(state.shardings[v])

    def pack(vs):
        return _Pack(vs, layout_of, mb)

    fin = [pack(parts.fwd[s - 1]) if s else pack(()) for s in range(S)]
    bin_ = [pack(parts.bwd[s]) if s < S - 1 else pack(()) for s in range(S)]
    saved = [pack(parts.saved[s]) for s in range(S)]
    wsaved = [pack(parts.wsaved[s]) for s in range(S)]
    acc = [pack(parts.accumulated.get(s, ())) for s in range(S)]
    packs = {"fin": fin, "saved": saved, "bin": bin_, "wsaved": wsaved}
    lowered = LoweredPipeline(None, None, grid, nslots, parts)
    reads = {key: reads_of(program, ids) for key, ids in parts.segments.items()}

    def run_work(st, s, w, genv):
        m, kind = w.microbatch, w.kind
        env = {}
        for v in reads[s, kind]:
            if v in genv:
                env[v] = {layout_key(layout_of(v)): localize(genv[v], layout_of(v), m, mb)}

        def load(pool, p):
            for v, a in p.unpack(st[pool][slot[pool, s, m]]).items():
                env[v] = {layout_key(layout_of(v)): a}

        def get(vs):
            return {v: env[v][layout_key(layout_of(v))] for v in vs}

        if kind == "F" and s > 0:
            load("fin", fin[s])
        if kind in "BW":
            load("saved", saved[s])
        if kind == "B" and s < S - 1:
            load("bin", bin_[s])
        if kind == "W":
            load("wsaved", wsaved[s])
        interp.m = m
        interp.run(env, parts.segments[s, kind])
        st = {k: (list(b) if isinstance(b, list) else b) for k, b in st.items()}
        if kind == "F":
            k = slot["saved", s, m]
            st["saved"][k] = saved[s].pack(get(saved[s].values), st["saved"][k])
            if s < S - 1:
                st["out_f"] = fin[s + 1].pack(get(fin[s + 1].values), st["out_f"])
        if kind == "B":
            if s > 0:
                st["out_b"] = bin_[s - 1].pack(get(bin_[s - 1].values), st["out_b"])
            if schedule.split_backward:
                k = slot["wsaved", s, m]
                st["wsaved"][k] = wsaved[s].pack(get(wsaved[s].values), st["wsaved"][k])
        made = [v for v in acc[s].values if parts.home[v] == (s, kind)]
        st["acc"] = acc[s].add(get(made), st["acc"])
        return st

    def branch(s, tick, genv):
        def run(st):
            st = {k: (list(b) if isinstance(b, list) else b) for k, b in st.items()}
            for pool, m in tick.stores[s]:
                st[pool][slot[pool, s, m]] = st["in_f" if pool == "fin" else "in_b"]
            w = tick.work[s]
            if w is not None:
                lowered.emitted[s].append(w)
                st = run_work(st, s, w, genv)
            return st

        return run

    def per_device(*flat):
        lowered.emitted[:] = [[] for _ in range(S)]
        genv = dict(zip(program.inputs, flat))
        genv.update(program.consts)
        Interpreter(program).run(genv, parts.pre)
        st = {p: [_zeros(packs[p])] * nslots[p] for p in POOLS}
        st["acc"] = _zeros(acc)
        st["out_f"] = st["in_f"] = _zeros(fin)
        st["out_b"] = st["in_b"] = _zeros(bin_)
        index = lax.axis_index(axis)
        for tick in grid:
            busy = [tick.work[s] is not None or tick.stores[s] for s in range(S)]
            if any(busy):
                st = lax.switch(index, [branch(s, tick, genv) for s in range(S)], st)
            if any(w is not None and w.kind == "F" for w in tick.work[: S - 1]):
                st["in_f"] = _send(st["out_f"], axis, [(s, s + 1) for s in range(S - 1)])
            if any(w is not None and w.kind == "B" for w in tick.work[1:]):
                st["in_b"] = _send(st["out_b"], axis, [(s + 1, s) for s in range(S - 1)])
        gathered = {dt: lax.all_gather(b, axis) for dt, b in st["acc"].items()}
        for s in range(S):
            genv.update(acc[s].unpack({dt: g[s] for dt, g in gathered.items()}))
        Interpreter(program).run(genv, parts.post)
        return tuple(literal(v) if isinstance(v, Lit) else genv[v] for v in program.outputs)

    if devices is None:  # the first devices the mesh spans
        devices = jax.devices()[: math.prod(mesh.sizes)]
    jmesh = jax_mesh(mesh, devices)
    mapped = jax.shard_map(
        per_device,
        mesh=jmesh,
        in_specs=tuple(PartitionSpec() for _ in program.inputs),
        out_specs=tuple(PartitionSpec() for _ in program.outputs),
        check_vma=False,
    )
    lowered.fn, lowered.mesh = jax.jit(in_mesh(mapped, jmesh)), jmesh
    return lowered


def _send(bufs: dict, axis: str, perm) -> dict:
    return {dt: lax.ppermute(b, axis, perm) for dt, b in bufs.items()}


def _check(program, mesh: Mesh, axis: str, cuts, schedule) -> tuple[int, int]:
    """(stages, microbatches), checked against each other and the program's batch."""
    if not isinstance(mesh, Mesh) or axis not in mesh.names:
        names = list(mesh.names) if isinstance(mesh, Mesh) else None
        raise InputError(
            f"axis={given(axis)} is not an axis of the mesh {given(mesh)}; give the name of "
            f"the stages' axis, one of {names}."
        )
    S = mesh.axis_size(axis)
    if len(cuts.stages) != S or schedule.stages != S:
        raise InputError(
            f"the pipeline over {axis!r} has {S} devices, but the cuts have "
            f"{len(cuts.stages)} stages and the schedule {schedule.stages}; cut the step "
            f"into {S} stages (stage_cuts(program, {S})) and schedule {S} stages."
        )
    if schedule.virtual_stages != 1:
        raise InputError(
            f"the pipeline lowering runs one model chunk per stage; the {schedule.kind!r} "
            f"schedule has virtual_stages={schedule.virtual_stages}. Use 'gpipe', '1f1b' "
            "or 'zero-bubble'."
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
    return S, M
