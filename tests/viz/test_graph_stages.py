"""The program graph of a pipelined state: each op and box says its stage (from core's stage
cuts), values a stage sends to the next are marked on their edges, the legend names the
pipeline; an unpipelined state's graph has no stage marks."""

import re

import jax
import jax.numpy as jnp
import pytest

import workbench as wb
from workbench.core.strategies.pipeline import pipeline_of
from workbench.viz import program_graph
from workbench.viz.graph import graph_picture
from workbench.viz.style import stage_fill

from ..models.programs import program
from .programs import dense_step, flow, nodes, sds

MESH = wb.Mesh({"stage": 4, "data": 2})
STAGE_LINE = re.compile(r"^(stages? [0-9–, ]+|every stage|no stage)", re.M)


@pytest.fixture(scope="module")
def dense():
    return dense_step(6)


@pytest.fixture(scope="module")
def piped(dense):
    return wb.Session(dense, MESH, [wb.PP("stage"), wb.BP("data")])


def scan_step(n=4, w=16, b=8):
    def loss(params, x):
        x, _ = jax.lax.scan(lambda x, wi: (jnp.tanh(x @ wi), None), x, params["ws"])
        return jnp.mean((x @ params["head"]) ** 2)

    def step(params, x):
        v, g = jax.value_and_grad(loss)(params, x)
        return v, jax.tree.map(lambda p, g: p - 0.1 * g, params, g)

    return wb.capture(step, {"ws": sds(n, w, w), "head": sds(w, w)}, sds(b, w))


def graph(s, **kw):
    return program_graph(s.program, s.state, s.mesh, collectives=s.collectives(), **kw)


def cuts_of(s):
    return pipeline_of(s.program, s.mesh, s.state).cuts


def test_every_op_says_the_stage_core_gives_it(piped):
    g, cuts = graph(piped, collapse=None), cuts_of(piped)
    drawn = {int(n[2:]): a for n, a in nodes(g).items() if n.startswith("op")}
    assert len(drawn) > 40
    for k in range(4):
        assert f"\\nstage {k}" in g.source  # every stage is named
    for o, attrs in drawn.items():
        k = cuts.stage_of(o)
        assert k is not None  # a dense step has no loop, and places every op
        assert attrs["label"].split("\n")[-1] == f"stage {k}"
        assert f"stage {k} of 4 (pipeline over 'stage')" in attrs["tooltip"]
        assert attrs["fillcolor"] == stage_fill(k) and "filled" in attrs["style"]


def test_a_box_says_its_stage_or_the_stages_it_spans(piped):
    cuts = cuts_of(piped)
    pic = graph_picture(piped.program, piped.state, piped.mesh, collapse=1)
    boxes = nodes(pic.digraph)
    spans = 0
    for name, group in pic.nodes.groups.items():
        stages = sorted({cuts.stage_of(o) for o in group.ops})
        attrs = boxes[name]
        line = STAGE_LINE.findall(attrs["label"])
        if len(stages) == 1:
            assert line == [f"stage {stages[0]}"]
            assert attrs["tooltip"].split("\n")[1] == f"stage {stages[0]}: {len(group.ops)} ops"
            assert attrs["fillcolor"] == stage_fill(stages[0])
        else:  # the optimizer's box updates every stage's weights
            spans += 1
            lo, hi = stages[0], stages[-1]
            assert stages == list(range(lo, hi + 1)) and line == [f"stages {lo}–{hi}"]
            for k in stages:
                n = sum(cuts.stage_of(o) == k for o in group.ops)
                assert f"stage {k}: {n} op" in attrs["tooltip"]
            assert attrs["fillcolor"] == "#F4F4F4"  # no one stage's colour
    assert spans >= 1


