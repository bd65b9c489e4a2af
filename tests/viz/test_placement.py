"""Pictures of placements and of synthesised reductions: every device once per axis, in
core's level groups and axis groups; every step of a program in order, with core's times."""

import re
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import numpy as np
import pytest

import workbench as wb
from tests.viz.programs import MESH, MLP_ARGS, mlp
from workbench.core import hardware as hw
from workbench.core.hardware.levels import HardwareError
from workbench.core.hardware.placement import Placement
from workbench.core.hardware.synthesis import Program, Step, Synthesis
from workbench.core.units import format_seconds
from workbench.viz import placement_picture, placement_rows, synthesis_rows, synthesis_timeline
from workbench.viz.placement import MAX_DEVICES

NODES_OF_4 = hw.H100.with_group_sizes({"nvlink": 4})


@pytest.fixture(scope="module")
def ranked():
    """The MLP with its hidden dim on ``model``: under the fastest placement ``model``
    crosses nodes, and its all-reduce is synthesised."""
    program = wb.capture(mlp, *MLP_ARGS)
    session = wb.Session(program, MESH, [wb.BP("batch"), wb.Tile("params/w_in", 1, "model")])
    return session.placements(NODES_OF_4)


def devices(svg: str) -> list[tuple[str, int, int]]:
    """(axis, device, group) of each device cell, in drawing order."""
    cells = re.findall(
        r'class="wb-device" data-axis="(\w+)" data-device="(\d+)" data-group="(\d+)"', svg
    )
    return [(a, int(d), int(g)) for a, d, g in cells]


def groups_from_core(placement: Placement, mesh: wb.Mesh, axis: str) -> set[frozenset]:
    """The devices one collective over ``axis`` joins, from ``device_ids`` alone."""
    ids = placement.device_ids(mesh)
    p = mesh.names.index(axis)
    return {frozenset(row) for row in np.moveaxis(ids, p, -1).reshape(-1, ids.shape[p]).tolist()}


def test_rows_keep_cores_order_with_each_ratio_to_the_fastest(ranked):
    rows = placement_rows(ranked, current=ranked[1].placement)
    assert [r["placement"] for r in rows] == [r.placement for r in ranked]
    assert [r["rank"] for r in rows] == [1, 2]
    assert rows[0]["ratio"] == 1.0
    assert rows[1]["ratio"] == pytest.approx(ranked[1].estimate.step_s / ranked[0].estimate.step_s)
    assert [r["current"] for r in rows] == [False, True]
    assert [r["text"] for r in rows] == [str(r.placement) for r in ranked]
    assert len(placement_rows(ranked, top=1)) == 1 and placement_rows([]) == []


@pytest.mark.parametrize("which", [0, 1])
def test_the_picture_draws_every_device_once_per_axis_in_cores_groups(ranked, which):
    placement = ranked[which].placement
    svg = placement_picture(placement, MESH)
    ET.fromstring(svg)  # well-formed
    cells = devices(svg)
    for axis in MESH.names:
        mine = [(d, g) for a, d, g in cells if a == axis]
        assert sorted(d for d, _ in mine) == list(range(MESH.size))  # each device once
        drawn: dict[int, set] = {}
        for d, g in mine:
            drawn.setdefault(g, set()).add(d)
        assert {frozenset(s) for s in drawn.values()} == groups_from_core(placement, MESH, axis)
    # two nodes of four (nvlink 0: devices 0-3), drawn once per axis; the outermost level
    # (infiniband) is the whole mesh, drawn as no box
    boxes = re.findall(r'class="wb-level-group" data-level="(\w+)" data-index="(\d+)"', svg)
    assert boxes == [("nvlink", "0"), ("nvlink", "1")] * len(MESH.names)
    assert str(placement.of("model")[1]) in svg and "nvlink" in svg


def test_a_node_box_holds_its_devices(ranked):
    """The cells drawn after a node's box, up to the next box, are that node's devices."""
    svg = placement_picture(ranked[0].placement, MESH)
    parts = re.split(r'<g class="wb-level-group"', svg)[1:]
    for i, part in enumerate(parts):
        node = i % 2
        inside = [int(d) for d in re.findall(r'data-device="(\d+)"', part)]
        assert inside == list(range(4 * node, 4 * node + 4))


def test_three_levels_draw_a_box_per_group_but_the_outermost():
    p = Placement(("chip", "board", "rack"), (("x", (2, 1, 2)), ("y", (2, 2, 1))))
    mesh = wb.Mesh({"x": 4, "y": 4})
    svg = placement_picture(p, mesh)
    ET.fromstring(svg)
    boxes = re.findall(r'class="wb-level-group" data-level="(\w+)"', svg)
    assert boxes.count("chip") == 2 * 4 and boxes.count("board") == 2 * 2
    assert "rack" not in boxes
    for axis in mesh.names:
        assert sorted(d for a, d, _ in devices(svg) if a == axis) == list(range(16))


def test_a_placement_of_another_mesh_is_refused_with_cores_message(ranked):
    with pytest.raises(HardwareError, match="places axes"):
        placement_picture(ranked[0].placement, wb.Mesh({"data": 2, "model": 4}))


