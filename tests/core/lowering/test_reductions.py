"""Synthesised reductions run: on 8 virtual CPU devices laid out as 2 nodes x 4 (and as
2 x 2 x 2), every program of the grammar computes what one all-reduce (or reduce-scatter,
or all-gather) over the same devices does, for random meshes, placements, axes and
shapes."""

import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import workbench as wb
from workbench.core.hardware import Link
from workbench.core.hardware.placement import placements
from workbench.core.hardware.synthesis import programs
from workbench.core.lowering.reductions import group_levels, order, reduce, split_mesh, sub_axes

NODES = (Link("node", 100e9, 1e-6, group_size=4), Link("network", 10e9, 1e-5))
THREE = (
    Link("chip", 400e9, 1e-7, group_size=2),
    Link("board", 100e9, 1e-6, group_size=2),
    Link("network", 10e9, 1e-5),
)
MESHES = [{"a": 8}, {"a": 2, "b": 4}, {"a": 4, "b": 2}, {"a": 2, "b": 2, "c": 2}]


def cases(n: int, seed: int = 0):
    """``n`` random (links, mesh, placement, axes, kind) whose group spans 2 levels or more."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        links = rng.choice([NODES, NODES, THREE])
        mesh = wb.Mesh(rng.choice(MESHES))
        placement = rng.choice(placements(mesh, links))
        names = list(mesh.names)
        axes = tuple(rng.sample(names, rng.randint(1, len(names))))
        if len(group_levels(placement, axes)) < 2:
            continue
        kind = rng.choice(["all-reduce", "reduce-scatter", "all-gather"])
        out.append((links, mesh, placement, axes, kind))
    return out


def group_names(placement, axes):
    """The sub-axes of the group, in the result's order."""
    return tuple(n for a in axes for n, _, f in sub_axes(placement, a) if f > 1)


def _run(mesh, placement, fn, x):
    """``fn`` on each device's block of ``x`` (one per device along its first dimension),
    inside ``shard_map`` over the split mesh; the results stacked in the same order."""
    jmesh = split_mesh(mesh, placement)
    every = P(jmesh.axis_names)
    mapped = jax.shard_map(
        lambda b: fn(b[0])[None], mesh=jmesh, in_specs=every, out_specs=every, check_vma=False
    )
    return np.asarray(jax.jit(mapped)(jax.device_put(x, NamedSharding(jmesh, every))))


CASES = cases(15)


@pytest.mark.parametrize("i", range(len(CASES)), ids=lambda i: f"{CASES[i][3]}-{CASES[i][4]}")
def test_every_program_computes_the_plain_reduction(i):
    _, mesh, placement, axes, kind = CASES[i]
    rng = np.random.default_rng(i)
    k = len(group_levels(placement, axes))
    group = group_names(placement, axes)
    size = int(np.prod([f for a in axes for _, _, f in sub_axes(placement, a)]))
    dim = int(rng.integers(0, 2))
    shape = [int(rng.integers(1, 4)), int(rng.integers(1, 4))]
    if kind == "reduce-scatter":
        shape[dim] *= size
    elif rng.random() < 0.5:
        shape[dim] = size * 2 + 1  # an all-reduce pads what does not split
    # per device one block, integers: sums are exact
    x = jnp.asarray(rng.integers(-100, 100, size=(mesh.size, *shape)), dtype=jnp.int32)

    def plain(b):
        if kind == "all-reduce":
            return jax.lax.psum(b, group)
        if kind == "all-gather":
            return jax.lax.all_gather(b, group, axis=dim, tiled=True)
        return jax.lax.psum_scatter(b, group, scatter_dimension=dim, tiled=True)

    expected = _run(mesh, placement, plain, x)
    tried = programs(kind, k, order(placement, axes))
    assert len(tried) >= (16 if kind == "all-reduce" else 3)
    for program in tried:
        got = _run(mesh, placement, lambda b, p=program: reduce(b, p, placement, axes, dim), x)
        np.testing.assert_array_equal(got, expected, err_msg=program.describe(placement.levels))


def test_floats_agree_within_rounding():
    mesh = wb.Mesh({"a": 2, "b": 4})
    placement = next(p for p in placements(mesh, NODES) if len(group_levels(p, ("a", "b"))) == 2)
    axes = ("a", "b")
    x = jnp.asarray(np.random.default_rng(0).normal(size=(8, 16, 3)), dtype=jnp.float32)
    group = group_names(placement, axes)
    plain = _run(mesh, placement, lambda b: jax.lax.psum(b, group), x)
    for program in programs("all-reduce", 2, order(placement, axes)):
        got = _run(mesh, placement, lambda b, p=program: reduce(b, p, placement, axes), x)
        np.testing.assert_allclose(got, plain, rtol=1e-6, atol=1e-5)


def test_the_split_mesh_indexes_each_axis_as_the_placement_does():
    mesh = wb.Mesh({"a": 2, "b": 4})
    for placement in placements(mesh, NODES):
        jmesh = split_mesh(mesh, placement)
        ids = np.vectorize(lambda d: d.id)(jmesh.devices).reshape(mesh.sizes)
        np.testing.assert_array_equal(ids, placement.device_ids(mesh))
