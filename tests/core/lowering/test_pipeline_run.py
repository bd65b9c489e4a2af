"""The pipeline lowering: a captured step run as a pipeline of stages over one mesh axis
computes what the unpartitioned step computes, in the order its schedule table gives."""

from functools import cache

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb
from workbench.core.anatomy.stages import stage_cuts
from workbench.core.errors import InputError, TacticError
from workbench.core.lowering.pipeline import lower_pipeline
from workbench.core.lowering.pipeline_segments import ticks
from workbench.core.lowering.run import (
    compare,
    example_inputs,
    reference_outputs,
    tolerance_dtypes,
)
from workbench.core.plan.schedule import schedule
from workbench.models import build, lm

BATCH, WIDTH = 8, 16


def _mlp_step(norm: bool):
    """Four tanh layers, a masked mean loss, global-norm clipping and SGD; ``norm``: each
    layer centred on its batch mean (couples the examples of a batch)."""

    def step(params, x, y, mask):
        def loss_fn(params):
            h = x
            for w in params:
                h = jnp.tanh(h @ w)
                if norm:
                    h = h - h.mean(0)
            err = jnp.sum((h - y) ** 2, axis=-1)
            return jnp.sum(err * mask) / jnp.sum(mask)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        norm2 = jnp.sqrt(sum(jnp.sum(g**2) for g in grads))
        scale = jnp.minimum(1.0, 0.5 / norm2)
        return [w - 0.1 * scale * g for w, g in zip(params, grads)], loss

    return step


@cache
def mlp(norm: bool = False):
    """The captured MLP step and its inputs: the mask keeps 5 of 8 examples, so microbatches
    hold different numbers (a mean of microbatch means would differ)."""
    rng = np.random.default_rng(0)
    params = [jnp.asarray(rng.normal(0, 0.5, (WIDTH, WIDTH)), jnp.float32) for _ in range(4)]
    x = jnp.asarray(rng.normal(size=(BATCH, WIDTH)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(BATCH, WIDTH)), jnp.float32)
    mask = jnp.asarray([1, 1, 1, 1, 1, 0, 0, 0], jnp.float32)
    program = wb.capture(_mlp_step(norm), params, x, y, mask)
    return program, [*params, x, y, mask]


@cache
def zoo_lm():
    ex = build("lm", lm.Config.preset("tiny", n_layers=4))
    program = wb.capture(ex.fn, *ex.args)
    return program, example_inputs(program)


def pipelined(program, kind, S, M, mesh=None):
    mesh = mesh or wb.Mesh({"stage": S})
    return lower_pipeline(program, mesh, "stage", stage_cuts(program, S), schedule(kind, S, M))


def assert_agrees(program, flat, lowered):
    out = lowered(*flat)
    ref = reference_outputs(program, flat)
    assert len(out) == len(ref)
    worst_abs, worst_rel, ok = compare(out, ref, tolerance_dtypes(program))
    assert ok, f"pipelined outputs differ: worst abs {worst_abs:.3g}, rel {worst_rel:.3g}"


# -- the order of work: what each stage's code runs is its row of the table ----------------
@pytest.mark.parametrize("kind", ["gpipe", "1f1b", "zero-bubble"])
def test_each_stage_emits_its_row_of_the_schedule(kind):
    program, flat = mlp()
    sched = schedule(kind, 2, 4)
    lowered = pipelined(program, kind, 2, 4)
    jax.eval_shape(lowered.fn, *flat)  # traces: each stage's branches emit their work
    assert [tuple(row) for row in lowered.emitted] == [tuple(row) for row in sched.table]


