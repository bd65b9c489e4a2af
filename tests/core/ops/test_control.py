"""The control-flow traits: regions laid out for capture and anatomy, priced by jaxpr_cost,
and run by the interpreter (scan, while, cond)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import workbench as wb
from workbench.core import ops
from workbench.core.anatomy.layers import carried_inputs, region_operands
from workbench.core.lowering.interpret import Interpreter
from workbench.core.ops.costs import jaxpr_cost

W = jnp.linspace(-0.5, 0.5, 64, dtype=jnp.float32).reshape(8, 8)
X = jnp.linspace(0.0, 1.0, 32, dtype=jnp.float32).reshape(4, 8)


def step(x, w, flag):
    def body(c, _):
        return jnp.tanh(c @ w), c.sum()

    y, sums = lax.scan(body, x, None, length=3)
    z, k = lax.while_loop(lambda c: c[1] < 2, lambda c: (c[0] * 0.5 + y, c[1] + 1), (y, 0))
    out = lax.cond(flag, lambda a: a @ w, lambda a: a + 1.0, z)
    return out.sum() + sums.sum() + k


def test_regions_are_laid_out_by_the_control_trait():
    p = wb.capture(step, X, W, True)
    kinds = {op.primitive: op for op in p.ops if op.regions}
    assert set(kinds) == {"scan", "while", "cond"}
    assert [r.name for r in kinds["while"].regions] == ["cond", "body"]
    assert [r.name for r in kinds["cond"].regions] == ["branch0", "branch1"]
    scan, loop = kinds["scan"], kinds["while"]
    assert carried_inputs(scan, len(scan.regions[0].inputs)) == range(1, 2)  # w is a constant
    assert carried_inputs(loop, len(loop.regions[1].inputs)) == range(1, 3)
    assert region_operands(kinds["cond"]) == [kinds["cond"].operands[1:]] * 2
    control = ops.traits("scan").control
    assert control.trips(scan.params) == 3 and control.stacked(scan.params, 1)
    assert not control.stacked(scan.params, 0)
    assert ops.traits("while").control.trips(loop.params) == 1


def test_jaxpr_cost_prices_a_while_loops_regions_once():
    def loop(x):
        return lax.while_loop(lambda c: c[1] < 3, lambda c: (jnp.tanh(c[0] @ W), c[1] + 1), (x, 0))

    cost = jaxpr_cost(jax.make_jaxpr(loop)(X))
    assert cost.transcendentals == 4 * 8 and cost.flops == 2 * 4 * 8 * 8 + 2  # + add, compare


def test_the_interpreter_runs_scan_while_and_cond():
    for flag in (True, False):
        p = wb.capture(step, X, W, flag)
        (got,) = Interpreter(p)(X, W, flag)
        np.testing.assert_allclose(got, step(X, W, flag), rtol=1e-6)
