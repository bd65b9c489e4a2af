"""The estimate charts, read back from their figure JSON: bars per kind and category holding
the estimate's numbers, the capacity line, the verdict, and one label per schedule step."""

import dataclasses

import pytest

import workbench as wb
from workbench.core import hardware as hw
from workbench.core.estimate import CATEGORIES
from workbench.core.units import format_bytes, format_seconds
from workbench.models import build
from workbench.viz import (
    compare_strategies,
    estimates_over_schedule,
    memory_breakdown,
    schedule_estimates,
    schedule_labels,
    time_breakdown,
)
from workbench.viz.charts import byte_ticks
from workbench.viz.style import DOES_NOT_FIT, FITS

MESH = wb.Mesh({"batch": 2, "model": 4})


@pytest.fixture(scope="module")
def program():
    ex = build("lm", "tiny", abstract=True)
    return wb.capture(ex.fn, *ex.args)


@pytest.fixture(scope="module")
def session(program):
    return wb.Session(program, MESH, [wb.BP("batch"), wb.MP("model")])


@pytest.fixture(scope="module")
def strategies(program):
    schedules = {
        "BP": ({"batch": 8}, [wb.BP("batch")]),
        "BP+MP": ({"batch": 2, "model": 4}, [wb.BP("batch"), wb.MP("model")]),
        "BP+Z3": ({"batch": 8}, [wb.BP("batch"), wb.Z3("batch")]),
    }
    return {
        name: wb.Session(program, wb.Mesh(mesh), tactics).estimate(hw.H100)
        for name, (mesh, tactics) in schedules.items()
    }


def traces(fig, type_=None):
    """Trace name -> trace dict (of one plotly type, if given)."""
    data = fig.to_plotly_json()["data"]
    return {t["name"]: t for t in data if type_ is None or t["type"] == type_}


def shapes(fig, type_=None):
    return [s for s in fig.to_plotly_json()["layout"].get("shapes", []) if s["type"] == type_]


def title(fig) -> str:
    return fig.to_plotly_json()["layout"]["title"]["text"]


def with_capacity(e, capacity):
    return dataclasses.replace(e, memory=dataclasses.replace(e.memory, capacity=capacity))


# -- time ---------------------------------------------------------------------------------------
def test_time_breakdown_has_compute_and_each_kind_present(session):
    e = session.estimate(hw.H100)
    bars = traces(time_breakdown(e), "bar")
    kinds = [k for k, s in e.by_kind.items() if s]
    # compute split by kind (`Estimate.breakdown`), each part after the one before
    parts = [w for w, _ in e.breakdown.rows() if not w.startswith("communication")]
    assert kinds and list(bars) == [*parts, *kinds]
    assert sum(bars[p]["x"][0] for p in parts) == pytest.approx(e.compute_s)
    assert bars[parts[1]]["base"][0] == pytest.approx(bars[parts[0]]["x"][0])
    assert f"MFU {e.breakdown.mfu:.1%}" in title(time_breakdown(e))
    for k in kinds:
        assert list(bars[k]["x"]) == [e.by_kind[k]]
        assert list(bars[k]["y"]) == ["communication"]
    assert sum(bars[k]["x"][0] for k in kinds) == pytest.approx(e.communication_s)


def test_time_breakdown_marks_the_step_and_the_policy(session):
    e = session.estimate(hw.H100)
    fig = time_breakdown(e)
    (line,) = shapes(fig, "line")
    assert line["x0"] == line["x1"] == e.step_s
    assert format_seconds(e.step_s) in title(fig) and e.hardware in title(fig)
    assert "no overlap" in title(fig)
    assert not shapes(fig, "rect")  # nothing hidden
    first = next(t for t in traces(fig, "bar").values() if t["y"][0] == "communication")
    assert first["base"][0] == pytest.approx(e.compute_s)  # communication follows compute


@pytest.mark.parametrize("overlap", ["full", 0.5, "prefetch"])
def test_overlap_slides_communication_under_compute(session, overlap):
    e = session.estimate(hw.H100, overlap=overlap)
    fig = time_breakdown(e)
    (rect,) = shapes(fig, "rect")
    hidden = e.compute_s + e.communication_s - e.step_s
    assert hidden > 0
    assert rect["x1"] - rect["x0"] == pytest.approx(hidden)
    first = next(t for t in traces(fig, "bar").values() if t["y"][0] == "communication")
    assert first["base"][0] == pytest.approx(e.step_s - e.communication_s)
    assert "overlap" in title(fig)


# -- memory -------------------------------------------------------------------------------------
def test_memory_breakdown_stacks_every_category(session):
    e = session.estimate(hw.H100)
    fig = memory_breakdown(e)
    bars = traces(fig, "bar")
    assert list(bars) == list(CATEGORIES)
    for cat in CATEGORIES:
        assert list(bars[cat]["y"]) == [e.memory.at_peak[cat]]
    assert sum(bars[c]["y"][0] for c in CATEGORIES) == e.memory.peak
    assert fig.to_plotly_json()["layout"]["barmode"] == "stack"


def test_capacity_line_and_fits(session):
    e = session.estimate(hw.H100)
    near = with_capacity(e, e.memory.peak * 1.5)  # on the scale
    fig = memory_breakdown(near)
    (line,) = shapes(fig, "line")
    assert line["y0"] == line["y1"] == near.memory.capacity
    layout = fig.to_plotly_json()["layout"]
    assert layout["yaxis"]["range"][1] > near.memory.capacity
    notes = [a["text"] for a in layout["annotations"]]
    assert f"capacity {format_bytes(near.memory.capacity)}" in notes
    assert "✓ fits" in title(fig) and FITS in title(fig)
    assert "does not fit" not in title(fig)


