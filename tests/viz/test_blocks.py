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
    assert not re.search(rf"^\s*g\d+ -> {backward}\b", src, re.M)
