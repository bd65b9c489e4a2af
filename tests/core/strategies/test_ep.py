"""EP, expert parallelism: the experts of each MoE layer split over an axis; alone (tokens
whole on the axis), with BP after it on the same axis (GShard's all-to-alls) and with MP on
another; applied like any tactic (undo, why, save, load, export) and run like the
unpartitioned step; refused where there are no experts, E is not divisible, the form is
not split, or an earlier tactic already splits the tokens on its axis. The dropless form
(grouped matmuls over rows sorted by expert): the zoo's and one written as MaxText writes it."""

from collections import Counter

import pytest

import workbench as wb
from tests.core.strategies.roundtrip import round_trip
from workbench.core.errors import TacticError
from workbench.models import build, lm

CASES = {
    "ep": ({"data": 2, "expert": 4}, (("EP", "expert"),)),
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


def test_bp_then_ep_on_one_axis_is_refused_saying_what_works(program):
    # BP first splits the tokens on the axis: EP after it would meet them as conflicts (4
    # all-to-alls per MoE layer each way, twice GShard's); refused, the session unchanged
    s = wb.Session(program, wb.Mesh({"expert": 4, "data": 2}), [wb.BP("expert")])
    state, history = s.state, s.history
    with pytest.raises(
        TacticError,
        match=r"EP\('expert'\) given after BP\('expert'\).*already split on 'expert'.*twice "
        r"GShard's all-to-alls.*Apply EP\('expert'\) first and BP\('expert'\) after it.*undo",
    ):
        s.apply(wb.EP("expert"))
    assert s.state is state and s.history == history
    assert s.sharding("params/layers/0/moe/experts/w_in").dim_of("expert") is None
    # what works: undo the BP, apply EP, reapply the BP: GShard's two all-to-alls each way
    s.undo().apply(wb.EP("expert")).apply(wb.BP("expert"))
    n = len(program.anatomy().experts)
    assert not s.conflicts and kinds(s, "forward")["all-to-all"] == 2 * n
    # the same tactic on another axis is no split of the tokens on the experts axis
    other = wb.Session(program, wb.Mesh({"data": 2, "expert": 4}), [wb.BP("data")])
    assert other.apply(wb.EP("expert")).history[-1] == wb.EP("expert")


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


@pytest.mark.parametrize("dispatch", ["einsum", "gather"])
def test_ep_then_bp_is_clean_in_both_capacity_forms(dispatch):
    # the gather form's combine reads a padding row concatenated to the experts' outputs:
    # the experts dim meets the tokens there too, and is held (no conflict)
    ex = build("lm", lm.Config.preset("moe", dispatch=dispatch))
    program = wb.capture(ex.fn, *ex.args)
    mesh = wb.Mesh({"data": 2, "expert": 4})
    s = wb.Session(program, mesh, [wb.EP("expert"), wb.BP("expert")])
    assert not s.conflicts
    assert kinds(s, "forward", "expert")["all-to-all"] == 2 * len(program.anatomy().experts)


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


def test_ep_first_shards_the_experts_optimizer_state_and_bp_first_is_refused():
    # with float32 master weights: EP before BP on the axis shards the experts' optimizer
    # state with them; BP first (the experts' gradients reduced over the tokens whole) is
    # refused, strict or not
    ex = build("lm", lm.Config.preset("moe", dtype="bfloat16", master_weights=True), abstract=True)
    p = wb.capture(ex.fn, *ex.args)
    mesh = wb.Mesh({"expert": 4, "data": 2})
    early = wb.Session(p, mesh, [wb.EP("expert"), wb.BP("expert")])
    assert not early.notes(1)
    assert "4@expert" in str(early.sharding("opt_state/master/layers/0/moe/experts/w_in"))
    for ep in (wb.EP("expert"), wb.EP("expert", strict=True)):
        with pytest.raises(TacticError, match="already split on 'expert' by BP"):
            wb.Session(p, mesh, [wb.BP("expert"), ep])


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


# -- the dropless form: grouped matmuls (ragged_dot) over the rows sorted by expert ---------

RAGGED = {
    "ep": ({"data": 2, "expert": 4}, lambda: [wb.EP("expert")]),
    "ep+bp": ({"data": 2, "expert": 4}, lambda: [wb.EP("expert"), wb.BP("data")]),
    # MP inside each expert: the grouped matmuls are no projections MP finds; name them
    "ep+mp": (
        {"data": 2, "expert": 4},
        lambda: [wb.EP("expert"), wb.MP("data", hidden="params/layers/*/moe/*/w_in")],
    ),
    "ep+bp+z3": ({"data": 2, "expert": 4}, lambda: [wb.EP("expert"), wb.BP("data"), wb.Z3("data")]),
}


@pytest.fixture(scope="module")
def ragged():
    ex = build("lm", lm.Config.preset("moe", dispatch="ragged"))
    return wb.capture(ex.fn, *ex.args)


def ragged_session(program, case: str) -> wb.Session:
    mesh, tactics = RAGGED[case]
    return wb.Session(program, wb.Mesh(mesh), tactics())


def ragged_ops(program, phase: str, contracting: bool) -> list:
    """The grouped matmuls of ``phase``: rows x groups' matrices, or (``contracting``) the
    weight gradients, [g, k, n]."""
    out = []
    for op in program.ops:
        if op.primitive == "ragged_dot_general" and op.phase == phase:
            (lc, _), _ = op.params["ragged_dot_dimension_numbers"].dot_dimension_numbers
            if (0 in lc) == contracting:
                out.append(op)
    return out


@pytest.mark.parametrize("case", ["ep", "ep+bp", "ep+mp"])
def test_ep_on_the_ragged_form_runs_each_devices_groups(ragged, case):
    """Tokens whole on the axis: each device runs its experts' rows of each grouped matmul
    (zeros elsewhere: a sum over the axis). Per MoE layer, forward: an all-reduce of the
    combine, and one of the experts' hidden (its rows a sum over the devices, whole before
    the gelu: the plan has no layout for "each device's rows", so it is not the textbook's
    single all-reduce); backward: an all-reduce of the rows' gradient at each grouped
    matmul (the hidden's, the dispatched tokens'); the weight gradients stay split: no
    all-to-all, no all-gather on the axis."""
    s = ragged_session(ragged, case)
    layers = ragged.anatomy().experts
    n = len(layers)
    assert [layer.form for layer in layers] == ["ragged"] * n and not s.conflicts
    for layer in layers:
        for v, d in layer.experts:
            assert s.state.shardings[v].dim_of("expert") == d
    assert kinds(s, "forward") == {"all-reduce": 2 * n} == kinds(s, "backward")
    ops = ragged.ops
    reduced = {(ops[c.op].phase, c.value) for c in s.collectives() if "expert" in c.axes}
    first = [
        op
        for op in ragged_ops(ragged, "forward", False)
        if op.operands[1] in {layer.experts[0][0] for layer in layers}
    ]
    combined = {ops[layer.combine[-1]].operands[0] for layer in layers}
    assert {("forward", v) for v in combined} | {("forward", op.results[0]) for op in first} == {
        r for r in reduced if r[0] == "forward"
    }
    backward = {op.results[0] for op in ragged_ops(ragged, "backward", False)}
    assert {v for phase, v in reduced if phase == "backward"} == backward
    for op in ragged_ops(ragged, "backward", True):  # each device its experts' gradients
        assert s.state.shardings[op.results[0]].dim_of("expert") == 0
    if case == "ep+mp":  # each expert's hidden split over "data" too
        assert str(s.sharding("params/layers/0/moe/experts/w_in")) == "f32[4@expert,32,64@data]"


def test_ep_on_the_ragged_form_splits_master_weights_and_moments():
    # with float32 master weights the update runs on the master copy: no activation carries
    # the experts dim to the gradients in this form, so EP tiles the optimizer state itself
    ex = build("lm", lm.Config.preset("moe", dispatch="ragged", master_weights=True))
    program = wb.capture(ex.fn, *ex.args)
    s = wb.Session(program, wb.Mesh({"data": 2, "expert": 4}), [wb.EP("expert")])
    assert not s.conflicts and not s.notes(0)
    for name in ("grads", "opt_state/master", "opt_state/m", "opt_state/v"):
        assert s.sharding(f"{name}/layers/0/moe/experts/w_in").dim_of("expert") == 0, name


def test_ep_on_the_ragged_form_counts_each_devices_groups(ragged):
    # the estimate's FLOPs of a grouped matmul: a quarter of the rows on each of 4 devices
    from workbench.core.ops.costs import op_cost

    s = ragged_session(ragged, "ep")
    plan = s.plan()
    for op in ragged_ops(ragged, "forward", False) + ragged_ops(ragged, "backward", True):
        whole = op_cost(op.primitive, op.params, *_types(ragged, op, None))
        local = op_cost(op.primitive, op.params, *_types(ragged, op, (plan, s.mesh)))
        assert local.flops == whole.flops / 4


def _types(program, op, local):
    from workbench.core.ops.mapping import TensorType

    def t(v, layout):
        shape = program.values[v].shape if local is None else layout.local_shape(local[1])
        return TensorType(shape, program.values[v].dtype)

    layouts = None if local is None else local[0].ops[op.id]
    ins = [t(v, layouts and layouts.operands[i]) for i, v in enumerate(op.operands)]
    outs = [t(v, layouts and layouts.results[i]) for i, v in enumerate(op.results)]
    return ins, outs


@pytest.mark.slow
@pytest.mark.parametrize("case", list(RAGGED))
def test_ep_on_the_ragged_form_runs_like_the_unpartitioned_step(ragged, case):
    s = ragged_session(ragged, case)
    assert not s.conflicts and s.run(repeats=1).matches


def test_ep_refuses_grouped_matmuls_that_keep_their_groups_whole(ragged, monkeypatch):
    # group sizes per batch row ([b, g]) keep the groups blocked (test_ragged_dot.py): EP
    # would gather the experts back, so it says so (the mappings' check faked here); the
    # zoo's grouped matmuls, with one [g] vector of sizes, pass it
    import workbench.core.strategies.experts as experts

    monkeypatch.setattr(experts, "_whole_groups", lambda program, layer: True)
    with pytest.raises(TacticError, match=r"'ragged' \(dropless\) form.*keep the groups whole"):
        wb.Session(ragged, wb.Mesh({"expert": 4}), [wb.EP("expert")])
    monkeypatch.undo()
    assert not experts._whole_groups(ragged, ragged.anatomy().experts[0])


@pytest.fixture(scope="module")
def maxtext_ragged():
    from tests.models import ragged_moe

    fn, args = ragged_moe.example()
    return wb.capture(fn, *args)


def test_ep_on_a_dropless_moe_written_as_maxtext_writes_it(maxtext_ragged):
    """MaxText's sparse-matmul path (argsort, bincount, ragged_dot, a SwiGLU): per layer,
    forward an all-reduce of each grouped matmul feeding the silu and the product (2) and of
    the combine; backward of the product's gradient and of the tokens' (the two grouped
    matmuls' rows' gradients summed first); the step runs as the unpartitioned one."""
    layers = maxtext_ragged.anatomy().experts
    assert [layer.form for layer in layers] == ["ragged"] and len(layers[0].experts) == 3
    s = wb.Session(maxtext_ragged, wb.Mesh({"expert": 4, "data": 2}), [wb.EP("expert")])
    assert not s.conflicts
    assert kinds(s, "forward") == {"all-reduce": 3} and kinds(s, "backward") == {"all-reduce": 2}
    assert s.sharding("params/moe/wi_0").dim_of("expert") == 0
    assert s.run(repeats=1).matches


def test_auto_lists_ep_after_bp_on_its_axis_as_a_move_that_does_not_apply(program):
    from workbench.core.search.tree import Auto

    mesh = wb.Mesh({"expert": 4, "data": 2})
    start = wb.Session(program, mesh, [wb.BP("expert")]).state
    report = Auto("expert", budget=1).report(program, mesh, start)
    ep = next(c for c in report.candidates if c.name == "EP('expert')")
    assert not ep.applies and "already split on 'expert' by BP('expert')" in ep.error
    assert report.winner.name != "EP('expert')"
