"""EP, expert parallelism: the experts of each MoE layer split over an axis; alone (tokens
whole on the axis), with BP on the same axis (tokens split: all-to-alls) and with MP on
another; applied like any tactic (undo, why, save, load, export) and run like the
unpartitioned step; refused where there are no experts, E is not divisible or the form is
not split."""

from collections import Counter

import pytest

import workbench as wb
from tests.core.strategies.roundtrip import round_trip
from workbench.core.errors import TacticError
from workbench.models import build, lm

CASES = {
    "ep": ({"data": 2, "expert": 4}, (("EP", "expert"),)),
    "bp+ep": ({"expert": 4, "data": 2}, (("BP", "expert"), ("EP", "expert"))),
    "ep+bp": ({"expert": 4, "data": 2}, (("EP", "expert"), ("BP", "expert"))),
    "bp+ep other axis": ({"data": 2, "expert": 4}, (("BP", "data"), ("EP", "expert"))),
    "ep+mp": ({"data": 2, "expert": 4}, (("EP", "expert"), ("MP", "data"))),
}


@pytest.fixture(scope="module")
def program():
    ex = build("lm", lm.Config.preset("moe", dispatch="einsum"))
    return wb.capture(ex.fn, *ex.args)


def session(program, case: str) -> wb.Session:
    mesh, steps = CASES[case]
    return wb.Session(program, wb.Mesh(mesh), [getattr(wb, n)(a) for n, a in steps])


def kinds(s: wb.Session, phase: str, axis: str = "expert") -> Counter:
    ops = s.program.ops
    return Counter(
        c.kind
        for c in s.collectives()
        if axis in c.axes and c.op is not None and ops[c.op].phase == phase
        for _ in range(c.count)
    )


def test_ep_alone_splits_the_experts_and_sums_at_the_combine(program):
    s = session(program, "ep")
    layers = program.anatomy().experts
    n = len(layers)
    assert n == 2 and not s.conflicts
    for layer in layers:
        for v, d in layer.experts:
            assert s.state.shardings[v].dim_of("expert") == d
    # tokens whole on the axis: each device selects its experts' tokens locally, and the
    # combine sums over the experts (one all-reduce per layer); no all-to-all anywhere
    forward, backward = kinds(s, "forward"), kinds(s, "backward")
    assert forward == {"all-reduce": n}
    assert "all-to-all" not in backward
    combined = {program.ops[layer.combine[-1]].results[0] for layer in layers}
    reduced = {c.value for c in s.collectives() if c.kind == "all-reduce"}
    assert combined <= reduced
    s.undo()
    assert not s.sharding("params/layers/0/moe/experts/w_in").uses("expert")


def test_bp_then_ep_on_one_axis_moves_tokens_by_all_to_all(program):
    s = session(program, "bp+ep")
    n = len(program.anatomy().experts)
    forward, backward = kinds(s, "forward"), kinds(s, "backward")
    # measured: 4 all-to-alls per MoE layer each way (the textbook has 2: dispatch and
    # combine); the expert matmuls read tokens split by group and experts split by expert,
    # conflicts the lowering resolves around each expert matmul
    assert forward["all-to-all"] == 4 * n and backward["all-to-all"] == 4 * n
    assert len(s.conflicts) == 4 * n
    assert all("experts" in str(c) for c in s.conflicts)


def test_ep_then_bp_on_one_axis_is_gshard_two_all_to_alls_each_way(program):
    s = session(program, "ep+bp")
    layers = program.anatomy().experts
    n = len(layers)
    assert not s.conflicts
    forward, backward = kinds(s, "forward"), kinds(s, "backward")
    assert forward["all-to-all"] == 2 * n and backward["all-to-all"] == 2 * n
    # forward: the dispatch's result re-split from token groups onto experts, and the
    # combine's expert outputs back onto token groups; nowhere else
    ops = program.ops
    at = {c.op for c in s.collectives() if c.kind == "all-to-all" and ops[c.op].phase == "forward"}
    dispatched = {ops[layer.dispatch[0]].results[0] for layer in layers}
    moved = {c.value for c in s.collectives() if c.kind == "all-to-all"}
    assert dispatched <= moved
    assert at <= {o for layer in layers for o in (*layer.combine, *layer.dispatch)} | {
        u for v in dispatched for u in program.users[v]
    }
    # the router and its masks keep the tokens' split; the experts stay split by expert
    for layer in layers:
        assert s.state.shardings[ops[layer.dispatch[0]].operands[0]].uses("expert")
        for v, d in layer.experts:
            assert s.state.shardings[v].dim_of("expert") == d


