"""Folding the graph by the anatomy's phases and repeated blocks, and the SVG's addresses."""

import re
from collections import Counter

import pytest

import workbench as wb
from workbench.models import build
from workbench.models.external import build_external
from workbench.viz import default_expand, graph_picture, to_svg
from workbench.viz.blocks import POST, PRE, assign_blocks, op_layers
from workbench.viz.graph import IO_FANOUT

from .programs import MESH, lm_step


@pytest.fixture(scope="module")
def eqx():
    """An Equinox LM: its scopes name module classes, never a layer."""
    ex = build_external("eqx_lm", "tiny")
    return wb.capture(ex.fn, *ex.args)


@pytest.fixture(scope="module")
def lm():
    ex = build("lm", "tiny")
    s = wb.Session(wb.capture(ex.fn, *ex.args), MESH, [wb.BP("batch"), wb.MP("model")])
    return s


def test_layers_come_from_the_anatomy_not_the_scopes(eqx):
    assert not any(re.search(r"\d", "/".join(op.scope)) for op in eqx.ops)  # no layer names
    blocks = eqx.anatomy().layers.blocks
    assert len(blocks) == 2
    layers = op_layers(eqx)
    forward = Counter(layers[o] for o in eqx.body if eqx.ops[o].phase == "forward")
    assert set(forward) == {PRE, 0, 1, POST}
    # each layer holds a layer's worth of ops: its parameters' readers and what lies between
    for k, params in enumerate(blocks):
        readers = {u for p in params for u in eqx.users[p] if eqx.ops[u].phase == "forward"}
        assert readers and all(layers[u] == k for u in readers if u in layers)
    assert abs(forward[0] - forward[1]) <= 0.15 * forward[1]


def test_opens_on_the_forward_phase_with_the_repeated_block_folded(eqx):
    nodes = assign_blocks(eqx, expand=("forward",))
    keys = {g.key: g for g in nodes.groups.values()}
    assert set(keys) == {"forward/pre", "forward/layers", "forward/post", "backward", "optimizer"}
    assert keys["forward/layers"].scope == ("layers 0–1 ×2",)
    assert not nodes.drawn  # every op in a box
    # one layer opened: its ops one by one, in a cluster that folds it back, beside the rest
    nodes = assign_blocks(eqx, expand=default_expand(eqx))
    keys = {g.key: g for g in nodes.groups.values()}
    assert keys["forward/layers"].scope == ("layer 1",)
    layer0 = [o for o in eqx.body if nodes.cluster_of.get(o, ("",))[0] == "forward/layer0"]
    assert layer0 and all(nodes.is_drawn(o) for o in layer0)


def test_picture_addresses_ops_values_and_folds(lm):
    s = lm
    pic = graph_picture(
        s.program, s.state, s.mesh, collectives=s.collectives(), collapse="blocks",
        expand=default_expand(s.program),
    )  # fmt: skip
    svg = to_svg(pic.digraph)
    ids = set(re.findall(r'<g id="([^"]+)" class="(?:node|edge|cluster)', svg))
    assert {f"op{o}" for o in pic.nodes.drawn} <= ids
    for elements in pic.value_elements.values():
        assert set(elements) <= ids and all(e.startswith("e") for e in elements)
        assert pic.element_value(elements[0]) is not None
    assert set(pic.folds) <= ids
    assert "forward/layers" in pic.folds.values() and "backward" in pic.folds.values()
    assert any(e.startswith("b") for e in pic.folds)  # the opened layer's cluster
    assert pic.changed and set(pic.changed) <= ids
    for node, cs in pic.collectives.items():
        assert node in ids and all(c.why for c in cs)
    op = pic.nodes.drawn[0]
    assert pic.element_value(f"op{op}") == s.program.ops[op].results[0]


