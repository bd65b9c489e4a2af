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
from workbench.core.lowering.interpret import Interpreter, literal
from workbench.core.lowering.local import bind_local
from workbench.core.lowering.steps import run_step
from workbench.core.plan.plan import Fetch, Plan


class _Explicit(Interpreter):
    """Interprets the program per device; ``env[v]`` maps layout keys to local arrays."""

    def __init__(self, program, mesh: Mesh, plan: Plan, state, extra=()):
        super().__init__(program, extra)
        self.mesh, self.plan, self.state = mesh, plan, state

    def extras(self, env):
        return [self.fetch(env, f, v) for f, v in zip(self.plan.probes, self.extra)]

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
        fetch = self.plan.outputs[slot] if op is None else self.plan.ops[op.id].fetches[slot]
        return self.fetch(env, fetch, v)

    def region_output(self, env, op, v, slot):
        return self.fetch(env, self.plan.ops[op.id].fetches[slot], v)

    def define(self, env, op, v, array, slot):
        layout = self.plan.ops[op.id].results[slot]
        env[v] = {layout_key(as_layout(layout)): array}

    def bind(self, op, args):
        p = self.plan.ops[op.id]
        return bind_local(op, args, list(p.operands), list(p.results), self.mesh, p)

    def start(self, flat_args):
        p = self.program
        env = {
            v: {layout_key(as_layout(self.state.shardings[v])): a}
            for v, a in zip(p.inputs, flat_args)
        }
        for v, array in p.consts.items():
            env[v] = {layout_key(p.values[v].type_sharding()): array}
        return env


def spec(sharding) -> PartitionSpec:
    return PartitionSpec(*sharding.spec())


def jax_mesh(mesh: Mesh, devices=None) -> jax.sharding.Mesh:
    """A ``jax.sharding.Mesh`` over ``devices`` (default: all attached), shaped like ``mesh``;
    a ``DeviceError`` saying what would work when they are not as many as it spans."""
    from workbench.core.lowering.arguments import check_devices

    check_devices(mesh, devices)
    devices = list(
        jax.devices() if devices is None else np.ravel(np.asarray(devices, dtype=object))
    )
    return jax.sharding.Mesh(np.asarray(devices, dtype=object).reshape(mesh.sizes), mesh.names)


def lower_explicit(program, mesh: Mesh, state, plan: Plan, devices=None, donate=(), probes=()):
    """A jitted function of the program's flat inputs, partitioned per the plan; ``donate``:
    indices of inputs whose buffers it may reuse (see ``jax.jit``'s ``donate_argnums``);
    ``probes``: the values of ``plan.probes``, returned after the outputs."""
    jmesh = jax_mesh(mesh, devices)
    interp = _Explicit(program, mesh, plan, state, probes)
    in_specs = tuple(spec(state.shardings[v]) for v in program.inputs)
    fetches = (*plan.outputs, *plan.probes)
    out_specs = tuple(spec(f.dst) if f is not None else PartitionSpec() for f in fetches)

    def per_device(*flat):
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
