"""Hardware presets, link selection per mesh axis, and the collective formulas in closed form."""

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
import pytest

from workbench.core import hardware as hw
from workbench.core.errors import MeshError
from workbench.core.hardware import (
    A100,
    CPU,
    H100,
    H200,
    PRESETS,
    TPU_V4,
    TPU_V5E,
    TPU_V5P,
    Hardware,
    HardwareError,
    Link,
    collective_time,
)
from workbench.core.layout.mesh import Mesh

GB = 1e9


def spec(
    bandwidth=100 * GB,
    latency=1e-6,
    inter=10 * GB,
    inter_latency=1e-5,
    per_node=8,
    topology="switch",
):
    return Hardware(
        name="test",
        flops={"bfloat16": 1e15},
        hbm_bandwidth=1e12,
        memory_bytes=16e9,
        links=(Link("fast", bandwidth, latency, topology), Link("slow", inter, inter_latency)),
        devices_per_node=per_node,
    )


@pytest.mark.parametrize("h", list(PRESETS.values()), ids=list(PRESETS))
def test_presets_have_every_figure_and_a_source_for_each(h):
    figures = h.figures()
    assert figures and all(math.isfinite(v) and v > 0 for v in figures.values() if v)
    missing = [k for k in figures if not h.sources.get(k)]
    assert not missing, f"{h.name}: no source for {missing}"
    assert not set(h.sources) - set(figures), "a source for a figure the spec does not have"
    for key, text in h.sources.items():
        if h is not CPU and "assumed" not in text and key != "devices_per_node":
            assert "http" in text or "docs.nvidia" in text, f"{h.name} {key}: cite a URL"
    assert h.peak_flops("bfloat16") > 0 and h.peak_flops("float32") > 0
    assert h.hbm_bandwidth > 1e9 and h.memory_bytes > 1e9
    assert h.links[0].bandwidth >= h.links[-1].bandwidth


def test_preset_figures_as_quoted():
    assert H100.peak_flops(jnp.bfloat16) == 989.5e12  # 1,979 with sparsity
    assert H200.memory_bytes == 141e9 and H200.hbm_bandwidth == 4.8e12
    assert A100.flops["bfloat16"] == 312e12 and A100.links[0].bandwidth == 300e9
    assert TPU_V5E.flops["bfloat16"] == 197e12 and TPU_V5E.links[0].topology == "torus"
    assert TPU_V5P.hbm_bandwidth == 2765e9 and TPU_V4.hbm_bandwidth == 1.2e12
    assert "placeholder" in CPU.name.lower() and "calibrate" in CPU.sources["flops.float32"]


def test_peak_flops_fallbacks_and_errors():
    assert TPU_V5E.peak_flops("float32") == TPU_V5E.flops["bfloat16"]  # one bf16 pass
    assert TPU_V5E.peak_flops(np.float16) == TPU_V5E.flops["bfloat16"]
    assert TPU_V5E.peak_flops("float8_e4m3fn") == TPU_V5E.flops["bfloat16"]
    assert TPU_V5P.peak_flops("float8_e4m3fn") == 459e12
    assert H100.peak_flops("float32") == 494.5e12  # TF32 at JAX's default precision
    assert H100.peak_flops("int32") == H100.flops["float32"]
    assert H100.peak_flops("uint4") == H100.flops["int8"]
    assert CPU.peak_flops("bfloat16") == CPU.flops["float32"]
    assert CPU.peak_flops(None) == CPU.flops["float32"]
    with pytest.raises(HardwareError, match="not a dtype"):
        H100.peak_flops("floot32")
    only_fp8 = dataclasses.replace(spec(), flops={"float8_e5m2": 1e15})
    with pytest.raises(HardwareError, match="no peak FLOP/s for 'float32'"):
        only_fp8.peak_flops("float32")


def test_flops_keys_are_normalised_to_dtype_names():
    h = dataclasses.replace(spec(), flops={jnp.bfloat16: np.float32(1e15), np.dtype("int8"): 2e15})
    assert h.flops == pytest.approx({"bfloat16": 1e15, "int8": 2e15})
    with pytest.raises(HardwareError, match="not a dtype"):
        dataclasses.replace(spec(), flops={"tf32": 1e15})


def test_invalid_specs_are_refused_with_a_reason():
    with pytest.raises(HardwareError, match="bandwidth"):
        Link("x", 0.0, 1e-6)
    with pytest.raises(HardwareError, match="topology"):
        Link("x", 1e9, 1e-6, "ring")
    with pytest.raises(HardwareError, match="duplicate link"):
        dataclasses.replace(spec(), links=(Link("a", 1e9, 0), Link("a", 1e8, 0)))
    with pytest.raises(HardwareError, match="hbm_bandwidth"):
        dataclasses.replace(spec(), hbm_bandwidth=-1.0)
    with pytest.raises(HardwareError, match="devices_per_node"):
        dataclasses.replace(spec(), devices_per_node=0)


