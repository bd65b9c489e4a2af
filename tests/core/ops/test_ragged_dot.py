"""ragged_dot_general's record (``jax.lax.ragged_dot``, mixture-of-experts layers): its rule
in each of the three modes JAX has, its cost and fusion (on local shapes with the groups
split too), and its free factors and its groups tiled and run partitioned (forward and
backward) against the unpartitioned op."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import workbench as wb
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
    "ragged_dot_general": "([i, j], [k, j, l], [m])->([i, l]) {i=8, j=4, k=3, l=6, m=3} sum: j, k blocked: i, m linear: 0 | 1",
    "ragged_dot_general/contracting": "([i, j], [i, k], [l])->([m, j, k]) {i=8, j=4, k=6, l=3, m=3} blocked: i, l linear: 0 | 1",
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


def test_cost_on_local_shapes_counts_the_devices_own_groups():
    # 2 of 4 groups on this device: half the rows, balanced (the sizes stay whole)
    rec = ops.record("ragged_dot_general")
    assert rec.local.__name__ == "_ragged_local"
    params = {
        "ragged_dot_dimension_numbers": lax.RaggedDotDimensionNumbers(
            (((1,), (1,)), ((), ())), (0,), (0,)
        )
    }
    ts = [TensorType((8, 4), np.float32), TensorType((2, 4, 6), np.float32), TensorType((4,), i32)]
    cost = op_cost("ragged_dot_general", params, ts, [TensorType((8, 6), np.float32)])
    assert cost.flops == 2 * 8 * 4 * 6 * 2 / 4
    grad = {"ragged_dot_dimension_numbers": lax.RaggedDotDimensionNumbers(
        (((0,), (0,)), ((), ())), (0,), ())}  # fmt: skip
    ts = [TensorType((8, 4), np.float32), TensorType((8, 6), np.float32), TensorType((4,), i32)]
    cost = op_cost("ragged_dot_general", grad, ts, [TensorType((2, 4, 6), np.float32)])
    assert cost.flops == 2 * 8 * 4 * 6 * 2 / 4


R = np.random.default_rng(0)
NUMERICAL = {
    # the rhs's free dim (n), the contraction (k, a partial sum) and the groups tiled (free
    # mode: the rhs's groups, a partial sum; contracting mode: the result's); rows whole
    "ragged_dot_general": (
        lax.ragged_dot,
        (R.normal(size=(8, 4)), R.normal(size=(4, 4, 8)), np.array([3, 0, 4, 1], np.int32)),
    ),
    "ragged_dot_general/contracting": (
        _ragged_contracting,
        (R.normal(size=(8, 4)), R.normal(size=(8, 8)), np.array([2, 5, 0, 1], np.int32)),
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


def _step(x, w, sizes):
    """A grouped matmul, a nonlinearity and its gradients: the forward op (free mode) and
    the backward's (free mode for the rows, contracting mode for the weights)."""

    def loss(x, w):
        return jnp.sum(jnp.sin(lax.ragged_dot(x, w, sizes)) ** 2)

    return jax.value_and_grad(loss, argnums=(0, 1))(x, w)


@pytest.mark.parametrize(
    "sizes",
    [[3, 0, 5, 2, 1, 4, 0, 1], [16, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 9]],
    ids=["uneven", "all-in-one", "last-only"],
)
def test_groups_split_run_forward_and_backward_like_the_unpartitioned(sizes):
    """8 groups on 4 devices (2 each): each runs its groups' rows (a block at an offset the
    sizes give; rows past the groups, here up to 4, belong to none); the rows' result is a
    sum over the axis, the weights' gradient keeps the groups split: no collective."""
    x, w = R.normal(size=(20, 6)).astype(np.float32), R.normal(size=(8, 6, 5)).astype(np.float32)
    program = wb.capture(_step, x, w, np.array(sizes, np.int32))
    (dw,) = [program.ops[op].results[0] for op in _ragged_ops(program, contracting=True)]
    tiles = [wb.Tile(program.values[v].name, 0, "x") for v in (program.inputs[1], dw)]
    s = wb.Session(program, wb.Mesh({"x": 4, "y": 2}), tiles)
    assert str(s.state.shardings[dw]) == "f32[8@x,6,5]" and not s.conflicts
    kinds = sorted((c.kind, c.axes) for c in s.collectives() for _ in range(c.count))
    # the forward result is reduced before the sine; the rows' gradient before its output
    assert kinds == [("all-reduce", ("x",))] * 2
    lowered, _ = s.lower("explicit", devices=jax.devices()[:8])
    got = lowered(*program.example_args)
    want = jax.tree.leaves(jax.jit(_step)(x, w, np.array(sizes, np.int32)))
    for g, v in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(v), rtol=2e-5, atol=2e-5)


def _ragged_ops(program, contracting: bool) -> list[int]:
    out = []
    for op in program.ops:
        if op.primitive == "ragged_dot_general":
            (lc, _), _ = op.params["ragged_dot_dimension_numbers"].dot_dimension_numbers
            if (0 in lc) == contracting:
                out.append(op.id)
    return out


def test_batched_sizes_keep_the_groups_whole():
    # sizes per batch row ([b, g]): the offset of a device's groups differs by row, which the
    # local lowering does not build; the groups stay blocked (gathered where tiled)
    fn, args = NUMERICAL["ragged_dot_general/batched_sizes"]
    program = wb.capture(fn, *(a.astype(np.float32) if a.dtype == np.float64 else a for a in args))
    (op,) = (op for op in program.ops if op.primitive == "ragged_dot_general")
    mapping = program.mapping(op)
    assert mapping.operands[1][0][0] in mapping.blocked
