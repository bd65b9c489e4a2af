"""A step written in JAX's explicit sharding mode, as JAX's explicit-sharding tutorial writes
one: a mesh of Explicit axes set as the context mesh, parameters and batch placed with
``device_put``, an ``einsum`` with ``out_sharding=``, a ``reshard`` inside the step. The plan
is read from the types; runs and the explicit-mode export work inside and outside the
context mesh."""

from __future__ import annotations

import types
from collections import Counter

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
from workbench.core.xla.crosscheck import crosscheck, executed_by_axes
from workbench.core.xla.hlo import normalize_cpu, parse_collectives

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


def dims(sharding) -> tuple:
    return tuple(map(tuple, sharding.dims))


def test_from_jax_reads_the_plan_the_types_hold():
    mesh = explicit_mesh()
    s = session(mesh)
    (imported,) = s.history
    held = sum(len(names) for names, _ in imported.whole)
    assert str(imported) == (
        f"Imported('sharding types', {len(imported.tiles)} tiles, {held} held whole)"
    )
    program, state = s.program, s.state
    specs = type_specs(s)
    assert len(specs) == len(program.values)  # every value of this step has a type
    # every typed value is exactly as its type says on the Explicit axes, not only the ends
    for v, spec in specs.items():
        assert dims(state.shardings[v]) == spec, program.values[v].name
    assert not state.conflicts
    by_name = {program.values[v].name: state.shardings[v].dims for v in program.inputs}
    assert tuple(map(tuple, by_name["x"])) == (("batch",), ())
    assert tuple(map(tuple, by_name["params/w1"])) == ((), ("model",))
    # the einsum's out_sharding holds: its result is tiled on both axes
    first = next(op for op in program.walk() if ops.traits(op.primitive).contraction)
    assert dims(state.shardings[first.results[0]]) == (("batch",), ("model",))
    # outside the context mesh the same plan is read (the arguments' mesh is entered)
    again = session(mesh, inside=False)
    assert again.history == s.history


def test_what_the_types_leave_whole_stays_whole():
    """After ``reshard(h, P('batch', None))`` the value and the backward dot its type makes
    whole on model are whole there; the tiles alone would let propagation tile them."""
    mesh = explicit_mesh()
    s = session(mesh)
    program, specs = s.program, type_specs(s)
    resharded = [
        op.results[0]
        for op in program.walk()
        if ops.traits(op.primitive).constraint and specs[op.results[0]] == (("batch",), ())
    ]
    assert resharded  # the forward reshard to P('batch', None)
    tiles_only = wb.Session(program, s.mesh, [wb.Imported("sharding types", s.history[0].tiles)])
    over = [v for v in specs if dims(tiles_only.state.shardings[v]) != specs[v]]
    assert set(resharded) <= set(over) and len(over) >= 2  # the gap the holds close
    for v in over:
        assert dims(s.state.shardings[v]) == specs[v]
        assert "model" in s.state.shardings[v].atomic, program.values[v].name


def test_a_pending_sum_is_only_a_contraction_s_and_is_reduced_before_any_use():
    """JAX reduces a contraction over a tiled dim inside the op; the plan holds that sum
    pending until the first use fetches it whole: the same all-reduce, at the same place.
    No other value is pending, and none is pending on an axis its producer does not sum."""
    s = session(explicit_mesh())
    program, state = s.program, s.state
    pending = {
        (v, axis) for v, sh in state.shardings.items() if sh.partial for axis, _ in sh.partial
    }
    assert pending  # the weight gradients, the loss and the second layer's dot
    reduced = {(c.value, c.axes) for c in s.collectives() if c.kind == "all-reduce"}
    specs = type_specs(s)
    for v, axis in pending:
        op = program.ops[program.values[v].producer]
        assert program.mapping(op).contracting, op.name  # a contraction or a reduction
        assert any(axis in sum(specs[o], ()) for o in op.operands if isinstance(o, int))
        assert (v, (axis,)) in reduced, program.values[v].name
        assert v not in program.outputs  # what the step returns leaves whole


def xla_collectives(mesh, args):
    """The collectives XLA compiles for the user's own jitted step, on the user's mesh."""
    with jax.set_mesh(mesh):
        text = jax.jit(train_step).lower(*args).compile().as_text()
    return normalize_cpu(parse_collectives(text, dict(zip(AXES, mesh.axis_sizes))), text)