def test_a_links_measured_shares_scale_with_it_and_bad_ones_are_refused():
    link = Link("x", 100e9, 1e-6, efficiency=(("all-gather", 0.8),))
    assert link.figures_for("all-gather") == (pytest.approx(80e9), 1e-6)
    assert link.figures_for("all-to-all") == (100e9, 1e-6)  # no share: the link's
    slower = dataclasses.replace(link, bandwidth=10e9)
    assert slower.figures_for("all-gather")[0] == pytest.approx(8e9)
    assert link.figures()["all-gather.efficiency"] == 0.8
    with pytest.raises(HardwareError, match=r"efficiency \('all-gather', 0\); give \(kind, share"):
        Link("x", 1e9, 0, efficiency=(("all-gather", 0),))
    with pytest.raises(HardwareError, match="one of"):
        Link("x", 1e9, 0, efficiency=(("broadcast", 0.5),))
    with pytest.raises(HardwareError, match="efficiency twice"):
        Link("x", 1e9, 0, efficiency=(("all-gather", 0.5), ("all-gather", 0.6)))


def test_transpose_bandwidth_as_measured_points():
    flat = spec()
    assert flat.copy_bandwidth(1 << 20) == flat.hbm_bandwidth  # none given
    one = dataclasses.replace(flat, transpose_bandwidth=2e9)
    assert one.copy_bandwidth() == one.copy_bandwidth(1 << 30) == 2e9
    points = ((4 << 20, 1e9), (1 << 16, 4e9))  # any order: kept sorted by size
    curve = dataclasses.replace(flat, transpose_bandwidth=points)
    assert curve.transpose_bandwidth == ((1 << 16, 4e9), (4 << 20, 1e9))
    assert curve.copy_bandwidth(1 << 10) == 4e9 and curve.copy_bandwidth(1 << 30) == 1e9
    # log-log between points: 512 KiB is halfway from 64 KiB to 4 MiB in log size
    assert curve.copy_bandwidth(1 << 19) == pytest.approx(2e9)
    assert curve.copy_bandwidth() == pytest.approx(2.5e9)  # no size: the median
    assert curve.figures()["transpose_bandwidth.65536"] == 4e9
    assert hash(curve) != hash(one)
    for bad in (-1.0, ((1 << 16, 0.0),), ((1 << 16, 1e9), (1 << 16, 2e9)), "fast"):
        with pytest.raises(HardwareError, match="transpose_bandwidth"):
            dataclasses.replace(flat, transpose_bandwidth=bad)


def test_fresh_memory_is_priced_above_the_threshold():
    mib = 1 << 20
    flat = spec()
    assert flat.fresh_memory_time([64 * mib]) == 0.0  # presets: the runtime reuses memory
    fresh = dataclasses.replace(flat, fresh_buffer_bytes=32 * mib, first_touch_bandwidth=1e9)
    # only the buffers above the threshold are mapped fresh each step
    assert fresh.fresh_memory_time([10 * mib, 32 * mib, 40 * mib, 33 * mib]) == pytest.approx(
        73 * mib / 1e9
    )
    assert fresh.fresh_memory_time([]) == 0.0
    unmeasured = dataclasses.replace(fresh, first_touch_bandwidth=None)
    assert unmeasured.fresh_memory_time([64 * mib]) == 0.0
    assert fresh.figures()["fresh_buffer_bytes"] == 32 * mib
    assert "first_touch_bandwidth" not in unmeasured.figures()
    assert hash(fresh) != hash(unmeasured)
    for what in ("fresh_buffer_bytes", "first_touch_bandwidth"):
        for bad in (0, -1.0, "big", math.inf):
            with pytest.raises(HardwareError, match=what):
                dataclasses.replace(fresh, **{what: bad})


def test_specs_are_frozen_and_hashable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        H100.name = "x"
    assert len({H100, H200, H100}) == 2


# -- link selection --------------------------------------------------------------------------------
def test_node_filling_from_the_minor_most_axes():
    mesh = Mesh({"data": 4, "fsdp": 4, "model": 2})
    h = spec(per_node=8)
    assert h.intra_node_axes(mesh) == ("fsdp", "model")
    assert [h.link(mesh, a).name for a in mesh] == ["slow", "fast", "fast"]
    # a node of 4 holds model (2) but not fsdp (2 x 4 = 8): filling stops there
    h4 = spec(per_node=4)
    assert h4.intra_node_axes(mesh) == ("model",)
    assert [h4.link(mesh, a).name for a in mesh] == ["slow", "slow", "fast"]
    # an axis larger than a node is never inside one
    assert spec(per_node=8).intra_node_axes(Mesh({"a": 2, "b": 16})) == ()
    # GPUs: 8 per node; TPU slices hold thousands
    assert H100.link(Mesh({"batch": 16, "model": 8}), "batch").name == "infiniband"
    assert TPU_V5P.link(Mesh({"batch": 16, "model": 8}), "batch").name == "ici"
    assert CPU.link(Mesh({"a": 2048}), "a").name == "host"  # a single level


