"""The placement tab, driven by clicks: it lists ``Session.placements`` as core ranks them,
draws the chosen one and the reductions synthesised under it, and "Place" adds a step the
estimate follows and undo takes back; with nothing to choose it says so, and a failing
place says why in the panel and changes nothing."""

import dataclasses
import re

import pytest

import workbench as wb
from tests.widgets.conftest import MESH, on_page
from workbench.core import hardware as hw
from workbench.core.errors import WorkbenchError
from workbench.core.hardware.placement import Placement
from workbench.core.units import format_seconds
from workbench.viz import placement_picture, synthesis_rows
from workbench.widgets import Workbench, render
from workbench.widgets.placement import NONE_SPANS

NODES_OF_4 = hw.H100.with_group_sizes({"nvlink": 4})  # the 8 devices on two nodes
SCHEDULE = [wb.BP("batch"), wb.MP("model")]


def make(program, hardware=NODES_OF_4, mesh=MESH, schedule=SCHEDULE) -> Workbench:
    return on_page(Workbench(program, mesh=mesh, hardware=hardware, schedule=schedule))


def opened(bench: Workbench) -> Workbench:
    """Open the placement tab, as a click on its title does."""
    bench.sections.selected_index = list(bench.sections.children).index(bench.placement.box)
    return bench


@pytest.fixture
def bench(program):
    return opened(make(program))


def labels(bench) -> list[str]:
    return [label for label, _ in bench.placement.choice.options]


def cells(svg: str) -> list[tuple[str, int]]:
    return [(a, int(d)) for a, d in re.findall(r'data-axis="(\w+)" data-device="(\d+)"', svg)]


def state(b):
    s = b.session
    return (s.step, s.state, tuple(map(str, s.history)), b.summary.value, b.status.value)


def failed_in(b, line, *words):
    """Exactly ``line`` (and the top error line) says what failed."""
    assert all(word in line.value for word in words), line.value
    assert all(word in b.error.value for word in words), b.error.value
    others = [x for x in b.error_lines() if x is not line and x.value]
    assert not others, [x.value for x in others]


def test_it_ranks_only_while_its_tab_is_open(program, monkeypatch):
    b = make(program)
    calls = []
    real = b.session.placements
    monkeypatch.setattr(b.session, "placements", lambda *a, **k: calls.append(a) or real(*a, **k))
    b.history.undo.click()
    b.history.redo.click()
    assert calls == [] and labels(b) == []
    opened(b)
    assert len(calls) == 1 and len(labels(b)) == 2 and not b.error.value
    b.history.undo.click()  # while it is open, every step ranks again
    assert len(calls) == 2
    b.sections.selected_index = 0
    b.history.redo.click()
    assert len(calls) == 2
    opened(b)  # opened again after a step: ranked for the step now
    assert len(calls) == 3 and b.session.step == 2


def test_it_lists_the_placements_as_core_ranks_them(bench):
    panel = bench.placement
    ranked = bench.session.placements(NODES_OF_4)
    assert ranked.total == len(ranked) == 2 == len(labels(bench))
    fastest = ranked[0].estimate.step_s
    for i, (label, r) in enumerate(zip(labels(bench), ranked, strict=True)):
        assert label.startswith(f"{i + 1} · step {format_seconds(r.estimate.step_s)}")
        assert f"{r.estimate.step_s / fastest:.2f}x" in label and label.endswith(str(r.placement))
    assert "The 2 placements" in panel.head.value and "No Place step yet" in panel.head.value
    assert panel.chosen().placement == ranked[0].placement  # the fastest, to start with
    assert "wb-place" in panel.place_button._dom_classes
    assert "wb-placement-choice" in panel.choice._dom_classes


def test_the_picture_draws_every_device_once_per_axis_and_follows_the_choice(bench):
    panel = bench.placement
    ranked = bench.session.placements(NODES_OF_4)
    for i, r in enumerate(ranked):
        panel.choice.value = i
        svg = panel.picture.value
        assert placement_picture(r.placement, bench.session.mesh) in svg
        for axis in MESH:
            assert sorted(d for a, d in cells(svg) if a == axis) == list(range(8))
    assert not bench.error.value


def test_the_synthesised_reductions_of_the_chosen_placement(bench):
    panel = bench.placement
    ranked = bench.session.placements(NODES_OF_4)
    spans = [i for i, r in enumerate(ranked) if r.placement.of("model") == (2, 2)]
    (i,) = spans
    panel.choice.value = 1 - i  # model on one node: nothing spans levels
    assert panel.reductions.value == render.note(NONE_SPANS)
    panel.choice.value = i
    shown = panel.reductions.value
    (row,) = synthesis_rows(ranked[i].estimate)
    for text in ("RS nvlink", "AR infiniband", "AG nvlink", "AR nvlink+infiniband"):
        assert text in shown
    assert format_seconds(row["seconds"]) in shown and format_seconds(row["default_s"]) in shown


