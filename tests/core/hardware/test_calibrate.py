"""Calibration on the 8 virtual CPU devices, in quick mode, and the link fit in closed form."""

import math
import platform
import statistics

import jax
import numpy as np
import pytest

from workbench.core import hardware as hw
from workbench.core.hardware import calibrate as cal
from workbench.core.hardware.calibrate import calibrate
from workbench.core.hardware.fit import Sample, fit_link
from workbench.core.layout.mesh import Mesh

# times the attached devices: in the full suite (CI), not the fast lane
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def measured():
    return calibrate(quick=True)


def test_quick_calibration_is_plausible(measured):
    n = len(jax.devices())
    assert measured.name == f"calibrated cpu x{n}"
    assert measured.devices_per_node == n
    for key, value in measured.figures().items():
        assert math.isfinite(value) and value >= 0, key
        assert measured.sources[key], key
    # a core does 1e9-1e12 FLOP/s; 8 virtual devices share a few of them
    assert 1e7 < measured.flops["float32"] < 1e13
    assert 1e6 < measured.hbm_bandwidth < 1e12
    assert 1e8 < measured.memory_bytes < 1e13
    (link,) = measured.links
    assert 1e5 < link.bandwidth <= measured.hbm_bandwidth  # it copies through memory
    for _, bandwidth, latency in link.kinds:
        assert 1e5 < bandwidth <= measured.hbm_bandwidth and 0 <= latency < 1e-2
    assert 0 <= link.latency < 1e-2
    kind = jax.devices()[0].device_kind
    for key in ("flops.float32", "hbm_bandwidth", f"links.{link.name}.bandwidth"):
        assert "measured" in measured.sources[key] and kind in measured.sources[key]


def test_transposes_are_measured_per_size(measured):
    # a curve of (array bytes, bytes/s), one point per size measured, each with a source
    curve = measured.transpose_bandwidth
    assert [size for size, _ in curve] == [4 * 128 * 128, 4 * 256 * 256]
    for size, rate in curve:
        assert 1e6 < rate < 1e12
        assert "(x * 0.5 + 1).T" in measured.sources[f"transpose_bandwidth.{size:.0f}"]
    assert curve[0][1] >= curve[1][1]  # no slower for a smaller array
    assert measured.copy_bandwidth(1 << 30) == curve[-1][1]


def test_fresh_memory_is_measured_where_glibc_maps_it(measured):
    threshold, _ = cal.fresh_buffer_threshold()
    assert measured.fresh_buffer_bytes == threshold
    if threshold is None:
        assert measured.first_touch_bandwidth is None
        pytest.skip(f"this host's C library is not glibc: {platform.libc_ver()}")
    assert threshold == 32 << 20  # glibc's cap on its mmap threshold, 64-bit
    assert "mallopt" in measured.sources["fresh_buffer_bytes"]
    assert 1e6 < measured.first_touch_bandwidth < 1e12
    assert "malloc + memset" in measured.sources["first_touch_bandwidth"]


def test_fresh_buffer_threshold_follows_the_environment(monkeypatch):
    if platform.libc_ver()[0] != "glibc":
        pytest.skip(f"this host's C library is not glibc: {platform.libc_ver()}")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_MMAP_MAX_", raising=False)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=1048576")
    assert cal.fresh_buffer_threshold()[0] == 1 << 20
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1:glibc.malloc.mmap_max=0")
    assert cal.fresh_buffer_threshold()[0] is None  # malloc maps nothing
    monkeypatch.delenv("GLIBC_TUNABLES")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "0x10000")
    assert cal.fresh_buffer_threshold()[0] == 1 << 16


def test_calibrated_spec_prices_collectives(measured):
    n = len(jax.devices())
    mesh = Mesh({"d": n})
    (link,) = measured.links
    t = hw.collective_time("all-reduce", 1 << 20, ("d",), mesh, measured)
    bandwidth, latency = link.figures_for("all-reduce")
    assert t == pytest.approx(hw.all_reduce_time(1 << 20, n, bandwidth, latency))
    assert 0 < t < 10
    assert measured.peak_flops("bfloat16") > 0  # measured, or the float32 fallback


def test_collectives_are_timed_in_context(measured):
    # inside a program every collective waits for all devices of its group: even 256 bytes
    # cost a rendezvous, which a lone collective less a program's dispatch time hides
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("d",))
    samples, chains = cal.measure_collectives(mesh, quick=True)
    assert chains == "1 and 5"
    assert {s.kind for s in samples} == set(hw.KINDS)
    # the median: one sample may be lost in the host's noise
    assert statistics.median(s.seconds for s in samples if s.nbytes <= 256) > 1e-6
    (link,) = measured.links
    assert link.figures_for("all-reduce")[1] > 0  # the fit keeps a latency


def test_a_device_count_that_is_not_a_power_of_two():
    # groups of 2 and 6: every collective moves whole shares of its group
    h = calibrate(jax.devices()[:6], quick=True, dtypes=("float32",))
    (link,) = h.links
    assert [k for k, *_ in link.kinds] == list(hw.KINDS)
    assert all(bandwidth > 0 for _, bandwidth, _ in link.kinds)


def test_fit_recovers_bandwidth_and_latency():
    bw, lat, n = 5e9, 3e-6, 8
    samples = [
        Sample(kind, n, nbytes, f(nbytes, n, bw, lat))
        for nbytes in (1e4, 1e6, 1e8)
        for kind, f in (("all-reduce", hw.all_reduce_time), ("all-gather", hw.all_gather_time))
    ]
    got_bw, got_lat = fit_link(samples)
    assert got_bw == pytest.approx(bw, rel=1e-6)
    assert got_lat == pytest.approx(lat, rel=1e-6)


def test_fit_never_returns_a_negative_latency():
    # bandwidth-only timings with noise that would pull the intercept below zero
    samples = [Sample("all-gather", 4, b, 0.75 * b / 1e9 * s) for b, s in ((1e3, 0.5), (1e8, 1.0))]
    bw, lat = fit_link(samples)
    assert lat == 0.0 and bw > 0


def test_one_device_and_unsupported_dtypes(monkeypatch):
    real = cal.measure_matmul

    def fake(mesh, dtype="float32", **kw):
        if dtype == "bfloat16":
            raise NotImplementedError("no bf16 dots here")
        return real(mesh, dtype, **kw)

    monkeypatch.setattr(cal, "measure_matmul", fake)
    h = calibrate(jax.devices()[:1], quick=True)
    assert set(h.flops) == {"float32"} and "bfloat16" in h.notes
    assert h.name.endswith("x1") and "not measured" in h.sources["links.host.latency"]


def test_a_latency_that_noise_hides_is_kept():
    # two sizes, both near the latency, the larger timed a little faster: least squares
    # would put the latency below zero; a 256-byte collective still costs its rendezvous
    samples = [
        Sample("all-reduce", 8, 256, 2.4e-4),
        Sample("all-reduce", 8, 65536, 2.3e-4),
        Sample("all-gather", 8, 256, 2.5e-4),
        Sample("all-gather", 8, 65536, 2.7e-4),
    ]
    bw, lat = fit_link(samples)
    assert 1e-5 < lat < 3e-5  # about 2.4e-4 s over 14 or 7 steps
    assert bw > 0
