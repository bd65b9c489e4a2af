"""The Workbench's graph panel from Python: what the browser's clicks and searches do, and
the replay it is sent (the Session's own events)."""

import html

import pytest

import workbench as wb
from tests.widgets.conftest import MESH, on_page
from workbench.core import hardware as hw
from workbench.core.errors import InputError
from workbench.widgets import Workbench


@pytest.fixture
def bench(program):
    return on_page(
        Workbench(
            program, mesh=MESH, hardware=hw.TPU_V5E, schedule=[wb.BP("batch"), wb.MP("model")]
        )
    )


def send(bench, **message):
    """What the browser sends when the user clicks or searches."""
    bench.graph._message(bench.graph, message, [])
    assert not bench.error.value, bench.error.value


def test_opens_fitted_on_the_folded_program(program):
    bench = on_page(Workbench(program, mesh=MESH, hardware=hw.TPU_V5E))
    g, pic = bench.graph, bench.graph_panel.picture
    assert g.svg.startswith("<svg") and "wb-graph" in g._dom_classes
    # the phases and the repeated block as a few boxes, none of the ops one by one
    assert set(g.folds.values()) >= {"forward/pre", "forward/layers", "backward", "optimizer"}
    assert not pic.nodes.drawn
    assert g.focus["mode"] == "fit" and not g.focus["keep_zoom"]
    # the whole program: its boxes, and its inputs and outputs grouped by role
    ids = g.focus["ids"]
    boxes = [e for e in ids if e in pic.nodes.groups]
    assert 3 <= len(boxes) <= 8 and set(boxes) == set(pic.nodes.groups) & set(pic.folds)
    io = [e for e in ids if e.startswith(("in", "out")) and f'id="{e}"' in g.svg]
    assert 2 <= len(io) <= 10, io
    assert set(ids) == set(boxes) | {e for e in ids if e.startswith(("in", "out"))}
    assert all(f'id="{b}"' in g.svg for b in boxes)
    # the colours' key above the drawing, not in it (the drawing stays narrow)
    assert "batch (" in bench.graph_panel.legend.value and "pending sum" not in g.svg


def test_fits_each_step_on_what_it_changed(bench):
    g, pic = bench.graph, bench.graph_panel.picture
    assert g.focus["mode"] == "fit" and g.focus["ids"]
    assert set(g.focus["ids"]) == set(pic.changed)
    ranks = [0 if e.startswith("op") else 1 if e.startswith("e") else 2 for e in g.focus["ids"]]
    assert ranks == sorted(ranks)  # ops drawn one by one, then values, then the rest
    n = g.focus["n"]
    bench.history.undo.click()
    assert g.focus["n"] > n and set(g.focus["ids"]) == set(bench.graph_panel.picture.changed)
    bench.history.reset.click()  # nothing changed at step 0: the whole program again
    pic = bench.graph_panel.picture
    assert set(g.focus["ids"]) <= set(pic.nodes.groups) | set(pic.node_values)
    assert set(pic.nodes.groups) & set(g.focus["ids"])


def test_show_refuses_a_mode_it_does_not_know(bench):
    with pytest.raises(InputError, match=r"'zoom'.*use one of"):
        bench.graph.show([], mode="zoom")


def test_clicking_a_value_inspects_it(bench):
    pic = bench.graph_panel.picture
    vid, elements = next(iter(pic.value_elements.items()))
    send(bench, event="click", id=elements[0])
    name = bench.session.program.values[pic.element_value(elements[0])].name
    assert bench.inspect_value.value == name and html.escape(name) in bench.inspector.value
    assert bench.sections.selected_index == 1
    assert set(bench.graph.selected) >= set(elements) or vid != pic.element_value(elements[0])
    assert html.escape(name) in bench.graph_panel.why.value
    send(bench, event="click", id=next(e for e, k in pic.folds.items() if k == "forward/pre"))
    pic = bench.graph_panel.picture
    op = pic.nodes.drawn[0]  # an op: its first result
    send(bench, event="click", id=f"op{op}")
    assert (
        bench.inspect_value.value
        == bench.session.program.values[bench.session.program.ops[op].results[0]].name
    )


def test_typing_a_value_marks_it_in_the_graph(bench):
    pic = bench.graph_panel.picture
    vid = next(iter(pic.value_elements))
    bench.inspect_value.value = bench.session.program.values[vid].name
    assert bench.graph.selected == list(pic.value_elements[vid])


def test_a_box_opens_and_its_frame_folds_it(bench):
    panel = bench.graph_panel
    box = next(e for e, k in panel.picture.folds.items() if k == "backward")
    before = bench.graph.svg
    send(bench, event="click", id=box)
    assert "backward" in panel.expanded and bench.graph.svg != before
    assert any(k.startswith("backward/") for k in bench.graph.folds.values())
    assert not bench.graph.focus["keep_zoom"] and bench.graph.focus["ids"]
    send(
        bench,
        event="click",
        id=next(e for e, k in panel.picture.folds.items() if k == "forward/layers"),
    )
    layer = next(e for e, k in panel.picture.folds.items() if k == "forward/layer0")
    assert set(bench.graph.focus["ids"]) >= {layer}  # the view fits on what opened
    send(bench, event="click", id=layer)
    frame = next(e for e, k in panel.picture.folds.items() if k == "forward/layer0")
    assert frame.startswith("b")  # the opened layer's cluster
    send(bench, event="click", id=frame)
    assert "forward/layer0" not in panel.expanded
    assert not any(e.startswith("b") for e, k in bench.graph.folds.items() if k == "forward/layer0")


def test_a_collective_says_why(bench):
    node, cs = next(iter(bench.graph_panel.picture.collectives.items()))
    send(bench, event="click", id=node)
    assert "Why these collectives" in bench.graph_panel.why.value
    assert cs[0].kind in bench.graph_panel.why.value


def test_search(bench):
    send(bench, event="search", text="mlp/w_out")
    assert bench.inspect_value.value.endswith("mlp/w_out")
    send(bench, event="search", text="no such value")
    assert "no value named" in bench.graph_panel.why.value


def test_the_replay_is_the_sessions_events(bench):
    s, g = bench.session, bench.graph
    assert bench.graph_panel.replay_step.value == 2 and "MP" in g.replay_title
    assert [(f["index"], f["text"]) for f in g.frames] == [(e.index, e.text) for e in s.events()]
    bench.graph_panel.replay_step.value = 1
    assert [f["text"] for f in g.frames] == [e.text for e in s.events(1)]
    assert {f["axis"] for f in g.frames} == {"batch"}
    bench.history.undo.click()
    assert bench.graph_panel.replay_step.value == 1 and len(g.frames) == len(s.events(1))