def test_ep_with_bp_on_another_axis_has_no_all_to_all(program):
    s = session(program, "bp+ep other axis")
    assert not s.conflicts
    assert kinds(s, "forward", "expert") == {"all-reduce": 2}
    assert not kinds(s, "forward", "data")["all-to-all"]


def test_ep_with_mp_on_another_axis(program):
    s = session(program, "ep+mp")
    assert not s.conflicts
    assert s.sharding("params/layers/0/moe/experts/w_in").dim_of("expert") == 0


def test_ep_explains_saves_loads_and_exports(program, tmp_path):
    s = session(program, "bp+ep other axis")
    assert "EP('expert')" in str(s.why("params/layers/0/moe/experts/w_in"))
    assert round_trip(s, program, tmp_path)["schedule"][1]["axis"] == "expert"
    assert "EP" in wb.__all__ and "EP" in wb.core.strategies.STRATEGIES  # a button and Auto's move
    assert str(wb.EP("expert", strict=True)) == "EP('expert', strict=True)"


def test_ep_refuses_an_axis_that_does_not_divide_the_experts(program):
    with pytest.raises(TacticError, match=r"4 experts.*3-way axis 'expert'.*size 2, 4"):
        wb.Session(program, wb.Mesh({"expert": 3}), [wb.EP("expert")])


def test_ep_without_experts_says_what_would_work():
    ex = build("lm", lm.Config.preset("tiny", n_layers=1))
    program = wb.capture(ex.fn, *ex.args)
    with pytest.raises(TacticError, match=r"no mixture of experts.*anatomy\(\)\.experts.*MP\("):
        wb.Session(program, wb.Mesh({"expert": 2}), [wb.EP("expert")])


@pytest.mark.slow
def test_ep_refuses_the_ragged_form_saying_why():
    ex = build("lm", lm.Config.preset("moe", dispatch="ragged"))
    program = wb.capture(ex.fn, *ex.args)
    with pytest.raises(TacticError, match=r"'ragged' form.*ragged_dot.*capacity"):
        wb.Session(program, wb.Mesh({"expert": 4}), [wb.EP("expert")])


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_ep_runs_like_the_unpartitioned_step(program, case):
    assert session(program, case).run(repeats=1).matches


@pytest.mark.slow
def test_ep_on_the_gather_form_runs_like_the_unpartitioned_step():
    ex = build("lm", lm.Config.preset("moe", dispatch="gather"))
    program = wb.capture(ex.fn, *ex.args)
    s = wb.Session(program, wb.Mesh({"data": 2, "expert": 4}), [wb.BP("data"), wb.EP("expert")])
    assert not s.conflicts
    assert s.run(repeats=1).matches


def test_ep_after_bp_on_its_axis_says_the_experts_state_stays_whole():
    # with float32 master weights, BP on the axis first reduces the experts' gradients over
    # the tokens whole: their optimizer state cannot follow the experts, and EP says so;
    # EP first shards it
    ex = build("lm", lm.Config.preset("moe", dtype="bfloat16", master_weights=True), abstract=True)
    p = wb.capture(ex.fn, *ex.args)
    mesh = wb.Mesh({"expert": 4, "data": 2})
    late = wb.Session(p, mesh, [wb.BP("expert"), wb.EP("expert")])
    notes = late.notes(2)
    assert notes and all("apply EP before" in n for n in notes)
    assert any(
        n.startswith("opt_state/master/layers/0/moe/experts/w_in stays whole") for n in notes
    )
    early = wb.Session(p, mesh, [wb.EP("expert"), wb.BP("expert")])
    assert not early.notes(1)
    assert "4@expert" in str(early.sharding("opt_state/master/layers/0/moe/experts/w_in"))
    with pytest.raises(wb.WorkbenchError, match="apply EP before"):
        wb.Session(p, mesh, [wb.BP("expert"), wb.EP("expert", strict=True)])


@pytest.fixture(scope="module")
def maxtext():
    from tests.models import maxtext_capacity_moe

    fn, args = maxtext_capacity_moe.example()
    return wb.capture(fn, *args)


def test_ep_then_bp_on_a_moe_written_as_maxtext_writes_it(maxtext):
    """MaxText's capacity path (masks by a cumulative sum, dispatch and combine einsums):
    GShard's two all-to-alls per layer each way, no conflicts, and the step runs as the
    unpartitioned one does."""
    layers = maxtext.anatomy().experts
    assert [layer.form for layer in layers] == ["einsum", "einsum"]
    s = wb.Session(maxtext, wb.Mesh({"expert": 4, "data": 2}), [wb.EP("expert"), wb.BP("expert")])
    assert not s.conflicts
    forward, backward = kinds(s, "forward"), kinds(s, "backward")
    assert forward == {"all-to-all": 2 * len(layers)} == backward
    assert s.run(repeats=1).matches
