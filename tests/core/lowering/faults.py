"""Faults of a stated size injected into partitioned programs, for the verdict to catch.

Each fault patches the explicit lowering (or the step that runs it) for one run and counts
where it struck, so a test can tell a fault that was caught from one that never happened.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from workbench.core.lowering import explicit, run
from workbench.core.ops.local import shard_index


@dataclass
class Fault:
    """A fault, its size in words, and what it struck: names of the outputs it must show in."""

    name: str
    size: str
    struck: list = field(default_factory=list)
    outputs: set = field(default_factory=set)  # output positions the fault reaches


def _patched_steps(monkeypatch, fault: Fault, change):
    """Replace the first redistribution step ``change`` accepts by what it returns."""
    original = explicit.run_step

    def step(x, s, mesh, again=False):
        if not fault.struck:
            out = change(x, s, mesh, again, original)
            if out is not None:
                fault.struck.append(s)
                return out
        return original(x, s, mesh, again)

    monkeypatch.setattr(explicit, "run_step", step)


def dropped_all_reduce(monkeypatch) -> Fault:
    fault = Fault("dropped all-reduce", "the sum of one shard instead of all")

    def change(x, s, mesh, again, original):
        return x if s.kind == "all-reduce" else None

    _patched_steps(monkeypatch, fault, change)
    return fault


def doubled_all_reduce(monkeypatch) -> Fault:
    fault = Fault("doubled all-reduce", "a sum taken twice: n times the value")

    def change(x, s, mesh, again, original):
        if s.kind == "all-reduce" and s.reduction == "sum":
            return original(original(x, s, mesh, again), s, mesh, again)
        return None

    _patched_steps(monkeypatch, fault, change)
    return fault


def shards_out_of_order(monkeypatch) -> Fault:
    fault = Fault("shards out of order", "blocks gathered or sliced in reversed order")

    def change(x, s, mesh, again, original):
        n = int(np.prod([mesh.axis_size(a) for a in s.axes]))
        if s.kind == "all-gather":
            blocks = jnp.split(original(x, s, mesh, again), n, axis=s.dim)
            return jnp.concatenate(blocks[::-1], axis=s.dim)
        if s.kind == "slice":
            new = s.after.local_shape(mesh)[s.dim]
            index = n - 1 - shard_index(s.axes, mesh)
            return lax.dynamic_slice_in_dim(x, index * new, new, axis=s.dim)
        return None

    _patched_steps(monkeypatch, fault, change)
    return fault


def one_axis_unreduced(monkeypatch) -> Fault:
    fault = Fault("a reduction missing over one axis", "a sum over two axes taken over one")

    def change(x, s, mesh, again, original):
        if s.kind == "all-reduce" and s.reduction == "sum" and len(s.axes) >= 2:
            return lax.psum(x, s.axes[0])
        return None

    _patched_steps(monkeypatch, fault, change)
    return fault


def stale_parameter(monkeypatch, program) -> Fault:
    """The updated parameter that moves most comes out as it went in: its update is lost.
    (A step whose learning rate is zero moves none: then the fault strikes nothing.)"""
    fault = Fault("stale parameter", "an update lost: the step's size")
    pairs = [
        (program.outputs.index(out), program.inputs.index(param))
        for param, out in program.anatomy().new_params.items()
        if out in program.outputs
    ]
    original = run.TrainingStep.__call__

    def call(self, *, keep=False):
        before = {i: np.asarray(self.inputs[i]) for _, i in pairs}  # donated below
        outputs = list(original(self, keep=keep))
        if not fault.struck:
            moved = {j: np.abs(np.asarray(outputs[j]) - before[i]).max() for j, i in pairs}
            j = max(moved, key=moved.get)
            if moved[j] > 0:
                i = dict(pairs)[j]
                outputs[j] = jax.device_put(before[i], self.shardings[i])
                fault.struck.append(program.output_names[j])
                fault.outputs.add(j)
        return outputs

    monkeypatch.setattr(run.TrainingStep, "__call__", call)
    return fault


def one_shard_gradient_off(monkeypatch, program, mesh, factor=1.01) -> Fault:
    """One device's local gradient of the first updated parameter is off by 1%."""
    fault = Fault("one shard's gradient off by 1%", "1% of one shard's gradient")
    anatomy = program.anatomy()
    param = next(
        p
        for p in anatomy.new_params
        if anatomy.gradients.get(p) is not None
        and program.values[anatomy.gradients[p]].region_of is None
    )
    grad = anatomy.gradients[param]
    fault.outputs = {
        program.outputs.index(o)
        for o in (anatomy.new_params[param], *anatomy.updates.get(param, ()))
        if o in program.outputs
    }
    original = explicit._Explicit.define

    def define(self, env, op, v, array, slot):
        if v == grad and jnp.issubdtype(array.dtype, jnp.floating):
            first = jnp.ones((), bool)
            for axis in mesh.names:
                first = first & (lax.axis_index(axis) == 0)
            array = array * jnp.where(first, jnp.asarray(factor, array.dtype), 1)
            fault.struck.append(program.values[v].name)
        return original(self, env, op, v, array, slot)

    monkeypatch.setattr(explicit._Explicit, "define", define)
    return fault


@contextlib.contextmanager
def nothing():
    yield