def test_explicit_axis_links_win_and_merge():
    mesh = Mesh({"batch": 2, "model": 4})
    h = H100.with_axis_links({"model": "infiniband"})
    assert h.link(mesh, "model").name == "infiniband"
    assert h.link(mesh, "batch").name == "nvlink"  # node filling for the rest
    h2 = h.with_axis_links({"batch": "infiniband", "model": "nvlink"})
    assert dict(h2.axis_links) == {"batch": "infiniband", "model": "nvlink"}
    assert H100.axis_links == ()  # the original is unchanged
    with pytest.raises(HardwareError, match=r"no link named 'nvswitch'.*nvlink"):
        H100.with_axis_links({"model": "nvswitch"})
    with pytest.raises(MeshError, match="'expert' is not in"):
        H100.link(mesh, "expert")


# -- collective formulas ------------------------------------------------------------------------------
def test_ring_formulas_in_closed_form():
    bw, lat = 100 * GB, 2e-6
    # all-gather of 1 GB over 8 devices at 100 GB/s: 7/8 of it crosses each link
    assert hw.all_gather_time(1 * GB, 8, bw, lat) == pytest.approx(0.875 * 0.01 + 7 * lat)
    assert hw.reduce_scatter_time(1 * GB, 8, bw, lat) == pytest.approx(0.875 * 0.01 + 7 * lat)
    assert hw.all_reduce_time(1 * GB, 8, bw, lat) == pytest.approx(2 * 0.875 * 0.01 + 14 * lat)
    assert hw.all_to_all_time(1 * GB, 8, bw, lat) == pytest.approx(0.875 * 0.01 + 7 * lat)
    # torus: each device forwards n/4 of its array (HTSYM: bytes / 4 of the global array)
    assert hw.all_to_all_time(1 * GB, 8, bw, lat, "torus") == pytest.approx(2 * 0.01 + 7 * lat)
    assert hw.all_to_all_time(1 * GB, 5, bw, 0, "torus") == pytest.approx(6 / 5 * 0.01)
    assert hw.permute_time(1 * GB, bw, lat) == pytest.approx(0.01 + lat)
    for f in (hw.all_gather_time, hw.reduce_scatter_time, hw.all_reduce_time, hw.all_to_all_time):
        assert f(1 * GB, 1, bw, lat) == 0.0


def test_collective_time_over_one_axis():
    mesh = Mesh({"batch": 2, "model": 8})
    h = spec()
    t = collective_time("all-gather", 1 * GB, ("model",), mesh, h)
    assert t == pytest.approx(0.875 * 0.01 + 7e-6)
    assert collective_time("all-reduce", 1 * GB, ["model"], mesh, h) == pytest.approx(
        2 * 0.875 * 0.01 + 14e-6
    )
    assert collective_time("collective-permute", 1 * GB, ("model",), mesh, h) == pytest.approx(
        0.01 + 1e-6
    )
    assert collective_time("all-reduce", 1 * GB, (), mesh, h) == 0.0
    # an 8xH100 node all-gathers B bytes at the bus bandwidth NCCL measures (361.4 GB/s;
    # HTSYM's B / 450e9 is the link's spec); an all-to-all keeps the spec
    assert collective_time("all-gather", 1 * GB, ("model",), mesh, H100) == pytest.approx(
        7 / 8 / 361.4 + 7e-6
    )
    assert H100.links[0].figures_for("all-to-all") == (450e9, 1e-6)
    with pytest.raises(HardwareError, match="unknown collective kind"):
        collective_time("broadcast", 1, ("model",), mesh, h)
    with pytest.raises(HardwareError, match="once"):
        collective_time("all-gather", 1, ("model", "model"), mesh, h)


def test_two_axes_on_one_link_form_one_ring():
    mesh = Mesh({"a": 2, "b": 4})
    h = spec(per_node=8)
    t = collective_time("reduce-scatter", 1 * GB, ("a", "b"), mesh, h)
    assert t == pytest.approx(7 / 8 * 0.01 + 7e-6)


