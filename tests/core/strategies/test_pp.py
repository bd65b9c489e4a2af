"""PP, the pipeline strategy: applied like any tactic (undo, save, load, export), checked
when applied, its stage axis kept free of tiles, priced by `Session.estimate` with the
other axes' layouts, and run by `Session.run` (what its lowering cannot do yet is refused,
saying why)."""

import pytest

import workbench as wb
from tests.core.strategies.roundtrip import round_trip
from tests.models import programs as external
from workbench.core.errors import InputError, TacticError
from workbench.core.propagate.tactics import TacticInputError
from workbench.core.strategies.pipeline import default_microbatches, pipeline_of
from workbench.models import build, lm

MESH = wb.Mesh({"stage": 4, "data": 2})


@pytest.fixture(scope="module")
def program():
    ex = build("lm", lm.Config.preset("tiny", n_layers=4))
    return wb.capture(ex.fn, *ex.args)


def test_pp_cuts_the_blocks_over_its_axis_and_tiles_nothing(program):
    s = wb.Session(program, MESH, [wb.PP("stage", microbatches=4)])
    assert s.state.shardings == wb.Session(program, MESH).state.shardings
    pipe = pipeline_of(program, s.mesh, s.state)
    assert (pipe.stages, pipe.microbatches, pipe.schedule.kind) == (4, 4, "1f1b")
    assert [st.blocks for st in pipe.cuts.stages] == [(0,), (1,), (2,), (3,)]
    s.undo()
    assert pipeline_of(program, s.mesh, s.state) is None


def test_microbatches_must_split_what_each_device_holds(program):
    with pytest.raises(TacticError, match=r"each device holds 4 of the batch's examples"):
        wb.Session(program, MESH, [wb.PP("stage", microbatches=8), wb.BP("data")])
    s = wb.Session(program, MESH, [wb.PP("stage"), wb.BP("data")])  # as many as fit
    assert pipeline_of(program, MESH, s.state).microbatches == 4
    s.undo()
    assert pipeline_of(program, MESH, s.state).microbatches == 8


def test_pp_composes_with_strategies_on_the_other_axes(program):
    mesh = wb.Mesh({"stage": 2, "data": 2, "model": 2})
    s = wb.Session(program, mesh, [wb.PP("stage", stages=[1]), wb.BP("data"), wb.MP("model")])
    assert s.sharding("batch/tokens").uses("data")
    assert [st.blocks for st in pipeline_of(program, mesh, s.state).cuts.stages] == [
        (0,),
        (1, 2, 3),
    ]
    assert not any(sh.uses("stage") for sh in s.state.shardings.values())


@pytest.mark.parametrize(
    "tactic", [wb.BP("stage"), wb.MP("stage"), wb.Tile("params/layers/0/mlp/w1", 1, "stage")]
)
def test_a_tactic_on_the_stage_axis_is_refused_and_changes_nothing(program, tactic):
    s = wb.Session(program, MESH, [wb.PP("stage"), wb.BP("data")])
    before = (s.step, s.state)
    with pytest.raises(TacticError, match=r"axis 'stage' is the stages' axis of PP\('stage'\)"):
        s.apply(tactic)
    assert (s.step, s.state) == before


@pytest.mark.parametrize(
    "schedule, tactic, message",
    [
        ([wb.BP("data")], wb.PP("data"), r"axis 'data' already tiles batch/"),
        ([wb.PP("stage")], wb.PP("data"), r"pipelines the step already \(PP\('stage'\)\)"),
        ([], wb.PP("stage", microbatches=3), r"microbatches=3 does not divide the batch of 8"),
        ([], wb.PP("stage", stages=[1, 2]), r"stage starts \(1, 2\) are not 3 block indices"),
        ([], wb.PP("stage", stages=[2, 1, 3]), r"must increase strictly"),
        ([], wb.PP("stage", virtual_stages=2), r"'1f1b' schedule runs one model chunk per stage"),
        ([], wb.PP("stage", schedule="interleaved"), r"interleaved schedule needs virtual_stag"),
        ([], wb.PP("pipe"), r"axis 'pipe' is not in Mesh"),
    ],
)
def test_pp_refused_when_applied_says_why(program, schedule, tactic, message):
    s = wb.Session(program, MESH, schedule)
    before = (s.step, s.state)
    with pytest.raises(TacticError, match=message):
        s.apply(tactic)
    assert (s.step, s.state) == before


