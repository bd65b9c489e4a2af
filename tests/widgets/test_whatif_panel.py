"""The What-if tab, driven by clicks: "Sweep" prices the session's program over the chip
kinds, counts and stages given, and shows core's answers and the Pareto chart; bad input
says what would work, in the panel, and leaves the session as it was."""

import pytest

from tests.widgets.conftest import on_page
from workbench.core import hardware as hw
from workbench.viz.whatif import answer_rows
from workbench.widgets import Workbench, render


@pytest.fixture
def bench(program):
    return on_page(Workbench(program, mesh={"batch": 2, "model": 4}, hardware=hw.H100))


def test_sweep_shows_cores_answers(bench):
    panel = bench.whatif
    assert bench.sections.titles[-1] == "What if"
    panel.chips.value, panel.stages.value = "2, 4", "1"
    panel.kinds.value = ("H100 SXM", "A100 80GB SXM")
    panel.run_button.click()
    assert not panel.error.value and panel.result is not None
    assert {p.hardware for p in panel.result.points} == {"H100 SXM", "A100 80GB SXM"}
    assert {p.chips for p in panel.result.points} == {2, 4}
    assert panel.answers.value == render.answers(answer_rows(panel.result))
    assert "smallest cluster that fits" in panel.answers.value
    assert "plans in" in panel.progress.value
    assert bench.session.step == 0  # a sweep prices; it applies nothing


@pytest.mark.parametrize(
    "chips, stages, kinds, match",
    [
        ("8, x", "1", ("H100 SXM",), "chips: give positive whole numbers"),
        ("8", "0", ("H100 SXM",), "stages: give positive whole numbers"),
        ("8", "1", (), "choose at least one chip kind"),
    ],
)
def test_bad_input_says_what_would_work(bench, chips, stages, kinds, match):
    panel = bench.whatif
    panel.chips.value, panel.stages.value, panel.kinds.value = chips, stages, kinds
    panel.run_button.click()
    assert match in panel.error.value and panel.result is None
    assert bench.session.step == 0