def test_values_a_stage_sends_to_the_next_are_marked(piped):
    g, cuts = graph(piped, collapse=None), cuts_of(piped)
    assert len(cuts.boundaries) == 3
    sent = {v: b.after for b in cuts.boundaries for v in b.values}
    names = {piped.program.values[v].name: k for v, k in sent.items()}
    marked = [(s, d, a) for s, d, a in flow(g) if a["label"].startswith("send stage")]
    assert {a["label"].split("\n")[0] for _, _, a in marked} == {
        f"send stage {k} → {k + 1}" for k in range(3)
    }
    onward = {src: dst for src, dst, _ in flow(g)}  # through the send's collective node
    back = {dst: src for src, dst, _ in flow(g)}
    for src, dst, attrs in marked:
        name = attrs["tooltip"].split("\n")[1].split(":")[0]
        k = names[name]
        assert attrs["label"].startswith(f"send stage {k} → {k + 1}\n")
        assert "wb-send" in attrs["class"]
        reader = dst if dst.startswith("op") else onward[dst]
        maker = src if src.startswith("op") else back[src]
        assert src != dst and cuts.stage_of(int(reader[2:])) > k >= cuts.stage_of(int(maker[2:]))
    # an edge carrying nothing a stage sends is not marked
    unmarked = [a for *_, a in flow(g) if "send" not in a["label"]]
    assert unmarked and all("wb-send" not in a["class"] for a in unmarked)


def test_the_legend_names_the_pipeline_and_its_stages(piped):
    pp = pipeline_of(piped.program, piped.mesh, piped.state)
    for collapse in ("auto", "blocks"):
        legend = nodes(graph(piped, collapse=collapse))["legend"]["label"]
        assert f"pipeline over stage: {pp.schedule.kind}, S=4, M={pp.microbatches}" in legend
        for k in range(4):
            assert f'bgcolor="{stage_fill(k)}">stage {k}</td>' in legend
        assert "no fill" not in legend  # every op of a dense step sits on one stage


def test_a_scanned_block_runs_on_every_stage():
    s = wb.Session(scan_step(), wb.Mesh({"stage": 4}), [wb.PP("stage")])
    cuts = cuts_of(s)
    assert cuts.looped
    g = graph(s, collapse=None)
    drawn = nodes(g)
    for o in cuts.looped:
        if f"op{o}" in drawn:
            attrs = drawn[f"op{o}"]
            assert attrs["label"].endswith("\nevery stage") and "fillcolor" not in attrs
            assert "every stage: a loop each stage runs" in attrs["tooltip"]
    carry = [a for *_, a in flow(g) if a["label"].startswith("send stage 0 → 1 … 2 → 3")]
    assert carry  # the loop's carry passes from each stage to the next
    assert "no fill: every stage (a loop)" in drawn["legend"]["label"]
    # folded, a phase box says how many of its ops every stage runs
    boxes = nodes(graph(s, collapse=0))
    assert any(re.search(r"stage 3 · \d+ on every stage", a["label"]) for a in boxes.values())


def test_a_third_party_model_gets_stage_marks():
    p = program("eqx_lm")
    s = wb.Session(p, wb.Mesh({"stage": 2, "data": 2}), [wb.PP("stage"), wb.BP("data")])
    cuts = cuts_of(s)
    g = graph(s, collapse=None)
    drawn = nodes(g)
    for k in (0, 1):
        assert f"\\nstage {k}" in g.source
    assert any(a["label"].startswith("send stage 0 → 1") for *_, a in flow(g))
    assert cuts.unplaced  # a step counter feeds both stages' updates
    for o, why in cuts.unplaced:
        if f"op{o}" in drawn:
            assert drawn[f"op{o}"]["label"].endswith("\nno stage")
            assert f"no stage: {why}" in drawn[f"op{o}"]["tooltip"]
    folded = nodes(graph(s, collapse="blocks"))
    optimizer = [a for a in folded.values() if a["label"].startswith("optimizer  ▾")]
    assert len(optimizer) == 1
    assert re.search(r"\nstages 0–1 · \d+ on no stage\n", optimizer[0]["label"])


def test_an_unpipelined_state_has_no_stage_marks(dense):
    s = wb.Session(dense, wb.Mesh({"data": 2, "model": 4}), [wb.BP("data")])
    for collapse in (None, 1, "blocks"):
        source = graph(s, collapse=collapse).source
        assert "stage" not in source and "wb-send" not in source
        assert "pipeline" not in source and "bgcolor" not in source
