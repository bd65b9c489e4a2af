"""Capture works on models written with Flax (NNX and Linen) and Equinox.

Each model is turned into a pure function of its parameters (the framework's own way),
and a ``jax.grad`` SGD step over it is captured: inputs are named after the framework's
parameter paths, and the backward pass is there.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb

eqx = pytest.importorskip("equinox")
nn = pytest.importorskip("flax.linen")
nnx = pytest.importorskip("flax.nnx")

X = jnp.ones((8, 16), jnp.float32)
Y = jnp.zeros((8, 4), jnp.float32)


def sgd_step(loss_fn):
    """A training step ``step(params, x, y) -> (params, loss)`` for ``loss_fn(params, x, y)``."""

    def step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        grads = wb.tag(grads, "grads")
        with jax.named_scope("optimizer"):
            params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
        return params, loss

    return step


def check(program: wb.Program, expected_inputs: set[str], step, *args) -> None:
    names = set(program.names())
    assert expected_inputs <= names, sorted(n for n in names if "/" in n)[:20]
    assert {"dot_general", "max"} <= program.primitives
    assert any(n.startswith("bwd/") for n in names)
    assert {"forward", "backward", "optimizer"} <= {op.phase for op in program.ops}
    _, loss = jax.jit(step)(*args)
    assert np.isfinite(float(loss))


def test_flax_nnx_model():
    class MLP(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.hidden = nnx.Linear(16, 32, rngs=rngs)
            self.out = nnx.Linear(32, 4, rngs=rngs)

        def __call__(self, x):
            return self.out(nnx.relu(self.hidden(x)))

    graphdef, state = nnx.split(MLP(nnx.Rngs(0)), nnx.Param)

    def loss_fn(state, x, y):
        return jnp.mean((nnx.merge(graphdef, state)(x) - y) ** 2)

    step = sgd_step(loss_fn)
    program = wb.capture(step, state, X, Y)
    expected = {"params/hidden/kernel/value", "params/hidden/bias/value", "params/out/kernel/value"}
    check(program, expected | {"grads/hidden/kernel/value"}, step, state, X, Y)
    assert program.value("params/hidden/kernel/value").shape == (16, 32)


def test_flax_linen_model():
    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Dense(32, name="hidden")(x))
            return nn.Dense(4, name="out")(x)

    model = MLP()
    variables = model.init(jax.random.key(0), X)

    def loss_fn(variables, x, y):
        return jnp.mean((model.apply(variables, x) - y) ** 2)

    step = sgd_step(loss_fn)
    program = wb.capture(step, variables, X, Y)
    expected = {"params/params/hidden/kernel", "params/params/out/bias"}
    check(program, expected | {"grads/params/out/kernel"}, step, variables, X, Y)
    assert program.value("params/params/out/kernel").shape == (32, 4)


def test_equinox_model():
    class MLP(eqx.Module):
        hidden: eqx.nn.Linear
        out: eqx.nn.Linear

        def __init__(self, key):
            k1, k2 = jax.random.split(key)
            self.hidden = eqx.nn.Linear(16, 32, key=k1)
            self.out = eqx.nn.Linear(32, 4, key=k2)

        def __call__(self, x):
            return self.out(jax.nn.relu(self.hidden(x)))

    params, static = eqx.partition(MLP(jax.random.key(0)), eqx.is_array)

    def loss_fn(params, x, y):
        model = eqx.combine(params, static)
        return jnp.mean((jax.vmap(model)(x) - y) ** 2)

    step = sgd_step(loss_fn)
    program = wb.capture(step, params, X, Y)
    expected = {"params/hidden/weight", "params/hidden/bias", "params/out/weight"}
    check(program, expected | {"grads/out/weight"}, step, params, X, Y)
    assert program.value("params/hidden/weight").shape == (32, 16)
