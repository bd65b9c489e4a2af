"""Measure the attached devices and return a `Hardware` with what was measured.

``calibrate()`` runs three microbenchmarks on every device at once (under
``jax.shard_map`` over a one-axis mesh of the devices), so each figure is what one
device gets while all of them are busy, as in a partitioned step:

- **matmul FLOP/s** per dtype (float32 and bfloat16 where the backend runs them): an
  n x n @ n x n product on each device, n sized from a probe so one run takes about
  ``target_s``; the median of several timed runs after a warm-up, 2 n^3 FLOPs each.
- **memory bandwidth**: ``x + 1`` over a large array on each device (read + write).
- **collective bandwidth and latency** (two or more devices): ``psum`` and
  ``all_gather`` at several sizes; the times, less the dispatch time of a trivial
  program, are fitted to the ring formulas of `hardware` (all-reduce
  2(n-1)/n * bytes/bw + 2(n-1) * lat, all-gather half that) by least squares on
  relative error, so the spec prices collectives with the same formulas it was fitted with.

``quick=True`` keeps everything small (a few seconds; cache-sized arrays, so memory
bandwidth reads high) for tests. On CPU the figures describe virtual devices sharing
the host's cores: useful to compare predicted with measured steps on this machine, not
to predict accelerators.
"""

from __future__ import annotations

import datetime as _dt
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from workbench.core.hardware import Hardware, Link


@dataclass(frozen=True, slots=True)
class Sample:
    """One timed collective: its kind, group size, bytes (per device, as in `hardware`), seconds."""

    kind: str  # "all-reduce" or "all-gather"
    n: int
    nbytes: float
    seconds: float


def calibrate(
    devices: Sequence | None = None,
    *,
    quick: bool = False,
    dtypes: Sequence[str] = ("float32", "bfloat16"),
    collectives: bool = True,
) -> Hardware:
    """Measure ``devices`` (default: all of ``jax.devices()``) and return their spec."""
    devices = list(devices if devices is not None else jax.devices())
    mesh = jax.sharding.Mesh(np.array(devices), ("d",))
    n = len(devices)
    kind = devices[0].device_kind
    platform = devices[0].platform
    when = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    where = f"{n} x {kind} ({platform})"
    mode = "quick mode, small arrays" if quick else "full mode"

    def measured(what: str) -> str:
        return f"measured by workbench.core.calibrate on {where}, {when} ({mode}): {what}"

    flops, sources, skipped = {}, {}, []
    for dtype in dtypes:
        name = jnp.dtype(dtype).name
        try:
            rate, size = measure_matmul(mesh, dtype, quick=quick)
        except Exception as e:  # the backend does not run this dtype
            skipped.append(f"{name} ({type(e).__name__})")
            continue
        flops[name] = rate
        sources[f"flops.{name}"] = measured(
            f"{size} x {size} matmul per device, all devices at once, median"
        )

    hbm, hbm_bytes = measure_memory_bandwidth(mesh, quick=quick)
    sources["hbm_bandwidth"] = measured(
        f"x + 1 over {hbm_bytes >> 20} MiB per device (read + write)"
    )
    memory, memory_how = _memory_capacity(devices)
    sources["memory_bytes"] = f"{memory_how} on {where}"

    link_name = "host" if platform == "cpu" else "interconnect"
    if collectives and n > 1:
        samples, overhead = measure_collectives(mesh, quick=quick)
        bandwidth, latency = fit_link(samples)
        sizes = sorted({int(s.nbytes) for s in samples})
        how = (
            f"psum and all_gather of {sizes[0] >> 10}-{sizes[-1] >> 10} KiB per device, "
            f"fitted to the ring formulas; {overhead * 1e6:.0f} us dispatch subtracted"
        )
        sources[f"links.{link_name}.bandwidth"] = measured(how)
        sources[f"links.{link_name}.latency"] = measured(how)
    else:
        bandwidth, latency = hbm, 0.0
        note = "not measured (one device, or collectives=False): set to the memory bandwidth"
        sources[f"links.{link_name}.bandwidth"] = note
        sources[f"links.{link_name}.latency"] = note
    sources["devices_per_node"] = f"all {n} calibrated devices, joined by one measured link"
    return Hardware(
        name=f"calibrated {platform} x{n}",
        flops=flops,
        hbm_bandwidth=hbm,
        memory_bytes=memory,
        links=(Link(link_name, bandwidth, latency),),
        devices_per_node=n,
        sources=sources,
        notes=f"Measured on {where} at {when}."
        + (f" Matmul not measured for {', '.join(skipped)}." if skipped else ""),
    )