def test_pp_on_an_axis_of_one_device_and_on_a_step_without_blocks_is_refused(program):
    s = wb.Session(program, wb.Mesh({"stage": 1, "data": 8}))
    with pytest.raises(TacticError, match="one stage; pipeline over an axis of 2 or more"):
        s.apply(wb.PP("stage"))
    ex = build("cnn", "tiny")
    flat = wb.Session(wb.capture(ex.fn, *ex.args), MESH)
    with pytest.raises(TacticError, match="no repeated blocks"):
        flat.apply(wb.PP("stage"))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: wb.PP("stage", microbatches=0), r"microbatches must be a whole number >= 1"),
        (lambda: wb.PP("stage", microbatches=2.5), r"got 2\.5"),
        (lambda: wb.PP("stage", microbatches=True), r"got True"),
        (lambda: wb.PP("stage", schedule="1fb1"), r"did you mean '1f1b'\? Use one of"),
        (lambda: wb.PP("stage", schedule=None), r"schedule=None is not a pipeline schedule"),
        (lambda: wb.PP("stage", stages="2"), r"stages must be the block indices"),
        (lambda: wb.PP("stage", stages=[1.5]), r"stages must be the block indices"),
        (lambda: wb.PP("stage", virtual_stages=0), r"virtual_stages must be a whole number"),
        (lambda: wb.PP(3), r"axis 3 is not a mesh axis"),
    ],
)
def test_pp_made_with_bad_arguments_is_refused(make, message):
    with pytest.raises(TacticInputError, match=message):
        make()


def test_default_microbatches_are_four_per_stage_when_the_batch_allows():
    assert default_microbatches(64, 4) == 16
    assert default_microbatches(24, 4) == 24  # 16 does not divide 24; nor 17..23
    assert default_microbatches(8, 4) == 8  # the batch, when smaller than 4 per stage
    assert default_microbatches(40, 2) == 8


def test_pp_saves_loads_and_exports(program, tmp_path):
    tactics = [wb.PP("stage", microbatches=4, schedule="gpipe", stages=[1, 2, 3]), wb.BP("data")]
    s = wb.Session(program, MESH, tactics)
    assert round_trip(s, program, tmp_path)["schedule"][0]["stages"] == [1, 2, 3]


def test_what_a_pipelined_step_cannot_do_yet_is_refused_saying_why(program):
    s = wb.Session(program, MESH, [wb.PP("stage"), wb.BP("data")])
    s.lower()  # the other axes' layouts lower with it
    import jax
    import jax.numpy as jnp

    def step(ws, x):  # tanh layers under a scan whose loss also reads the loop's stack
        def loss_fn(ws):
            h, ys = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), jnp.sum(h)), x, ws)
            return jnp.sum(h) + jnp.sum(ys)

        loss, grads = jax.value_and_grad(loss_fn)(ws)
        return ws - 0.1 * grads, loss

    ws, x = jax.ShapeDtypeStruct((4, 8, 8), jnp.float32), jax.ShapeDtypeStruct((8, 8), jnp.float32)
    looped = wb.Session(wb.capture(step, ws, x), MESH, [wb.PP("stage", microbatches=4)])
    with pytest.raises(InputError, match=r"under a loop \(scan\).*read where a stage holds"):
        looped.lower()  # the loss reads a stack of the forward loop: each stage has its range
    s.undo()
    with pytest.raises(InputError, match=r"lowers explicitly only"):
        s.lower("constrained")
    with pytest.raises(InputError, match=r"lowering returns no intermediate values"):
        s.lower(probes=[program.inputs[0]])
    s.jump(0)
    s.lower("constrained")  # the steps before the pipeline lower as ever


@pytest.mark.slow
def test_session_runs_a_pipelined_step_and_it_agrees(program):
    s = wb.Session(program, MESH, [wb.PP("stage", microbatches=4, schedule="1f1b")])
    result = s.run(repeats=1)
    assert result.matches, result


def test_the_estimate_of_a_pipelined_step_is_its_timeline(program):
    plain = wb.Session(program, MESH, [wb.BP("data")]).estimate("h100")
    by = {}
    for kind in ("gpipe", "1f1b", "zero-bubble"):
        s = wb.Session(program, MESH, [wb.PP("stage", microbatches=8, schedule=kind)])
        e = by[kind] = s.estimate("h100")
        pe = e.pipeline
        assert pe is not None and pe.schedule.kind == kind
        assert e.step_s == pe.step_s and e.memory.peak == max(pe.peak)
        assert e.by_kind["collective-permute"] > 0 and e.pipeline.bubble_s > 0
        # a stage holds about a quarter of the blocks: its state is under the unpipelined one
        assert max(sum(st.values()) for st in pe.state) < sum(plain.memory.states.values())
    # 1F1B and zero-bubble hold fewer microbatches' activations than GPipe's M
    assert max(by["1f1b"].pipeline.peak) < max(by["gpipe"].pipeline.peak)
    assert by["gpipe"].pipeline.timeline.peak_in_flight[0] == 8
    assert by["1f1b"].pipeline.timeline.peak_in_flight[0] == 4


def test_the_other_axes_layouts_price_each_stage(program):
    """BP on another axis halves a stage's per-microbatch work; MP adds its all-reduces to
    the forward; the sends carry the local (batch-split) activations."""
    alone = wb.Session(program, MESH, [wb.PP("stage", microbatches=2)]).estimate("h100").pipeline
    bp = wb.Session(program, MESH, [wb.PP("stage", microbatches=2), wb.BP("data")])
    data = bp.estimate("h100").pipeline
    assert data.activations[1] == pytest.approx(alone.activations[1] / 2, rel=0.05)
    assert data.p2p[0] < alone.p2p[0]
    mesh = wb.Mesh({"stage": 4, "model": 2})
    mp = wb.Session(program, mesh, [wb.PP("stage", microbatches=2), wb.MP("model")])
    plain = wb.Session(program, mesh, [wb.MP("model")])
    assert any(c.collective.kind == "all-reduce" for c in plain.estimate("h100").collectives)
    tensor = mp.estimate("h100").pipeline
    assert tensor.state[1]["parameters"] < alone.state[1]["parameters"]


