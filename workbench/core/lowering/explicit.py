"""Explicit SPMD lowering (PartIR's own): a per-device program under ``jax.shard_map``.

The workbench inserts every collective itself, exactly as the execution plan says: each
operand is fetched into the layout its op runs in (from the layout already materialised
that costs least), the op runs on local shards, and outputs leave in their decided
layouts. What the simulator prices is what runs.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.sharding import PartitionSpec

from workbench.core.ir.program import Lit
from workbench.core.layout.mesh import Mesh
from workbench.core.layout.redistribute import as_layout, layout_key
from workbench.core.lowering import reductions, ring_pairs
from workbench.core.lowering import ring as rings
from workbench.core.lowering.arguments import check_devices
from workbench.core.lowering.interpret import Interpreter, literal
from workbench.core.lowering.local import bind_local
from workbench.core.lowering.steps import into_balance, out_of_balance, run_step
from workbench.core.ops.local import balanced
from workbench.core.plan.plan import Fetch, Plan
from workbench.core.plan.zigzag import held


class _Explicit(Interpreter):
    """Interprets the program per device; ``env[v]`` maps layout keys to local arrays."""

    def __init__(self, program, mesh: Mesh, plan: Plan, state, extra=()):
        super().__init__(program, extra)
        self.mesh, self.plan, self.state = mesh, plan, state
        self.saved = {}  # a ring attention's context op -> its (output, log-sum-exp)

    def run(self, env, op_ids) -> None:
        if not self.plan.skipped:
            return super().run(env, op_ids)
        for o in op_ids:
            ring = self.plan.rings.get(o)
            if ring is not None:
                self.ring(env, ring)
            elif o not in self.plan.skipped:
                super().run(env, (o,))

    def ring(self, env, ring) -> None:
        """One pass of a ring attention (``lowering/ring.py``) in place of its ops."""
        arrays = {
            v: self.fetch(env, f, v) for (v, _), f in zip(ring.reads, ring.fetches, strict=True)
        }
        kept = ring.region.forward.context  # its output and log-sum-exp, forward to backward
        way = rings if self.plan.zigzag is None else ring_pairs  # balanced: by chunk pairs
        if ring.kind == "forward":
            self.saved[kept] = way.forward(self.program, ring, self.mesh, arrays)
            made = self.saved[kept][:1]
        elif ring.kind == "replay":  # a recomputation's output: the forward's, kept
            made = [rings.replayed(*self.saved[kept])]
        else:
            made = way.backward(self.program, ring, self.mesh, arrays, *self.saved[kept])
        for (v, layout), array in zip(ring.makes, made, strict=True):
            env[v] = {layout_key(as_layout(layout)): array}

    def extras(self, env):
        return [
            self.ordered(self.fetch(env, f, v), f) for f, v in zip(self.plan.probes, self.extra)
        ]

    def ordered(self, x, fetch: Fetch | None):
        """An output's block back in order where the plan balanced its sequence."""
        d = None if fetch is None else held(fetch.dst, self.plan.zigzag)
        return x if d is None else out_of_balance(x, d, self.plan.zigzag)

    def fetch(self, env, fetch: Fetch | None, v):
        if isinstance(v, Lit):
            return literal(v)
        versions = env[v]
        x = versions[layout_key(fetch.src)]
        for step in fetch.steps:
            x = run_step(x, step, self.mesh, again=fetch.copy > 0)
        versions = dict(versions)
        versions[layout_key(fetch.dst)] = x
        env[v] = versions
        return x

    def read(self, env, v, op, slot):
        if op is None:
            fetch = self.plan.outputs[slot]
            return self.ordered(self.fetch(env, fetch, v), fetch)
        return self.fetch(env, self.plan.ops[op.id].fetches[slot], v)

    def region_output(self, env, op, v, slot):
        return self.fetch(env, self.plan.ops[op.id].fetches[slot], v)

    def define(self, env, op, v, array, slot):
        layout = self.plan.ops[op.id].results[slot]
        env[v] = {layout_key(as_layout(layout)): array}

    def bind(self, op, args):
        p = self.plan.ops[op.id]
        return bind_local(op, args, list(p.operands), list(p.results), self.mesh, p)

    def start(self, flat_args):
        p, z = self.program, self.plan.zigzag
        env = {}
        for v, a in zip(p.inputs, flat_args):
            layout = as_layout(self.state.shardings[v])
            d = held(layout, z)
            env[v] = {layout_key(layout): a if d is None else into_balance(a, d, z)}
        for v, array in p.consts.items():
            env[v] = {layout_key(p.values[v].type_sharding()): array}
        return env


