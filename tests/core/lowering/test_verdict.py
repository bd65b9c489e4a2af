"""The run's verdict: partitioned and unpartitioned runs judged against a float64 reference."""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import workbench as wb
from workbench.core.lowering.float64 import reference64
from workbench.core.lowering.run import compare, example_inputs, references
from workbench.core.lowering.verdict import check
from workbench.core.plan import plan as planning
from workbench.models import build
from workbench.models.external import build_external

# compiles and runs partitioned programs: in the full suite (CI), not the fast lane
pytestmark = pytest.mark.slow

MESH = wb.Mesh({"data": 2, "model": 4})


def symmetric_attention(optimizer, batch=8, seq=6, dim=8, zero_bias=False):
    """A plain-JAX attention step whose key bias has an exactly zero gradient (it adds the
    same number to every key score of a query, which the softmax cancels): its rounding
    noise is all an optimizer sees of it. ``zero_bias``: the bias starts at zero."""
    k = jax.random.split(jax.random.key(0), 5)
    params = {
        "wq": jax.random.normal(k[0], (dim, dim)) / dim**0.5,
        "wk": jax.random.normal(k[1], (dim, dim)) / dim**0.5,
        "bk": jnp.zeros((dim,)) if zero_bias else jax.random.normal(k[2], (dim,)),
        "wv": jax.random.normal(k[3], (dim, dim)) / dim**0.5,
    }
    x = jax.random.normal(k[4], (batch, seq, dim))

    def loss_fn(params, x):
        q = x @ params["wq"]
        keys = x @ params["wk"] + params["bk"]
        att = jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", q, keys), axis=-1)
        return jnp.mean(jnp.einsum("bqk,bkd->bqd", att, x @ params["wv"]) ** 2)

    def step(params, opt_state, x):
        loss, grads = jax.value_and_grad(loss_fn)(params, x)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return wb.capture(step, params, optimizer.init(params), x)


OPTIMIZERS = {
    "adam": lambda: optax.adam(1e-3),
    "adamw": lambda: optax.adamw(1e-3, weight_decay=0.1),
    "adafactor": lambda: optax.adafactor(1e-3),
    "lion": lambda: optax.lion(1e-4, weight_decay=0.01),
    "clipped adamw on a schedule": lambda: optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(optax.warmup_cosine_decay_schedule(1e-4, 1e-3, 1, 10), weight_decay=0.1),
    ),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_an_optimizer_amplifying_a_zero_gradient_passes_a_correct_plan(name):
    p = symmetric_attention(OPTIMIZERS[name]())
    result = wb.Session(p, wb.Mesh({"data": 8}), [wb.BP("data")]).run(repeats=1)
    assert result.matches, str(result)
    bias = p.anatomy().new_params[p.value("params/bk").id]
    check = result.verdict.checks[p.outputs.index(bias)]
    assert check.ok and check.size == 8


def test_rounding_scales_see_through_a_cancelling_sum():
    """The key bias's update: zero in float64, yet rounding can move it by a step."""
    from workbench.core.lowering.rounding import reference_with_scales
    from workbench.core.lowering.run import example_inputs

    p = symmetric_attention(optax.adam(1e-3))
    flat = example_inputs(p)
    ref, scales = reference_with_scales(p, flat)
    a = p.anatomy()
    j = p.outputs.index(a.new_params[p.value("params/bk").id])
    before = np.asarray(flat[p.inputs.index(p.value("params/bk").id)])
    assert np.abs(ref[j] - before).max() < 1e-6  # the true step is nothing
    assert scales[j].max() > 1e-5  # but rounding can make it a large part of the step
    k = p.outputs.index(a.new_params[p.value("params/wq").id])
    assert scales[k].max() < 1e-5  # a weight with a real gradient moves by a real step


def test_rounding_noise_agrees_and_a_one_percent_error_differs():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=1000)
    unpart = (ref + rng.normal(scale=1e-7, size=1000)).astype(np.float32)
    part = (ref + rng.normal(scale=1.5e-7, size=1000)).astype(np.float32)
    assert check("x", "output", part, unpart, ref, "float32").ok
    assert not check("x", "output", part * 1.01, unpart, ref, "float32").ok
    # an integer output must be exact
    assert not check("n", "output", np.array([3]), np.array([2]), np.array([2]), "int32").ok


def test_float64_reference_is_float64_and_close_to_the_program():
    ex = build("lm", "tiny")
    p = wb.capture(ex.fn, *ex.args)
    flat = example_inputs(p)
    ref = reference64(p, flat)
    unpart, _, scales = references(p, flat)
    assert all(s is None or s.shape == np.shape(u) for s, u in zip(scales, unpart))
    assert all(r.dtype == np.float64 for r in ref if np.issubdtype(r.dtype, np.floating))
    _, rel, _ = compare(unpart, ref)
    assert rel < 1e-5


def gpt2_with_adam():
    """The README's step on GPT-2, with a constant learning rate: Adam moves every parameter
    by the learning rate on the first step, whatever the size of its gradient."""
    from transformers import FlaxGPT2LMHeadModel, GPT2Config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=32)
        model = FlaxGPT2LMHeadModel(config, seed=0)
    optimizer = optax.adamw(1e-3)

    def train_step(params, opt_state, batch):
        def loss_fn(params):
            logits = model(batch["input_ids"], params=params).logits
            return optax.softmax_cross_entropy_with_integer_labels(
                logits[:, :-1], batch["input_ids"][:, 1:]
            ).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    batch = {"input_ids": jax.random.randint(jax.random.key(1), (8, 16), 0, 256, "int32")}
    return wb.capture(train_step, model.params, optimizer.init(model.params), batch)


