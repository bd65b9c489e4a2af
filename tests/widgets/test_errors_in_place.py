"""A failure shows in the panel where the user acted (and in the error line at the top),
the session is left as it was, and every panel shows that session."""

import pytest

import workbench as wb
from tests.widgets.conftest import MESH, on_page
from workbench.core import hardware as hw
from workbench.core.errors import DeviceError, WorkbenchError
from workbench.widgets import Workbench


@pytest.fixture
def bench(program):
    b = on_page(Workbench(program, mesh=MESH, hardware=hw.TPU_V5E, auto_budget=8))
    b.strategies.buttons["BP"].click()
    assert b.session.step == 1 and not b.error.value
    return b


def state(b):
    s = b.session
    views = (b.status, b.summary, b.table, b.export, b.run_result, b.history.steps, b.auto.label)
    return (s.step, s.state, tuple(map(str, s.history)), b.graph.svg, [v.value for v in views])


def failed_in(b, line, *words):
    """Exactly ``line`` (and the top error line) says what failed."""
    assert all(word in line.value for word in words), line.value
    assert all(word in b.error.value for word in words), b.error.value
    others = [x for x in b.error_lines() if x is not line and x.value]
    assert not others, [x.value for x in others]


def test_a_bad_tactic_shows_in_the_tactic_panel(bench):
    before = state(bench)
    bench.builder.value.value = "params/nothing"
    bench.builder.apply_button.click()
    failed_in(bench, bench.builder.error, "matches no value")
    assert state(bench) == before
    bench.strategies.buttons["MP"].click()  # the next action clears every error line
    assert not bench.error.value and not any(x.value for x in bench.error_lines())


def test_auto_refused_shows_in_the_auto_panel(bench):
    before = state(bench)
    bench.auto.budget.value = 0
    bench.auto.run_button.click()
    failed_in(bench, bench.auto.error, "budget=0")
    assert isinstance(bench.last_error, WorkbenchError) and state(bench) == before


def test_a_strategy_and_an_undo_fail_where_they_were_clicked(bench, monkeypatch):
    bench.history.reset.click()
    bench.history.undo.click()
    failed_in(bench, bench.history.error, "nothing to undo")

    def broken(tactic):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(bench.session, "apply", broken)
    before = state(bench)
    bench.strategies.buttons["MP"].click()
    failed_in(bench, bench.strategies.error, "RuntimeError: disk on fire", "traceback")
    assert state(bench) == before


def test_a_failed_run_shows_in_the_run_panel_and_the_panel_its_state(bench, monkeypatch):
    def no_devices(**_):
        raise DeviceError("the mesh needs 8 devices and 1 is attached; attach more")

    monkeypatch.setattr(bench.session, "run", no_devices)
    before = state(bench)
    bench.run_button.click()
    failed_in(bench, bench.run_error, "8 devices")
    assert "running" not in bench.run_result.value and state(bench) == before


def test_a_bad_export_shows_in_the_export_panel(bench, tmp_path, monkeypatch):
    before = state(bench)
    bench.save_path.value = str(tmp_path)  # a folder, not a file
    bench.save_button.click()
    failed_in(bench, bench.save_error, "save failed")
    assert state(bench) == before

    def broken():
        raise WorkbenchError("this program has no plain-JAX form")

    monkeypatch.setattr(bench.session, "export_jax", broken)
    bench.export_kind.value = "plain JAX"
    failed_in(bench, bench.export_error, "no plain-JAX form")
    bench.export_kind.value = "Python"
    assert not bench.export_error.value and "BP(" in bench.export.value


def test_a_view_that_fails_says_so_in_its_panel_and_the_rest_are_drawn(bench, monkeypatch):
    def broken(*_, **__):
        raise RuntimeError("table on fire")

    monkeypatch.setattr("workbench.widgets.workbench.collective_rows", broken)
    bench.strategies.buttons["MP"].click()
    failed_in(bench, bench.table_error, "table on fire")
    assert bench.session.step == 2 and "MP(" in bench.export.value
    assert "step 2 of 2" in bench.status.value


def test_every_panel_is_a_wb_panel(bench):
    panels = {c[9:] for p in _walk(bench) for c in p._dom_classes if c.startswith("wb-panel-")}
    panels.discard("error")
    expected = {"session", "strategies", "tactic", "auto", "history", "graph", "estimate"}
    assert panels >= expected | {"sections", "anatomy", "export"}
    assert len([p for p in _walk(bench) if "wb-panel-error" in p._dom_classes]) == len(
        bench.error_lines()
    )


def _walk(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from _walk(child)


def test_schedule_given_at_the_start_still_opens(program):
    b = on_page(Workbench(program, mesh=MESH, schedule=[wb.BP("batch")]))
    assert b.session.step == 1 and not b.error.value
