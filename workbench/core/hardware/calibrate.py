"""Measure the attached devices and return a `Hardware` with what was measured.

``calibrate()`` runs the microbenchmarks of ``measure.py`` on every device at once and
fits what they time (``fit.py``): matmul FLOP/s per dtype (float32 and bfloat16 where the
backend runs them), kernel overhead (the slope of time against the kernels a chain of tiny
dependent steps launches), memory bandwidth (the slope of ``x + 1``'s time against bytes,
so a launch's fixed cost is the intercept), transpose bandwidth per array size from 64 KiB
to 16 MiB (a curve: a transpose slows as its array leaves the caches), on CPU devices under
glibc the first-touch bandwidth of freshly mapped memory, and with two or more devices
every collective kind over groups of 2, 4, ... devices, timed inside a program as the slope
over chains of dependent collectives (so the devices' rendezvous counts and the program's
dispatch does not). The collectives are fitted per kind to the formulas of
``collectives.py`` by least squares on relative error: the link's own figures are the fit
of all-reduce and all-gather together, each kind's fit is kept in ``Link.kinds``, so the
spec prices every collective with the formula it was fitted with.

``quick=True`` keeps everything small (a few seconds; cache-sized arrays, so memory
bandwidth reads high) for tests. On CPU the figures describe virtual devices sharing the
host's cores: useful to compare predicted with measured steps on this machine, not to
predict accelerators.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from workbench.core import progress
from workbench.core.errors import InputError, given
from workbench.core.hardware.fit import fit_link
from workbench.core.hardware.levels import KINDS, HardwareError, Link
from workbench.core.hardware.measure import (
    fresh_buffer_threshold,
    measure_collectives,
    measure_first_touch_bandwidth,
    measure_matmul,
    measure_memory_bandwidth,
    measure_op_overhead,
    measure_transpose_bandwidth,
    memory_capacity,
)
from workbench.core.hardware.presets.citations import XLA_COMBINE, XLA_CPU_COMBINE
from workbench.core.hardware.rates import dtype_name
from workbench.core.hardware.spec import XLA_COMBINE_BYTES, XLA_CPU_COMBINE_BYTES, Hardware


def calibrate(
    devices: Sequence | None = None,
    *,
    quick: bool = False,
    dtypes: Sequence[str] = ("float32", "bfloat16"),
    collectives: bool = True,
) -> Hardware:
    """Measure ``devices`` (default: all of ``jax.devices()``) and return their spec. Each
    measurement shows on a status line (`workbench.core.progress`); a KeyboardInterrupt
    propagates."""
    devices = _checked(devices, quick, dtypes, collectives)
    with progress.Status("calibrate"):
        return _measured(devices, quick, dtypes, collectives)


def _measured(devices, quick, dtypes, collectives) -> Hardware:
    """``calibrate``'s measurements and their fit, each measurement a stage of the status."""
    mesh = jax.sharding.Mesh(np.array(devices), ("d",))
    n = len(devices)
    kind = devices[0].device_kind
    platform = devices[0].platform
    when = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    where = f"{n} x {kind} ({platform})"
    mode = "quick mode, small arrays" if quick else "full mode"

    def measured(what: str) -> str:
        return f"measured by workbench.core.hardware.calibrate on {where}, {when} ({mode}): {what}"

    on_cpu = platform == "cpu"
    fresh, fresh_how = fresh_buffer_threshold() if on_cpu else (None, "")
    total = len(dtypes) + 3 + (fresh is not None) + (collectives and n > 1)
    count = iter(range(1, total + 1))

    def stage(what: str) -> None:
        progress.stage(f"measurement {next(count)}/{total}: {what}")

    flops, sources, skipped = {}, {}, []
    for dtype in dtypes:
        name = jnp.dtype(dtype).name
        stage(f"matmul in {name}")
        try:
            rate, size = measure_matmul(mesh, dtype, quick=quick)
        except Exception as e:  # the backend does not run this dtype
            skipped.append(f"{name} ({type(e).__name__})")
            continue
        flops[name] = rate
        sources[f"flops.{name}"] = measured(
            f"{size} x {size} matmul per device, all devices at once, fastest run"
        )

    stage("kernel overhead")
    overhead, dispatch, chains = measure_op_overhead(mesh, quick=quick)
    if overhead > 0:
        sources["op_overhead"] = measured(
            f"chains of {chains} tiny dependent kernels per device, slope of time against "
            f"kernels launched ({dispatch * 1e6:.0f} us dispatch per program as intercept)"
        )
    stage("memory bandwidth")
    hbm, hbm_sizes = measure_memory_bandwidth(mesh, quick=quick)
    sources["hbm_bandwidth"] = measured(
        f"x + 1 over {_sizes(hbm_sizes)} per device (read + write), slope of time against bytes"
    )
    stage("transpose bandwidth")
    transpose, t_sizes = measure_transpose_bandwidth(mesh, quick=quick, dispatch=dispatch)
    for size in t_sizes:
        sources[f"transpose_bandwidth.{size}"] = measured(
            f"(x * 0.5 + 1).T on {_sizes([size])} per device (read + write), fastest run, "
            "dispatch subtracted"
        )
    memory, memory_how = memory_capacity(devices)
    sources["memory_bytes"] = f"{memory_how} on {where}"
    touch = None
    if fresh is not None:
        stage("first-touch bandwidth")
        block = int(fresh * 1.25)
        touch = measure_first_touch_bandwidth(n, block, quick=quick)
        sources["fresh_buffer_bytes"] = fresh_how
        sources["first_touch_bandwidth"] = measured(
            f"malloc + memset of {_sizes([block])} (then free) on {n} threads at once, one "
            "per device, less memset of memory already touched; fastest of several"
        )

    link_name = "host" if platform == "cpu" else "interconnect"
    per_kind, level = (), {}  # the link's figures and their sources
    if collectives and n > 1:
        stage("collectives")
        samples, chains = measure_collectives(mesh, quick=quick, op_overhead=overhead)
        base = [s for s in samples if s.kind in ("all-reduce", "all-gather")]
        # a collective copies through memory: where noise swamps the transfer
        # (small arrays, devices sharing a host), the fit is capped at the memory bandwidth
        bandwidth, latency = fit_link(base)
        bandwidth = min(bandwidth, hbm)
        sizes = sorted({int(s.nbytes) for s in samples})
        groups = sorted({s.n for s in samples})
        how = (
            f"{{kinds}} of {sizes[0] >> 10}-{sizes[-1] >> 10} KiB per device over groups of "
            f"{', '.join(map(str, groups))} devices, fitted to the formulas of "
            f"workbench.core.hardware.collectives; each timed inside a program, the slope over chains of "
            f"{chains} dependent collectives; bandwidth at most the memory bandwidth"
        )
        level["bandwidth"] = measured(how.format(kinds="all-reduce and all-gather"))
        level["latency"] = level["bandwidth"]
        fits = []
        for k in KINDS:
            mine = [s for s in samples if s.kind == k]
            if mine:
                bw, lat = fit_link(mine)
                fits.append((k, min(bw, hbm), lat))
                for fig in ("bandwidth", "latency"):
                    level[f"{k}.{fig}"] = measured(how.format(kinds=k))
        per_kind = tuple(fits)
    else:
        bandwidth, latency = hbm, 0.0
        note = "not measured (one device, or collectives=False): set to the memory bandwidth"
        level["bandwidth"] = level["latency"] = note
    level["group_size"] = f"all {n} calibrated devices, joined by one measured link"
    sources["all_reduce_combine_bytes"] = XLA_CPU_COMBINE if on_cpu else XLA_COMBINE
    return Hardware(
        name=f"calibrated {platform} x{n}",
        flops=flops,
        hbm_bandwidth=hbm,
        memory_bytes=memory,
        links=(Link(link_name, bandwidth, latency, kinds=per_kind, group_size=n, sources=level),),
        sources=sources,
        notes=f"Measured on {where} at {when}."
        + (f" Matmul not measured for {', '.join(skipped)}." if skipped else ""),
        op_overhead=overhead,
        transpose_bandwidth=transpose,
        all_reduce_combine_bytes=XLA_CPU_COMBINE_BYTES if on_cpu else XLA_COMBINE_BYTES,
        fresh_buffer_bytes=fresh,
        first_touch_bandwidth=touch,
        fuses_per_reader=on_cpu,
    )


