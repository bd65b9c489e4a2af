"""A step written in JAX's explicit sharding mode, as JAX's explicit-sharding tutorial writes
one: a mesh of Explicit axes set as the context mesh, parameters and batch placed with
``device_put``, an ``einsum`` with ``out_sharding=``, a ``reshard`` inside the step. The plan
is read from the types; runs and the explicit-mode export work inside and outside the
context mesh."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, reshard
from jax.sharding import PartitionSpec as P

import workbench as wb
from workbench.core import ops
from workbench.core.errors import InputError
from workbench.core.io.export_jax import export_jax
from workbench.core.io.imports import explicit_spec, typed_values

AXES = ("batch", "model")
PLACES = {"w1": P(None, "model"), "w2": P("model", None)}


def loss(params, x, y):
    h = jnp.einsum("bd,dh->bh", x, params["w1"], out_sharding=P("batch", "model"))
    h = jax.nn.relu(h)
    h = reshard(h, P("batch", None))  # gathered on model before the second layer
    out = jnp.dot(h, params["w2"])
    return jnp.mean((out - y) ** 2)


def train_step(params, x, y):
    value, grads = jax.value_and_grad(loss)(params, x, y)
    return value, jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


def host_arrays(seed=0):
    rng = np.random.default_rng(seed)
    params = {
        "w1": rng.normal(size=(16, 32)).astype(np.float32),
        "w2": rng.normal(size=(32, 8)).astype(np.float32),
    }
    return (
        params,
        rng.normal(size=(8, 16)).astype(np.float32),
        rng.normal(size=(8, 8)).astype(np.float32),
    )


def explicit_mesh():
    return jax.make_mesh((4, 2), AXES, axis_types=(AxisType.Explicit,) * 2)


def placed(mesh, seed=0):
    params, x, y = host_arrays(seed)
    with jax.set_mesh(mesh):
        return (
            jax.device_put(params, PLACES),
            jax.device_put(x, P("batch", None)),
            jax.device_put(y, P("batch", None)),
        )


def session(mesh, inside=True):
    args = placed(mesh)
    if not inside:  # the arguments' mesh is entered for tracing
        return wb.Session.from_jax(train_step, *args, mesh=mesh)
    with jax.set_mesh(mesh):
        assert str(jax.typeof(args[1])) == "float32[8@batch,16]"
        return wb.Session.from_jax(train_step, *args, mesh=mesh)


def type_specs(s):
    """Per value the types place, the axes per dim they name."""
    return {v: explicit_spec(aval.sharding) for v, aval in typed_values_of(s)}


def typed_values_of(s):
    return typed_values(s.program)


def test_reshard_has_a_record_an_identity_whose_target_the_import_reads():
    rec = ops.record(jax.sharding.reshard.__name__)
    assert rec is not None and rec.barrier is None
    assert rec.traits.constraint and rec.traits.transparent


def test_from_jax_reads_the_plan_the_types_hold():
    mesh = explicit_mesh()
    s = session(mesh)
    assert [str(t) for t in s.history] == [
        f"Imported('sharding types', {len(s.history[0].tiles)} tiles)"
    ]
    program, state = s.program, s.state
    specs = type_specs(s)
    # every tile a type holds is in the plan, and nothing conflicts
    for v, spec in specs.items():
        have = state.shardings[v].dims
        for d, axes in enumerate(spec):
            assert tuple(have[d])[: len(axes)] == axes, program.values[v].name
    assert not state.conflicts
    # the arguments and what the step returns are exactly as their types say
    ends = (*program.inputs, *(v for v in program.outputs if isinstance(v, int)))
    for v in ends:
        assert tuple(map(tuple, state.shardings[v].dims)) == specs[v], program.values[v].name
    by_name = {program.values[v].name: state.shardings[v].dims for v in program.inputs}
    assert tuple(map(tuple, by_name["x"])) == (("batch",), ())
    assert tuple(map(tuple, by_name["params/w1"])) == ((), ("model",))
    # the einsum's out_sharding holds: its result is tiled on both axes
    first = next(op for op in program.walk() if ops.traits(op.primitive).contraction)
    assert tuple(map(tuple, state.shardings[first.results[0]].dims)) == (("batch",), ("model",))
    # outside the context mesh the same plan is read (the arguments' mesh is entered)
    again = session(mesh, inside=False)
    assert again.history == s.history


@pytest.mark.slow
@pytest.mark.parametrize("lowering", ["explicit", "constrained"])
def test_runs_agree_inside_and_outside_the_context_mesh(lowering):
    mesh = explicit_mesh()
    s = session(mesh)
    args = host_arrays(1)
    with jax.set_mesh(mesh):
        inside = s.run(lowering=lowering, args=args, repeats=1)
    outside = s.run(lowering=lowering, args=args, repeats=1)
    assert inside.matches and outside.matches
    for a, b in zip(jax.tree.leaves(inside.outputs), jax.tree.leaves(outside.outputs)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


def load(code: str):
    module = types.ModuleType("exported")
    exec(compile(code, "exported.py", "exec"), module.__dict__)
    return module


@pytest.mark.slow
def test_the_explicit_export_runs_and_computes_the_step():
    mesh = explicit_mesh()
    s = session(mesh)
    code = export_jax(s, mode="explicit")
    assert "AxisType.Explicit" in code and "jax.sharding.reshard" in code
    module = load(code)
    params, x, y = host_arrays(2)
    out = module.partitioned(train_step, module.make_mesh())(params, x, y)
    with jax.set_mesh(mesh):
        expected = jax.jit(train_step)(*placed(mesh, 2))
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # the outputs leave in the plan's shardings, in their types
    assert str(jax.typeof(out[1]["w1"])) == "float32[16,32@model]"
    assert str(jax.typeof(out[1]["w2"])) == "float32[32@model,8]"


@pytest.mark.slow
def test_an_auto_plan_exports_in_explicit_mode():
    params, x, _ = host_arrays(3)

    def step(p, x):
        value, g = jax.value_and_grad(lambda p: jnp.mean(jnp.tanh(x @ p["w1"]) @ p["w2"]))(p)
        return value, jax.tree.map(lambda a, b: a - 0.1 * b, p, g)

    plan = [wb.BP("batch"), wb.Tile("p/w1", 1, "model"), wb.Tile("p/w2", 0, "model")]
    s = wb.Session(wb.capture(step, params, x), wb.Mesh(dict(zip(AXES, (4, 2)))), plan)
    module = load(export_jax(s, mode="explicit"))
    out = module.partitioned(step)(params, x)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(jax.jit(step)(params, x))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_the_default_export_is_unchanged_and_a_bad_mode_is_refused():
    s = session(explicit_mesh())
    assert export_jax(s) == export_jax(s, mode="constrained")
    assert "AxisType" not in export_jax(s)
    with pytest.raises(InputError, match="mode 'shardy'"):
        export_jax(s, mode="shardy")


def test_a_context_mesh_of_explicit_axes_does_not_break_the_lowerings():
    """A step written for the compiler's propagation, lowered while the user's explicit mesh
    is the context: both lowerings trace and compile on our own mesh."""
    params, x, _ = host_arrays(4)

    def f(p, x):
        return jnp.tanh(x @ p["w1"]) @ p["w2"]

    s = wb.Session(wb.capture(f, params, x), wb.Mesh(dict(zip(AXES, (4, 2)))), [wb.BP("batch")])
    flat = jax.tree.leaves((params, x))
    with jax.set_mesh(explicit_mesh()):
        for kind in ("explicit", "constrained"):
            fn, jmesh = s.lower(kind)
            shardings = [
                NamedSharding(jmesh, P(*s.state.shardings[v].spec())) for v in s.program.inputs
            ]
            out = fn(*[jax.device_put(a, sh) for a, sh in zip(flat, shardings)])
            np.testing.assert_allclose(np.asarray(out[0]), np.asarray(f(params, x)), rtol=1e-5)
