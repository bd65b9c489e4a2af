"""Placements: the ways a mesh's axes lie on a hardware's levels, the device ids each one
gives, and what a collective costs under it."""

import itertools
import math

import numpy as np
import pytest

import workbench as wb
from workbench.core.hardware import H100, Hardware, HardwareError, Link, collective_time
from workbench.core.hardware.collectives import all_reduce_time
from workbench.core.hardware.placement import (
    Placement,
    count,
    level_sizes,
    placements,
    row_major,
)

TWO_LEVELS = (Link("fast", 100e9, 1e-6, group_size=4), Link("slow", 10e9, 1e-5))


def brute(mesh, sizes):
    """Every factor matrix by brute force: each axis's size split over the levels."""
    per_axis = []
    for _, n in mesh.axes:
        per_axis.append(
            [
                fs
                for fs in itertools.product(range(1, n + 1), repeat=len(sizes))
                if math.prod(fs) == n
            ]
        )
    out = set()
    for choice in itertools.product(*per_axis):
        if all(math.prod(fs[j] for fs in choice) == size for j, size in enumerate(sizes)):
            out.add(tuple(zip(mesh.names, choice)))
    return out


@pytest.mark.parametrize(
    "axes", [{"a": 8}, {"a": 2, "b": 4}, {"a": 4, "b": 2, "c": 2}, {"a": 16, "b": 2}]
)
def test_enumeration_is_every_factor_matrix(axes):
    mesh = wb.Mesh(axes)
    sizes = level_sizes(mesh, TWO_LEVELS)
    found = placements(mesh, TWO_LEVELS)
    assert {p.factors for p in found} == brute(mesh, sizes)
    assert len(found) == len(set(found))
    assert found[0] == row_major(mesh, TWO_LEVELS)
    assert count(mesh, TWO_LEVELS) == len(found)
    for p in found:
        p.check(mesh, sizes)


@pytest.mark.parametrize("axes", [{"a": 2, "b": 4}, {"a": 4, "b": 2, "c": 2}, {"a": 16, "b": 2}])
def test_device_ids_form_the_groups_the_factors_say(axes):
    mesh = wb.Mesh(axes)
    node = TWO_LEVELS[0].group_size
    for p in placements(mesh, TWO_LEVELS):
        ids = p.device_ids(mesh)
        assert sorted(ids.ravel()) == list(range(mesh.size))
        for i, axis in enumerate(mesh.names):
            inner, outer = p.of(axis)
            for rest in np.ndindex(*[n for j, n in enumerate(mesh.sizes) if j != i]):
                index = list(rest)
                group = [ids[(*index[:i], k, *index[i:])] for k in range(mesh.sizes[i])]
                nodes = {d // node for d in group}
                assert len(nodes) == outer
                assert all(sum(d // node == x for d in group) == inner for x in nodes)


def test_row_major_is_the_mesh_order():
    mesh = wb.Mesh({"data": 8, "model": 4})
    p = row_major(mesh, H100.links)
    assert p.of("model") == (4, 1) and p.of("data") == (2, 4)
    assert (p.device_ids(mesh).ravel() == np.arange(32)).all()


def test_an_axis_across_levels_is_priced_hierarchically():
    mesh = wb.Mesh({"data": 8, "model": 4})
    fast, slow = TWO_LEVELS
    hw = Hardware("two levels", {"float32": 1e12}, 1e11, 1e10, TWO_LEVELS)
    nbytes = 1e8
    # the mesh order: model (4) fills a group of 4, data (8) runs on the slow level alone
    assert collective_time("all-reduce", nbytes, ["data"], mesh, hw) == pytest.approx(
        all_reduce_time(nbytes, 8, slow.bandwidth, slow.latency)
    )
    # data split 2 inside a group and 4 across: the fast ring first, then the slow one on
    # the half of the bytes left
    split = Placement(("fast", "slow"), (("data", (2, 4)), ("model", (2, 2))))
    placed = hw.with_placement(split)
    assert collective_time("all-reduce", nbytes, ["data"], mesh, placed) == pytest.approx(
        all_reduce_time(nbytes, 2, fast.bandwidth, fast.latency)
        + all_reduce_time(nbytes / 2, 4, slow.bandwidth, slow.latency)
    )
    assert collective_time("all-reduce", nbytes, ["data"], mesh, placed) < collective_time(
        "all-reduce", nbytes, ["data"], mesh, hw
    )


def test_bad_placements_say_what_would_work():
    mesh = wb.Mesh({"data": 8, "model": 4})
    with pytest.raises(HardwareError, match="one positive int per level"):
        Placement(("nvlink", "infiniband"), (("data", (2,)),))
    with pytest.raises(HardwareError, match="give a Placement"):
        H100.with_placement("data inside")
    with pytest.raises(HardwareError, match="levels"):
        H100.with_placement(Placement(("ici",), (("data", (8,)),)))
    wrong = H100.with_placement(
        Placement(("nvlink", "infiniband"), (("data", (4, 2)), ("model", (4, 1))))
    )
    with pytest.raises(HardwareError, match="puts 16 devices in each 'nvlink' group"):
        collective_time("all-reduce", 1e6, ["data"], mesh, wrong)
    other = H100.with_placement(row_major(wb.Mesh({"x": 32}), H100.links))
    with pytest.raises(HardwareError, match=r"place its axes \['data', 'model'\], in that order"):
        collective_time("all-reduce", 1e6, ["data"], mesh, other)
    with pytest.raises(HardwareError, match="does not fill whole groups"):
        placements(wb.Mesh({"x": 12}), H100.links)


def test_the_limit_caps_and_says_so():
    mesh = wb.Mesh({"a": 4, "b": 4, "c": 4})
    every = placements(mesh, H100.links)
    assert len(placements(mesh, H100.links, limit=3)) == 3 < len(every)
