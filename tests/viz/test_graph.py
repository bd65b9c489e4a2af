"""The program graph, read back from its DOT source: colours, partial sums, conflicts,
collectives, collapsing by scope and phase, regions, and speed on a deep training step."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb
from workbench.core.layout.collectives import Collective
from workbench.viz import PALETTE, REPLICATED, program_graph, to_svg
from workbench.viz.style import CONFLICT

from .programs import MESH, MLP_ARGS, dense_step, edge_of, edges, flow, lm_step, mlp, nodes, sds

BATCH, MODEL = PALETTE[0], PALETTE[1]


@pytest.fixture(scope="module")
def megatron():
    s = wb.Session(wb.capture(mlp, *MLP_ARGS), MESH)
    s.apply(wb.Tile("params/w_in", 1, "model"))
    return s


def graph(s, **kw):
    return program_graph(s.program, s.state, s.mesh, **kw)


def op_node(g, s, op_name):
    return nodes(g)[f"op{s.program.op(op_name).id}"]


def test_hidden_edges_carry_the_model_colour(megatron):
    g = graph(megatron)
    hidden = [edge_of(g, "dot_general.0"), edge_of(g, "relu/max.0")]
    for _, _, attrs in hidden:
        assert attrs["label"] == "f32[8,32@model]"
        assert attrs["color"] == MODEL
        assert "dashed" not in attrs["style"]
    # the input is whole on every device: grey
    _, _, x = next(e for e in flow(g) if e[2]["tooltip"].startswith("x:"))
    assert x["color"] == REPLICATED and x["label"] == "f32[8,16]"


def test_a_pending_sum_is_dashed_and_labelled(megatron):
    src, dst, attrs = edge_of(g := graph(megatron), "dot_general.1")
    assert "dashed" in attrs["style"]
    assert attrs["label"] == "f32[8,16]{sum: model}"
    assert attrs["color"] == MODEL
    assert (src, dst) == ("op2", "op3")  # from the second product into the residual add
    assert nodes(g)["op3"]["label"] == "add.0"


def test_several_axes_give_one_stroke_each():
    s = wb.Session(wb.capture(mlp, *MLP_ARGS), MESH)
    s.apply(wb.Tile("x", 0, "batch")).apply(wb.Tile("params/w_in", 1, "model"))
    _, _, attrs = edge_of(graph(s), "dot_general.0")
    assert attrs["color"] == f"{BATCH}:{MODEL}"
    assert attrs["label"] == "f32[8@batch,32@model]"
    assert "batch: Tile('x', dim=0, axis='batch')" in attrs["tooltip"]  # the why


def test_inputs_and_outputs_are_named_nodes(megatron):
    ns = nodes(graph(megatron))
    shapes = {a["label"]: a["shape"] for a in ns.values() if "shape" in a}
    assert shapes["params/w_in"] == shapes["x"] == "parallelogram"
    assert shapes["out"] == "ellipse"


def test_the_last_tactic_s_values_are_bold_and_changed_overrides(megatron):
    _, _, attrs = edge_of(graph(megatron), "dot_general.0")
    assert "bold" in attrs["style"] and attrs["penwidth"] == "3"
    _, _, attrs = edge_of(graph(megatron, changed=()), "dot_general.0")
    assert "bold" not in attrs["style"]
    x = megatron.program.value("x").id
    _, _, attrs = edge_of(graph(megatron, changed={x}), "dot_general.0")
    assert "bold" not in attrs["style"]
    assert any("bold" in a["style"] for _, _, a in flow(graph(megatron, changed={x})))


def test_a_conflict_is_highlighted_with_its_reason():
    s = wb.Session(wb.capture(lambda x, w: x @ w, sds(8, 16), sds(16, 4)), MESH)
    s.apply(wb.Tile("x", 0, "model")).apply(wb.Tile("w", 1, "model"))
    assert s.conflicts
    node = op_node(graph(s), s, "dot_general.0")
    assert node["color"] == CONFLICT and node["penwidth"] == "3"
    assert "conflict on model" in node["label"]
    assert s.conflicts[0].reason in node["tooltip"]
    # and no other op is marked
    assert sum(a.get("color") == CONFLICT for a in nodes(graph(s)).values()) == 1


def test_a_collective_sits_on_the_edge_to_the_op_that_needs_it(megatron):
    p, state = megatron.program, megatron.state
    v, add = p.value("dot_general.1").id, p.op("add.0").id
    c = Collective(
        "all-reduce", v, ("model",), 2048, add, 0, state[v], state[v], reduction="sum", why="w"
    )
    g = graph(megatron, collectives=[c])
    (name,) = [n for n in nodes(g) if n.startswith("c")]
    assert nodes(g)[name]["label"] == "all-reduce · model\n2.0 KiB"
    pairs = {(s, d) for s, d, _ in flow(g)}
    assert {("op2", name), (name, f"op{add}")} <= pairs
    assert ("op2", f"op{add}") not in pairs  # the value goes through the collective
    # one the program's output needs ends at the output node
    out = p.value("out").id
    c = Collective("all-gather", out, ("batch",), 512, None, 0, state[out], state[out])
    g = graph(megatron, collectives=[c])
    (name,) = [n for n in nodes(g) if n.startswith("c")]
    assert (name, "out0") in {(s, d) for s, d, _ in flow(g)}
    assert nodes(g)[name]["label"] == "all-gather · batch\n512 B"


def test_the_plan_s_collectives_are_drawn():
    s = wb.Session(wb.capture(mlp, *MLP_ARGS), MESH)
    s.apply(wb.Tile("x", 0, "batch")).apply(wb.Tile("params/w_in", 1, "model"))
    g = graph(s, collectives=s.collectives())
    labels = [a["label"] for n, a in nodes(g).items() if n.startswith("c")]
    assert len(labels) == len(s.collectives()) > 0
    assert all("model" in label for label in labels)


def test_collapse_gives_one_box_per_scope_and_phase():
    p = dense_step(4)
    s = wb.Session(p, MESH).apply(wb.Tile("x", 0, "batch"))
    g = graph(s, collapse=1)
    boxes = {a["label"].split("\n")[0]: a for n, a in nodes(g).items() if n.startswith("g")}
    for i in range(4):
        assert f"layer{i} · forward" in boxes and f"layer{i} · backward" in boxes
        assert boxes[f"layer{i} · forward"]["label"].split("\n")[1].startswith("3 ops")
    assert "optimizer" in boxes
    assert "in: 1 batch, 1 replicated" in boxes["layer1 · forward"]["label"]
    assert not [n for n in nodes(g) if n.startswith("op") and "layer" in p.ops[int(n[2:])].name]
    # one box per phase at depth 0
    g0 = graph(s, collapse=0)
    assert len([n for n in nodes(g0) if n.startswith("g")]) == 3
    # every edge between boxes has both ends drawn
    names = set(nodes(g))
    assert all(t in names and h in names for t, h, _ in edges(g))


def test_expand_shows_a_scope_op_by_op():
    p = dense_step(4)
    s = wb.Session(p, MESH)
    g = graph(s, collapse=1, expand=["layer2"], phases=("forward",))
    ns = nodes(g)
    drawn = {p.ops[int(n[2:])].name for n in ns if n.startswith("op")}
    assert {"layer2/dot_general.0", "layer2/tanh.0"} <= drawn
    assert not any(n.startswith(("layer0", "layer1", "layer3")) for n in drawn)
    boxes = [a["label"].split("\n")[0] for n, a in ns.items() if n.startswith("g")]
    assert "layer2 · forward" not in boxes and "layer1 · forward" in boxes
    assert "label=layer2" in g.source  # its ops sit in a cluster named by the scope


def test_phases_filter_what_is_drawn():
    s = wb.Session(dense_step(2), MESH).apply(wb.Tile("x", 0, "batch"))
    g = graph(s, collapse=None, phases=("forward",))
    ops = [s.program.ops[int(n[2:])] for n in nodes(g) if n.startswith("op")]
    assert ops and {op.phase for op in ops} == {"forward"}
    names = set(nodes(g))
    assert all(t in names and h in names for t, h, _ in edges(g))
    # a box still counts what it sends to phases not drawn: layer1 sends its output to the
    # loss and 1 - tanh (saved for the backward pass) to the backward pass only
    g = graph(s, collapse=1, phases=("forward",))
    (box,) = [n for n, a in nodes(g).items() if a["label"].startswith("layer1 · forward")]
    assert "out: 2 batch" in nodes(g)[box]["label"]
    (out,) = [a for t, _, a in flow(g) if t == box]
    assert out["tooltip"].startswith("layer1/tanh.0:")
    assert "cluster_phase" not in g.source  # one phase: no phase clusters
    g = graph(s, collapse=None)
    assert {"cluster_phase_forward", "cluster_phase_backward", "cluster_phase_optimizer"} <= set(
        g.source.replace("subgraph ", "\n").split()
    )


def test_backward_edges_are_drawn_upwards():
    s = wb.Session(dense_step(2), MESH)
    g = graph(s, collapse=1)
    phase = {n: a["label"].split("\n")[0].split(" · ")[-1] for n, a in nodes(g).items()}
    for tail, head, attrs in edges(g):
        both_backward = phase.get(tail) == phase.get(head) == "backward"
        assert (attrs.get("dir") == "back") == both_backward


def test_auto_collapse_keeps_small_programs_whole_and_big_ones_small():
    s = wb.Session(dense_step(3), MESH)
    assert not [n for n in nodes(graph(s)) if n.startswith("g")]  # op by op
    g = graph(s, max_nodes=10)
    assert [n for n in nodes(g) if n.startswith("g")]
    op_nodes = [n for n in nodes(g) if n.startswith(("g", "op", "end"))]
    assert len(op_nodes) <= 10


def test_regions_are_clusters_when_drawn_and_one_node_when_collapsed():
    def f(x, w):
        with jax.named_scope("blocks"):
            x, _ = jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, w)
        return x * 2.0

    s = wb.Session(wb.capture(f, sds(8, 16), sds(3, 16, 16)), MESH)
    s.apply(wb.Tile("x", 0, "batch"))
    p, g = s.program, graph(s)
    scan = p.op("blocks/scan.0").id
    assert f"subgraph cluster_r{scan}" in g.source
    ns = nodes(g)
    assert ns[f"op{scan}"]["label"] == "scan.0" and ns[f"end{scan}"]["label"] == "end scan.0"
    body = p.op("blocks/scan.0/dot_general.0").id
    assert (f"op{scan}", f"op{body}") in {(t, h) for t, h, _ in flow(g)}
    g = graph(s, collapse=1)
    (box,) = [a for n, a in nodes(g).items() if n.startswith("g")]
    assert box["label"].startswith("blocks/scan.0 (scan) · forward\n3 ops")


def test_to_svg_renders_with_tooltips(megatron):
    svg = to_svg(graph(megatron))
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert "f32[8,16]{sum: model}" in svg


@pytest.fixture(scope="module")
def lm():
    s = wb.Session(lm_step(24), MESH)
    s.apply(wb.Tile("x", 0, "batch")).apply(wb.Tile("params/layers/*/w1", 1, "model"))
    return s


def test_a_deep_training_step_collapses_and_renders_fast(lm):
    p = lm.program
    assert len(p.ops) > 3000
    start = time.perf_counter()
    g = program_graph(p, lm.state, lm.mesh, collectives=lm.collectives())
    svg = to_svg(g)
    elapsed = time.perf_counter() - start
    ns = nodes(g)
    boxes = [n for n in ns if n.startswith("g")]
    assert len(boxes) >= 24 * 2 and len(ns) < len(p.ops) / 10
    assert "layer23 · backward" in svg
    assert elapsed < 10, f"collapsed rendering took {elapsed:.1f} s (target: under 2 s)"


def test_collapsed_boxes_account_for_every_op(lm):
    from workbench.viz.collapse import assign_nodes

    plan = assign_nodes(lm.program, collapse=2)
    in_boxes = sum(len(g.ops) for g in plan.groups.values())
    assert in_boxes + len(plan.drawn) == len(lm.program.ops)
    assert len(np.unique(plan.node_of)) == len(plan.groups) + len(plan.drawn)


def test_bad_arguments_say_what_would_work(megatron):
    with pytest.raises(wb.WorkbenchError, match="pick from 'forward', 'backward', 'optimizer'"):
        graph(megatron, phases=("fwd",))
    with pytest.raises(wb.WorkbenchError, match="use 'auto', None"):
        graph(megatron, collapse="deep")
    assert graph(megatron, phases="forward").source  # one phase as a plain string is fine
