"""The pipeline charts draw the simulated timeline: its items, its idle time, its makespan and
the activations each stage holds."""

from __future__ import annotations

import itertools
import math

import pytest

import workbench as wb
from workbench.core.errors import InputError
from workbench.core.estimate.pipelined import price_pipeline
from workbench.core.estimate.timeline import simulate
from workbench.core.plan.schedule import schedule
from workbench.models import build
from workbench.viz.pipeline import PASS_COLORS, pipeline_memory, pipeline_timeline

S, M = 4, 8
CASES = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zero-bubble", 1)]
# unequal stages and a send cost, so that idle time falls between items, not only at the ends
FORWARD = [1.0, 1.3, 0.8, 1.1]
BACKWARD = [2.0, 2.4, 1.7, 2.2]
WEIGHT = [0.9, 1.0, 0.7, 1.2]


@pytest.fixture(scope="module", params=CASES, ids=[k for k, _ in CASES])
def timeline(request):
    kind, v = request.param
    return simulate(schedule(kind, S, M, v), FORWARD, BACKWARD, WEIGHT, p2p=0.05)


def bars(fig, name=None):
    """(trace name, y, base, x) of every bar trace, or of those whose name starts with `name`."""
    out = []
    for t in fig.to_plotly_json()["data"]:
        if t["type"] == "bar" and (name is None or t["name"].startswith(name)):
            out += [(t["name"], y, b, x) for y, b, x in zip(t["y"], t["base"], t["x"])]
    return out


def test_one_bar_per_work_item_where_it_runs(timeline):
    sched = timeline.schedule
    fig = pipeline_timeline(timeline)
    passes = 3 if sched.split_backward else 2
    items = [b for b in bars(fig) if not b[0].startswith("idle")]
    assert len(items) == S * M * passes * sched.virtual_stages
    drawn = sorted((y, round(b, 9), round(b + x, 9)) for _, y, b, x in items)
    want = sorted(
        (f"stage {slot.stage}", round(slot.start, 9), round(slot.end, 9))
        for row in timeline.slots
        for slot in row
    )
    assert drawn == want
    # each pass in its own colour, one trace per pass
    data = fig.to_plotly_json()["data"]
    colors = {
        t["name"][0]: t["marker"]["color"] for t in data if t["name"][:2] in ("F:", "B:", "W:")
    }
    assert colors == {k: PASS_COLORS[k] for k in ("FBW" if sched.split_backward else "FB")}


def test_labels_name_microbatch_and_chunk(timeline):
    v = timeline.schedule.virtual_stages
    forward = next(
        t
        for t in pipeline_timeline(timeline).to_plotly_json()["data"]
        if t["name"].startswith("F:")
    )
    slots = [slot for row in timeline.slots for slot in row if slot.work.kind == "F"]
    expected = [
        f"{s.work.microbatch}.{s.work.chunk}" if v > 1 else f"{s.work.microbatch}" for s in slots
    ]
    assert list(forward["text"]) == expected
    first = slots[0]
    assert f"microbatch {first.work.microbatch}" in forward["customdata"][0]
    assert f"stage {first.stage}" in forward["customdata"][0]
    assert ("chunk" in forward["customdata"][0]) == (v > 1)


def test_idle_spans_add_up_to_each_stages_bubble(timeline):
    idle = bars(pipeline_timeline(timeline), "idle")
    for s in range(S):
        spans = [x for _, y, _, x in idle if y == f"stage {s}"]
        assert all(x > 0 for x in spans)
        assert math.isclose(sum(spans), timeline.idle[s], rel_tol=1e-9, abs_tol=1e-9)
    # idle spans and items never overlap on a stage, and fill it to the makespan
    items = bars(pipeline_timeline(timeline))
    for s in range(S):
        row = sorted((b, b + x) for _, y, b, x in items if y == f"stage {s}")
        assert math.isclose(row[0][0], 0.0, abs_tol=1e-12)
        assert math.isclose(row[-1][1], timeline.makespan, rel_tol=1e-12)
        assert all(
            math.isclose(a[1], b[0], rel_tol=1e-9, abs_tol=1e-12)
            for a, b in itertools.pairwise(row)
        )


def test_makespan_line_and_subtitle(timeline):
    sched = timeline.schedule
    layout = pipeline_timeline(timeline).to_plotly_json()["layout"]
    (line,) = [sh for sh in layout["shapes"] if sh.get("line", {}).get("dash") == "dash"]
    assert line["x0"] == line["x1"] == timeline.makespan
    title = layout["title"]["text"]
    for part in (
        sched.kind,
        f"S={S}",
        f"M={M}",
        f"v={sched.virtual_stages}",
        f"{timeline.bubble_share:.1%}",
    ):
        assert part in title
    # stage 0 is the top row
    assert list(layout["yaxis"]["categoryarray"]) == [f"stage {s}" for s in reversed(range(S))]


def test_memory_peaks_are_the_timelines(timeline):
    v = timeline.schedule.virtual_stages
    data = pipeline_memory(timeline).to_plotly_json()["data"]
    for s in range(S):
        (line,) = [t for t in data if t["name"] == f"stage {s}"]
        (mark,) = [t for t in data if t["name"] == f"stage {s} peak"]
        assert line["line"]["shape"] == "hv"
        assert math.isclose(max(line["y"]), timeline.peak_in_flight[s])
        assert math.isclose(mark["y"][0], timeline.peak_in_flight[s])
        assert math.isclose(mark["y"][0] * v, timeline.peak_chunks[s])
        assert line["x"][-1] == timeline.makespan and line["y"][-1] == 0
        # the mark sits where the line first reaches the peak
        i = next(i for i, y in enumerate(line["y"]) if math.isclose(y, mark["y"][0]))
        assert line["x"][i] == mark["x"][0]


def test_the_schedules_differ_where_they_should():
    """1F1B holds fewer activations than GPipe on stage 0 and zero-bubble idles less: the
    charts follow the timeline, not a fixed shape."""
    runs = {
        k: simulate(schedule(k, S, M, v), FORWARD, BACKWARD, WEIGHT, p2p=0.05) for k, v in CASES
    }
    peak = {k: max(pipeline_memory(t).to_plotly_json()["data"][0]["y"]) for k, t in runs.items()}
    assert peak["gpipe"] == M and peak["1f1b"] == S
    idle = {k: sum(x for *_, x in bars(pipeline_timeline(t), "idle")) for k, t in runs.items()}
    assert idle["zero-bubble"] < idle["1f1b"]


def test_a_pipeline_estimate_draws_its_timeline():
    ex = build("lm", "tiny", abstract=True)
    e = price_pipeline(wb.capture(ex.fn, *ex.args), 2, 4, wb.hardware.H100, schedule="1f1b")
    fig = pipeline_timeline(e)
    assert len([b for b in bars(fig) if not b[0].startswith("idle")]) == 2 * 4 * 2
    assert e.hardware in fig.layout.title.text
    assert len([t for t in pipeline_memory(e).data if t.name.endswith("peak")]) == 2
    assert pipeline_timeline(e, title="mine").layout.title.text.startswith("mine")


@pytest.mark.parametrize("draw", [pipeline_timeline, pipeline_memory])
@pytest.mark.parametrize("bad", [None, schedule("1f1b", 2, 4), [1.0, 2.0]])
def test_bad_input_says_what_works(draw, bad):
    with pytest.raises(InputError, match=r"Timeline or PipelineEstimate, got .*simulate"):
        draw(bad)
