"""Redistribution plans: they chain, stay within the memory bound, and move the right data."""

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

from workbench.core.layout.mesh import Mesh
from workbench.core.layout.redistribute import layout_key, peak_bytes, redistribute
from workbench.core.layout.sharding import Sharding
from workbench.core.lowering.explicit import jax_mesh
from workbench.core.lowering.steps import run_step

MESH = Mesh({"a": 2, "b": 4})
SHAPE = (8, 16, 4)


@st.composite
def layouts(draw, shape=SHAPE, mesh=MESH, partial=True):
    dims = [[] for _ in shape]
    pending = []
    for axis in draw(st.permutations(mesh.names)):
        where = draw(
            st.sampled_from(
                ["none", "partial", *range(len(shape))] if partial else ["none", *range(len(shape))]
            )
        )
        if where == "partial":
            pending.append((axis, draw(st.sampled_from(["sum", "sum", "max"]))))
        elif where != "none":
            d = int(where)
            shards = np.prod([mesh.axis_size(a) for a in dims[d]], dtype=int)
            if shape[d] % (shards * mesh.axis_size(axis)) == 0:
                dims[d].append(axis)
    return Sharding(
        shape, np.dtype("float32"), tuple(tuple(d) for d in dims), tuple(sorted(pending))
    )


@settings(max_examples=300, deadline=None)
@given(layouts(), layouts())
def test_plans_chain_to_the_target_and_never_exceed_the_larger_shard(src, dst):
    steps = redistribute(src, dst, MESH)
    cur = src
    for step in steps:
        assert layout_key(step.before) == layout_key(cur)
        cur = step.after
    assert layout_key(cur) == layout_key(dst)
    bound = max(src.local_nbytes(MESH), dst.local_nbytes(MESH))
    assert peak_bytes(steps, src, MESH) <= bound


def test_the_common_cases_take_one_collective():
    def S(dims, partial=()):
        return Sharding((16, 32), np.dtype("float32"), dims, partial)

    kinds = {
        (S(((), ()), (("b", "sum"),)), S((("b",), ()))): ["reduce-scatter"],
        (S(((), ()), (("b", "sum"),)), S(((), ()))): ["all-reduce"],
        (S((("a",), ())), S(((), ("a",)))): ["all-to-all"],
        (S((("a", "b"), ())), S(((), ()))): ["all-gather"],
        (S(((), ())), S((("a", "b"), ()))): ["slice"],
    }
    for (src, dst), expected in kinds.items():
        assert [s.kind for s in redistribute(src, dst, MESH)] == expected
    (gather,) = redistribute(S((("a", "b"), ())), S(((), ())), MESH)
    assert gather.axes == ("a", "b") and gather.bytes == 16 * 32 * 4


def _terms(x, src: Sharding):
    """Split a whole local block into per-device terms whose reduction over each axis is x."""
    from jax import lax

    for axis, kind in src.partial:
        i = lax.axis_index(axis)
        n = MESH.axis_size(axis)
        if kind == "sum":
            x = x * (2.0 * (i + 1) / (n * (n + 1)))
        elif kind == "max":
            x = x - i.astype(x.dtype)
    return x


@pytest.mark.slow  # 25 compiled runs: in the full suite
@settings(max_examples=25, deadline=None)
@given(layouts(), layouts(partial=False))
def test_running_a_plan_moves_the_right_data(src, dst):
    jm = jax_mesh(MESH)
    x = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    steps = redistribute(src, dst, MESH)

    def body(local):
        local = _terms(local, src)
        for step in steps:
            local = run_step(local, step, MESH)
        return local

    fn = jax.jit(
        jax.shard_map(
            body, mesh=jm, in_specs=P(*src.spec()), out_specs=P(*dst.spec()), check_vma=False
        )
    )
    np.testing.assert_allclose(np.asarray(fn(x)), x, rtol=1e-6)