def test_place_is_a_step_the_estimate_follows_and_undo_takes_back(bench):
    panel, s = bench.placement, bench.session
    before = (bench.summary.value, s.step, s.estimate(NODES_OF_4).step_s)
    ranked = s.placements(NODES_OF_4)
    slow = ranked[1]
    panel.choice.value = 1
    panel.place_button.click()
    assert not bench.error.value, bench.error.value
    assert s.history[-1] == wb.Place.of(slow) and s.state.placement == slow.placement
    assert "step 3 of 3" in bench.status.value and "Place(" in bench.export.value
    assert labels(bench)[1].endswith("(placed)") and panel.choice.value == 1
    assert render.esc(f"Placed: {slow.placement}") in panel.head.value
    assert [label for label, _ in bench.history.steps.options][-1].startswith("3 · Place(")
    e = s.estimate(NODES_OF_4)
    assert e.step_s == pytest.approx(slow.estimate.step_s) and e.step_s != before[2]
    assert bench.summary.value == render.estimate(e) != before[0]

    bench.history.undo.click()
    assert s.state.placement is None and s.step == 2
    assert (bench.summary.value, s.step, s.estimate(NODES_OF_4).step_s) == before
    assert not any("(placed)" in label for label in labels(bench))
    assert "No Place step yet" in panel.head.value


def test_one_level_says_there_is_nothing_to_choose(program):
    b = opened(make(program, hardware=hw.CPU))
    panel = b.placement
    assert "has one level (host)" in panel.head.value
    assert "no placement to choose" in panel.head.value
    assert panel.choice.layout.display == "none" == panel.place_button.layout.display
    for axis in MESH:  # still drawn: where the devices lie
        assert sorted(d for a, d in cells(panel.picture.value) if a == axis) == list(range(8))
    assert not b.error.value


def test_one_placement_says_so_and_a_hardware_switch_redraws(bench):
    bench.spec.value = hw.TPU_V5E.name  # 8 devices in one ici group of 256
    panel = bench.placement
    assert "has one placement" in panel.head.value and "Nothing to choose" in panel.head.value
    assert "TPU v5e" in panel.head.value and len(labels(bench)) == 1
    assert panel.choice.layout.display == "none" == panel.place_button.layout.display
    assert not bench.error.value


def test_a_placement_that_does_not_apply_says_why(bench):
    bench.placement.place_button.click()
    bench.spec.value = hw.TPU_V5E.name
    note = bench.session.estimate(hw.TPU_V5E).note
    assert note and render.esc(note) in bench.placement.head.value


def test_a_mesh_that_does_not_fill_the_nodes_is_said_plainly(program):
    b = opened(make(program, mesh={"batch": 2, "model": 3}, schedule=()))
    assert "No placement to choose on H100 SXM" in b.placement.head.value
    assert "does not fill whole groups" in b.placement.head.value
    assert labels(b) == [] and b.placement.picture.value == "" and not b.error.value


def test_a_failing_place_shows_in_the_panel_and_changes_nothing(bench, monkeypatch):
    before = state(bench)

    def broken(_):
        raise RuntimeError("scheduler on fire")

    monkeypatch.setattr(bench.session, "place", broken)
    bench.placement.place_button.click()
    failed_in(bench, bench.placement.error, "RuntimeError: scheduler on fire", "traceback")
    assert state(bench) == before
    monkeypatch.undo()
    bench.placement.place_button.click()  # the next action clears the error lines
    assert not bench.error.value and bench.session.step == before[0] + 1


def test_a_placement_of_another_mesh_is_refused_with_cores_message(bench):
    """As if the panel's list were left from another session: core refuses the step."""
    panel = bench.placement
    other = Placement(("nvlink", "infiniband"), (("data", (1, 2)), ("model", (4, 1))))
    panel.ranked[0] = dataclasses.replace(panel.ranked[0], placement=other)
    before = state(bench)
    panel.place_button.click()
    failed_in(bench, panel.error, render.esc("places axes ['data', 'model']"), "Place(")
    assert isinstance(bench.last_error, WorkbenchError) and "traceback" not in panel.error.value
    assert state(bench) == before


def test_a_given_spec_keeps_its_place_in_the_hardware_list(program):
    """A spec of the user's named like a preset (``with_group_sizes`` keeps the name) is
    its own entry: choosing another and coming back brings the user's spec back, not the
    preset of its name."""
    b = make(program)
    given = b.spec.value
    assert given == f"{hw.H100.name} (given)" and b.hardware is NODES_OF_4
    assert hw.H100.name in [label for label, _ in b.spec.options]
    b.spec.value = hw.TPU_V5E.name
    assert b.hardware is hw.TPU_V5E
    b.spec.value = given
    assert b.hardware is NODES_OF_4
    b.spec.value = hw.H100.name
    assert b.hardware is hw.H100
    # a preset given as it is: no second entry
    assert make(program, hardware=hw.H100).spec.value == hw.H100.name
