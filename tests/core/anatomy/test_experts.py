"""The anatomy's mixture-of-experts layers: the zoo LM's three dispatches (unrolled and
scanned), its shared experts, a dense LM, and a MaxText-style MoE written in plain JAX."""

from __future__ import annotations

import pytest

import workbench as wb
from tests.models import plain_moe
from workbench.models import build, lm


def _program(name, **kw):
    ex = build(name, lm.Config.preset("moe", **kw))
    return wb.capture(ex.fn, *ex.args)


def _name(program, v):
    return program.values[v].name


@pytest.mark.parametrize("name", ["lm", "lm_scan"])
@pytest.mark.parametrize("form", ["einsum", "gather", "ragged"])
def test_the_zoo_moe_finds_router_experts_dispatch_and_combine(name, form):
    program = _program(name, dispatch=form)
    a = program.anatomy()
    layers = 1 if name == "lm_scan" else lm.Config.preset("moe").n_layers
    assert len(a.experts) == layers
    stacked = 1 if name == "lm_scan" else 0  # the scan's leading [L]
    for i, e in enumerate(a.experts):
        scope = "layers/" if name == "lm_scan" else f"layers/{i}/"
        assert _name(program, e.router) == f"params/{scope}moe/router"
        assert e.router_dim == stacked + 1
        assert {_name(program, p) for p, _ in e.experts} == {
            f"params/{scope}moe/experts/w_in",
            f"params/{scope}moe/experts/w_out",
        }
        assert {d for _, d in e.experts} == {stacked}
        assert e.size == 4 and e.form == form
        assert e.dispatch and e.combine
        # the dispatch reads the tokens, the combine ends in the op weighting by the gates
        assert all(program.ops[o].phase == "forward" for o in (*e.dispatch, *e.combine))
    roles = [f.role for f in a.report()]
    assert {"router 0", "experts 0", "dispatch 0", "combine 0"} <= set(roles)
    # the router is no output head, the routing einsums no attention
    routers = {e.router for e in a.experts}
    assert not routers & {p for p, _ in a.layers.heads_out}
    assert len(a.layers.attention) == layers
    for att in a.layers.attention:
        assert not att.fused
        assert all("/attn/" in _name(program, v) for v in (*att.queries, *att.keys, *att.values))
    # the shared experts are a dense MLP, not experts
    experts = {p for e in a.experts for p, _ in e.experts}
    shared = [p for p in a.parameters if "/shared/" in _name(program, p)]
    assert shared and not set(shared) & experts
    assert any("/shared/w_in" in _name(program, p) for p, _ in a.hidden_splits())


def test_the_experts_dimension_joins_the_routers():
    program = _program("lm", dispatch="einsum")
    a = program.anatomy()
    for e in a.experts:
        router = a.classes.dims_of(e.router, 2)[e.router_dim]
        for p, d in e.experts:
            assert a.classes.of(p, d) in e.classes
        assert router in e.classes


def test_a_dense_lm_has_no_experts():
    ex = build("lm", lm.Config.preset("tiny"))
    a = wb.capture(ex.fn, *ex.args).anatomy()
    assert a.experts == ()
    assert not any(f.role.startswith(("router", "experts")) for f in a.report())


def test_a_plain_jax_maxtext_style_moe():
    """Its step also takes an ``argmax`` of the logits (an accuracy): no second router."""
    fn, args = plain_moe.example()
    program = wb.capture(fn, *args)
    a = program.anatomy()
    (e,) = a.experts
    assert _name(program, e.router) == "params/moe/gate/kernel" and e.router_dim == 1
    assert [(_name(program, p), d) for p, d in e.experts] == [
        ("params/moe/wi_0", 0),
        ("params/moe/wi_1", 0),
        ("params/moe/wo", 0),
    ]
    assert e.size == plain_moe.EXPERTS and e.form == "dense"
    assert e.dispatch == ()  # every expert sees every token
    (combine,) = e.combine
    assert _name(program, program.ops[combine].results[0]).startswith("BSEM,BSE->BSM")
    assert e.router not in {p for p, _ in a.layers.heads_out}
    assert [_name(program, p) for p, _ in a.layers.heads_out] == ["params/logits_dense"]
    loss, accuracy = fn(*args)[1:]
    assert 0.0 <= float(accuracy) <= 1.0 and float(loss) > 0