def test_does_not_fit_says_so_in_red(session):
    e = with_capacity(session.estimate(hw.H100), 100_000)
    fig = memory_breakdown(e)
    assert "does not fit" in title(fig) and DOES_NOT_FIT in title(fig)
    assert format_bytes(e.memory.peak - 100_000) in title(fig)
    (line,) = shapes(fig, "line")
    assert line["y0"] == 100_000


def test_a_capacity_far_above_the_peak_is_noted_off_the_scale(session):
    e = session.estimate(hw.H100)  # a tiny model on an 80 GB device
    fig = memory_breakdown(e)
    layout = fig.to_plotly_json()["layout"]
    assert layout["yaxis"]["range"][1] < e.memory.capacity
    assert any("off the scale" in a["text"] for a in layout["annotations"])
    (line,) = shapes(fig, "line")
    assert line["y0"] == e.memory.capacity  # still there, off the axis


def test_byte_ticks_are_round_binary_units():
    ticks = byte_ticks(337.6 * 1024)
    assert ticks["ticktext"] == ["0", "100 KiB", "200 KiB", "300 KiB"]
    assert ticks["tickvals"][1] == 100 * 1024
    assert byte_ticks(80e9)["ticktext"][-1] == "60 GiB"


# -- strategies side by side --------------------------------------------------------------------
def test_compare_strategies_puts_each_number_in_its_bar(strategies):
    fig = compare_strategies(strategies)
    names = list(strategies)
    es = list(strategies.values())
    bars = traces(fig, "bar")
    kinds = [k for k in es[0].by_kind if any(e.by_kind[k] for e in es)]
    assert list(bars) == ["compute", *kinds, *CATEGORIES]
    for t in bars.values():
        assert list(t["x"]) == names
    assert list(bars["compute"]["y"]) == [e.compute_s for e in es]
    for k in kinds:
        assert list(bars[k]["y"]) == [e.by_kind[k] for e in es]
        assert bars[k]["xaxis"] == "x" and bars[k]["yaxis"] == "y"  # the time panel
    for cat in CATEGORIES:
        assert list(bars[cat]["y"]) == [e.memory.at_peak[cat] for e in es]
        assert bars[cat]["xaxis"] == "x2"  # the memory panel
    step = traces(fig)["step time"]
    assert list(step["y"]) == [e.step_s for e in es]
    assert list(step["text"]) == [format_seconds(e.step_s) for e in es]
    (line,) = shapes(fig, "line")
    assert line["y0"] == es[0].memory.capacity and line["yref"] == "y2"
    assert "fastest that fits" in title(fig)


def test_different_capacities_get_a_mark_per_bar(strategies):
    es = dict(strategies)
    es["BP"] = with_capacity(es["BP"], 1e5)
    fig = compare_strategies(es)
    capacity = traces(fig)["capacity"]
    assert list(capacity["y"]) == [e.memory.capacity for e in es.values()]
    assert not shapes(fig, "line")
    verdicts = traces(fig)["peak"]["text"]
    assert verdicts[0].endswith("does not fit") and verdicts[1].endswith("✓")


def test_compare_nothing_says_what_to_pass():
    with pytest.raises(wb.WorkbenchError, match=r"session\.estimate"):
        compare_strategies({})


# -- across the schedule ------------------------------------------------------------------------
def test_estimates_over_schedule_leaves_the_session_where_it_was(program):
    s = wb.Session(program, MESH, [wb.BP("batch"), wb.MP("model")])
    s.undo()
    state = s.state
    es = estimates_over_schedule(s, hw.H100)
    assert s.step == 1 and s.state is state and len(s.redo_stack) == 1
    assert len(es) == 2
    assert es[0].step_s == wb.Session(program, MESH).estimate(hw.H100).step_s
    assert es[1].step_s == s.estimate(hw.H100).step_s
    every = estimates_over_schedule(s, hw.H100, steps=range(3))  # the undone step too
    assert every[2].memory.peak == s.redo().estimate(hw.H100).memory.peak


def test_schedule_chart_has_a_label_per_step(session):
    es = estimates_over_schedule(session, hw.H100)
    labels = schedule_labels(session)
    assert labels == ["0 · nothing", "1 · BP('batch')", "2 · MP('model')"]
    fig = schedule_estimates(es, labels)
    bars = traces(fig, "bar")
    for t in bars.values():
        assert list(t["x"]) == labels
    assert list(bars["compute"]["y"]) == [e.compute_s for e in es]
    assert list(bars["parameters"]["y"]) == [e.memory.at_peak["parameters"] for e in es]
    assert bars["compute"]["yaxis"] == "y" and bars["parameters"]["yaxis"] == "y2"
    assert list(traces(fig)["step time"]["y"]) == [e.step_s for e in es]
    assert format_bytes(es[-1].memory.peak) in title(fig)


def test_schedule_labels_default_and_mismatch(session):
    es = estimates_over_schedule(session, hw.H100, steps=[0, 2])
    fig = schedule_estimates(es)
    assert list(traces(fig, "bar")["compute"]["x"]) == ["step 0", "step 1"]
    with pytest.raises(wb.WorkbenchError, match="one label per estimate"):
        schedule_estimates(es, ["just one"])


def test_long_tactic_labels_are_cut(program):
    s = wb.Session(program, MESH, [wb.Tile("params/layers/0/mlp/w_in", 1, "model")])
    (_, label) = schedule_labels(s)
    assert label.startswith("1 · Tile('params/") and label.endswith("…")
    assert len(label) <= len("1 · ") + 28
