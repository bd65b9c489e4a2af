"""A Pallas kernel (``pallas_call``) is kept whole and priced: by the cost its author gives
(``cost_estimate``, as XLA takes it), else by its body's on its blocks times its grid."""

import warnings

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

import workbench as wb
from workbench.core import hardware as hw
from workbench.core import ops
from workbench.core.ops import registry
from workbench.core.ops.mapping import TensorType


def _matmul(cost_estimate=None):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] @ y_ref[...]

    def step(x, y):
        out = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]), x.dtype),
            grid=(4,),
            in_specs=[
                pl.BlockSpec((256, 1024), lambda i: (i, 0)),
                pl.BlockSpec((1024, 1024), lambda i: (0, 0)),
            ],
            out_specs=pl.BlockSpec((256, 1024), lambda i: (i, 0)),
            interpret=True,
            cost_estimate=cost_estimate,
        )(x, y)
        return out.sum()

    x = jax.ShapeDtypeStruct((1024, 1024), jnp.float32)
    return wb.capture(step, x, x)


def _kernel_estimate(program):
    e = wb.Session(program, wb.Mesh({"data": 8})).estimate(hw.H100)
    (kernel,) = [o for o in e.ops if program.ops[o.op].primitive == "pallas_call"]
    return kernel


def test_a_kernel_without_a_cost_is_priced_by_its_body_times_its_grid():
    kernel = _kernel_estimate(_matmul())
    # 4 steps of a 256 x 1024 x 1024 block matmul; its operands read and result written once
    assert kernel.cost.flops == 4 * 2 * 256 * 1024 * 1024
    assert kernel.cost.bytes_accessed == 3 * 1024 * 1024 * 4
    assert kernel.seconds >= kernel.cost.flops / hw.H100.peak_flops("float32")


def test_a_kernel_with_a_cost_estimate_is_priced_as_its_author_says():
    given = pl.CostEstimate(flops=10**12, transcendentals=0, bytes_accessed=10**9)
    kernel = _kernel_estimate(_matmul(given))
    assert (kernel.cost.flops, kernel.cost.bytes_accessed) == (1e12, 1e9)
    assert kernel.seconds == pytest.approx(1e12 / hw.H100.peak_flops("float32"), rel=0.01)


def test_a_kernel_is_kept_whole_saying_why():
    rule = registry.record("pallas_call").rule
    assert "Pallas kernel" in rule.reason and "whole" in rule.reason
    program = _matmul()
    (o,) = [o for o in program.body if program.ops[o].primitive == "pallas_call"]
    types = [
        TensorType(program.values[v].shape, program.values[v].dtype)
        for v in program.ops[o].operands
    ]
    (out,) = program.ops[o].results
    result = TensorType(program.values[out].shape, program.values[out].dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert ops.mapping_for("pallas_call", program.ops[o].params, types, [result]).barrier
