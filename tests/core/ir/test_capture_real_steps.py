"""Capture what real training steps contain, shard them data-parallel, and check that the
partitioned step computes what the unpartitioned one computes.

Each step is tiny. The batch is tiled with an explicit selector (``Tile("batch/x", 0,
"data")``), the simulator prices it, and where it runs, ``Session.run()`` must agree with
the unpartitioned step: random keys (typed and raw, passed in and made inside, threefry and
rbg), dropout, optax chains, flax.nnx optimizers and jitted steps, bf16 compute with f32
master weights, remat, custom_vjp, scan and cond.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import workbench as wb
from workbench.core.xla.crosscheck import crosscheck

optax = pytest.importorskip("optax")

DP = wb.Mesh({"data": 8})
MIXED = wb.Mesh({"data": 2, "model": 4})
K = jax.random.split(jax.random.key(1), 4)
PARAMS = {
    "w1": jax.random.normal(K[0], (16, 32)) * 0.2,
    "b1": jnp.zeros(32),
    "w2": jax.random.normal(K[1], (32, 4)) * 0.2,
}
BATCH = {"x": jax.random.normal(K[2], (8, 16)), "y": jax.random.normal(K[3], (8, 4))}


def mlp_loss(p, x, y, mask=1.0):
    h = jnp.tanh(x @ p["w1"] + p["b1"]) * mask
    return jnp.mean((h @ p["w2"] - y) ** 2)


def sgd(params, grads):
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


def dropout(key, shape, rate=0.2):
    return jax.random.bernoulli(key, 1.0 - rate, shape) / (1.0 - rate)


def data_parallel(program, *names, mesh=DP) -> wb.Session:
    s = wb.Session(program, mesh)
    for name in names or ("batch/x", "batch/y"):
        s.apply(wb.Tile(name, 0, "data"))
    return s


def check(s: wb.Session, *lowerings: str):
    """The estimate works, and each lowering's run agrees with the unpartitioned step."""
    estimate = s.estimate()
    assert estimate.step_s > 0 and estimate.memory.peak > 0
    results = []
    for lowering in lowerings or ("explicit",):
        result = s.run(lowering=lowering, repeats=1)
        assert result.matches, str(result)
        results.append(result)
    return estimate, results


def named(program, primitive) -> list[str]:
    return [program.values[op.results[0]].name for op in program.ops if op.primitive == primitive]


# -- random keys ---------------------------------------------------------------------------------
def dropout_step(params, batch, key):
    key, sub = jax.random.split(key)
    mask = dropout(jax.random.fold_in(sub, 7), (batch["x"].shape[0], 32))
    loss, grads = jax.value_and_grad(mlp_loss)(params, batch["x"], batch["y"], mask)
    return {"params": sgd(params, grads), "key": key, "loss": loss}


@pytest.mark.slow  # seconds: in the full suite, not the fast lane
def test_dropout_with_a_typed_key_input():
    program = wb.capture(dropout_step, PARAMS, BATCH, jax.random.key(0))
    assert str(program.value("key").dtype) == "key<fry>" and program.value("key").nbytes == 8
    assert {"random_split", "random_fold_in", "random_bits"} <= program.primitives
    s = data_parallel(program)
    (bits,) = named(program, "random_bits")
    assert str(s.sharding(bits)) == "u32[8@data,32]"  # each device draws only its rows
    estimate, results = check(s, "explicit", "constrained")
    (priced,) = [o for o in estimate.ops if program.ops[o.op].primitive == "random_bits"]
    assert priced.cost.flops == 121 * 1 * 32  # threefry on the local block: 1 row of 32
    assert not any(r.notes for r in results)


def test_key_arrays_copy_to_the_host_and_back():
    from workbench.core.lowering.run import host_copy

    keys = jax.random.split(jax.random.key(0, impl="rbg"), 3)
    copy = host_copy(keys)
    assert copy.dtype == keys.dtype and copy is not keys
    assert (jax.random.key_data(copy) == jax.random.key_data(keys)).all()


@pytest.mark.slow  # seconds: in the full suite, not the fast lane
def test_random_bits_tiled_on_two_axes_in_every_width():
    def noisy(x, key):
        k8, k16, k32 = jax.random.split(key, 3)
        small = jax.random.bits(k8, x.shape, jnp.uint8) + jax.random.bits(k16, x.shape, jnp.uint16)
        return x * jax.random.uniform(k32, x.shape) + small.astype(jnp.float32)

    program = wb.capture(noisy, jnp.ones((8, 32)), jax.random.key(5))
    s = wb.Session(program, MIXED)
    s.apply(wb.Tile("x", 0, "data"))
    s.apply(wb.Tile("x", 1, "model"))
    tiled = {str(s.sharding(b)).split("[")[1] for b in named(program, "random_bits")}
    assert tiled == {"8@data,32@model]"}  # u8, u16 and u32 bits, each device its block
    check(s, "explicit", "constrained")