def test_the_plan_s_collectives_are_the_ones_xla_compiles_for_the_user_s_step():
    """Per kind and mesh axes, the same collectives, counts and bytes as XLA compiles for
    ``jax.jit(train_step)`` on the placed arrays; one named difference: XLA gathers w2
    on model for the backward dot whose type is whole on model, where the plan runs that
    dot on w2's tiles and hands them straight to the reshard that tiles the result on
    model again (the whole result is never used)."""
    mesh = explicit_mesh()
    s = session(mesh)
    xla = xla_collectives(mesh, placed(mesh))
    plan = s.collectives()
    assert Counter((c.kind, c.axes) for c in plan) + Counter({("all-gather", ("model",)): 1}) == (
        Counter((c.kind, c.axes) for c in xla)
    )
    w2 = s.program.value("params/w2")
    extra = executed_by_axes(xla) - executed_by_axes(plan)
    assert extra == Counter({("all-gather", ("model",)): w2.nbytes})
    assert executed_by_axes(plan) - executed_by_axes(xla) == Counter()
    assert crosscheck(s).identical  # and the explicit lowering compiles to exactly the plan
    # the dot it stands for: its result whole on model, its only use the reshard to model
    results = [v for o in s.program.users[w2.id] for v in s.program.ops[o].results]
    (dot,) = [v for v in results if "model" in s.state.shardings[v].atomic]
    (use,) = s.program.users[dot]
    assert ops.traits(s.program.ops[use].primitive).constraint
    assert "model" in s.state.shardings[s.program.ops[use].results[0]].dims[1]


def mixed_step(p, x, y):
    def loss(p):
        return jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"] - y) ** 2)

    value, g = jax.value_and_grad(loss)(p)
    return value, jax.tree.map(lambda a, b: a - 0.1 * b, p, g)


def test_a_mixed_mesh_holds_the_explicit_axis_and_leaves_the_auto_axis_free():
    mesh = jax.make_mesh((4, 2), AXES, axis_types=(AxisType.Explicit, AxisType.Auto))
    params, x, y = host_arrays(5)
    with jax.set_mesh(mesh):
        args = (
            jax.device_put(params, PLACES),
            jax.device_put(x, P("batch", None)),
            jax.device_put(y, P("batch", None)),
        )
        s = wb.Session.from_jax(mixed_step, *args, mesh=mesh)
    (imported,) = s.history
    assert {axis for _, axis in imported.whole} == {"batch"}
    assert {axis for _, _, axis in imported.tiles} == {"batch"}
    specs = type_specs(s)
    for v, spec in specs.items():
        sh = s.state.shardings[v]
        assert dims(sh) == spec, s.program.values[v].name  # the types name batch only
        assert "model" not in sh.atomic | sh.replicated
    # the compiler's axis is the user's to decide: a later tile spreads on it
    tiled = s.apply(wb.Tile("p/w1", 1, "model"))
    first = next(op for op in tiled.program.walk() if ops.traits(op.primitive).contraction)
    assert dims(tiled.state.shardings[first.results[0]]) == (("batch",), ("model",))


def test_the_holds_survive_a_strategy_file(tmp_path):
    from workbench.core.io.export import export_code, read

    s = session(explicit_mesh())
    mesh, tactics = read(s.save(tmp_path / "explicit.json"))
    assert tuple(tactics) == s.history and tactics[0].whole
    assert wb.Session(s.program, mesh, tactics).state.shardings == s.state.shardings
    code = export_code(s)
    assert "whole=" in code and "Atomic" not in code  # the holds stay part of the import


@pytest.mark.parametrize(
    "whole",
    [5, [("h", "model")], [(["h"], 3)], [([], "model")], [(["h"], "model", 1)]],
    ids=["an int", "a bare name", "an axis not a string", "no names", "a triple"],
)
def test_a_bad_whole_is_refused_with_what_would_work(whole):
    from workbench.core.errors import TacticError

    with pytest.raises(TacticError, match=r"whole .*\(selectors, axis\).*got"):
        wb.Imported("sharding types", (), whole)


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
