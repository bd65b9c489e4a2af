"""Propagation semantics on small programs: spreading, partial sums, conflicts, regions, pins."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import workbench as wb

MESH = wb.Mesh({"batch": 2, "model": 4})


def sds(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def session(fn, *args, mesh=MESH):
    return wb.Session(wb.capture(fn, *args), mesh)


def mlp(params, x):
    h = jax.nn.relu(x @ params["w_in"])
    return h @ params["w_out"] + x


MLP_ARGS = ({"w_in": sds(16, 32), "w_out": sds(32, 16)}, sds(8, 16))


def test_tiling_the_hidden_dim_gives_the_megatron_mlp():
    s = session(mlp, *MLP_ARGS)
    s.apply(wb.Tile("params/w_in", 1, "model"))
    assert str(s.sharding("params/w_out")) == "f32[32@model,16]"
    # the second product is a pending sum; the residual add needs it whole, so it stops there
    products = [n for n in s.program.names() if n.startswith("dot_general")]
    assert str(s.sharding(products[1])) == "f32[8,16]{sum: model}"
    assert str(s.sharding("out")) == "f32[8,16]"
    assert s.conflicts == []


def test_a_pending_sum_flows_through_a_single_use_linear_chain_and_stops_at_a_fork():
    def f(x, w):
        y = (x @ w).T * 2.0  # contraction, then a transpose and a scale: linear, single use
        return jnp.tanh(y), y.sum()

    s = session(f, sds(8, 16), sds(16, 4))
    s.apply(wb.Tile("x", 1, "model"))
    names = s.program.names()
    assert str(s.sharding(names[names.index("transpose.0")])) == "f32[4,8]{sum: model}"
    # `mul.0` is used twice (tanh and sum): it is reduced once where it forks
    assert str(s.sharding("mul.0")) == "f32[4,8]{sum: model}"
    assert str(s.sharding("out/0")) == "f32[4,8]"
    assert str(s.sharding("out/1")) == "f32[]"


def test_a_pending_sum_does_not_flow_into_an_add_with_a_whole_value():
    def f(x, w, b):
        return x @ w + b

    s = session(f, sds(8, 16), sds(16, 4), sds(8, 4))
    s.apply(wb.Tile("w", 0, "model"))
    assert str(s.sharding("dot_general.0")) == "f32[8,4]{sum: model}"
    assert str(s.sharding("out")) == "f32[8,4]"


def test_a_conflict_is_recorded_and_nothing_is_guessed():
    def f(x, w):
        return x @ w

    s = session(f, sds(8, 16), sds(16, 4))
    s.apply(wb.Tile("x", 0, "model"))  # rows of the result on model
    before = s.sharding("out")
    s.apply(wb.Tile("w", 1, "model"))  # and columns too: the result cannot have both
    assert s.sharding("out") == before == s.state_at(1).shardings[s.program.value("out").id]
    (conflict,) = s.conflicts
    assert conflict.op == "dot_general.0" and conflict.axis == "model"
    assert {value for value, _, _ in conflict.claims} == {"x", "w", "out"}
    tactics = {tactic for _, _, tactic in conflict.claims}
    assert tactics == {
        "tactic #0 Tile('x', dim=0, axis='model')",
        "tactic #1 Tile('w', dim=1, axis='model')",
    }
    assert "conflict at dot_general.0 on axis 'model'" in str(conflict)


def test_a_contraction_split_under_a_result_already_tiled_is_a_reduce_scatter():
    # one tactic tiles the contracted dim of the product's input and, through the add, the
    # rows of its result, which reach the product first (the input's way is longer): each
    # device sums its share of the contraction and the sums are scattered onto the rows (a
    # key gradient under CP), with no conflict
    def f(a, w, z):
        return (jnp.cos(jnp.sin(jnp.tanh(a))) @ w).T + z

    s = session(f, sds(8, 16), sds(16, 4), sds(4, 8))
    s.apply(wb.Tile("{a,z}", 1, "model"))
    assert s.conflicts == []
    assert str(s.sharding("w")) == "f32[16@model,4]"
    assert str(s.sharding("out")) == "f32[4,8@model]"
    (scatter,) = [c for c in s.collectives() if c.axes == ("model",)]
    assert scatter.kind == "reduce-scatter"
    assert s.run(repeats=1).matches


def test_a_later_tactic_never_overrides_an_earlier_decision():
    def f(x, z):
        return jnp.sin(x) + z

    s = session(f, sds(8, 16), sds(8, 16))
    s.apply(wb.Tile("x", 0, "model"))
    assert str(s.sharding("z")) == "f32[8@model,16]"
    s.apply(wb.Tile("out", 1, "batch"))
    assert str(s.sharding("z")) == "f32[8@model,16@batch]"
    assert str(s.sharding("x")) == "f32[8@model,16@batch]"
    with pytest.raises(wb.WorkbenchError, match="already uses axis 'model'"):
        s.apply(wb.Tile("z", 1, "model"))


def test_reshape_merges_carry_the_major_factor_only():
    def f(x):
        return jnp.tanh(x.reshape(16, 4))

    s = session(f, sds(4, 4, 4))
    s.apply(wb.Tile("x", 1, "model"))  # the minor factor of the merged dim: not expressible
    assert str(s.sharding("out")) == "f32[16,4]"
    s.reset()
    s.apply(wb.Tile("x", 0, "model"))
    assert str(s.sharding("out")) == "f32[16@model,4]"


def test_one_axis_opens_the_way_for_another_across_a_merged_dimension():
    def f(x):
        return jnp.tanh(x).reshape(2, 16, 4)

    s = session(f, sds(32, 4))
    s.apply(
        wb.Tile("out", 1, "model")
    )  # the minor factor of x's merged dim: waits for the major one
    assert str(s.sharding("x")) == "f32[32,4]"
    s.apply(wb.Tile("out", 0, "batch"))
    assert str(s.sharding("x")) == "f32[32@(batch,model),4]"


def test_scan_carries_and_loop_constants_reach_a_fixed_point():
    def f(c, xs, w):
        def body(c, x):
            return jnp.tanh(c @ w + x), c.sum(axis=1)

        return lax.scan(body, c, xs)

    s = session(f, sds(8, 16), sds(5, 8, 16), sds(16, 16))
    s.apply(wb.Tile("c", 0, "batch"))
    out = s.shardings()
    assert str(out["out/0"]) == "f32[8@batch,16]"  # the final carry
    assert str(out["xs"]) == "f32[5,8@batch,16]"  # the scanned input, per step
    assert str(out["out/1"]) == "f32[5,8@batch]"  # the stacked per-step output
    body = [n for n in out if n.startswith("scan.0/")]
    assert body and all(
        "@batch" in str(out[n]) for n in body if out[n].rank >= 1 and "const[" not in n
    )
    assert str(out["scan.0/const[w]"]) == "f32[16,16]"


def test_the_scanned_dimension_is_never_tiled():
    def f(xs):
        return lax.scan(lambda c, x: (c + x, x * 2), jnp.zeros(4), xs)

    s = session(f, sds(8, 4))
    s.apply(wb.Tile("xs", 0, "batch"))
    assert str(s.sharding("out/1")) == "f32[8,4]"


def test_while_and_cond_regions_propagate():
    def f(x, w):
        def body(c):
            i, y = c
            return i + 1, jnp.tanh(y @ w)

        _, y = lax.while_loop(lambda c: c[0] < 3, body, (0, x))
        return lax.cond(y.sum() > 0, lambda v: v * 2.0, lambda v: -v, y)

    s = session(f, sds(8, 16), sds(16, 16))
    s.apply(wb.Tile("x", 0, "batch"))
    assert str(s.sharding("out")) == "f32[8@batch,16]"
    inner = {n: str(sh) for n, sh in s.shardings("while.0/**").items()}
    assert any("@batch" in text for text in inner.values())


def test_replicate_pins_a_value_and_atomic_stops_propagation():
    def f(x, y):
        a = jnp.sin(x)
        return a * y, jnp.cos(a)

    s = session(f, sds(8, 4), sds(8, 4))
    s.apply(wb.Replicate("y", "batch"))
    s.apply(wb.Tile("x", 0, "batch"))
    assert str(s.sharding("y")) == "f32[8,4]{replicated: batch}"
    assert str(s.sharding("out/0")) == "f32[8@batch,4]"
    s.reset()
    s.apply(wb.Atomic("sin.0", "batch"))
    s.apply(wb.Tile("x", 0, "batch"))
    assert str(s.sharding("sin.0")) == "f32[8,4]{atomic: batch}"
    assert str(s.sharding("out/1")) == "f32[8,4]"


def test_why_traces_from_the_tactic_to_the_value():
    s = session(mlp, *MLP_ARGS)
    s.apply(wb.Tile("params/w_in", 1, "model"))
    why = s.why("params/w_out")
    (trace,) = why.traces
    assert trace.axis == "model" and trace.decision == "dim 0" and trace.tactic == 0
    assert trace.hops[0].value == "params/w_in" and trace.hops[0].op is None
    assert trace.hops[-1].value == "params/w_out" and trace.hops[-1].op == "dot_general.1"
    steps = [hop.step for hop in trace.hops]
    assert steps == sorted(steps)
    assert "Tile('params/w_in', dim=1, axis='model')" in str(why)
    assert "replicated on every axis" in str(s.why("x"))


def test_the_decision_order_replays_the_propagation():
    s = session(mlp, *MLP_ARGS)
    s.apply(wb.Tile("params/w_in", 1, "model"))
    order = s.state.order
    assert [p.step for p in order] == list(range(1, len(order) + 1))
    assert order[0].op is None and s.program.values[order[0].value].name == "params/w_in"
    assert {p.value for p in order} == set(s.state.changed)


def test_an_unknown_primitive_warns_once_and_is_a_barrier():
    def f(x):
        y = jax.pure_callback(
            lambda a: np.asarray(a) * 2, jax.ShapeDtypeStruct((8, 4), jnp.float32), x
        )
        z = jax.pure_callback(
            lambda a: np.asarray(a) * 3, jax.ShapeDtypeStruct((8, 4), jnp.float32), y
        )
        return jnp.sin(z)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = session(f, sds(8, 4))
        s.apply(wb.Tile("x", 0, "batch"))
    messages = [str(w.message) for w in caught if "no sharding rule" in str(w.message)]
    assert len(messages) <= 1  # once per process: an earlier test may have warned already
    assert str(s.sharding("out")) == "f32[8,4]"
    assert all(
        m.barrier
        for op, m in zip(s.program.ops, s.program.mappings)
        if op.primitive == "pure_callback"
    )


def test_a_contraction_and_a_result_factor_on_one_axis_conflict():
    # rows of a table tiled, and then the lookups too: the gather cannot both leave a pending
    # sum (from the table) and tile its result (from the indices); the first decision stays
    def f(table, idx):
        return table[idx]

    s = session(f, sds(16, 8), sds(32, dtype=jnp.int32))
    s.apply(wb.Tile("table", 0, "batch"))
    assert str(s.sharding("out")) == "f32[32,8]{sum: batch}" and not s.conflicts
    s.apply(wb.Tile("idx", 0, "batch"))
    (conflict,) = s.conflicts
    assert conflict.op == "gather.0" and str(s.sharding("out")) == "f32[32,8]{sum: batch}"
    assert {tactic for _, _, tactic in conflict.claims} == {
        "tactic #0 Tile('table', dim=0, axis='batch')",
        "tactic #1 Tile('idx', dim=0, axis='batch')",
    }


def test_a_step_reports_its_events_in_the_order_propagation_made_them():
    s = session(mlp, *MLP_ARGS)
    s.apply(wb.Tile("params/w_in", 1, "model"))
    s.apply(wb.Replicate("x", "batch"))
    s.apply(wb.Tile("params/w_out", 1, "batch"))
    first = s.events(1)
    assert [e.index for e in first] == list(range(1, len(first) + 1))
    assert first[0].kind == "seed" and first[0].value == "params/w_in" and first[0].op is None
    for e in first[1:]:  # each later decision came over an op from a value decided before it
        assert e.kind in ("tile", "sum") and e.op is not None
        assert e.source in {d.value for d in first if d.index < e.index}
    assert {e.value for e in first} == {s.program.values[v].name for v in s.state_at(1).changed}
    assert [(e.kind, e.value, e.axis) for e in s.events(2)] == [("replicate", "x", "batch")]
    assert s.events(0) == ()
    assert s.events() == s.events(3)


def test_conflicts_are_events_at_the_point_they_arise():
    def f(x, w):
        return x @ w

    s = session(f, sds(8, 16), sds(16, 4))
    s.apply(wb.Tile("x", 0, "batch"))
    s.apply(wb.Tile("w", 1, "batch"))  # the product cannot take batch on both its dims
    events = s.events()
    conflicts = [e for e in events if e.kind == "conflict"]
    assert len(conflicts) == 1 and conflicts[0].axis == "batch" and conflicts[0].op
    assert conflicts[0].index == events.index(conflicts[0]) + 1
    assert s.state.conflicts[0].step == conflicts[0].index
