"""The automatic search: it recovers Megatron, composes with manual tactics, respects memory
limits, is deterministic for a seed, and exports as the tactics it chose."""

import gc
from functools import cache

import pytest

import workbench as wb
from workbench.core import hardware as hw
from workbench.core.errors import TacticError
from workbench.core.search.tree import Auto, Search, decision_groups
from workbench.models import build, lm


@cache
def wide_lm():
    """An LM wide enough for compute to matter on an H100, with a small batch: the regime
    where tensor parallelism beats replicating or splitting the batch."""
    config = lm.Config(
        batch=2,
        seq_len=256,
        d_model=2048,
        n_heads=16,
        d_head=128,
        d_ff=8192,
        vocab=4096,
        n_layers=2,
    )
    ex = build("lm", config, abstract=True)
    return wb.capture(ex.fn, *ex.args)


def megatron_weights(program):
    return [n for n in program.names("params/**") if "/attn/" in n or "/mlp/" in n]


@pytest.mark.parametrize("size", [4, 8])
def test_auto_recovers_megatron_from_nothing(size):
    program = wide_lm()
    mesh = wb.Mesh({"model": size})
    auto = wb.Session(program, mesh, [Auto("model")])
    mp = wb.Session(program, mesh, [wb.MP("model")])
    assert {n: auto.sharding(n) for n in megatron_weights(program)} == {
        n: mp.sharding(n) for n in megatron_weights(program)
    }
    assert auto.estimate(hw.H100).step_s <= mp.estimate(hw.H100).step_s


@pytest.mark.slow  # seconds: in the full suite
def test_auto_composes_with_manual_tactics():
    program = wide_lm()
    s = wb.Session(
        program, wb.Mesh({"batch": 2, "model": 4}), [wb.BP("batch"), Auto("model", budget=100)]
    )
    assert str(s.sharding("batch/tokens")) == "i32[2@batch,256]"
    decided = Auto("model", budget=100).decisions(program, s.mesh, s.state_at(1))
    assert decided and all(isinstance(t, wb.Tile) and t.axis == "model" for t in decided)


def test_with_a_memory_limit_plain_bp_exceeds_auto_finds_a_strategy_that_fits():
    program = wide_lm()
    mesh = wb.Mesh({"data": 8})
    bp = wb.Session(program, mesh, [wb.BP("data", dim=1)])  # the batch of 2 splits on its sequence
    limit = 0.5 * bp.estimate(hw.H100).memory.peak
    s = wb.Session(program, mesh, [Auto("data", memory_limit=limit)])
    assert s.estimate(hw.H100).memory.peak <= limit


@pytest.mark.slow  # several seconds: in the full suite, not the fast lane
def test_the_search_is_deterministic_and_reports_progress():
    program = wide_lm()
    mesh = wb.Mesh({"model": 4})
    reports = []
    first = Auto("model", budget=60, seed=3, callback=reports.append).decisions(
        program, mesh, wb.Session(program, mesh).state
    )
    again = Auto("model", budget=60, seed=3).decisions(
        program, mesh, wb.Session(program, mesh).state
    )
    assert first == again
    assert [r.evaluations for r in reports] == sorted(r.evaluations for r in reports)
    assert reports[-1].evaluations <= 60 and reports[-1].best_step_s > 0


def test_decision_groups_tie_a_weight_to_its_moments_and_its_copies_in_every_layer():
    program = wide_lm()
    mesh = wb.Mesh({"model": 4})
    groups = {
        g.key: g for g in decision_groups(program, mesh, wb.Session(program, mesh).state, "model")
    }
    wq = groups["params/layers/*/attn/wq"]
    names = {program.values[m].name for m in wq.members}
    assert names == {
        f"{root}/layers/{i}/attn/wq"
        for root in ("params", "opt_state/m", "opt_state/v")
        for i in range(2)
    }
    assert wq.dims == (0, 1, 2)


def test_exported_code_holds_the_decisions_not_the_search():
    program = wide_lm()
    s = wb.Session(program, wb.Mesh({"model": 4}), [Auto("model", budget=40)])
    code = s.export_code()
    lines = [x.strip() for x in code.splitlines()]
    assert "# Auto('model') decided:" in lines  # the search, named in a comment
    assert not [x for x in lines if "Auto(" in x and not x.startswith("#")]
    assert "Tile(selector=" in code
    namespace: dict = {}
    exec(compile(code, "<exported>", "exec"), namespace)
    assert dict(namespace["build"](program).state.shardings) == dict(s.state.shardings)


def test_bad_search_requests():
    program = wide_lm()
    with pytest.raises(TacticError, match=r"axis 'modle' is not in Mesh\(model=4\)"):
        wb.Session(program, wb.Mesh({"model": 4}), [Auto("modle")])
    with pytest.raises(TacticError, match="goal must be 'time' or 'memory'"):
        Auto("model", goal="speed")
    with pytest.raises(TacticError, match="needs a mesh axis name or a list of them"):
        Auto(3)
    assert Auto(["batch", "model"]) == Auto(("batch", "model"))  # a list is fine


def test_the_data_inputs_are_one_group_first_with_their_batch_dim_as_prior():
    program = wide_lm()
    mesh = wb.Mesh({"batch": 2})
    groups = decision_groups(program, mesh, wb.Session(program, mesh).state, "batch")
    data = groups[0]
    assert {program.values[m].name for m in data.members} == {"batch/tokens", "batch/targets"}
    assert data.data and data.prior == 0 and data.dims == (0, 1)
    assert not any(g.data for g in groups[1:])


def test_small_groups_alike_in_shape_are_decided_together():
    program = wide_lm()
    mesh = wb.Mesh({"model": 4})
    state = wb.Session(program, mesh).state
    listed = {g.key: g for g in decision_groups(program, mesh, state, "model")}
    searched = {g.key: g for g in Search(program, mesh, state, Auto("model", budget=1)).groups}
    norms = [k for k in listed if "/ln" in k]  # norm scales and biases: tiny, shape (d,)
    assert len(norms) >= 4 and not set(norms) & set(searched)
    merged = [g for g in searched.values() if set(listed[norms[0]].members) <= set(g.members)]
    assert len(merged) == 1
    assert {m for k in norms for m in listed[k].members} == set(merged[0].members)
    assert searched["params/layers/*/attn/wq"] == listed["params/layers/*/attn/wq"]
    assert any(g.data for g in searched.values())  # data inputs are never merged


@pytest.mark.slow  # seconds: in the full suite
@pytest.mark.parametrize("cache", [1, 12])
def test_the_state_cache_does_not_change_the_result(cache):
    program = wide_lm()
    mesh = wb.Mesh({"model": 4})
    state = wb.Session(program, mesh).state
    auto = Auto("model", budget=30, seed=1)
    cached = Search(program, mesh, state, auto)
    small = Search(program, mesh, state, auto, state_cache=cache)
    assert small.run() == cached.run()
    assert small.evaluations == cached.evaluations
    assert len(small.states.items) <= cache < len(cached.states.items)
    assert cached.states.hits > 0


def test_search_results_are_held_by_the_program_while_their_state_lives():
    program = wide_lm()
    mesh = wb.Mesh({"model": 4})
    runs = []
    auto = Auto("model", budget=20, callback=runs.append)
    s = wb.Session(program, mesh, [auto])
    searched = len(runs)
    s.export_code()
    s.undo()
    s.redo()
    assert len(runs) == searched  # neither export nor redo searched again
    held = program.cache.get("search.results", dict)
    assert s.state_at(0) in held
    del s
    gc.collect()
    assert len(held) == 0
