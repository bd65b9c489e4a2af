"""Attention priced as fused kernels (``Hardware.fused_attention``): each attention the
program writes out costs one flash-style kernel per pass at the chip's published rate,
less the tiles a causal mask hides; its logits and probabilities never reach memory;
attentions it cannot price so are priced as written and the note says why."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import workbench as wb
from tests.models import programs as external
from workbench.core import hardware as hw
from workbench.core.anatomy.attention import region
from workbench.core.hardware.levels import HardwareError
from workbench.models import build, lm

FUSED = dataclasses.replace(hw.H100, fused_attention=True)
SEQ = 2048


def lm_program(**changes):
    """The zoo LM from shapes: 2 layers, bfloat16, remat, ``changes`` on top."""
    fields = dict(
        batch=8, seq_len=SEQ, d_model=512, n_heads=8, d_head=64, d_ff=2048, vocab=4096,
        n_layers=2, dtype="bfloat16", master_weights=True, remat=True,
    )  # fmt: skip
    ex = build("lm", lm.Config(**{**fields, **changes}), abstract=True)
    return wb.capture(ex.fn, *ex.args)


@pytest.fixture(scope="module")
def program():
    return lm_program()


def kernels(e, program):
    """The fused kernels' estimates: at the context dots (forward, replay) and the first
    backward op of each region."""
    anchors = set()
    for a in program.anatomy().layers.attention:
        r = region(program, a.scores, a.context)
        anchors |= {r.forward.context, r.first_backward}
        if r.replay is not None:
            anchors.add(r.replay.context)
    return [o for o in e.ops if o.op in anchors]


def test_a_fused_attention_costs_its_kernels_and_not_its_logits(program):
    s = wb.Session(program, wb.Mesh({"data": 8}), [wb.BP("data")])
    written, fused = s.estimate(hw.H100), s.estimate(FUSED)
    assert fused.breakdown.attention_s < written.breakdown.attention_s / 3
    assert fused.breakdown.matmul_s == pytest.approx(written.breakdown.matmul_s, rel=1e-6)
    assert fused.step_s < written.step_s and fused.note == ""
    # 2 layers x (forward, recomputation, backward): one kernel each
    ks = kernels(fused, program)
    assert len(ks) == 6
    # a causal mask hides the tiles above the diagonal: (n + 1) / 2n of them are computed
    n = SEQ // 128
    per_layer = 4 * (8 // 8) * SEQ * SEQ * 512  # the two dots: 2 x 2 b s^2 (h d)
    forward = per_layer * (n + 1) / (2 * n)
    assert sorted(k.cost.flops / forward for k in ks) == pytest.approx([1, 1, 1, 1, 2.5, 2.5])
    rate = hw.H100.attention_flops("bfloat16")
    assert rate == pytest.approx(740e12)
    assert all(k.seconds >= k.cost.flops / rate for k in ks)


def test_without_remat_the_fused_step_does_not_hold_the_probabilities():
    program = lm_program(remat=False, seq_len=4096)
    s = wb.Session(program, wb.Mesh({"data": 8}), [wb.BP("data")])
    written, fused = s.estimate(hw.H100), s.estimate(FUSED)
    # the forward keeps each layer's probabilities (1 x 8 heads x 4096^2 in bfloat16) for the
    # backward as written; a fused kernel keeps its output and log-sum-exp only
    probs = 8 * 4096 * 4096 * 2
    assert written.memory.peak - fused.memory.peak > 2 * probs


def test_a_pipelined_step_prices_its_attention_fused(program):
    mesh = wb.Mesh({"stage": 2, "data": 4})
    s = wb.Session(program, mesh, [wb.PP("stage", microbatches=2), wb.BP("data")])
    written, fused = s.estimate(hw.H100), s.estimate(FUSED)
    assert fused.breakdown.attention_s < written.breakdown.attention_s / 3
    assert fused.step_s < written.step_s


@pytest.mark.parametrize("balance", [False, True])
def test_a_ring_runs_fused_kernels_block_by_block(program, balance):
    mesh = wb.Mesh({"seq": 8})
    s = wb.Session(program, mesh, [wb.CP("seq", dim=1, kind="ring", balance=balance)])
    written, fused = s.estimate(hw.H100), s.estimate(FUSED)
    assert fused.breakdown.attention_s < written.breakdown.attention_s / 2
    assert "priced as written" not in fused.note
    # one kernel per pass, the replayed one left out by the ring (the forward's output is
    # kept): 2 layers x (forward, recomputation, backward)
    ks = kernels(fused, program)
    assert len(ks) == 6
    # the busiest device computes every block of its queries' rows (8 sequences, an eighth
    # of their queries, every key); its transfers hide behind them
    per_layer = 4 * 8 * (SEQ // 8) * SEQ * 512
    assert sorted(k.cost.flops / per_layer for k in ks) == pytest.approx([1, 1, 1, 1, 2.5, 2.5])
    permutes = [c for c in fused.collectives if c.collective.kind == "collective-permute"]
    assert permutes and sum(c.behind_s for c in permutes) > 0
    if balance:  # about half of each block is skipped, as the note says
        assert "balanced ring passes skip" in fused.note
        unbalanced = wb.Session(program, mesh, [wb.CP("seq", dim=1, kind="ring")])
        assert fused.breakdown.attention_s < 0.7 * unbalanced.estimate(FUSED).breakdown.attention_s


def test_an_attention_with_a_dropout_is_priced_as_written_and_the_note_says_why():
    program = external.dropout_attention()
    s = wb.Session(program, wb.Mesh({"data": 2}), [wb.BP("data")])
    e = s.estimate(FUSED)
    assert "1 attention priced as written" in e.note and "dropout" in e.note
    assert e.step_s == pytest.approx(s.estimate(hw.H100).step_s, rel=1e-9)


@pytest.mark.parametrize("name", ["eqx_lm", "nnx_lm", "hf_gpt2"])
def test_third_party_attention_is_fused_too(name):
    program = external.program(name)
    s = wb.Session(program, wb.Mesh({"data": 2}), [wb.BP("data")])
    e = s.estimate(FUSED)
    assert e.note == ""
    assert len(kernels(e, program)) >= 2 * len(program.anatomy().layers.attention)


def test_the_rate_falls_back_to_the_matmuls_and_bad_shares_are_refused():
    # no published fused-attention rate for TPUs: a matmul's
    assert hw.TPU_V5E.attention_flops("bfloat16") == hw.TPU_V5E.matmul_flops("bfloat16")
    assert hw.A100.attention_flops("float16") == pytest.approx(0.73 * 312e12)
    assert "arxiv.org" in hw.A100.sources["attention_efficiency.bfloat16"]
    with pytest.raises(HardwareError, match="attention_efficiency"):
        dataclasses.replace(hw.H100, attention_efficiency={"bfloat16": 1.5})


def test_a_grouped_query_attention_is_fused():
    program = lm_program(seq_len=1024, n_kv_heads=2, d_ff=1408, mlp="swiglu", master_weights=False)
    s = wb.Session(program, wb.Mesh({"data": 2, "model": 2}), [wb.BP("data"), wb.MP("model")])
    e = s.estimate(FUSED)
    assert e.note == "" and len(kernels(e, program)) == 6
    assert e.breakdown.attention_s < s.estimate(hw.H100).breakdown.attention_s / 3


def test_a_kernel_reads_the_keys_and_values_as_the_plan_gathers_them():
    changes = dict(batch=1, seq_len=8192, d_model=1024, d_head=128, d_ff=4096)
    program = lm_program(**changes, master_weights=False)
    s = wb.Session(program, wb.Mesh({"seq": 8}), [wb.CP("seq", dim=1)])
    e = s.estimate(FUSED)
    whole = 8192 * 8 * 128 * 2  # one sequence's keys (or values), gathered on every device
    assert e.note == "" and all(k.cost.bytes_accessed > 2 * whole for k in kernels(e, program))


@pytest.mark.parametrize("policy", [None, "dots_with_no_batch_dims_saveable"])
def test_jaxs_own_dot_product_attention_is_priced_fused(policy):
    """``jax.nn.dot_product_attention`` (causal), as a user calls it in plain JAX, with or
    without ``jax.checkpoint`` under a policy that keeps the projections: capture
    decomposes it into its dots and softmax, the anatomy finds it (under the policy with
    its replay), and a fused estimate prices it as kernels, the causal half of its tiles
    skipped."""

    def block(w, x):
        q, k, v = (jnp.einsum("bsd,dhk->bshk", x, w[n]) for n in "qkv")
        o = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        return jnp.einsum("bshk,hkd->bsd", o, w["o"])

    if policy is not None:
        block = jax.checkpoint(block, policy=getattr(jax.checkpoint_policies, policy))

    def loss(w, x):
        return jnp.tanh(block(w, x)).astype(jnp.float32).mean()

    b, s, d, h, k = 8, SEQ, 512, 8, 64
    w = {n: jax.ShapeDtypeStruct((d, h, k), jnp.bfloat16) for n in "qkv"}
    w["o"] = jax.ShapeDtypeStruct((h, k, d), jnp.bfloat16)
    x = jax.ShapeDtypeStruct((b, s, d), jnp.bfloat16)
    program = wb.capture(jax.value_and_grad(loss), w, x)
    session = wb.Session(program, wb.Mesh({"data": 8}), [wb.BP("data")])
    written, fused = session.estimate(hw.H100), session.estimate(FUSED)
    assert fused.note == "" and fused.breakdown.attention_s < written.breakdown.attention_s / 10
    ks = kernels(fused, program)
    n = s // 128
    forward = 4 * h * s * s * k * (n + 1) / (2 * n)  # a device's one sequence
    passes = [1, 2.5] if policy is None else [1, 1, 2.5]  # forward, (replay,) backward
    assert sorted(x.cost.flops / forward for x in ks) == pytest.approx(passes)


def test_under_a_remat_policy_that_keeps_the_projections_attention_is_priced_fused():
    """MaxText's "minimal" policy keeps the projections' outputs: the backward replays the
    dots and softmax on the kept queries and keys, and the region is read as a replay."""
    program = lm_program(remat_policy="dots_with_no_batch_dims_saveable")
    s = wb.Session(program, wb.Mesh({"data": 8}), [wb.BP("data")])
    written, fused = s.estimate(hw.H100), s.estimate(FUSED)
    assert fused.note == "" and fused.breakdown.attention_s < written.breakdown.attention_s / 3
    assert len(kernels(fused, program)) == 6  # 2 layers x (forward, replay, backward)
