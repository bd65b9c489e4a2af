"""The schedule list shows what each step could not do, as the session says it."""

import html

import pytest

import workbench as wb
from tests.core.propagate.test_not_done import heads_only_axis
from tests.widgets.conftest import on_page
from workbench.core import hardware as hw
from workbench.widgets import Workbench

# builds Workbenches that estimate on every step (about 40 s): in the full suite, not the fast lane
pytestmark = pytest.mark.slow


@pytest.fixture
def bench(program):
    mesh = {"batch": 2, "model": heads_only_axis(program)}
    return on_page(Workbench(program, mesh=mesh, hardware=hw.TPU_V5E, auto_budget=8))


def test_schedule_shows_the_notes_core_gives(bench):
    assert bench.history.notes.value == ""
    assert bench.act("BP", lambda: wb.BP("batch"))
    assert bench.history.notes.value == "" and bench.session.notes() == ()
    assert bench.act("MP", lambda: wb.MP("model"))
    said = bench.session.notes()
    assert said
    shown = bench.history.notes.value
    assert f"step 2 left {len(said)} values it targets whole" in shown
    assert all(html.escape(n, quote=True) in shown for n in said)
    labels = [label for label, _ in bench.history.steps.options]
    assert labels[1] == "1 · BP('batch')"
    assert labels[2] == f"2 · MP('model')   ({len(said)} left whole)"
    bench.history.undo.click()
    assert bench.history.notes.value == ""
    labels = [label for label, _ in bench.history.steps.options]
    assert labels[2] == f"2 · MP('model')   ({len(said)} left whole)   (undone)"


def test_a_strategy_that_tiles_nothing_shows_its_error_and_changes_nothing(program):
    n = 2 * max(program.values[v].shape[d] for v, d in program.anatomy().data)
    bench = on_page(Workbench(program, mesh={"batch": n}, hardware=hw.TPU_V5E))
    assert not bench.act("BP", lambda: wb.BP("batch"))
    assert "tiles nothing" in bench.error.value and bench.session.step == 0
    assert bench.history.notes.value == ""
