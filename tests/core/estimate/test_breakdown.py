"""Where a step's time goes, and its MFU: the parts add up to the step, the model's FLOPs
are three forward passes at global shapes (a closed form on a plain-JAX MLP), remat
raises HFU and not MFU, a pipelined step shows its bubble, a ring's replayed blocks count
as attention, and the Workbench and the shell show it."""

import jax
import jax.numpy as jnp
import pytest

import workbench as wb
from workbench.core import hardware as hw
from workbench.models import build, lm
from workbench.widgets import render

B, D, F = 16384, 1024, 4096


def mlp_step():
    """A plain-JAX training step: an MLP, its loss, SGD."""

    def loss(params, x):
        w1, w2 = params
        return jnp.mean((jax.nn.relu(x @ w1) @ w2) ** 2)

    def step(params, x):
        value, grads = jax.value_and_grad(loss)(params, x)
        return value, jax.tree.map(lambda w, g: w - 0.01 * g, params, grads)

    params = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in ((D, F), (F, D))]
    return wb.capture(step, params, jax.ShapeDtypeStruct((B, D), jnp.bfloat16))


def lm_program(**kw):
    ex = build("lm", lm.Config.preset("small", n_layers=2, dtype="bfloat16", **kw), abstract=True)
    return wb.capture(ex.fn, *ex.args)


def check_parts(e):
    b = e.breakdown
    assert b.compute_s == pytest.approx(e.compute_s, rel=1e-9)
    behind = sum(c.behind_s * c.collective.count for c in e.collectives)
    assert b.exposed_s + b.overlapped_s == pytest.approx(e.communication_s + behind, rel=1e-9)
    assert b.step_s == e.step_s


@pytest.mark.parametrize("overlap", ["none", "full"])
def test_the_parts_add_up_to_the_step(overlap):
    p = lm_program()
    s = wb.Session(p, wb.Mesh({"data": 4, "model": 2}), [wb.BP("data"), wb.MP("model")])
    e = s.estimate(hw.H100, overlap=overlap)
    check_parts(e)
    b = e.breakdown
    assert b.matmul_s > 0 and b.attention_s > 0 and b.other_s > 0
    if overlap == "none":
        assert b.compute_s + b.exposed_s == pytest.approx(e.step_s, rel=1e-9)
        assert b.overlapped_s == 0
    else:
        assert b.overlapped_s > 0 and b.exposed_s < e.communication_s


def test_mfu_counts_three_forward_passes_at_global_shapes():
    p = mlp_step()
    mesh = wb.Mesh({"data": 8})
    e = wb.Session(p, mesh, [wb.BP("data")]).estimate(hw.H100)
    b = e.breakdown
    matmuls = 3 * 2 * (2 * B * D * F)  # two matmuls forward, a backward twice each
    assert matmuls <= b.model_flops * mesh.size <= 1.01 * matmuls
    assert b.peak_flops == hw.H100.peak_flops("bfloat16")
    assert b.mfu == pytest.approx(b.model_flops / (e.step_s * b.peak_flops))
    # executed: two matmuls forward, three backward (the data input needs no gradient), so
    # this small model's MFU (PaLM's six passes) stands above its HFU
    executed = 5 * (2 * B * D * F) / mesh.size
    assert executed <= b.flops <= 1.01 * executed and 0 < b.hfu < b.mfu < 1
    # a device that repeats its neighbours' work does the same FLOPs for a smaller share
    alone = wb.Session(p, mesh).estimate(hw.H100).breakdown
    assert alone.model_flops == b.model_flops and alone.mfu < b.mfu / 4


def test_remat_raises_hfu_not_the_model_flops():
    mesh = wb.Mesh({"data": 8})
    plain, remat = (
        wb.Session(lm_program(remat=r), mesh, [wb.BP("data")]).estimate(hw.H100).breakdown
        for r in (False, True)
    )
    # (a checkpoint moves an op or two of the forward's bookkeeping into the backward)
    assert remat.model_flops == pytest.approx(plain.model_flops, rel=1e-2)
    assert remat.flops > 1.1 * plain.flops and remat.hfu / remat.mfu > plain.hfu / plain.mfu


def test_a_pipelined_step_shows_its_bubble_and_its_busiest_stages_kinds():
    p = lm_program(batch=8)
    s = wb.Session(p, wb.Mesh({"stage": 2}), [wb.PP("stage", microbatches=2)])
    e = s.estimate(hw.H100)
    b = e.breakdown
    assert b.bubble_s > 0 and "pipeline bubble" in dict(b.rows())
    assert b.compute_s + b.exposed_s + b.bubble_s == pytest.approx(e.step_s, rel=1e-6)
    # the busiest stage's passes by kind: M microbatches of its matmuls and attention
    whole = wb.Session(p, wb.Mesh({"stage": 2})).estimate(hw.H100).breakdown
    assert 0 < b.matmul_s < whole.matmul_s and 0 < b.attention_s < whole.attention_s
    assert b.matmul_s + b.attention_s > 0.3 * whole.matmul_s + 0.3 * whole.attention_s


def test_a_rings_replayed_blocks_count_as_attention():
    p = lm_program(seq_len=4096, batch=1)
    mesh = wb.Mesh({"seq": 8})
    gather, ring = (
        wb.Session(p, mesh, [wb.CP("seq", kind=k)]).estimate(hw.H100)
        for k in ("all-gather", "ring")
    )
    check_parts(ring)
    assert ring.breakdown.matmul_s == pytest.approx(gather.breakdown.matmul_s, rel=1e-6)
    assert ring.breakdown.attention_s > gather.breakdown.attention_s  # the replayed logits
    assert ring.breakdown.overlapped_s > 0  # the ring's transfers behind its blocks


def test_the_workbench_and_the_shell_show_it(capsys):
    from workbench.cli import main

    p = lm_program()
    e = wb.Session(p, wb.Mesh({"data": 8}), [wb.BP("data")]).estimate(hw.H100)
    line = render.estimate(e)
    assert f"MFU {e.breakdown.mfu:.1%}" in line and "matmuls" in line and "attention" in line
    assert "MFU" in repr(e) and "MFU" in e._repr_html_()
    argv = ["plan", "--model", "lm:tiny", "--mesh", "data=8", "--tactics", "BP('data')"]
    assert main([*argv, "--hardware", "H100"]) == 0
    out = capsys.readouterr().out
    assert "MFU " in out and "where it goes" in out and "matmuls" in out
    assert main([*argv, "--hardware", "H100", "--json"]) == 0
    import json

    got = json.loads(capsys.readouterr().out)["estimate"]["breakdown"]
    assert 0 < got["mfu"] <= got["hfu"] and got["seconds"]["matmuls"] > 0
