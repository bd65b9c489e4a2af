"""Auto is never worse than what it could have chosen: every registered named strategy on
its axes is a candidate, priced from the same state on the same hardware; conflicts are
avoided unless the report says what they cost; the report lists what was compared."""

from functools import cache

import pytest

import workbench as wb
from tests.core.search.test_search import wide_lm
from tests.core.zoo import program as zoo_program
from workbench.core import hardware as hw
from workbench.core.search.candidates import Candidate, choose, decide, price
from workbench.core.search.tree import Auto, Search
from workbench.core.strategies import STRATEGIES
from workbench.models import build, lm

MESH = {"data": 2, "model": 4}


@cache
def program(name: str) -> wb.Program:
    if name in ("lm", "mlp"):
        return zoo_program(name)
    from workbench.models.external import build_external

    ex = build_external(name, "tiny", abstract=True)
    return wb.capture(ex.fn, *ex.args)


def step(program, mesh, schedule) -> float | None:
    """The simulated step of ``schedule`` on H100 (Auto's default), None where it raises."""
    try:
        return wb.Session(program, mesh, schedule).estimate(hw.H100).step_s
    except wb.WorkbenchError:
        return None


def new_conflicts(session, before: int) -> int:
    return len(session.state.conflicts) - len(session.state_at(before).conflicts)


@pytest.mark.parametrize(
    "name",
    [
        "lm",
        pytest.param("hf_gpt2", marks=pytest.mark.slow),
        pytest.param("nnx_lm", marks=pytest.mark.slow),
    ],
)
@pytest.mark.parametrize("start", ["nothing", "BP"])
def test_auto_is_never_slower_than_a_registered_strategy(name, start):
    p, mesh = program(name), wb.Mesh(MESH)
    before = [wb.BP("data")] if start == "BP" else []  # then MP is the composition BP+MP
    auto = Auto("model", budget=10)
    s = wb.Session(p, mesh, [*before, auto])
    report = auto.report(p, mesh, s.state_at(len(before)))
    auto_s = s.estimate(hw.H100).step_s
    assert report.winner.step_s == pytest.approx(auto_s, rel=1e-9)  # it priced what it gives
    priced = {c.name: c for c in report.candidates}
    compared = 0
    for strategy, cls in STRATEGIES.items():  # the registry: strategies added later join in
        theirs = step(p, mesh, [*before, cls("model")])
        candidate = priced[f"{strategy}('model')"]
        assert candidate.applies == (theirs is not None), candidate
        if theirs is not None:
            compared += 1
            assert candidate.step_s == pytest.approx(theirs, rel=1e-9)
            assert auto_s <= theirs * (1 + 1e-9), (strategy, auto_s, theirs)
    assert compared >= 2
    assert new_conflicts(s, len(before)) == len(report.winner.conflicts)
    assert not report.winner.conflicts or "conflict" in report.why


@pytest.mark.slow  # about 5 s: some twenty candidates on two axes
def test_auto_on_both_axes_is_never_slower_than_bp_then_mp():
    p, mesh = program("lm"), wb.Mesh(MESH)
    auto = Auto(("data", "model"), budget=10)
    s = wb.Session(p, mesh, [auto])
    bp_mp = step(p, mesh, [wb.BP("data"), wb.MP("model")])
    assert s.estimate(hw.H100).step_s <= bp_mp * (1 + 1e-9)
    names = {c.name for c in auto.report(p, mesh, s.state_at(0)).candidates}
    assert {f"{n}({a!r})" for n in STRATEGIES for a in ("data", "model")} <= names
    assert any(" + " in n for n in names)  # a composition over both axes


def test_a_named_strategy_wins_where_the_search_finds_less():
    p, mesh = wide_lm(), wb.Mesh({"model": 4})  # tensor parallelism's regime
    auto = Auto("model", budget=1)  # one evaluation: the search barely starts
    s = wb.Session(p, mesh, [auto])
    report = auto.report(p, mesh, s.state_at(0))
    mp = step(p, mesh, [wb.MP("model")])
    search = next(c for c in report.candidates if c.name == "tree search")
    assert search.step_s > mp  # the search alone would have been slower than MP
    assert s.estimate(hw.H100).step_s <= mp * (1 + 1e-9)
    assert report.winner.name in {f"{n}('model')" for n in STRATEGIES}
    assert list(report.tactics) == auto.decisions(p, mesh, s.state_at(0))
    text = str(report)
    assert f"* {report.winner}" in text and str(search) in text and "won: " in text
    namespace: dict = {}  # the export writes the named strategy that won, and rebuilds it
    exec(compile(s.export_code(), "<exported>", "exec"), namespace)
    assert dict(namespace["build"](p).state.shardings) == dict(s.state.shardings)


