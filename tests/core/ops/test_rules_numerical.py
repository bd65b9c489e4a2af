"""Every case of every sharding rule, run partitioned: each factor its rule leaves free is
tiled on a mesh axis of its own, the program is lowered explicitly (``shard_map``, the
records' local lowerings) and its outputs compared with the unpartitioned op's.

The meshes are not the usual {2, 4} and {8}: three axes of 2, one with an axis of size 1,
and 4 x 2. Each case asserts the op really ran with every such factor tiled (the plan's
``factor_axes``), so no case passes by gathering everything first."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import workbench as wb

f32, i32 = jnp.float32, jnp.int32
MESHES = ({"a": 2, "b": 2, "c": 2}, {"u": 1, "v": 4, "w": 2}, {"x": 4, "y": 2})
RNG = np.random.default_rng(0)


def r(*shape):
    return RNG.normal(size=shape).astype(np.float32)


def ints(*shape, high=4):
    return RNG.integers(0, high, size=shape).astype(np.int32)


def _conv(x, w, strides=(1, 1), groups=1):
    dn = ("NHWC", "HWIO", "NHWC")
    return lax.conv_general_dilated(
        x, w, strides, "SAME", dimension_numbers=dn, feature_group_count=groups
    )


def _pool_grad(x):
    def pool(z):
        return lax.reduce_window(z, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    return jax.grad(lambda z: (pool(z) ** 2).sum())(x)


# key -> (fn, args); the key's part before "/" names the primitive whose op is checked
CASES = {
    # elementwise (shared factors, scalars and broadcast size-1 dims carry none)
    "add": (lambda x, y: x + y, (r(4, 8), r(4, 8))),
    "mul/broadcast": (lambda x, y: lax.mul(x, y), (r(4, 8), r(1, 8))),
    "select_n": (lambda p, x, y: lax.select(p, x, y), (r(4, 8) > 0, r(4, 8), r(4, 8))),
    "clamp": (lambda x: lax.clamp(-0.5, x, 0.5), (r(4, 8),)),
    "erf_inv": (lambda x: lax.erf_inv(jnp.tanh(x)), (r(4, 8),)),
    "reduce_precision": (lambda x: lax.reduce_precision(x, 5, 10), (r(4, 8),)),
    "le_to": (lambda x, y: lax.le_to_p.bind(x, y), (r(4, 8), r(4, 8))),
    "integer_pow": (lambda x: x**3, (r(4, 8),)),
    # contractions
    "dot_general": (lambda x, w: x @ w, (r(4, 8), r(8, 4))),
    "dot_general/batched": (
        lambda q, k: jnp.einsum("bqd,bkd->bqk", q, k),
        (r(2, 4, 8), r(2, 8, 8)),
    ),
    "conv_general_dilated": (_conv, (r(2, 8, 8, 4), r(3, 3, 4, 8))),
    "conv_general_dilated/patches": (
        lambda x, w: _conv(x, w, strides=(4, 4)),
        (r(2, 8, 8, 2), r(4, 4, 2, 8)),
    ),
    "conv_general_dilated/depthwise": (
        lambda x, w: _conv(x, w, groups=4),
        (r(2, 8, 8, 4), r(3, 3, 1, 8)),
    ),
    # reductions and scans
    "reduce_sum": (lambda x: x.sum(axis=1), (r(4, 8, 2),)),
    "reduce_max": (lambda x: x.max(axis=0), (r(8, 4),)),
    "reduce_min": (lambda x: x.min(axis=1), (r(4, 8),)),
    "argmax": (lambda x: jnp.argmax(x, axis=1), (r(4, 8, 2),)),
    "argmin": (lambda x: jnp.argmin(x, axis=0), (r(8, 4),)),
    "reduce_prod": (lambda x: jnp.prod(x, axis=1), (r(4, 8),)),
    "cumsum": (lambda x: jnp.cumsum(x, axis=1), (r(4, 8, 2),)),
    "cumsum/reverse": (lambda x: lax.cumsum(x, axis=0, reverse=True), (r(8, 4),)),
    "cumprod": (lambda x: jnp.cumprod(x, axis=0), (r(8, 4),)),
    "cummax": (lambda x: lax.cummax(x, axis=1), (r(4, 8),)),
    "cummin": (lambda x: lax.cummin(x, axis=1), (r(4, 8),)),
    "cumlogsumexp": (lambda x: lax.cumlogsumexp(x, axis=1), (r(4, 8),)),
    # sorting and windows
    "sort": (lambda x: jnp.sort(x, axis=1), (r(4, 8, 2),)),
    "sort/multi_operand": (
        lambda k, v: lax.sort((k, v), dimension=0, num_keys=1),
        (r(8, 4), r(8, 4)),
    ),
    "sort/argsort": (lambda x: jnp.argsort(x, axis=-1), (r(4, 2, 8),)),
    "top_k": (lambda x: lax.top_k(x, 3), (r(4, 2, 8),)),
    "reduce_window_sum": (
        lambda x: lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"),
        (r(2, 8, 8, 4),),
    ),
    "reduce_window_max": (
        lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"),
        (r(2, 8, 8, 4),),
    ),
    "select_and_scatter_add": (_pool_grad, (r(2, 8, 8, 4),)),
    # shape ops
    "broadcast_in_dim": (lambda x: jnp.broadcast_to(x[:, None, :], (4, 2, 8)), (r(4, 8),)),
    "reshape/merge": (lambda x: x.reshape(8, 4), (r(2, 4, 4),)),
    "reshape/split": (lambda x: x.reshape(2, 4, 4), (r(8, 4),)),
    "reshape/mixed": (lambda x: x.reshape(4, 6), (r(6, 4),)),
    "transpose": (lambda x: x.transpose(2, 0, 1), (r(2, 4, 8),)),
    "squeeze": (lambda x: x.squeeze(1), (r(4, 1, 8),)),
    "rev": (lambda x: x[::-1], (r(4, 8),)),
    "concatenate": (lambda x, y: jnp.concatenate([x, y], axis=1), (r(4, 8), r(4, 2))),
    "pad": (lambda x: jnp.pad(x, ((0, 0), (1, 2))), (r(4, 8),)),
    "pad/value": (lambda x: jnp.pad(x, ((1, 1), (0, 0)), constant_values=3.0), (r(4, 8),)),
    "slice": (lambda x: x[:, 1:3], (r(4, 8),)),
    "split": (lambda x: jnp.split(x, 2, axis=1), (r(4, 8),)),
    "iota": (lambda: lax.broadcasted_iota(i32, (4, 8), 1), ()),
    "tile": (lambda x: jnp.tile(x, (2, 1)), (r(4, 8),)),
    "tile/both": (lambda x: jnp.tile(x, (2, 4)), (r(4, 2),)),
    "tile/cls_token": (
        lambda cls, x: jnp.concatenate([jnp.tile(cls, (x.shape[0], 1, 1)), x], axis=1),
        (r(1, 1, 8), r(4, 3, 8)),
    ),
    # indexing
    "dynamic_slice": (
        lambda x, i: lax.dynamic_slice_in_dim(x, i, 2, axis=1),
        (r(4, 8), np.int32(3)),
    ),
    "dynamic_update_slice": (
        lambda x, u, i: lax.dynamic_update_slice_in_dim(x, u, i, axis=1),
        (r(4, 8), r(4, 2), np.int32(5)),
    ),
    "gather/embedding": (lambda e, t: e[t], (r(16, 8), ints(4, 2, high=16))),
    "gather/take_along_axis": (
        lambda x, i: jnp.take_along_axis(x, i[:, :, None], axis=-1),
        (r(2, 4, 16), ints(2, 4, high=16)),
    ),
    "gather/rows": (lambda x, i: jnp.take(x, i, axis=1), (r(4, 8), ints(2, high=8))),
    "scatter-add/embedding_grad": (
        lambda e, t: jax.grad(lambda e: (e[t] ** 2).sum())(e),
        (r(16, 8), ints(4, 2, high=16)),
    ),
    "scatter-add/segment_sum": (
        lambda x, s: jax.ops.segment_sum(x, s, num_segments=8),
        (r(16, 4), ints(16, high=8)),
    ),
    "scatter": (lambda x, i, u: x.at[i].set(u), (r(8, 4), np.array([1, 6, 3], np.int32), r(3, 4))),
    "scatter-mul": (lambda x, i, u: x.at[i].multiply(u), (r(8, 4), ints(3, high=8), r(3, 4))),
    "scatter-min": (lambda x, i, u: x.at[i].min(u), (r(8, 4), ints(3, high=8), r(3, 4))),
    "scatter-max": (lambda x, i, u: x.at[i].max(u), (r(8, 4), ints(3, high=8), r(3, 4))),
    # control flow
    "scan": (
        lambda c, xs, w: lax.scan(lambda c, x: (jnp.tanh(c @ w + x), c.sum(1)), c, xs),
        (r(4, 8), r(3, 4, 8), r(8, 8) * 0.3),
    ),
    "while": (
        lambda x, w: lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] @ w), (0, x)),
        (r(4, 8), r(8, 8) * 0.3),
    ),
    "cond": (
        lambda p, x: lax.cond(p, lambda y: y + 1.0, lambda y: y * 2.0, x),
        (np.bool_(True), r(4, 8)),
    ),
}

#: Cases that compile for long (loops, windows, convolutions): the slow lane only.
SLOW = {"scan", "while", "select_and_scatter_add", "conv_general_dilated/depthwise"}


def seeds(program, op, mesh: dict) -> dict[int, tuple]:
    """Per free factor of ``op``, a ``Tile`` on an axis of its own (the largest dividing it;
    an axis of size 1 where no other is left), on a dimension it leads: an operand's, or
    else a result's. A factor behind another in a merged dimension (``[B*S]``) is tiled only
    where the factors before it are whole on their axes (else no block layout holds it)."""
    mapping = program.mapping(op)
    tensors = [*zip(op.operands, mapping.operands), *zip(op.results, mapping.results)]
    before: dict[int, set] = {}
    for _, dims in tensors:
        for factors in dims:
            for k, f in enumerate(factors):
                before.setdefault(f, set()).update(factors[:k])
    free_axes = sorted(mesh, key=lambda ax: -mesh[ax])  # an axis of size 1 last
    whole, out = set(), {}
    for f in sorted(before, key=lambda f: len(before[f])):
        size = mapping.sizes[f]
        if f in mapping.blocked or size == 1 or not before[f] <= whole:
            continue
        axis = next((ax for ax in free_axes if size % mesh[ax] == 0), None)
        where = next(
            (
                (v, d)
                for v, dims in tensors
                if isinstance(v, int)
                for d, factors in enumerate(dims)
                if factors[:1] == (f,)
            ),
            None,
        )
        if axis is None or where is None:
            continue
        free_axes.remove(axis)
        if mesh[axis] == size:
            whole.add(f)
        v, d = where
        out[f] = (wb.Tile(program.values[v].name, d, axis), axis)
    return out


def run_case(key: str, mesh: dict, lowering: str = "explicit") -> None:
    fn, args = CASES[key]
    program = wb.capture(fn, *args)
    primitive = key.split("/")[0]
    op = next(op for op in program.ops if op.primitive == primitive)
    assert not program.mapping(op).barrier, f"{primitive} fell back to a barrier"
    s = wb.Session(program, mesh)
    chosen = seeds(program, op, mesh)
    mapping = program.mapping(op)
    assert chosen or set(mapping.blocked) >= {f for f, n in enumerate(mapping.sizes) if n > 1}
    for tactic, _ in chosen.values():
        s.apply(tactic)
    tiled = s.plan().ops[op.id].factor_axes
    for f, (tactic, axis) in chosen.items():
        if mesh[axis] > 1:
            assert axis in tiled.get(f, ()), f"{key}: {tactic} did not reach {op.name}"
    n = int(np.prod(list(mesh.values())))
    lowered, _ = s.lower(lowering, devices=jax.devices()[:n])
    got = lowered(*program.example_args)
    want = jax.tree.leaves(jax.jit(fn)(*args))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-5, err_msg=key)


KEYS = sorted(CASES)
#: every FAST-th case (cheap ones) also runs in the fast lane; the full suite runs them all
FAST = 6


@pytest.mark.parametrize(
    "key, mesh",
    [
        pytest.param(
            k,
            MESHES[i % len(MESHES)],
            marks=[pytest.mark.slow] if k in SLOW or i % FAST else [],
        )
        for i, k in enumerate(KEYS)
    ],
)
def test_rule_partitioned_matches_unpartitioned(key, mesh):
    run_case(key, mesh)


@pytest.mark.slow
@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("mesh", MESHES[:2], ids=["a2b2c2", "u1v4w2"])
def test_rule_on_every_mesh(key, mesh):
    run_case(key, mesh)


@pytest.mark.slow
@pytest.mark.parametrize("key", KEYS)
def test_rule_constrained(key):
    """The same layouts as constraints: XLA places the collectives."""
    run_case(key, MESHES[2], lowering="constrained")
