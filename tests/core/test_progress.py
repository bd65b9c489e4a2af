"""Long operations show progress on a status line and can be interrupted: a KeyboardInterrupt
propagates, the line ends saying so, and the session and caches are as they were."""

import sys
import time

import jax
import numpy as np
import pytest

import workbench as wb
from workbench.core import progress
from workbench.core.hardware import calibrate as cal
from workbench.core.lowering import rounding
from workbench.core.lowering import run as run_module
from workbench.core.search import tree
from workbench.models import build


@pytest.fixture
def drawn(monkeypatch):
    """Progress drawn on the captured stderr, from the first tick and often."""
    monkeypatch.setenv(progress.ENV, "1")
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    monkeypatch.setattr(progress, "INTERVAL_S", 0.01)


def fresh_mlp():
    """The tiny MLP captured anew: its program's caches are empty."""
    ex = build("mlp", "tiny", abstract=True)
    return wb.capture(ex.fn, *ex.args)


MESH = {"batch": 2, "model": 4}


def snapshot(s: wb.Session):
    return s.step, s.history, s.state, s.redo_stack


def shardings(s: wb.Session) -> dict:
    return {v.name: str(s.sharding(v.name)) for v in s.program.values if v.name}


def interrupt_at(calls: int, fn):
    """``fn`` raising KeyboardInterrupt on its ``calls``-th call."""
    seen = []

    def wrapper(*args, **kwargs):
        seen.append(1)
        if len(seen) == calls:
            raise KeyboardInterrupt
        return fn(*args, **kwargs)

    return wrapper


def recorded(monkeypatch) -> list[str]:
    """The stages reported from now on, in order."""
    stages, stage = [], progress.stage

    def record(text):
        stages.append(text)
        stage(text)

    monkeypatch.setattr(progress, "stage", record)
    return stages


# -- the status line -----------------------------------------------------------------------
def test_a_slow_operation_draws_a_line_rewritten_in_place_that_ends_with_a_newline(
    monkeypatch, capsys
):
    monkeypatch.setattr(progress, "DELAY_S", 0.05)
    monkeypatch.setattr(progress, "INTERVAL_S", 0.01)
    with progress.Status("slow", enabled=True):
        progress.stage("stage 1/2")
        time.sleep(0.15)
        progress.stage("stage 2/2")
        time.sleep(0.1)
    err = capsys.readouterr().err
    assert err.startswith("\r") and err.count("\n") == 1 and err.endswith("\n")
    assert "slow: stage 1/2 [" in err and "slow: stage 2/2, done in" in err


def test_a_fast_operation_draws_nothing(monkeypatch, capsys):
    monkeypatch.setenv(progress.ENV, "1")
    with progress.Status("fast"):
        progress.stage("stage 1/1")
    assert capsys.readouterr().err == ""


def test_the_environment_decides_where_the_caller_does_not(monkeypatch, capsys):
    for value, drawn in (("0", False), ("1", True), ("", False)):  # "": captured, no terminal
        monkeypatch.setenv(progress.ENV, value)
        assert progress.drawing_by_default(sys.stderr) is drawn
    monkeypatch.setenv(progress.ENV, "sometimes")
    with pytest.warns(UserWarning, match="neither 1 nor 0"):
        assert progress.drawing_by_default(sys.stderr) is False


def test_a_callback_replaces_the_line_and_an_interrupt_ends_it(drawn, capsys):
    seen = []
    with progress.Status("quiet", callback=seen.append) as status:
        status.show("a line", lambda: "info")
        time.sleep(0.05)
    assert seen == ["info"] and capsys.readouterr().err == ""
    with pytest.raises(KeyboardInterrupt), progress.Status("outer"), progress.Status("inner"):
        progress.stage("working")
        time.sleep(0.05)
        raise KeyboardInterrupt
    err = capsys.readouterr().err
    assert "outer > inner: working [" in err  # a nested status is drawn in the outer line
    assert err.endswith("\n") and "outer: interrupted after" in err.splitlines()[-1]


# -- Auto ----------------------------------------------------------------------------------
def test_auto_shows_its_evaluations_when_slow_and_nothing_when_fast(monkeypatch, capsys):
    monkeypatch.setenv(progress.ENV, "1")
    program = fresh_mlp()
    wb.Session(program, wb.Mesh(MESH), [wb.BP("batch"), wb.Auto("model", budget=10)])
    assert capsys.readouterr().err == ""  # well under a second
    measure = tree.Search.measure

    def slow(self, state):
        time.sleep(0.02)
        return measure(self, state)

    monkeypatch.setattr(tree.Search, "measure", slow)
    monkeypatch.setattr(progress, "DELAY_S", 0.1)
    monkeypatch.setattr(progress, "INTERVAL_S", 0.02)
    wb.Session(program, wb.Mesh(MESH), [wb.BP("batch"), wb.Auto("model", budget=12, seed=1)])
    err = capsys.readouterr().err
    assert "Auto('model'): " in err and "/12 evaluations, best step " in err
    assert err.endswith("\n") and "done in" in err.splitlines()[-1]
    reports = []
    wb.Session(
        program,
        wb.Mesh(MESH),
        [wb.BP("batch"), wb.Auto("model", budget=12, seed=2, callback=reports.append)],
    )
    assert reports and capsys.readouterr().err == ""  # the callback replaces the line