def test_too_many_devices_are_said_not_drawn():
    n = 2 * MAX_DEVICES
    p = Placement(("nvlink", "infiniband"), (("data", (1, n // 8)), ("model", (8, 1))))
    svg = placement_picture(p, wb.Mesh({"data": n // 8, "model": 8}))
    assert "too many to draw" in svg and "wb-device" not in svg and str(p) in svg


def test_synthesised_reductions_are_listed_with_cores_program_and_times(ranked):
    spanning = next(r for r in ranked if r.placement.of("model") == (2, 2))
    rows = synthesis_rows(spanning.estimate)
    with_synthesis = [c for c in spanning.estimate.collectives if c.synthesis is not None]
    assert sum(r["collectives"] for r in rows) == sum(c.collective.count for c in with_synthesis)
    (row,) = rows
    s = row["synthesis"]
    assert [t for t, _ in row["steps"]] == ["RS nvlink", "AR infiniband", "AG nvlink"]
    assert [k for _, k in row["steps"]] == [step.kind for step in s.program.steps]
    assert [t for t, _ in row["default_steps"]] == ["AR nvlink+infiniband"]
    assert (row["seconds"], row["default_s"]) == (s.seconds, s.default_s)
    assert row["axes"] == ["model"] and row["group"] == "nvlink 2 x infiniband 2"
    other = next(r for r in ranked if r is not spanning)
    assert synthesis_rows(other.estimate) == []  # each axis on one level: nothing to synthesise


def lanes(svg: str) -> dict[str, list[str]]:
    """Per lane (``program``, ``default``) of the first row: its label, each step's label in
    order, its time."""
    ns = "{http://www.w3.org/2000/svg}"
    out = {}
    for g in ET.fromstring(svg).iter(f"{ns}g"):
        css = g.get("class", "")
        if css.startswith("wb-synthesis-") and css.split("-")[-1] in ("program", "default"):
            texts = [t.text for t in g.findall(f"{ns}text")]
            steps = [s.get("data-label") for s in g.iter(f"{ns}g") if s is not g]
            out.setdefault(css.split("-")[-1], [texts[0], *steps, texts[-1]])
    return out


def widths(svg: str) -> list[float]:
    """Each step's bar width, in order (the program's, then the default's)."""
    return [float(w) for w in re.findall(r'<rect x="[\d.]+" y="[\d.]+" width="([\d.]+)"', svg)]


def test_the_timeline_names_each_step_in_order_and_both_times(ranked):
    spanning = next(r for r in ranked if r.placement.of("model") == (2, 2))
    (row,) = rows = synthesis_rows(spanning.estimate)
    svg = synthesis_timeline(rows)
    got = lanes(svg)
    # the lane's label, its steps in order, its time
    assert got["program"] == [
        "synthesised",
        "RS nvlink",
        "AR infiniband",
        "AG nvlink",
        format_seconds(row["seconds"]),
    ]
    assert got["default"] == [
        "default (one ring)",
        "AR nvlink+infiniband",
        format_seconds(row["default_s"]),
    ]
    kinds = re.findall(r'class="wb-synthesis-step" data-kind="([\w-]+)"', svg)
    assert kinds == ["reduce-scatter", "all-reduce", "all-gather", "all-reduce"]
    assert f"{row['speedup']:.2f}x the default" in svg and "as wide as its time" in svg
    # drawn to scale: each bar as wide as its step's time, the default's on the same scale
    times = [*row["step_s"], row["default_s"]]
    drawn = widths(svg)
    assert len(drawn) == len(times)
    per_second = (drawn[-1] + 1) / times[-1]
    for w, t in zip(drawn, times):
        assert w + 1 == pytest.approx(max(t * per_second, 2.0), rel=1e-3)


def _synthesis(permuted: bool, seconds: float) -> Synthesis:
    steps = (Step("reduce-scatter", (1,)), Step("reduce-scatter", (0,)))
    program = Program("reduce-scatter", steps, permuted)
    parts = (1e-6,) * permuted + (seconds / 2 - 1e-6 * permuted, seconds / 2)
    group = (("nvlink", 4), ("ib", 2))
    return Synthesis("reduce-scatter", 4096.0, group, program, seconds, 3e-5, parts)


def _estimate(*pairs):
    """An estimate's collectives, each (synthesis, count, seconds per run)."""
    cs = [
        SimpleNamespace(
            synthesis=s,
            collective=SimpleNamespace(axes=("data",), count=n),
            total_s=n * t,
        )
        for s, n, t in pairs
    ]
    return SimpleNamespace(collectives=cs)


def test_a_permuted_program_starts_with_its_copy_and_rows_go_most_time_first():
    slow, fast = _synthesis(True, 2e-5), _synthesis(False, 1e-5)
    rows = synthesis_rows(
        _estimate((fast, 1, 1e-5), (slow, 2, 2e-5), (None, 5, 1.0), (fast, 1, 1e-5))
    )
    assert [r["synthesis"] for r in rows] == [slow, fast]
    assert [r["collectives"] for r in rows] == [2, 2]
    assert rows[0]["steps"] == [
        ("permute blocks", "copy"),
        ("RS ib", "reduce-scatter"),
        ("RS nvlink", "reduce-scatter"),
    ]
    svg = synthesis_timeline(rows, top=1)
    assert svg.count('class="wb-synthesis-row"') == 1 and "And 1 more program." in svg
    assert "permute blocks" in svg and "RS nvlink" in svg
