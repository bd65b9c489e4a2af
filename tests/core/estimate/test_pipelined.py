"""A pipeline priced from stage cuts, a schedule and the simulator's op prices."""

from __future__ import annotations

from functools import cache

import pytest

import workbench as wb
from workbench.core.errors import InputError
from workbench.core.estimate import estimate
from workbench.core.estimate.pipelined import price_pipeline
from workbench.core.layout.state import State
from workbench.core.plan.plan import build_plan
from workbench.models import build, lm

HW = wb.hardware.H100


@cache
def model(size: str) -> wb.Program:
    config = lm.Config.preset("small", n_layers=8, dtype="bfloat16") if size == "small" else size
    ex = build("lm", config, abstract=True)
    return wb.capture(ex.fn, *ex.args)


@cache
def whole(size: str):
    """The unpartitioned step on one device."""
    p = model(size)
    mesh = wb.Mesh({"d": 1})
    state = State.initial(p)
    return estimate(p, mesh, state, build_plan(p, mesh, state), HW)


CASES = [("tiny", 2), ("small", 2), ("small", 4)]


@pytest.mark.parametrize("size,S", CASES)
def test_bubble_follows_the_closed_form(size, S):
    """With sends hidden, GPipe's and 1F1B's bubble share is the closed form (S-1)/(M+S-1)
    generalised to stages of unequal time t_s: 1 - M / ((M-1) * max t / mean t + S); it
    is the closed form itself where the stages are equal. The stages here are near equal
    (the embedding and the head make the end stages up to ~1.3x the mean)."""
    shares = {}
    for kind in ("gpipe", "1f1b", "zero-bubble"):
        for M in (4, 8):
            e = price_pipeline(model(size), S, M, HW, schedule=kind, overlap="full")
            assert len(e.cuts.stages) == S == len(e.forward) == len(e.peak)
            t = [f + b + w for f, b, w in zip(e.forward, e.backward, e.weight, strict=True)]
            balance = max(t) / (sum(t) / S)
            assert 1 <= balance < 1.3
            if kind != "zero-bubble":
                general = 1 - M / ((M - 1) * balance + S)
                assert e.bubble_share == pytest.approx(general, rel=0.03)
                closed = (S - 1) / (M + S - 1)
                assert closed - 1e-9 <= e.bubble_share <= general * 1.03
            shares[kind, M] = e.bubble_share
            assert e.step_s == pytest.approx(e.timeline.makespan + max(e.optimizer))
            assert e.bubble_s == pytest.approx(sum(e.timeline.idle))
    for kind in ("gpipe", "1f1b", "zero-bubble"):
        assert shares[kind, 8] < shares[kind, 4]  # more microbatches, smaller bubble
    for M in (4, 8):
        assert shares["zero-bubble", M] <= shares["1f1b", M] + 1e-12


@pytest.mark.parametrize("size,S", CASES)
def test_cannot_beat_perfect_splitting(size, S):
    est = whole(size)
    p = model(size)
    fwd_bwd = sum(o.total_s for o in est.ops if p.ops[o.op].phase != "optimizer")
    for M in (4, 8):
        for kind in ("1f1b", "zero-bubble"):
            e = price_pipeline(p, S, M, HW, schedule=kind)
            assert e.step_s >= fwd_bwd / S
            # every microbatch's work, added over the stages, is at least the whole step's
            total = M * sum(e.forward) + M * sum(e.backward) + M * sum(e.weight)
            assert total >= fwd_bwd * (1 - 1e-9)
            assert len(e.p2p) == S - 1 and all(x > 0 for x in e.p2p)
            assert set(e.links) == {HW.links[0].name}  # S devices within one node


def test_zero_bubble_splits_the_weight_gradient_off():
    e = price_pipeline(model("small"), 2, 8, HW, schedule="zero-bubble")
    u = price_pipeline(model("small"), 2, 8, HW, schedule="1f1b")
    for s in range(2):
        assert 0 < e.weight[s] < e.backward[s] + e.weight[s]
        assert e.backward[s] + e.weight[s] == pytest.approx(u.backward[s])
        assert u.weight[s] == 0