# -- microbenchmarks ------------------------------------------------------------------------------
def median_time(fn, *args, repeats: int = 5, warmup: int = 1) -> float:
    """Median wall-clock seconds of ``fn(*args)`` to completion, after ``warmup`` calls."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _filled(mesh, shape, dtype, value=1.0):
    """An array of ``shape`` per device, made on the devices (no host transfer)."""
    n = mesh.devices.size
    sharding = NamedSharding(mesh, P("d"))
    full = (n * shape[0], *shape[1:])
    return jax.jit(lambda: jnp.full(full, value, dtype), out_shardings=sharding)()


def _per_device(mesh, fn, nargs=1):
    spec = P("d")
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(spec,) * nargs, out_specs=spec))


def measure_matmul(mesh, dtype="float32", *, quick=False, target_s=None) -> tuple[float, int]:
    """Per-device FLOP/s of an n x n matmul on every device at once, and the n used."""
    target_s = target_s or (0.02 if quick else 0.2)
    max_n = 512 if quick else 8192
    mm = _per_device(mesh, lambda a, b: a @ b, nargs=2)

    def run(n):
        a = _filled(mesh, (n, n), dtype, 0.5)
        return median_time(mm, a, a, repeats=3 if quick else 5)

    n = 128 if quick else 256
    t = run(n)
    if t < target_s:  # time grows as n^3: size for about target_s
        grown = int(n * (target_s / t) ** (1 / 3)) // 128 * 128
        n2 = min(max(grown, n), max_n)
        if n2 != n:
            n, t = n2, run(n2)
    return 2.0 * n**3 / t, n


def measure_memory_bandwidth(mesh, *, quick=False) -> tuple[float, int]:
    """Per-device bytes/s of ``x + 1`` (one read, one write), and the bytes per device."""
    nbytes = (4 if quick else 64) << 20
    x = _filled(mesh, (nbytes // 4,), jnp.float32)
    t = median_time(_per_device(mesh, lambda v: v + 1.0), x, repeats=3 if quick else 5)
    return 2 * nbytes / t, nbytes


def measure_collectives(mesh, *, quick=False) -> tuple[list[Sample], float]:
    """Timed psum and all_gather over all devices at several sizes, dispatch subtracted."""
    n = mesh.devices.size
    repeats = 3 if quick else 7
    sizes = [16 << 10, 256 << 10, 1 << 20] if quick else [16 << 10, 256 << 10, 4 << 20, 16 << 20]
    tiny = _filled(mesh, (8,), jnp.float32)
    overhead = median_time(_per_device(mesh, lambda v: v + 1.0), tiny, repeats=repeats)
    psum = _per_device(mesh, lambda v: jax.lax.psum(v, "d"))
    gather = jax.jit(
        jax.shard_map(
            lambda v: jax.lax.all_gather(v, "d", tiled=True),
            mesh=mesh,
            in_specs=P("d"),
            out_specs=P(),  # every device holds the gathered array
            check_vma=False,
        )
    )
    samples = []
    for nbytes in sizes:
        x = _filled(mesh, (nbytes // 4,), jnp.float32)
        t = median_time(psum, x, repeats=repeats)
        samples.append(Sample("all-reduce", n, nbytes, max(t - overhead, 1e-9)))
        part = _filled(mesh, (max(nbytes // 4 // n, 1),), jnp.float32)  # gathers to nbytes
        t = median_time(gather, part, repeats=repeats)
        samples.append(Sample("all-gather", n, part.nbytes, max(t - overhead, 1e-9)))
    return samples, overhead


def fit_link(samples: Sequence[Sample]) -> tuple[float, float]:
    """(bandwidth, latency) that best explain the samples by the ring formulas.

    Least squares on relative error of ``t = latency * steps + bytes_factor / bandwidth``;
    a negative latency is refitted as zero, a non-positive slope falls back to the
    largest sample's bytes / time.
    """
    rows, t = [], []
    for s in samples:
        f = 2 if s.kind == "all-reduce" else 1
        rows.append((f * (s.n - 1), f * (s.n - 1) / s.n * s.nbytes))
        t.append(s.seconds)
    a, t = np.array(rows, float), np.array(t, float)
    w = 1.0 / t  # relative error: small and large sizes weigh alike
    (lat, inv_bw), *_ = np.linalg.lstsq(a * w[:, None], t * w, rcond=None)
    if lat < 0:
        col = a[:, 1] * w
        lat, inv_bw = 0.0, float(col @ (t * w) / (col @ col))
    if not inv_bw > 0:
        big = max(range(len(t)), key=lambda i: a[i, 1])
        lat, inv_bw = 0.0, t[big] / a[big, 1]
    return float(1.0 / inv_bw), float(max(lat, 0.0))


def _memory_capacity(devices) -> tuple[float, str]:
    stats = None
    try:
        stats = devices[0].memory_stats()
    except Exception:  # some backends do not report memory
        stats = None
    if stats and stats.get("bytes_limit"):
        return float(stats["bytes_limit"]), "device.memory_stats()['bytes_limit']"
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return float(host / len(devices)), "host RAM (os.sysconf) divided among the devices"
