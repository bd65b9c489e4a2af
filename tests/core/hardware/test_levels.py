"""Hardware as a list of levels: group sizes, the level each mesh axis runs on, and sources."""

import dataclasses

import pytest

from workbench.core import hardware as hw
from workbench.core.hardware import PRESETS, Hardware, HardwareError, Link, collective_time
from workbench.core.layout.mesh import Mesh

GB = 1e9


def three_levels(**kw):
    """8 GPUs on NVLink per node, 4 nodes per rack on a leaf switch, racks on a spine."""
    return Hardware(
        name="three levels",
        flops={"bfloat16": 1e15},
        hbm_bandwidth=1e12,
        memory_bytes=80e9,
        links=(
            Link("nvlink", 400 * GB, 0.0, group_size=8, sources={"bandwidth": "given"}),
            Link("leaf", 50 * GB, 0.0, group_size=4),
            Link("spine", 10 * GB, 0.0),
        ),
        **kw,
    )


def test_a_third_level_is_chosen_by_cumulative_group_size():
    h = three_levels()
    assert h.devices_per_node == 8 and h.group_devices == (8, 32, None)
    mesh = Mesh({"data": 2, "fsdp": 4, "model": 8})
    # model spans 8 devices (a node), fsdp 32 (a rack), data 64 (beyond a rack)
    assert [h.level_of(mesh, a) for a in mesh] == [2, 1, 0]
    assert [h.link(mesh, a).name for a in mesh] == ["spine", "leaf", "nvlink"]
    # an axis spans its size times the axes minor to it: 2 x 8 = 16 fits a rack, not a node
    mesh = Mesh({"x": 8, "y": 2, "z": 8})
    assert [h.link(mesh, a).name for a in mesh] == ["spine", "leaf", "nvlink"]
    # a last level with a size still takes whatever no inner group holds
    closed = dataclasses.replace(
        h, links=(*h.links[:2], dataclasses.replace(h.links[2], group_size=2))
    )
    assert closed.group_devices == (8, 32, 64)
    assert closed.link(Mesh({"big": 1024}), "big").name == "spine"
    # explicit choices still win
    assert h.with_axis_links({"model": "spine"}).link(mesh, "z").name == "nvlink"
    assert h.with_axis_links({"z": "spine"}).link(mesh, "z").name == "spine"


def test_three_levels_are_priced_stage_by_stage():
    h = three_levels()
    mesh = Mesh({"rack": 2, "node": 4, "gpu": 8})
    b = 1 * GB
    ring = lambda n, nbytes, bw: (n - 1) / n * nbytes / bw  # noqa: E731
    # reduce-scatter: fastest level first, each on what the faster ones left, over axes
    # whose order puts the inner one major...
    rs = collective_time("reduce-scatter", b, ("gpu", "node", "rack"), mesh, h)
    want = ring(8, b, 400 * GB) + ring(4, b / 8, 50 * GB) + ring(2, b / 32, 10 * GB)
    assert rs == pytest.approx(want)
    # ...and, the outer one major, with the input's blocks permuted first (one copy)
    rs = collective_time("reduce-scatter", b, ("rack", "node", "gpu"), mesh, h)
    assert rs == pytest.approx(want + 2 * b / h.copy_bandwidth(b) + h.op_overhead)
    assert collective_time("all-to-all", b, ("rack", "gpu"), mesh, h) == pytest.approx(
        ring(8, b, 400 * GB) + ring(2, b, 10 * GB)
    )


def test_the_first_level_size_and_devices_per_node_are_one_figure():
    link = Link("fast", 1e11, 1e-6)
    h = Hardware("x", {"bfloat16": 1e15}, 1e12, 16e9, (link, Link("slow", 1e10, 1e-5)), 4)
    assert h.links[0].group_size == 4 and h.devices_per_node == 4  # filled in
    assert dataclasses.replace(h, links=(link,)).devices_per_node == 4
    with pytest.raises(HardwareError, match=r"group_size=n\) or devices_per_node=n"):
        Hardware("x", {"bfloat16": 1e15}, 1e12, 16e9, (link,))
    with pytest.raises(HardwareError, match="devices_per_node=16 but its first level"):
        three_levels(devices_per_node=16)
    assert three_levels(devices_per_node=8).devices_per_node == 8  # alike: fine
    with pytest.raises(HardwareError, match=r"with_group_sizes\(\{'nvlink': n\}\)"):
        dataclasses.replace(hw.H100, devices_per_node=16)
    nvl16 = hw.H100.with_group_sizes({"nvlink": 16})
    assert nvl16.devices_per_node == 16 and nvl16.links[0].sources == hw.H100.links[0].sources
    assert nvl16.link(Mesh({"batch": 2, "model": 16}), "model").name == "nvlink"
    assert hw.H100.link(Mesh({"batch": 2, "model": 16}), "model").name == "infiniband"
    wider = three_levels().with_group_sizes({"leaf": 8})
    assert wider.group_devices == (8, 64, None)
    with pytest.raises(HardwareError, match="no link named 'rail'"):
        three_levels().with_group_sizes({"rail": 2})
    with pytest.raises(HardwareError, match="'leaf' has no group_size"):
        levels = (link, Link("leaf", 1e10, 0.0), Link("spine", 1e9, 0.0))
        Hardware("x", {"bfloat16": 1e15}, 1e12, 16e9, levels, 4)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(HardwareError, match="group_size"):
            Link("x", 1e9, 0.0, group_size=bad)


def test_each_level_carries_the_sources_of_its_figures():
    for h in PRESETS.values():
        for x in h.links:
            assert set(x.sources) == set(x.figures()), (h.name, x.name)
            assert h.sources[f"links.{x.name}.bandwidth"] == x.sources["bandwidth"]
        assert h.sources["devices_per_node"] == h.links[0].sources["group_size"]
    h = three_levels(sources={"links.leaf.latency": "measured", "links.leaf.group_size": "4/rack"})
    assert h.links[0].sources == {"bandwidth": "given"}  # kept on the level ...
    assert h.sources["links.nvlink.bandwidth"] == "given"  # ... and filed in the spec
    assert h.links[1].sources == {"latency": "measured", "group_size": "4/rack"}
    assert h.figures()["links.leaf.group_size"] == 4 and "links.spine.group_size" not in h.figures()
    assert Link("a", 1e9, 0.0, sources={"bandwidth": "x"}) == Link("a", 1e9, 0.0)  # not compared


def test_the_formulas_live_apart_from_the_spec():
    from workbench.core.hardware import collectives, spec

    assert hw.collective_time is collectives.collective_time
    assert not hasattr(spec, "collective_time") and not hasattr(spec, "H100")