@pytest.mark.slow  # seconds: in the full suite, not the fast lane
def test_a_key_planned_without_arrays_runs_on_random_keys():
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (PARAMS, BATCH))
    key = jax.ShapeDtypeStruct((), jax.random.key(0, impl="rbg").dtype)
    program = wb.capture(dropout_step, *shapes, key)
    assert program.example_args is None
    check(data_parallel(program))


@pytest.mark.slow  # seconds: in the full suite
def test_dropout_with_a_raw_key_input():
    program = wb.capture(dropout_step, PARAMS, BATCH, jax.random.PRNGKey(0))
    assert str(program.value("key").dtype) == "uint32" and program.value("key").shape == (2,)
    assert {"random_wrap", "random_unwrap"} <= program.primitives
    check(data_parallel(program))


@pytest.mark.slow  # seconds: in the full suite, not the fast lane
def test_keys_made_inside_the_step():
    def step(params, batch, step):
        typed = jax.random.fold_in(jax.random.key(42), step)
        raw = jax.random.fold_in(jax.random.PRNGKey(7), step)
        mask = dropout(typed, (8, 32)) * jax.random.uniform(raw, (8, 32))
        loss, grads = jax.value_and_grad(mlp_loss)(params, batch["x"], batch["y"], mask)
        return {"params": sgd(params, grads), "loss": loss}

    program = wb.capture(step, PARAMS, BATCH, jnp.uint32(3))
    assert "random_seed" in program.primitives
    check(data_parallel(program), "explicit", "constrained")


@pytest.mark.slow  # seconds: in the full suite, not the fast lane
def test_per_example_keys_tiled_with_the_batch():
    def step(params, batch, keys):
        mask = jax.vmap(lambda k: dropout(k, (32,)))(keys)
        loss, grads = jax.value_and_grad(mlp_loss)(params, batch["x"], batch["y"], mask)
        swapped = keys[::-1]  # a reversal cannot be split: the keys are gathered first
        return {"params": sgd(params, grads), "loss": loss, "keys": swapped}

    keys = jax.random.split(jax.random.key(0), 8)
    program = wb.capture(step, PARAMS, BATCH, keys)
    s = data_parallel(program, "batch/x", "batch/y", "keys")
    assert str(s.sharding("keys")) == "key<fry>[8@data]"
    (gather,) = [c for c in s.collectives() if c.kind == "all-gather"]
    assert gather.bytes == 8 * 8  # eight keys of two uint32 words
    assert crosscheck(s).identical  # what XLA compiles moves the same bytes
    check(s, "explicit", "constrained")


@pytest.mark.slow  # seconds each: in the full suite
@pytest.mark.parametrize("impl", ["rbg", "unsafe_rbg"])
def test_rbg_keys_match_and_the_verdict_says_why(impl):
    program = wb.capture(dropout_step, PARAMS, BATCH, jax.random.key(0, impl=impl))
    assert program.value("key").nbytes == 16  # four uint32 words
    s = data_parallel(program)
    (bits,) = named(program, "random_bits")
    assert str(s.sharding(bits)) == "u32[8@data,32]"
    plan = s.plan().ops[program.value(bits).producer]
    assert str(plan.results[0]) == "u32[8,32]"  # generated whole, then each keeps its rows
    _, (result,) = check(s)
    assert any(impl in note and "whole on every device" in note for note in result.notes)
    assert "note: random bits from" in str(result)


def test_rbg_as_the_default_implementation():
    def step(params, batch):
        mask = dropout(jax.random.key(3), (8, 32))
        loss, grads = jax.value_and_grad(mlp_loss)(params, batch["x"], batch["y"], mask)
        return {"params": sgd(params, grads), "loss": loss}

    before = jax.config.jax_default_prng_impl
    jax.config.update("jax_default_prng_impl", "rbg")
    try:
        program = wb.capture(step, PARAMS, BATCH)
    finally:
        jax.config.update("jax_default_prng_impl", before)
    _, (result,) = check(data_parallel(program))
    assert result.notes


@pytest.mark.slow  # seconds: in the full suite, not the fast lane
def test_threefry_bits_without_partitionable_are_generated_whole():
    with jax.threefry_partitionable(False):
        program = wb.capture(dropout_step, PARAMS, BATCH, jax.random.key(0))
        _, (result,) = check(data_parallel(program))
    assert any("jax_threefry_partitionable is off" in n for n in result.notes)


def test_unknown_primitive_on_keys_warns_and_is_a_barrier():
    from jax.extend.core import Primitive
    from jax.interpreters import mlir

    mystery = Primitive("key_mystery")
    mystery.def_impl(lambda k: k)
    mystery.def_abstract_eval(lambda k: k)
    mlir.register_lowering(mystery, lambda ctx, k: [k])

    def step(params, batch, keys):
        mask = jax.vmap(lambda k: dropout(k, (32,)))(mystery.bind(keys))
        return mlp_loss(params, batch["x"], batch["y"], mask)

    program = wb.capture(step, PARAMS, BATCH, jax.random.split(jax.random.key(0), 8))
    with pytest.warns(UserWarning, match="no sharding rule for primitive 'key_mystery'"):
        s = data_parallel(program, "batch/x", "batch/y", "keys")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(s)