def test_a_long_program_folds_to_a_few_boxes():
    program = lm_step(n_layers=24)
    state = wb.Session(program, MESH).state
    pic = graph_picture(program, state, MESH, collapse="blocks", expand=("forward",))
    boxes = {g.key: g.scope for g in pic.nodes.groups.values()}
    assert boxes["forward/layers"] == ("layers 0–23 ×24",)
    assert len(pic.nodes.groups) <= 5 and not pic.nodes.drawn
    opened = graph_picture(
        program, state, MESH, collapse="blocks", expand=("forward", "forward/layers")
    )
    assert len([g for g in opened.nodes.groups.values() if "/layer" in g.key]) == 24
    # what makes dot slow at depth is left out: one input group linked to every layer box,
    # and every layer box linked to the folded backward phase
    src = opened.digraph.source
    fans = Counter(re.findall(r"^\s*(in\d+|out\d+) -> g\d+", src, re.M))
    assert max(fans.values(), default=0) <= IO_FANOUT
    backward = next(g.node for g in opened.nodes.groups.values() if g.key == "backward")
    drawn = [e for e in re.findall(rf"^\s*g\d+ -> {backward}\b.*$", src, re.M) if "invis" not in e]
    assert not drawn  # an invisible edge only places the folded phase beside the forward one


def io_labels(pic) -> dict[str, str]:
    """Input and output node -> its label, from the DOT source."""
    found = re.findall(r'^\s*((?:in|out)\d+) \[.*?label="([^"]*)"', pic.digraph.source, re.M)
    return dict(found)


def test_inputs_and_outputs_fold_by_role_and_unfold_with_their_layer(eqx):
    state = wb.Session(eqx, MESH).state
    anatomy = eqx.anatomy()
    pic = graph_picture(eqx, state, MESH, collapse="blocks", expand=("forward",))
    labels = io_labels(pic)
    # a few nodes, by role, with their counts: never a name's prefix
    assert len(labels) <= 8 and f"parameters ×{len(anatomy.parameters)}" in labels.values()
    assert not any("/" in t for n, t in labels.items() if len(pic.node_values[n]) > 1)
    params = next(n for n, t in labels.items() if t.startswith("parameters ×"))
    assert set(pic.node_values[params]) == set(anatomy.parameters)
    # a layer opened op by op: its parameters drawn one by one, the rest still one group
    pic = graph_picture(eqx, state, MESH, collapse="blocks", expand=default_expand(eqx))
    alone = {pic.node_values[n][0] for n in io_labels(pic) if len(pic.node_values[n]) == 1}
    assert set(anatomy.layers.blocks[0]) <= alone
    assert not set(anatomy.layers.blocks[1]) & alone
    # the repeated block opened box by box: each layer's parameters a group of their own
    pic = graph_picture(eqx, state, MESH, collapse="blocks", expand=("forward", "forward/layers"))
    labels = io_labels(pic)
    for k, block in enumerate(anatomy.layers.blocks):
        node = next(n for n, t in labels.items() if t.startswith(f"layer {k} parameters"))
        assert set(pic.node_values[node]) == set(block)


def test_the_folded_forward_phase_reads_top_to_bottom(eqx, lm):
    for program in (eqx, lm.program):
        pic = graph_picture(program, lm.state if program is lm.program else wb.Session(
            program, MESH).state, MESH, collapse="blocks", expand=("forward",))  # fmt: skip
        node = {g.key: g.node for g in pic.nodes.groups.values()}
        src = pic.digraph.source
        layers, pre = node["forward/layers"], node["forward/pre"]
        assert re.search(rf"^\s*{pre} -> {layers} \[", src, re.M)
        assert not re.search(rf"^\s*{layers} -> {pre} \[label", src, re.M), "a value runs back"


def test_the_folded_program_fits_a_panel(lm):
    """Every box, input and output of the opening view in about 530 x 560 points: the graph
    panel of a 1,280 px JupyterLab at 1.2 CSS px per point (labels at 12 px)."""
    s = lm
    for state in (wb.Session(s.program, MESH).state, s.state):
        pic = graph_picture(
            s.program, state, s.mesh, collectives=s.collectives(), collapse="blocks",
            expand=("forward",), legend=False,
        )  # fmt: skip
        width, height = map(float, re.search(r'viewBox="0.00 0.00 ([\d.]+) ([\d.]+)"',
                                             to_svg(pic.digraph)).groups())  # fmt: skip
        assert width <= 560 and height <= 600, (width, height)
