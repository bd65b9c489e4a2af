"""Torus levels that know their dimensions: a group over k of them uses k times the links,
a dimension without its wraparound (or only part of one) half as many."""

import dataclasses

import pytest

import workbench as wb
from workbench.core.hardware import H100, TPU_V5E, TPU_V5P, HardwareError, Link, collective_time
from workbench.core.hardware.formulas import all_gather_time
from workbench.core.hardware.torus import extents


def bandwidths(hw, mesh, *groups):
    return [[link.bandwidth for link, _ in hw.spread(mesh, g)] for g in groups]


def test_axes_over_more_dimensions_use_more_links():
    hw = TPU_V5P.with_torus((4, 4, 8))  # a multiple of the 4x4x4 cube: every dimension wraps
    assert hw.links[0].group_size == 128 and hw.links[0].dims == (4, 4, 8)
    mesh = wb.Mesh({"data": 8, "fsdp": 4, "model": 4})
    bw = TPU_V5P.links[0].bandwidth
    got = bandwidths(
        hw, mesh, ("model",), ("fsdp",), ("data",), ("fsdp", "model"), tuple(mesh.names)
    )
    assert got == [[bw], [bw], [bw], [2 * bw], [3 * bw]]
    t = collective_time("all-gather", 1e9, tuple(mesh.names), mesh, hw)
    assert t == pytest.approx(all_gather_time(1e9, 128, 3 * bw, hw.links[0].latency))
    # the preset without dims: one ring at the link's figure, as before
    flat = collective_time("all-gather", 1e9, tuple(mesh.names), mesh, TPU_V5P)
    assert flat == pytest.approx(all_gather_time(1e9, 128, bw, hw.links[0].latency))


def test_a_dimension_without_its_wraparound_halves_the_links():
    small = TPU_V5P.with_torus((2, 2, 2))  # less than a cube: no optical wraparounds
    mesh = wb.Mesh({"a": 2, "b": 4})
    bw = TPU_V5P.links[0].bandwidth
    assert bandwidths(small, mesh, ("a",), ("b",)) == [[bw / 2], [bw]]  # b: two half dims
    v5e = TPU_V5E.with_torus((16, 16))  # v5e wraps a whole 16 only
    mesh = wb.Mesh({"data": 32, "model": 8})
    bw = TPU_V5E.links[0].bandwidth
    # model: half of the fast dimension; data: the other half of it and all of the next
    assert bandwidths(v5e, mesh, ("model",), ("data",), ("data", "model")) == [
        [bw / 2],
        [1.5 * bw],
        [2 * bw],
    ]


def test_extents_follow_the_mesh_order_and_refuse_odd_splits():
    assert extents((4, 4), [4, 4], [True, False]) == [1, 4]  # the first axis: the slow dim
    assert extents((4, 4), [2, 8], [False, True]) == [4, 2]
    assert extents((4, 4), [8, 2], [True, False]) == [2, 4]
    assert extents((6, 4), [4, 6], [True, True]) == [6, 4]
    assert extents((6, 4), [6, 4], [True, True]) is None  # the 6 straddles the first 6 unevenly


def test_bad_tori_are_refused_saying_what_works():
    with pytest.raises(HardwareError, match="no torus level"):
        H100.with_torus((2, 4))
    for bad in ((), (0, 4), (2.5,), "4x4", None):
        with pytest.raises(HardwareError, match=r"e.g. \(4, 4, 8\)"):
            TPU_V5P.with_torus(bad)
    with pytest.raises(HardwareError, match="a torus level takes dims"):
        Link("nv", 1e11, 1e-6, dims=(2, 2))
    with pytest.raises(HardwareError, match="product is the group's size"):
        Link("ici", 1e11, 1e-6, "torus", group_size=8, dims=(2, 2))
    # a placement whose factors do not fill the torus leaves the link as it is
    hw = TPU_V5P.with_torus((4, 4, 8))
    odd = dataclasses.replace(hw.links[0], dims=(4, 4, 8))
    assert odd == hw.links[0]