def spec(sharding, jmesh: jax.sharding.Mesh | None = None) -> PartitionSpec:
    """``sharding``'s PartitionSpec; over ``jmesh`` split by level (`reductions.split_mesh`),
    each axis named by its parts, outermost first."""
    entries = sharding.spec()
    if jmesh is None:
        return PartitionSpec(*entries)
    parts = reductions.parts_of(jmesh)
    if not parts:
        return PartitionSpec(*entries)

    def named(entry):
        if entry is None:
            return None
        axes = (entry,) if isinstance(entry, str) else entry
        names = tuple(n for a in axes for n in parts.get(a, (a,)))
        return names[0] if len(names) == 1 else names

    return PartitionSpec(*(named(e) for e in entries))


def jax_mesh(mesh: Mesh, devices=None, placement=None) -> jax.sharding.Mesh:
    """A ``jax.sharding.Mesh`` over ``devices`` (default: all attached), shaped like ``mesh``:
    in their order, or with ``placement`` (a state's, ``State.placement``) the device at each
    position ``devices[placement.device_ids(mesh)[position]]``; a ``DeviceError`` saying what
    would work when they are not as many as it spans."""
    check_devices(mesh, devices)
    devices = np.asarray(
        list(jax.devices() if devices is None else np.ravel(np.asarray(devices, dtype=object))),
        dtype=object,
    )
    grid = devices.reshape(mesh.sizes) if placement is None else devices[placement.device_ids(mesh)]
    return jax.sharding.Mesh(grid, mesh.names)


def lower_explicit(
    program,
    mesh: Mesh,
    state,
    plan: Plan,
    devices=None,
    donate=(),
    probes=(),
    hardware=None,
):
    """A jitted function of the program's flat inputs, partitioned per the plan; ``donate``:
    indices of inputs whose buffers it may reuse (see ``jax.jit``'s ``donate_argnums``);
    ``probes``: the values of ``plan.probes``, returned after the outputs. With
    ``hardware`` (a `Hardware` whose levels a placement splits the mesh over: the state's,
    else its own, else the mesh order's), the mesh's axes are split by level and each sum
    over a group spanning levels runs as the program the simulator prices it as
    (`reductions.synthesising`)."""
    placed = reductions.lowered_on(mesh, state, hardware)
    if placed is None:
        jmesh = jax_mesh(mesh, devices, state.placement)
    else:
        check_devices(mesh, devices)
        jmesh = reductions.split_mesh(mesh, placed.placement, devices)
    interp = _Explicit(program, mesh, plan, state, probes)
    in_specs = tuple(spec(state.shardings[v], jmesh) for v in program.inputs)
    fetches = (*plan.outputs, *plan.probes)
    out_specs = tuple(spec(f.dst, jmesh) if f is not None else PartitionSpec() for f in fetches)

    def per_device(*flat):
        with balanced(plan.zigzag):
            if placed is None:
                return tuple(interp(*flat))
            with reductions.synthesising(mesh, placed):
                return tuple(interp(*flat))

    mapped = jax.shard_map(
        per_device, mesh=jmesh, in_specs=in_specs, out_specs=out_specs, check_vma=False
    )
    return jax.jit(in_mesh(mapped, jmesh), donate_argnums=tuple(donate)), jmesh


def in_mesh(fn, jmesh: jax.sharding.Mesh):
    """``fn`` traced with ``jmesh`` as the context mesh, whatever mesh the caller set (a
    user of JAX's explicit sharding sets one with ``jax.set_mesh``): our lowerings place
    everything on ``jmesh`` themselves, and JAX checks ops against the context mesh."""

    @functools.wraps(fn)
    def traced(*args):
        with jax.sharding.use_abstract_mesh(jmesh.abstract_mesh):
            return fn(*args)

    return traced
