"""ragged_dot_general's record (``jax.lax.ragged_dot``, mixture-of-experts layers): its rule
in each of the three modes JAX has, its cost and fusion, and its free factors tiled and run
partitioned against the unpartitioned op."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from tests.core.ops import test_rules_numerical as numerical
from tests.core.ops.cases import mapping_text
from workbench.core import ops
from workbench.core.ops.costs import op_cost
from workbench.core.ops.mapping import TensorType

i32 = jnp.int32


def a(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def _ragged_contracting(x, y, g):  # [m, k] x [m, n] -> [g, k, n]: a weight gradient
    dn = lax.RaggedDotDimensionNumbers((((0,), (0,)), ((), ())), (0,), ())
    return lax.ragged_dot_general(x, y, g, dn)


def _ragged_batch(x, y, g):  # [b, m, k] x [b, k, n], b cut into groups
    dn = lax.RaggedDotDimensionNumbers((((2,), (1,)), ((0,), (0,))), (0,), ())
    return lax.ragged_dot_general(x, y, g, dn)


def _batched(x, w, g):  # [b, m, k] x [g, b, k, n] with sizes [b, g]
    dn = lax.RaggedDotDimensionNumbers((((2,), (2,)), ((0,), (1,))), (1,), (0,))
    return lax.ragged_dot_general(x, w, g, dn)


CASES = {
    "ragged_dot_general": (lax.ragged_dot, (a(8, 4), a(3, 4, 6), a(3, dtype=i32))),
    "ragged_dot_general/contracting": (_ragged_contracting, (a(8, 4), a(8, 6), a(3, dtype=i32))),
    "ragged_dot_general/batch": (_ragged_batch, (a(4, 2, 6), a(4, 6, 8), a(3, dtype=i32))),
    "ragged_dot_general/batched_sizes": (
        _batched,
        (a(2, 8, 4), a(3, 2, 4, 6), a(2, 3, dtype=i32)),
    ),
}

GOLDEN = {
    "ragged_dot_general": "([i, j], [k, j, l], [k])->([i, l]) {i=8, j=4, k=3, l=6} sum: j blocked: i, k linear: 0 | 1",
    "ragged_dot_general/contracting": "([i, j], [i, k], [l])->([l, j, k]) {i=8, j=4, k=6, l=3} blocked: i, l linear: 0 | 1",
    "ragged_dot_general/batch": "([i, j, k], [i, k, l], [m])->([i, j, l]) {i=4, j=2, k=6, l=8, m=3} sum: k blocked: i, m linear: 0 | 1",
    "ragged_dot_general/batched_sizes": "([i, j, k], [l, i, k, m], [i, l])->([i, j, m]) {i=2, j=8, k=4, l=3, m=6} sum: k blocked: j, l linear: 0 | 1",
}  # fmt: skip


@pytest.mark.parametrize("key", sorted(CASES))
def test_rule(key):
    assert mapping_text(CASES, key) == GOLDEN[key]


def test_cost_counts_each_row_against_one_group():
    rec = ops.record("ragged_dot_general")
    assert rec.family == "dot" and rec.fusion.cpu.copies_operands and rec.fusion.cpu.why
    params = {
        "ragged_dot_dimension_numbers": lax.RaggedDotDimensionNumbers(
            (((1,), (1,)), ((), ())), (0,), (0,)
        )
    }
    ts = [TensorType((8, 4), np.float32), TensorType((3, 4, 6), np.float32), TensorType((3,), i32)]
    cost = op_cost("ragged_dot_general", params, ts, [TensorType((8, 6), np.float32)])
    assert cost.flops == 2 * 8 * 4 * 6
    grad = {"ragged_dot_dimension_numbers": lax.RaggedDotDimensionNumbers(
        (((0,), (0,)), ((), ())), (0,), ())}  # fmt: skip
    ts = [TensorType((8, 4), np.float32), TensorType((8, 6), np.float32), TensorType((3,), i32)]
    cost = op_cost("ragged_dot_general", grad, ts, [TensorType((3, 4, 6), np.float32)])
    assert cost.flops == 2 * 8 * 4 * 6  # not 3x: the groups split the rows


R = np.random.default_rng(0)
NUMERICAL = {
    # the rhs's free dim (n) and the contraction (k, a partial sum) tiled; rows and groups whole
    "ragged_dot_general": (
        lax.ragged_dot,
        (R.normal(size=(8, 4)), R.normal(size=(3, 4, 8)), np.array([3, 0, 4], np.int32)),
    ),
    "ragged_dot_general/contracting": (
        _ragged_contracting,
        (R.normal(size=(8, 4)), R.normal(size=(8, 8)), np.array([2, 5, 1], np.int32)),
    ),
    "ragged_dot_general/batched_sizes": (
        _batched,
        (R.normal(size=(2, 8, 4)), R.normal(size=(3, 2, 4, 8)), np.array([[2, 3, 3], [8, 0, 0]], np.int32)),
    ),
}  # fmt: skip


@pytest.mark.parametrize("key", sorted(NUMERICAL))
def test_partitioned_matches_unpartitioned(key, monkeypatch):
    fn, args = NUMERICAL[key]
    args = tuple(x.astype(np.float32) if x.dtype == np.float64 else x for x in args)
    monkeypatch.setitem(numerical.CASES, key, (fn, args))
    numerical.run_case(key, {"x": 4, "y": 2})
