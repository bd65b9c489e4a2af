"""Session history, queries and the bad-input contract: a clear error and nothing changed."""

import warnings

import jax
import jax.numpy as jnp
import pytest

import workbench as wb
from workbench import Tile
from workbench.core.errors import (
    CaptureError,
    HistoryError,
    MeshError,
    SelectorError,
    TacticError,
    UnknownValueError,
)
from workbench.models import build


def sds(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def model(params, x):
    with jax.named_scope("mlp"):
        h = jnp.tanh(x @ params["w_in"])
        return h @ params["w_out"]


@pytest.fixture
def s():
    program = wb.capture(model, {"w_in": sds(10, 32), "w_out": sds(32, 10)}, sds(8, 10))
    return wb.Session(program, wb.Mesh({"batch": 2, "model": 4}))


def snapshot(s):
    return (s.state, s.step, s.history, s.redo_stack)


def test_undo_redo_reset_jump(s):
    s.apply(wb.Tile("params/w_in", 1, "model"))
    s.apply(wb.Tile("x", 0, "batch"))
    assert s.step == 2 and len(s.history) == 2
    s.undo()
    assert s.step == 1 and str(s.sharding("x")) == "f32[8,10]"
    s.redo()
    assert str(s.sharding("x")) == "f32[8@batch,10]"
    s.reset()
    assert s.step == 0 and s.history == () and len(s.redo_stack) == 2
    s.jump(2)
    assert str(s.sharding("out")) == "f32[8@batch,10]{sum: model}"
    s.jump(1)
    s.apply(wb.Tile("x", 1, "batch"))  # a new tactic after undo drops the redo stack
    assert s.redo_stack == () and s.step == 2
    with pytest.raises(HistoryError, match="nothing to redo"):
        s.redo()
    s.reset()
    with pytest.raises(HistoryError, match="nothing to undo"):
        s.undo()
    with pytest.raises(
        HistoryError, match="step 7 is past the end of the history; give a step from 0 to 2"
    ):
        s.jump(7)


def test_diff_between_any_two_steps(s):
    s.apply(wb.Tile("params/w_in", 1, "model"))
    s.apply(wb.Tile("x", 0, "batch"))
    d = s.diff()
    assert d.before == 1 and d.after == 2 and "x" in d.names and "params/w_in" not in d.names
    d02 = s.diff(0, 2)
    assert set(d.names) | set(s.diff(0, 1).names) == set(d02.names)
    _, before, after = next(c for c in d02.changes if c[0] == "params/w_out")
    assert str(before) == "f32[32,10]" and str(after) == "f32[32@model,10]"
    assert s.changed == sorted(s.changed, key=lambda n: s.program.value(n).id)


def test_schedule_in_the_constructor_and_query_helpers(s):
    again = wb.Session(s.program, {"batch": 2, "model": 4}, [wb.Tile("params/w_in", 1, "model")])
    assert str(again.sharding("params/w_out")) == "f32[32@model,10]"
    assert set(again.shardings("params/*")) == {"params/w_in", "params/w_out"}
    assert "#0 Tile('params/w_in', dim=1, axis='model')" in repr(again)


BAD_TACTICS = [
    (
        wb.Tile("params/w_inn", 1, "model"),
        SelectorError,
        r"selector 'params/w_inn' matches no value of program 'model'\. Close names: params/w_in",
    ),
    (
        wb.Tile("params/w_in", 2, "model"),
        TacticError,
        r"params/w_in has rank 2 \(shape \(10, 32\)\), so dim 2 is out of range; use a dim in \[-2, 1\]",
    ),
    (
        wb.Tile("params/w_in", 0, "model"),
        TacticError,
        r"dim 0 of params/w_in has size 10, which mesh axis 'model' \(size 4\) does not divide; "
        r"pick a dim whose size 4 divides, or pad it",
    ),
    (
        wb.Tile("params/w_in", 1, "modle"),
        TacticError,
        r"axis 'modle' is not in Mesh\(batch=2, model=4\); did you mean 'model'\?",
    ),
    ("Tile(params/w_in)", TacticError, r"expected a tactic such as Tile\(selector, dim, axis\)"),
]
# tactics refused as they are made (a malformed selector, a dim of the wrong type)
BAD_TACTICS += [
    ((Tile, "params/***", 1, "model"), SelectorError, r"selector 'params/\*\*\*' is malformed"),
    ((Tile, "params/w**", 1, "model"), SelectorError, r"'\*\*' must be a whole path segment"),
    ((Tile, "params/{w_in", 1, "model"), SelectorError, r"unbalanced '\{'"),
    ((Tile, "", 1, "model"), SelectorError, r"selector '' is empty"),
    (
        (Tile, 42, 1, "model"),
        SelectorError,
        r"selector must be a name pattern \(a str\) or a list of them; got 42",
    ),
    (
        (Tile, "params/w_in", 1.5, "model"),
        TacticError,
        r"dim must be an integer dimension index .*; got 1\.5",
    ),
]


@pytest.mark.parametrize(
    "tactic, error, message",
    BAD_TACTICS,
    ids=[str(t[0][1:] if isinstance(t[0], tuple) else t[0])[:40] for t in BAD_TACTICS],
)
def test_bad_tactics_raise_a_clear_error_and_change_nothing(s, tactic, error, message):
    s.apply(wb.Tile("x", 0, "batch"))
    s.undo()  # keep a redo stack around: it must survive the failed tactic too
    before = snapshot(s)
    with pytest.raises(error, match=message) as info:
        s.apply(tactic[0](*tactic[1:]) if isinstance(tactic, tuple) else tactic)
    assert isinstance(info.value, wb.WorkbenchError)
    assert snapshot(s) == before


def test_an_axis_already_used_on_a_value_is_refused_naming_the_earlier_tactic(s):
    s.apply(wb.Tile("params/w_in", 1, "model"))
    before = snapshot(s)
    with pytest.raises(
        TacticError,
        match=r"params/w_out already uses axis 'model' \(dim 0 by tactic #0 Tile\('params/w_in', dim=1, "
        r"axis='model'\)\); a mesh axis appears at most once per value",
    ):
        s.apply(wb.Tile("params/w_out", 1, "model"))
    assert snapshot(s) == before
    with pytest.raises(TacticError, match=r"already f32\[10,32@model\] on axis 'model'"):
        s.apply(wb.Replicate("params/w_in", "model"))
    assert snapshot(s) == before


def test_a_tactic_that_fails_halfway_through_its_values_leaves_no_trace(s):
    # x tiles fine on batch; w_out's dim 0 (32) then gets batch too, but w_in's dim 0 (12)
    # is matched as well and is not divisible by 8: nothing may be written
    before = snapshot(s)
    with pytest.raises(TacticError, match="dim 0 of params/w_in has size 10"):
        s.apply(wb.Tile(["x", "params/w_out", "params/w_in"], 0, "model"))
    assert snapshot(s) == before


def test_unknown_value_names_suggest_close_ones(s):
    with pytest.raises(
        UnknownValueError, match=r"no value named 'params/w_ou'; did you mean 'params/w_out'"
    ):
        s.sharding("params/w_ou")
    with pytest.raises(UnknownValueError):
        s.why("nothing/here")


def test_a_function_jax_cannot_trace_is_a_capture_error():
    def broken(x):
        return x.reshape(7, -1)  # 8*12 elements do not fit 7 rows

    with pytest.raises(
        CaptureError, match=r"(?s)JAX could not trace broken\(x\): TypeError: .*functools\.partial"
    ):
        wb.capture(broken, sds(8, 10))
    with pytest.raises(CaptureError, match="capture needs a function; got int"):
        wb.capture(3, sds(8, 10))


def test_bad_meshes():
    with pytest.raises(MeshError, match="a mesh needs at least one axis"):
        wb.Mesh({})
    with pytest.raises(
        MeshError, match="mesh axis 'model' has size 0; a size must be a positive integer"
    ):
        wb.Mesh({"batch": 2, "model": 0})
    with pytest.raises(MeshError, match="mesh axis name 'my axis' is not a valid identifier"):
        wb.Mesh({"my axis": 2})


def _parts_one_by_one(program, mesh, schedule):
    """The schedule with each composite replaced by its parts, each a step of its own."""
    s = wb.Session(program, mesh)
    for tactic in schedule:
        for part in tactic.expand(program, mesh, s.state):
            s.apply(part)
    return s


@pytest.mark.parametrize(
    "model",
    [
        "mlp",
        "lm",
        "lm_scan",
        "gnn",
        pytest.param("hf_gpt2", marks=pytest.mark.slow),
        pytest.param("hf_llama", marks=pytest.mark.slow),
    ],
)
def test_a_composite_equals_its_parts_applied_one_by_one(model):
    """A composite costs what it changes (each part's propagation restarts from what that
    part wrote), and decides exactly what the schedule of its parts decides."""
    import warnings

    from workbench.models import build
    from workbench.models.external import build_external

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = (build_external if model.startswith("hf_") else build)(model, "tiny", abstract=True)
        program = wb.capture(ex.fn, *ex.args)
    mesh = wb.Mesh({"data": 2, "model": 4})
    schedules = [[wb.BP("data"), wb.Z3("data")], [wb.Z2("data"), wb.BP("data")]]
    if model not in ("mlp", "gnn"):
        schedules += [
            [wb.BP("data"), wb.MP("model"), wb.Z3("data")],
            [wb.Z3("data"), wb.MP("model")],
            [wb.BP("data"), wb.MP("model"), wb.SP("model")],
        ]
    for schedule in schedules:
        whole = wb.Session(program, mesh, schedule)
        parts = _parts_one_by_one(program, mesh, schedule)
        assert dict(whole.state.shardings) == dict(parts.state.shardings)
        assert {(c.op, c.axis) for c in whole.state.conflicts} == {
            (c.op, c.axis) for c in parts.state.conflicts
        }
        assert sorted((c.kind, c.value, c.axes, c.bytes) for c in whole.collectives()) == sorted(
            (c.kind, c.value, c.axes, c.bytes) for c in parts.collectives()
        )
        _each_decision_names_its_part(whole)


def _each_decision_names_its_part(s):
    """Every decision of a composite names the part it flowed from; a seed's part selected it."""
    from workbench.core.ir.selectors import select

    state = s.state
    for p in state.provenance.values():
        parts = state.parts[p.tactic]
        assert p.part is not None and p.part < len(parts)
        if p.op is None:
            assert p.value in select(s.program, parts[p.part].selector)
        else:  # it came from a value decided by the same part, or an earlier tactic's
            q = state.provenance.get((p.source, p.axis))
            assert q is None or q.tactic != p.tactic or q.part == p.part


def test_random_schedules_decide_what_their_parts_decide():
    import random

    from workbench.models.external import build_external

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        programs = [
            wb.capture(ex.fn, *ex.args)
            for ex in (
                build("lm", "tiny", abstract=True),
                build_external("hf_gpt2", "tiny", abstract=True),
            )
        ]
    mesh = wb.Mesh({"data": 2, "model": 4})
    pool = [
        wb.BP("data"),
        wb.MP("model"),
        wb.Z2("data"),
        wb.Z3("data"),
        wb.SP("model"),
        wb.EMB("model"),
        wb.Z3("model"),
    ]
    rng = random.Random(23)
    for _ in range(6):
        program = rng.choice(programs)
        schedule = rng.sample(pool, rng.randint(2, 4))
        try:
            whole = wb.Session(program, mesh, schedule)
        except wb.WorkbenchError:  # refused as a whole: refused part by part too
            with pytest.raises(wb.WorkbenchError):
                _parts_one_by_one(program, mesh, schedule)
            continue
        parts = _parts_one_by_one(program, mesh, schedule)
        assert dict(whole.state.shardings) == dict(parts.state.shardings), schedule
        assert {(c.op, c.axis) for c in whole.state.conflicts} == {
            (c.op, c.axis) for c in parts.state.conflicts
        }
        _each_decision_names_its_part(whole)


def test_exact_selects_one_name_whatever_characters_it_holds():
    from workbench.core.ir.selectors import exact, select

    params = {"w{a,b}*": jnp.ones((8, 4)), "wa": jnp.ones((8, 4)), "w?x": jnp.ones((8, 4))}
    program = wb.capture(lambda p: sum(v.sum() for v in p.values()), params)
    for name in ("p/w{a,b}*", "p/w?x", "p/wa"):
        assert [program.values[i].name for i in select(program, exact(name))] == [name]
    assert len(select(program, "p/w*")) == 3  # the glob itself still globs
    s = wb.Session(
        program, wb.Mesh({"data": 2, "model": 4}), [wb.Z3("data", params=exact("p/w?x"))]
    )
    assert s.sharding("p/w?x").tiled_axes and not s.sharding("p/wa").tiled_axes


def test_estimates_are_kept_per_state_while_the_state_is_in_the_history():
    from workbench.core import hardware as hw

    s = wb.Session(build_program("lm"), wb.Mesh({"data": 2, "model": 4}), [wb.BP("data")])
    first, bp = s.estimate(hw.H100), s.state
    assert s.estimate(hw.H100) is first and s.estimate(hw.H100, step=1) is first
    assert s.estimate(hw.H100, step=0) is not first
    assert s.estimate(hw.CPU) is not first  # a spec of its own
    s.undo()
    s.apply(wb.MP("model"))  # BP's state leaves the history, and what was kept for it
    assert bp not in s.__dict__["_estimates"]
    assert bp not in s.__dict__["_plans"]
    assert s.estimate(hw.H100).step_s != first.step_s


def build_program(name):
    ex = build(name, "tiny", abstract=True)
    return wb.capture(ex.fn, *ex.args)
