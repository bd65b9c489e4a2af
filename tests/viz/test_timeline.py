"""The overlap timeline: its lanes hold the estimate's numbers and end at its step time."""

from __future__ import annotations

import math

import pytest

import workbench as wb
from workbench.core import hardware as hw
from workbench.core.errors import InputError
from workbench.models import build
from workbench.viz.timeline import overlap_timeline, timeline_segments

POLICIES = ("none", "full", "prefetch", 0.5)


@pytest.fixture(scope="module")
def program():
    ex = build("lm", "tiny", abstract=True)
    return wb.capture(ex.fn, *ex.args)


@pytest.fixture(scope="module")
def sessions(program):
    data, model = wb.Mesh({"data": 8}), wb.Mesh({"model": 4})
    return {
        "DP": wb.Session(program, data, [wb.BP("data")]),
        "ZeRO-3": wb.Session(program, data, [wb.BP("data"), wb.Z3("data")]),
        "MP": wb.Session(program, model, [wb.MP("model")]),
    }


def lane(segments, name, hidden=None):
    return [s for s in segments if s["lane"] == name and (hidden is None or s["hidden"] is hidden)]


def total(segments) -> float:
    return sum(s["seconds"] for s in segments)


@pytest.mark.parametrize("overlap", POLICIES)
@pytest.mark.parametrize("name", ["DP", "ZeRO-3", "MP"])
def test_lanes_hold_the_estimates_numbers_and_end_at_its_step(sessions, name, overlap):
    s = sessions[name]
    e = s.estimate(hw.H100, overlap=overlap)
    segs = timeline_segments(s, hw.H100, overlap)
    assert math.isclose(total(lane(segs, "compute")), e.compute_s, rel_tol=1e-9)
    assert math.isclose(total(lane(segs, "communication")), e.communication_s, rel_tol=1e-9)
    end = max(x["start"] + x["seconds"] for x in segs)
    assert math.isclose(end, e.step_s, rel_tol=1e-9)
    hidden = total(lane(segs, "communication", hidden=True))
    exposed = total(lane(segs, "communication", hidden=False))
    assert math.isclose(e.step_s, max(e.compute_s, hidden) + exposed, rel_tol=1e-9)
    for x in lane(segs, "communication", hidden=True):  # behind compute, never past the span
        assert x["start"] >= 0 and x["start"] + x["seconds"] <= max(e.compute_s, hidden) * (
            1 + 1e-9
        )
    for x in lane(segs, "communication", hidden=False):  # on the critical path: after it
        assert x["start"] >= max(e.compute_s, hidden) * (1 - 1e-9)


def test_none_hides_nothing_and_full_hides_the_shorter(sessions):
    s = sessions["ZeRO-3"]
    assert not lane(timeline_segments(s, hw.H100, "none"), "communication", hidden=True)
    e = s.estimate(hw.H100, overlap="full")
    hidden = total(lane(timeline_segments(s, hw.H100, "full"), "communication", hidden=True))
    assert math.isclose(hidden, min(e.compute_s, e.communication_s), rel_tol=1e-9)


def test_prefetch_hides_dp_gradients_but_not_megatrons_activation_all_reduces(sessions):
    dp = timeline_segments(sessions["DP"], hw.H100, "prefetch")
    grads = [x for x in lane(dp, "communication") if x["phase"] == "optimizer"]
    assert grads and all(x["hidden"] for x in grads)
    mp = timeline_segments(sessions["MP"], hw.H100, "prefetch")
    inside = [x for x in lane(mp, "communication") if x["phase"] in ("forward", "backward")]
    assert inside and not any(x["hidden"] for x in inside)
    counts = sum(x["count"] for x in lane(mp, "communication"))
    assert counts == sum(c.count for c in sessions["MP"].collectives())


def test_zero3_prefetch_hides_weight_gathers_from_the_phase_that_uses_them(sessions):
    segs = timeline_segments(sessions["ZeRO-3"], hw.H100, "prefetch")
    gathers = [x for x in lane(segs, "communication", hidden=True) if x["kind"] == "all-gather"]
    assert {x["phase"] for x in gathers} >= {"forward"}
    backward = next(x for x in lane(segs, "compute") if x["kind"] == "backward")
    for x in lane(segs, "communication", hidden=True):
        if x["phase"] == "optimizer":  # a gradient's reduction runs in the backward pass
            assert x["start"] >= backward["start"] - 1e-12 or x["start"] == 0.0


def test_figure_has_both_lanes_and_the_step_line(sessions):
    s = sessions["ZeRO-3"]
    fig = overlap_timeline(s, hw.H100, "prefetch").to_plotly_json()
    rows = {t["y"][0] for t in fig["data"]}
    assert rows == {"compute", "communication"}
    bars = sum(t["x"][0] for t in fig["data"])
    e = s.estimate(hw.H100, overlap="prefetch")
    assert math.isclose(bars, e.compute_s + e.communication_s, rel_tol=1e-9)
    lines = [x for x in fig["layout"]["shapes"] if x["type"] == "line"]
    assert any(math.isclose(x["x0"], e.step_s) for x in lines)
    assert "not estimated" in fig["layout"]["title"]["text"]


def test_bad_input_says_what_would_work(sessions):
    with pytest.raises(InputError, match="Session"):
        timeline_segments(sessions["DP"].estimate(hw.H100), hw.H100)
    with pytest.raises(InputError, match="overlap"):
        timeline_segments(sessions["DP"], hw.H100, "sometimes")