def test_an_interrupted_auto_leaves_the_session_and_its_results_as_they_were(
    drawn, monkeypatch, capsys
):
    program = fresh_mlp()
    s = wb.Session(program, wb.Mesh(MESH), [wb.BP("batch")])
    before = snapshot(s)
    auto = wb.Auto("model", budget=20)
    measure = tree.Search.measure
    monkeypatch.setattr(tree.Search, "measure", interrupt_at(6, measure))
    with pytest.raises(KeyboardInterrupt):
        s.apply(auto)
    assert snapshot(s) == before
    assert (auto, s.mesh) not in tree._results(program).get(s.state, {})
    assert "interrupted after" in capsys.readouterr().err.splitlines()[-1]
    monkeypatch.setattr(tree.Search, "measure", measure)
    s.apply(auto)
    fresh = wb.Session(fresh_mlp(), wb.Mesh(MESH), [wb.BP("batch"), auto])
    assert s.history == fresh.history and shardings(s) == shardings(fresh)


# -- run -----------------------------------------------------------------------------------
SCHEDULE = (wb.BP("batch"), wb.Auto("model", budget=10))


def test_a_run_interrupted_while_timed_leaves_the_session_as_it_was(drawn, monkeypatch, capsys):
    program = fresh_mlp()
    s = wb.Session(program, wb.Mesh(MESH), list(SCHEDULE))
    before, cached = snapshot(s), dict.fromkeys(program.cache.keys())
    step = run_module.TrainingStep.__call__
    monkeypatch.setattr(run_module.TrainingStep, "__call__", interrupt_at(2, step))
    stages = recorded(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        s.run(repeats=3)
    assert snapshot(s) == before and program.cache.keys() == tuple(cached)
    assert stages == ["compiling the partitioned step", "first step", "timing 1/3"]
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("run (explicit): timing 1/3, interrupted after")


@pytest.mark.slow  # three runs: several seconds
def test_a_run_interrupted_in_its_references_keeps_none_and_runs_again_as_fresh(
    drawn, monkeypatch, capsys
):
    program = fresh_mlp()
    s = wb.Session(program, wb.Mesh(MESH), list(SCHEDULE))
    before = snapshot(s)
    distance = rounding._distance  # mid-way through the rounding runs
    monkeypatch.setattr(rounding, "_distance", interrupt_at(1, distance))
    stages = recorded(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        s.run(repeats=2)
    assert snapshot(s) == before
    assert not program.cache.get("lowering.references", dict)  # not even a part of one
    assert stages[-4:] == [
        "timing 2/2",
        "unpartitioned reference",
        "float64 reference",
        "rounding scales 1/2",
    ]
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("run (explicit): rounding scales 1/2, interrupted after")
    monkeypatch.setattr(rounding, "_distance", distance)
    again = s.run(repeats=1)
    assert snapshot(s) == before and len(program.cache.get("lowering.references", dict)) == 1
    assert capsys.readouterr().err.splitlines()[-1].startswith("run (explicit): outputs agree")
    fresh = wb.Session(fresh_mlp(), wb.Mesh(MESH), list(SCHEDULE)).run(repeats=1)
    assert again.matches and fresh.matches and again.max_abs_error == fresh.max_abs_error
    for a, b in zip(jax.tree.leaves(again.outputs), jax.tree.leaves(fresh.outputs), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_references_are_kept_only_when_complete(monkeypatch):
    program = fresh_mlp()
    flat = run_module.example_inputs(program)
    monkeypatch.setattr(rounding, "_distance", interrupt_at(2, rounding._distance))
    with pytest.raises(KeyboardInterrupt):
        run_module.references(program, flat, cache_key="example")
    assert not program.cache.get("lowering.references", dict)


# -- calibrate -----------------------------------------------------------------------------
@pytest.fixture
def fake_measurements(monkeypatch):
    """calibrate's microbenchmarks replaced by fixed figures, each a little slow: five of
    the drawing thread's intervals, so a loaded host still draws every one."""

    def fixed(value):
        def measure(*args, **kwargs):
            time.sleep(0.05)
            return value

        return measure

    monkeypatch.setattr(cal, "measure_matmul", fixed((1e12, 256)))
    monkeypatch.setattr(cal, "measure_op_overhead", fixed((1e-6, 1e-5, "2/4")))
    monkeypatch.setattr(cal, "measure_memory_bandwidth", fixed((1e11, [1 << 20])))
    monkeypatch.setattr(cal, "measure_transpose_bandwidth", fixed((((65536.0, 5e10),), [65536])))
    monkeypatch.setattr(cal, "measure_first_touch_bandwidth", fixed(2e10))
    monkeypatch.setattr(cal, "measure_collectives", fixed(([], "1 and 2")))
    monkeypatch.setattr(cal, "memory_capacity", lambda devices: (1e10, "fixed"))


def test_calibrate_shows_its_measurements_and_an_interrupt_leaves_nothing_behind(
    drawn, fake_measurements, monkeypatch, capsys
):
    monkeypatch.setattr(
        cal, "measure_transpose_bandwidth", interrupt_at(1, cal.measure_transpose_bandwidth)
    )
    with pytest.raises(KeyboardInterrupt):
        cal.calibrate(collectives=False)
    err = capsys.readouterr().err
    assert "calibrate: measurement 1/" in err and ": matmul in float32" in err
    assert "interrupted after" in err.splitlines()[-1]
    first = cal.calibrate(collectives=False)  # the interrupt fired once: this one completes
    err = capsys.readouterr().err
    total = err.split("measurement 1/")[1].split(":")[0]
    assert f"measurement {total}/{total}" in err and "done in" in err.splitlines()[-1]
    second = cal.calibrate(collectives=False)
    assert first.figures() == second.figures() and first.sources.keys() == second.sources.keys()