def test_two_levels_are_priced_hierarchically():
    mesh = Mesh({"node": 4, "gpu": 8})
    h = spec(latency=0.0, inter_latency=0.0)
    b = 1 * GB
    fast = lambda n, nbytes: (n - 1) / n * nbytes / (100 * GB)  # noqa: E731
    slow = lambda n, nbytes: (n - 1) / n * nbytes / (10 * GB)  # noqa: E731
    # all-gather: gather the small pieces across nodes first, then inside the node, the
    # last gathered major: in order where the inner axis is major...
    ag = collective_time("all-gather", b, ("gpu", "node"), mesh, h)
    assert ag == pytest.approx(fast(8, b) + slow(4, b / 8))
    # ...and with the output's blocks permuted (one copy) where the outer one is
    copy = 2 * b / h.copy_bandwidth(b) + h.op_overhead
    assert collective_time("all-gather", b, ("node", "gpu"), mesh, h) == pytest.approx(ag + copy)
    # reduce-scatter: inside the node first, then across nodes on 1/8 of the data...
    assert collective_time("reduce-scatter", b, ("gpu", "node"), mesh, h) == pytest.approx(ag)
    # ...its blocks permuted first where the result has the outer axis major (one copy of
    # the input, read and written: cheaper than scattering across nodes first)
    rs = collective_time("reduce-scatter", b, ("node", "gpu"), mesh, h)
    assert rs == pytest.approx(ag + copy)
    assert rs < slow(4, b) + fast(8, b / 4)
    # all-reduce: twice each stage
    ar = collective_time("all-reduce", b, ("gpu", "node"), mesh, h)
    assert ar == pytest.approx(2 * fast(8, b) + 2 * slow(4, b / 8))
    # all-to-all: one full-size exchange per level
    a2a = collective_time("all-to-all", b, ("node", "gpu"), mesh, h)
    assert a2a == pytest.approx(fast(8, b) + slow(4, b))
    # a permute over both pays the slow link once
    perm = collective_time("collective-permute", b, ("node", "gpu"), mesh, h)
    assert perm == pytest.approx(b / (10 * GB))
    # flat: one ring of 32 at the slowest link and the largest latency, an upper bound
    h = spec(latency=1e-6, inter_latency=1e-5)
    flat = collective_time("all-gather", b, ("node", "gpu"), mesh, h, hierarchical=False)
    assert flat == pytest.approx(31 / 32 * b / (10 * GB) + 31 * 1e-5)
    ag = collective_time("all-gather", b, ("gpu", "node"), mesh, h)
    assert ag == pytest.approx(fast(8, b) + 7e-6 + slow(4, b / 8) + 3e-5)
    assert flat > ag


def test_hierarchy_follows_explicit_links():
    mesh = Mesh({"x": 2, "y": 2})
    h = spec(latency=0.0, inter_latency=0.0).with_axis_links({"x": "slow"})
    t = collective_time("all-gather", 1 * GB, ("y", "x"), mesh, h)
    assert t == pytest.approx(0.5 * GB / (100 * GB) + 0.5 * 0.5 * GB / (10 * GB))


def test_a_matmul_runs_at_its_measured_share_of_the_peak():
    import dataclasses

    import jax
    import jax.numpy as jnp

    import workbench as wb
    from workbench.core.hardware.levels import HardwareError

    h100 = wb.hardware.H100
    assert h100.matmul_flops("bfloat16") == pytest.approx(792.1e12)  # the MAMF measurement
    assert h100.matmul_flops("float16") == pytest.approx(989.5e12 * 792.1 / 989.5)  # falls back
    assert wb.hardware.TPU_V5E.matmul_flops("bfloat16") == wb.hardware.TPU_V5E.peak_flops(
        "bfloat16"
    )
    at_peak = dataclasses.replace(h100, name="H100 at peak", matmul_efficiency={})
    x = jax.ShapeDtypeStruct((8192, 8192), jnp.bfloat16)
    program = wb.capture(lambda a, b: jnp.tanh(a @ b), x, x)  # a compute-bound matmul
    s = wb.Session(program, wb.Mesh({"d": 1}))
    measured, peak = (s.estimate(h) for h in (h100, at_peak))
    matmul = next(o for o in measured.ops if program.ops[o.op].primitive == "dot_general")
    fast = next(o for o in peak.ops if o.op == matmul.op)
    assert matmul.seconds == pytest.approx(fast.seconds * 989.5 / 792.1)
    # elementwise work keeps the peak: only matmuls and convolutions are scaled
    other = [(a.seconds, b.seconds) for a, b in zip(measured.ops, peak.ops) if a.op != matmul.op]
    assert all(a == b for a, b in other)
    for bad in ({"bfloat16": 0}, {"bfloat16": 1.5}, {"bfloat16": "high"}):
        with pytest.raises(HardwareError, match=r"matmul_efficiency=.*in \(0, 1\]"):
            dataclasses.replace(h100, matmul_efficiency=bad)