@pytest.mark.parametrize("kind", ["gpipe", "1f1b", "zero-bubble"])
@pytest.mark.parametrize("S, M", [(2, 2), (4, 4), (4, 8), (3, 5)])
def test_ticks_respect_the_dependencies(kind, S, M):
    sched = schedule(kind, S, M)
    done = {}
    for t, tick in enumerate(ticks(sched)):
        for s, w in enumerate(tick.work):
            if w is None:
                continue
            if w.kind == "F" and s > 0:
                assert done["F", s - 1, w.microbatch] < t
            if w.kind == "B" and s < S - 1:
                assert done["B", s + 1, w.microbatch] < t
            done[w.kind, s, w.microbatch] = t
    rows = [[w for tick in ticks(sched) if (w := tick.work[s])] for s in range(S)]
    assert rows == [list(row) for row in sched.table]


def test_gpipe_keeps_every_microbatch_and_1f1b_at_most_the_stages():
    program, _ = mlp()
    assert pipelined(program, "gpipe", 2, 4).slots["saved"] == 4
    assert pipelined(program, "1f1b", 2, 4).slots["saved"] == 2
    assert pipelined(program, "zero-bubble", 2, 4).slots["saved"] == 2


# -- the parts: what runs before, per microbatch, and after --------------------------------
def test_the_token_count_runs_before_and_the_update_after():
    program, _ = mlp()
    parts = pipelined(program, "1f1b", 2, 2).parts
    assert parts.pre and parts.post
    assert {program.ops[o].phase for o in parts.post} >= {"optimizer"}
    grads = {v for vs in parts.accumulated.values() for v in vs}
    assert len(grads) >= 4 + 1  # a sum per layer's gradient, and the loss's


@pytest.mark.slow  # compiles for ~5 s
def test_agrees_with_a_masked_mean_and_global_norm_clipping():
    program, flat = mlp()
    assert_agrees(program, flat, pipelined(program, "1f1b", 2, 4))


# -- bad input ------------------------------------------------------------------------------
def test_batch_coupling_ops_are_refused_by_name():
    program, _ = mlp(norm=True)
    with pytest.raises(TacticError, match=r"op \d+ \(\w+, forward.*batch normalisation"):
        pipelined(program, "gpipe", 2, 2)


def test_bad_inputs_say_what_would_work():
    program, _ = mlp()
    cuts, sched = stage_cuts(program, 2), schedule("gpipe", 2, 2)
    with pytest.raises(InputError, match="not an axis of the mesh"):
        lower_pipeline(program, wb.Mesh({"stage": 2}), "pipe", cuts, sched)
    with pytest.raises(InputError, match="cut the step into 4 stages"):
        lower_pipeline(program, wb.Mesh({"stage": 4}), "stage", cuts, sched)
    with pytest.raises(InputError, match=r"equal microbatches.*\[1, 2, 4, 8\]"):
        lower_pipeline(program, wb.Mesh({"stage": 2}), "stage", cuts, schedule("gpipe", 2, 3))
    with pytest.raises(InputError, match="one model chunk per stage"):
        sched = schedule("interleaved", 2, 2, virtual_stages=2)
        lower_pipeline(program, wb.Mesh({"stage": 2}), "stage", cuts, sched)


# -- the zoo LM: every schedule agrees with the unpartitioned step -------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, S, M",
    [
        ("gpipe", 2, 4),
        ("gpipe", 4, 2),
        ("1f1b", 2, 2),
        ("1f1b", 4, 4),
        ("zero-bubble", 4, 4),
    ],
)
def test_zoo_lm_pipelined_agrees(kind, S, M):
    program, flat = zoo_lm()
    assert_agrees(program, flat, pipelined(program, kind, S, M))


@pytest.mark.slow
def test_zoo_lm_on_stages_beside_a_replicated_axis():
    program, flat = zoo_lm()
    mesh = wb.Mesh({"stage": 4, "data": 2})
    assert_agrees(program, flat, pipelined(program, "1f1b", 4, 2, mesh=mesh))


@pytest.mark.slow
def test_a_flax_nnx_lm_pipelined_agrees():
    from tests.models.programs import program as external

    program = external("nnx_lm")
    flat = example_inputs(program)
    assert_agrees(program, flat, pipelined(program, "1f1b", 2, 2))