# -- optimizers -----------------------------------------------------------------------------------
@pytest.mark.slow  # seconds: in the full suite, not the fast lane
def test_optax_adamw_schedule_clipping_multisteps_and_masked_decay():
    schedule = optax.warmup_cosine_decay_schedule(0.0, 1e-2, warmup_steps=10, decay_steps=100)
    decay_mask = jax.tree.map(lambda p: p.ndim > 1, PARAMS)  # no weight decay on biases
    tx = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(schedule, weight_decay=0.1, mask=decay_mask),
    )
    tx = optax.MultiSteps(tx, every_k_schedule=2)

    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(mlp_loss)(params, batch["x"], batch["y"])
        updates, opt_state = tx.update(grads, opt_state, params)
        return {
            "params": optax.apply_updates(params, updates),
            "opt_state": opt_state,
            "loss": loss,
        }

    program = wb.capture(step, PARAMS, tx.init(PARAMS), BATCH)
    assert {"cond", "sqrt", "cos"} <= program.primitives  # MultiSteps' cond, adam, cosine
    assert program.has_value("opt_state/acc_grads/w1")
    check(data_parallel(program), "explicit", "constrained")


@pytest.mark.slow  # several seconds: in the full suite, not the fast lane
def test_flax_nnx_optimizer_and_jit_step_updated_in_place():
    nnx = pytest.importorskip("flax.nnx")

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.hidden = nnx.Linear(16, 32, rngs=rngs)
            self.drop = nnx.Dropout(0.2, rngs=rngs)
            self.out = nnx.Linear(32, 4, rngs=rngs)

        def __call__(self, x):
            return self.out(self.drop(nnx.relu(self.hidden(x))))

    model = Model(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)

    @nnx.jit
    def train_step(model, optimizer, x, y):
        def loss_fn(model):
            return ((model(x) - y) ** 2).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    program = wb.capture(train_step, model, optimizer, BATCH["x"], BATCH["y"])
    # the step returns only the loss; what it updates in place becomes outputs too
    assert "out/result" in program.output_names
    assert "out/model/hidden/kernel/value" in program.output_names
    assert "out/optimizer/opt_state/0/mu/hidden/kernel/value" in program.output_names
    assert str(program.value("model/drop/rngs/key/value").dtype) == "key<fry>"
    check(data_parallel(program, "x", "y"))

    # the functional form of the same step: split once, merge inside
    graphdef, state = nnx.split((model, optimizer))

    def functional(state, x, y):
        model, optimizer = nnx.merge(graphdef, state)
        loss = train_step(model, optimizer, x, y)
        return {"state": nnx.state((model, optimizer)), "loss": loss}

    program = wb.capture(functional, state, BATCH["x"], BATCH["y"])
    assert "out/state/0/hidden/kernel/value" in program.output_names
    assert program.value("out/state/1/step/value").shape == ()
    check(data_parallel(program, "x", "y"))


# -- precision and structure ----------------------------------------------------------------------
def test_bf16_compute_with_f32_master_weights():
    def loss_fn(params, x, y):
        half = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
        out = mlp_loss(half, x.astype(jnp.bfloat16), y.astype(jnp.bfloat16))
        return out.astype(jnp.float32)

    def step(params, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch["x"], batch["y"])
        return {"params": sgd(params, grads), "loss": loss}

    program = wb.capture(step, PARAMS, BATCH)
    assert program.value("out/params/w1").dtype == jnp.float32
    assert any(v.dtype == jnp.bfloat16 for v in program.values)
    check(data_parallel(program, mesh=MIXED), "explicit", "constrained")


@pytest.mark.slow  # seconds: in the full suite, not the fast lane
def test_remat_custom_vjp_scan_and_cond():
    @jax.custom_vjp
    def clip_gradient(x):
        return x

    clip_gradient.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -0.1, 0.1),))

    def loss_fn(params, x, y, flag):
        h = jax.checkpoint(lambda w, h: jnp.tanh(h @ w))(params["w_in"], x)
        h = clip_gradient(h)
        h, _ = lax.scan(lambda h, w: (jax.checkpoint(jnp.tanh)(h @ w), None), h, params["layers"])
        h = lax.cond(flag > 0, lambda h: 2.0 * h, lambda h: h, h)
        return jnp.mean((h @ params["w_out"] - y) ** 2)

    def step(params, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch["x"], batch["y"], batch["flag"])
        return {"params": sgd(params, grads), "loss": loss}

    params = {
        "w_in": PARAMS["w1"],
        "layers": jax.random.normal(K[0], (3, 32, 32)) * 0.2,
        "w_out": PARAMS["w2"],
    }
    program = wb.capture(step, params, dict(BATCH, flag=jnp.int32(1)))
    assert {"scan", "cond"} <= program.primitives  # loops and branches stay regions
    assert not program.primitives & {"checkpoint", "remat2", "custom_vjp_call"}  # inlined
    check(data_parallel(program, mesh=MIXED), "explicit", "constrained")