@pytest.mark.parametrize("size,S", CASES)
def test_one_f_one_b_holds_less_than_gpipe(size, S):
    gpipe = price_pipeline(model(size), S, 8, HW, schedule="gpipe")
    one = price_pipeline(model(size), S, 8, HW, schedule="1f1b")
    assert one.peak[0] < gpipe.peak[0]
    assert gpipe.timeline.peak_in_flight[0] == 8 and one.timeline.peak_in_flight[0] == S
    for e in (gpipe, one):
        for s in range(S):
            state = sum(e.state[s].values())
            assert e.peak[s] == state + round(e.timeline.peak_in_flight[s] * e.activations[s])
            assert e.activations[s] > 0


@pytest.mark.parametrize("size,S", CASES)
def test_model_state_adds_up_to_the_whole(size, S):
    """Per-stage state sums to the simulator's for the whole model, less what several
    stages each keep: a tied parameter (and its gradient and state) on every stage holding
    it, and optimizer state of no parameter (a step counter) on every stage."""
    p = model(size)
    e = price_pipeline(p, S, 4, HW)
    a = p.anatomy()
    owned = {x for q in a.parameters for x in a.state.get(q, ())}
    counter = sum(p.values[x].nbytes for x in a.optimizer_state if x not in owned)
    tied = sum(p.values[q].nbytes * (len(ss) - 1) for q, ss in e.cuts.shared)
    total = whole(size).memory.states
    for cat in ("parameters", "gradients"):
        assert sum(st[cat] for st in e.state) - tied == total[cat]
    extra = (S - 1) * counter + 2 * tied  # Adam's two moments per tied parameter
    assert sum(st["optimizer"] for st in e.state) - extra == total["optimizer"]


@pytest.mark.slow  # captures a Flax NNX model (seconds)
def test_third_party_model_prices_in_two():
    from tests.models.programs import program as external

    e = price_pipeline(external("nnx_lm"), 2, 1, HW)
    assert len(e.cuts.stages) == 2 and len(e.peak) == 2
    assert all(f > 0 and b > 0 for f, b in zip(e.forward, e.backward, strict=True))
    assert e.step_s > e.timeline.makespan > 0
    assert "stage 1" in str(e)


def test_bad_inputs_say_what_would_work():
    p = model("tiny")  # batch 8, two blocks
    with pytest.raises(
        InputError, match=r"microbatches=3 does not divide the batch of 8.*\[1, 2, 4, 8\]"
    ):
        price_pipeline(p, 2, 3, HW)
    with pytest.raises(InputError, match="more than the 2 repeated blocks"):
        price_pipeline(p, 3, 4, HW)
    with pytest.raises(InputError, match="is not one the workbench knows"):
        price_pipeline(p, 2, 4, HW, schedule="1f1bb")
    with pytest.raises(InputError, match="2 stages x 2 model chunks need 4 repeated blocks"):
        price_pipeline(p, 2, 4, HW, schedule="interleaved", virtual_stages=2)
    with pytest.raises(InputError, match="overlap='prefetch'"):
        price_pipeline(p, 2, 4, HW, overlap="prefetch")
    with pytest.raises(InputError, match="whole number >= 1"):
        price_pipeline(p, 2, 0, HW)


def test_each_stage_gathers_only_the_parameters_it_holds():
    # ZeRO-2 gathers the updated parameters for the step's outputs: a stage gathers its own
    from workbench.core import hardware as hw

    config = lm.Config(
        batch=128, seq_len=64, d_model=256, n_heads=4, d_head=64, d_ff=1024, vocab=1024,
        n_layers=8, dtype="bfloat16", master_weights=True,
    )  # fmt: skip
    ex = build("lm", config, abstract=True)
    program = wb.capture(ex.fn, *ex.args)
    whole = wb.Session(program, wb.Mesh({"data": 16}), [wb.BP("data"), wb.Z2("data")])
    piped = wb.Session(
        program,
        wb.Mesh({"stage": 2, "data": 16}),
        [wb.PP("stage", microbatches=8), wb.BP("data"), wb.Z2("data")],
    )
    gathered = whole.estimate(hw.H100).by_kind["all-gather"]
    stages = piped.estimate(hw.H100).pipeline.collectives
    assert [s["all-gather"] / gathered for s in stages] == pytest.approx([0.5, 0.5], abs=0.05)