@pytest.mark.slow
def test_a_correct_plan_of_gpt2_with_adam_agrees():
    p = gpt2_with_adam()
    s = wb.Session(p, MESH, [wb.BP("data"), wb.MP("model")])
    result = s.run(repeats=1)
    assert result.matches, str(result)


def test_correct_plans_agree_where_a_plain_tolerance_cries_differ():
    """A key bias starting at zero whose gradient is exactly zero: Adam turns each run's
    rounding noise into a step of about its learning rate, of either sign, so the runs'
    biases differ by that much around a reference of nothing. Each output against the
    unpartitioned within float32's tolerance (the old rule) cries differ; the verdict sees
    rounding."""
    p = symmetric_attention(optax.adam(1e-3), zero_bias=True)
    result = wb.Session(p, wb.Mesh({"data": 8}), [wb.BP("data")]).run(repeats=1)
    assert result.matches, str(result)
    outputs, reference = jax.tree.leaves(result.outputs), jax.tree.leaves(result.reference)
    assert not compare(outputs, reference)[2]


def drop_first_all_reduce(monkeypatch):
    """Plans lose the first all-reduce an op's operand needs: a deliberately wrong plan."""
    dropped = []
    original = planning.Planner.run

    def run(self, probes=()):
        plan = original(self, probes)
        for i, op_plan in enumerate(plan.ops):
            for k, f in enumerate(op_plan.fetches if op_plan else ()):
                if f is not None and any(step.kind == "all-reduce" for step in f.steps):
                    steps = tuple(step for step in f.steps if step.kind != "all-reduce")
                    fetches = list(op_plan.fetches)
                    fetches[k] = dataclasses.replace(f, steps=steps)
                    ops = list(plan.ops)
                    ops[i] = dataclasses.replace(op_plan, fetches=tuple(fetches))
                    dropped.append(self.program.values[f.value].name)
                    return dataclasses.replace(plan, ops=tuple(ops))
        return plan

    monkeypatch.setattr(planning.Planner, "run", run)
    return dropped


@pytest.mark.parametrize("model", ["mlp", "lm"])
def test_a_dropped_all_reduce_is_caught_and_located(model, monkeypatch):
    ex = build(model, "tiny")
    s = wb.Session(wb.capture(ex.fn, *ex.args), MESH, [wb.BP("data")])
    assert s.run(repeats=1).matches
    s._plans.clear()
    dropped = drop_first_all_reduce(monkeypatch)
    result = s.run(repeats=1)
    assert dropped and not result.matches
    assert result.verdict.first.startswith(dropped[0])
    assert "tactic #0 BP('data')" in result.verdict.first
    assert "DIFFER" in str(result) and "first differing value" in str(result)


def advanced(ex, steps=3):
    """The example's arguments after a few steps, so a warmup schedule's rate is not zero."""
    step = jax.jit(ex.fn)
    params, opt_state, batch = ex.args
    for _ in range(steps):
        params, opt_state, _ = step(params, opt_state, batch)
    return params, opt_state, batch


@pytest.mark.parametrize("model", ["mlp", "lm", "cnn", "gnn"])
def test_every_zoo_model_with_nothing_applied_agrees(model):
    ex = build(model, "tiny")
    result = wb.Session(wb.capture(ex.fn, *ex.args), MESH).run(repeats=1)
    assert result.matches, str(result)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hf_gpt2", "nnx_vit"])
def test_third_party_models_a_few_steps_in_agree(name):
    """After a few steps (a warmup schedule's rate is no longer zero); every model of the
    matrix runs from its first step in tests/models/test_matrix_runs.py."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = build_external(name, "tiny")
        args = advanced(ex)
        p = wb.capture(ex.fn, *ex.args)
    result = wb.Session(p, MESH).run(repeats=1, args=args)
    assert result.matches, str(result)
    assert jnp.isfinite(jax.tree.leaves(result.outputs)[-1]).all()


def test_a_nan_in_the_batch_agrees_where_both_runs_have_it():
    ex = build("mlp", "tiny")
    p = wb.capture(ex.fn, *ex.args)
    batch = ex.args[-1]
    x = np.array(batch["x"])
    x[0, 0] = np.nan  # one example's NaN: the loss and every gradient become NaN
    args = (*ex.args[:-1], {**batch, "x": jnp.asarray(x)})
    result = wb.Session(p, MESH, [wb.BP("data")]).run(repeats=1, args=args)
    assert result.matches, str(result)
    assert np.isnan(np.asarray(jax.tree.leaves(result.outputs)[-1])).any()


def test_references_are_kept_per_program_and_inputs(monkeypatch):
    from workbench.core.lowering import run as running

    ex = build("mlp", "tiny")
    p = wb.capture(ex.fn, *ex.args)
    s = wb.Session(p, MESH, [wb.BP("data")])
    computed = []
    original = running.reference_with_scales

    def counting(*args, **kwargs):
        computed.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(running, "reference_with_scales", counting)
    assert s.run(repeats=1, args=ex.args).matches and len(computed) == 1
    assert s.run(repeats=1, args=ex.args).matches and len(computed) == 1  # the same inputs
    batch = {**ex.args[-1], "x": ex.args[-1]["x"] + 1.0}
    assert s.run(repeats=1, args=(*ex.args[:-1], batch)).matches and len(computed) == 2
