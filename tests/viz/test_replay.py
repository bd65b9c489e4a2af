"""A tactic's propagation as frames over the drawing, and the filmstrip of a few of them."""

import re

import pytest

import workbench as wb
from workbench.models import build
from workbench.viz import (
    axis_colors,
    default_expand,
    filmstrip,
    find_value,
    graph_picture,
    replay_frames,
    to_svg,
)
from workbench.viz.replay import cut_points
from workbench.viz.style import CONFLICT

from .programs import MESH


@pytest.fixture(scope="module")
def session():
    ex = build("lm", "tiny")
    return wb.Session(wb.capture(ex.fn, *ex.args), MESH, [wb.BP("batch"), wb.MP("model")])


@pytest.fixture(scope="module")
def picture(session):
    s = session
    return graph_picture(
        s.program, s.state, s.mesh, collectives=s.collectives(), collapse="blocks",
        expand=default_expand(s.program),
    )  # fmt: skip


def test_one_frame_per_event_in_order_in_the_axis_colour(session, picture):
    events = session.events()
    frames = replay_frames(picture, session.program, events, session.mesh)
    assert (
        [f["index"] for f in frames] == [e.index for e in events] == list(range(1, len(events) + 1))
    )
    colors = axis_colors(session.mesh)
    for f, e in zip(frames, events):
        assert f["text"] == e.text and f["value"] == e.value
        assert f["color"] == (CONFLICT if e.kind == "conflict" else colors[e.axis])
    # every event lights something: the value's edges, or the box holding it
    assert all(f["values"] or f["op"] for f in frames)
    ids = set(re.findall(r'<g id="([^"]+)"', to_svg(picture.digraph)))
    assert all(set(f["values"]) <= ids for f in frames)


def test_a_step_replays_its_own_tactic(session, picture):
    bp = replay_frames(picture, session.program, session.events(1), session.mesh)
    assert {f["axis"] for f in bp} == {"batch"}
    assert replay_frames(picture, session.program, session.events(0), session.mesh) == []


def test_filmstrip(session, picture):
    frames = replay_frames(picture, session.program, session.events(), session.mesh)
    strip = filmstrip(to_svg(picture.digraph), frames, count=4, columns=2, title="MP")
    assert strip.startswith("<svg") and strip.count("<svg") == 5
    assert [int(k) for k in re.findall(r"event (\d+) of", strip)] == cut_points(len(frames), 4)
    ids = re.findall(r'\bid="([^"]+)"', strip)
    assert len(ids) == len(set(ids))  # each frame's copy has ids of its own
    assert "stroke: " + frames[-1]["color"] in strip


def test_cut_points():
    assert cut_points(0, 6) == [0]
    assert cut_points(3, 6) == [1, 2, 3]
    assert cut_points(100, 4) == [25, 50, 75, 100]


def test_find_value(session):
    p = session.program
    assert find_value(p, "params/layers/0/mlp/w_out") == p.value("params/layers/0/mlp/w_out").id
    assert p.values[find_value(p, "mlp/w_OUT")].name.endswith("mlp/w_out")
    assert find_value(p, "mlp/w_out", exact=True) is None
    assert find_value(p, "no such thing") is None