def test_a_pipelined_estimate_names_the_other_axes_collectives(program):
    """Under PP+BP+Z3 the busiest stage's gathers and reduce-scatters are communication,
    by kind, not compute: compute and those collectives add up to the stage's busy time, and
    a ZeRO-3 gather of a weight runs once per microbatch, as the lowering runs it."""
    tail = [wb.BP("data"), wb.Z3("data")]
    by_m = {}
    for m in (2, 4):
        s = wb.Session(program, MESH, [wb.PP("stage", microbatches=m), *tail])
        e = by_m[m] = s.estimate("h100")
        pe = e.pipeline
        busiest = max(range(4), key=pe.busy)
        assert e.by_kind["all-gather"] > 0 and e.by_kind["reduce-scatter"] > 0
        assert e.by_kind["collective-permute"] == pytest.approx(pe.sends_s(busiest))
        assert e.communication_s == pytest.approx(sum(e.by_kind.values()))
        others = e.communication_s - pe.sends_s(busiest)
        assert e.compute_s + others == pytest.approx(pe.busy(busiest))
    # per microbatch, bar the few gathers the optimizer or the outputs need once a step
    assert 1.8 < by_m[4].by_kind["all-gather"] / by_m[2].by_kind["all-gather"] <= 2
    bp = wb.Session(program, MESH, [wb.PP("stage", microbatches=2), wb.BP("data")])
    assert bp.estimate("h100").by_kind["all-gather"] == 0


@pytest.mark.slow  # ~45 s: one compile of a pipelined step
def test_pp_with_zero3_on_another_axis_runs_and_agrees(program):
    """ZeRO-3 beside a pipeline: each stage gathers its weights per microbatch and
    reduce-scatters their gradients over the data axis; the step still agrees."""
    s = wb.Session(program, MESH, [wb.PP("stage", microbatches=2), wb.BP("data"), wb.Z3("data")])
    kinds = {c.kind for c in s.collectives()}
    assert {"all-gather", "reduce-scatter", "collective-permute"} <= kinds
    result = s.run(repeats=1)
    assert result.matches, result


def test_estimate_prices_a_third_party_pipeline():
    p = external.program("eqx_lm")
    mesh = wb.Mesh({"stage": 2, "data": 2, "model": 2})
    s = wb.Session(p, mesh, [wb.PP("stage"), wb.BP("data"), wb.MP("model")])
    pe = s.estimate("h100").pipeline
    assert len(pe.cuts.stages) == 2 and all(st.blocks for st in pe.cuts.stages)
    assert 0 < pe.bubble_share < 1 and all(x > 0 for x in pe.forward)


@pytest.mark.slow
def test_auto_tries_pipelines_and_can_choose_one():
    ex = build("lm", lm.Config.preset("small", n_layers=8, batch=32))
    p = wb.capture(ex.fn, *ex.args)
    mesh = wb.Mesh({"stage": 4, "data": 2})
    s = wb.Session(p, mesh, [wb.Auto(("stage", "data"), goal="memory", budget=50)])
    report = s.history[-1].report(p, mesh, s.state_at(0))
    tried = [c.name for c in report.candidates if c.name.startswith("PP(")]
    assert "PP('stage', microbatches=8, schedule='zero-bubble')" in tried
    assert s.state.pipeline is not None  # the least memory: a pipeline of many microbatches
    chosen = pipeline_of(p, mesh, s.state)
    e = s.estimate("h100")
    assert e.pipeline.schedule == chosen.schedule
    plain = wb.Session(p, mesh, [wb.BP("stage"), wb.BP("data")]).estimate("h100")
    assert e.memory.peak < plain.memory.peak


def test_the_collective_plan_lists_the_sends_with_their_why(program):
    s = wb.Session(program, MESH, [wb.BP("data"), wb.PP("stage", microbatches=4)])
    sends = [c for c in s.collectives() if c.kind == "collective-permute"]
    cuts = pipeline_of(program, MESH, s.state).cuts
    crossing = [v for b in cuts.boundaries for v in b.values]
    assert sorted(c.value for c in sends) == sorted(crossing * 2)  # forward, and the gradient
    assert all(c.axes == ("stage",) and c.count == 4 and c.tactic == 1 for c in sends)
    assert any("sends the gradient of each microbatch's" in c.why for c in sends)
    stream = program.values[crossing[0]]
    assert sends[0].bytes == stream.nbytes // 2 // 4  # BP halves it, a microbatch is a quarter
    assert not [c for c in s.undo().collectives() if c.kind == "collective-permute"]