def test_a_strategy_that_tiles_nothing_is_listed_as_not_applicable():
    p, mesh = program("mlp"), wb.Mesh(MESH)  # no attention, no embedding table
    auto = Auto("model", budget=3)
    s = wb.Session(p, mesh, [auto])
    report = auto.report(p, mesh, s.state_at(0))
    mp = next(c for c in report.candidates if c.name == "MP('model')")
    assert not mp.applies and "MP('model')" in mp.error
    assert "does not apply" in str(report)
    assert report.winner.applies


def test_a_conflicted_candidate_says_what_each_conflict_costs_and_loses_to_a_clean_one():
    p, mesh = program("lm"), wb.Mesh(MESH)
    start = wb.Session(p, mesh, [wb.BP("data"), wb.MP("model")]).state
    auto = Auto("model", budget=3)
    search = Search(p, mesh, start, auto)
    bp = price(p, mesh, start, "BP('model')", (wb.BP("model"),), search)
    assert bp.conflicts and all("costs" in text for text in bp.conflicts)
    s = wb.Session(p, mesh, [wb.BP("data"), wb.MP("model"), auto])
    report = auto.report(p, mesh, s.state_at(2))
    assert not report.winner.conflicts and not s.state.conflicts


def _made_up(name, score, conflicts=(), tactics=("t",)):
    return Candidate(name, tactics, 1.0 / score, 1, score, conflicts)


def test_conflict_free_wins_unless_a_conflicted_candidate_scores_higher():
    clean = _made_up("clean", 2.0)
    worse = _made_up("dirty", 2.0, ("conflict at dot on axis 'model': ...; costs 1 us",))
    assert choose([worse, clean]) is clean  # a tie: the conflict-free one
    better = _made_up("dirty", 3.0, worse.conflicts)
    report = decide(Auto("model"), [clean, better, Candidate("x", (), error="tiles nothing")])
    assert report.winner is better
    assert "1.50x the best conflict-free candidate, clean" in report.why
    assert worse.conflicts[0] in str(report)
    alone = decide(Auto("model"), [better])
    assert "No conflict-free candidate applies" in alone.why
    fewer = _made_up("nothing", 2.0, tactics=())
    assert choose([clean, fewer]) is fewer  # a tie: the one with fewer tactics


def test_named_strategies_are_left_out_when_auto_may_decide_only_some_inputs():
    p, mesh = program("lm"), wb.Mesh(MESH)
    auto = Auto("model", budget=3, inputs="params/**")
    s = wb.Session(p, mesh, [auto])
    report = auto.report(p, mesh, s.state_at(0))
    assert report.winner.name == "tree search"
    assert all("inputs=" in c.error for c in report.candidates if c.name != "tree search")


def test_the_last_progress_report_is_the_winner():
    p, mesh = wide_lm(), wb.Mesh({"model": 4})
    reports = []
    auto = Auto("model", budget=1, callback=reports.append)
    s = wb.Session(p, mesh, [auto])
    assert reports[-1].best_tactics == tuple(auto.report(p, mesh, s.state_at(0)).tactics)
    assert reports[-1].best_step_s == pytest.approx(s.estimate(hw.H100).step_s, rel=1e-9)


def test_ep_and_cp_are_moves_that_say_why_they_do_not_apply():
    # on a dense LM EP finds no experts: listed with the reason, never the winner; on the
    # zoo's mixture of experts it applies on the experts' axis
    p, mesh = program("lm"), wb.Mesh({"data": 2})
    auto = Auto("data", budget=1)
    report = auto.report(p, mesh, wb.Session(p, mesh).state)
    by_name = {c.name: c for c in report.candidates}
    assert "no mixture of experts" in by_name["EP('data')"].error
    assert by_name["CP('data')"].applies and report.winner.name != "EP('data')"
    ex = build("lm", lm.Config.preset("moe"), abstract=True)
    moe, mesh = wb.capture(ex.fn, *ex.args), wb.Mesh({"expert": 4})
    report = Auto("expert", budget=1).report(moe, mesh, wb.Session(moe, mesh).state)
    ep = next(c for c in report.candidates if c.name == "EP('expert')")
    assert ep.applies and not ep.conflicts