def _sizes(nbytes: Sequence[int]) -> str:
    return ", ".join(f"{b / 2**20:g} MiB" for b in nbytes)


def _checked(devices, quick, dtypes, collectives) -> list:
    """``calibrate``'s arguments checked before anything is measured; the devices."""
    found = jax.devices() if devices is None else devices
    if not (
        isinstance(found, Sequence)
        and found
        and all(isinstance(d, jax.Device) for d in found)
        and len(set(found)) == len(found)
        and len({d.platform for d in found}) == 1
    ):
        raise InputError(
            f"calibrate(devices={given(devices)}): give distinct JAX devices of one platform, "
            "e.g. jax.devices() or jax.devices()[:4], or None for all attached."
        )
    for what, flag in (("quick", quick), ("collectives", collectives)):
        if not isinstance(flag, bool):
            raise InputError(f"calibrate({what}={given(flag)}): give True or False.")
    ok = isinstance(dtypes, Sequence) and not isinstance(dtypes, str) and len(dtypes) > 0
    try:
        ok = ok and all(dtype_name(d) for d in dtypes)
    except HardwareError:
        ok = False
    if not ok:
        raise InputError(
            f"calibrate(dtypes={given(dtypes)}): give a list of dtype names to time matmuls "
            "in, e.g. ('float32', 'bfloat16')."
        )
    return list(found)
