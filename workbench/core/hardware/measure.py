"""The microbenchmarks ``calibrate()`` runs, each on every device at once under
``jax.shard_map`` (so a figure is what one device gets while all are busy, as in a step):
matmul FLOP/s, kernel overhead, memory and transpose bandwidth, first touch of fresh memory
(CPU devices under glibc), and every collective kind inside a program. Each figure is the
fastest of its runs (`fastest_time`)."""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from platform import libc_ver

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from workbench.core.hardware.fit import Sample, fit_slope
from workbench.core.hardware.levels import KINDS


def fastest_time(fn, *args, repeats: int = 5, warmup: int = 1) -> float:
    """Fastest wall-clock seconds of ``fn(*args)`` to completion over ``repeats`` runs,
    after ``warmup`` calls. The fastest, not the median: whatever else the machine runs
    only ever adds time, so the fastest run is the best measure of the devices alone (on
    virtual devices sharing a busy host, medians of one figure drift by 2-3x between runs)."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return best


def fastest_interleaved(fn, inputs: Sequence, *, rounds: int, repeats: int) -> list[float]:
    """Per input, the fastest seconds of ``fn(input)`` over ``rounds`` passes through all
    the inputs in turn (``repeats`` timed runs each): a change in the host's load then hits
    every input alike instead of skewing a fit through them."""
    times = [math.inf] * len(inputs)
    for _ in range(rounds):
        for i, x in enumerate(inputs):
            times[i] = min(times[i], fastest_time(fn, x, repeats=repeats))
    return times


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
        return fastest_time(mm, a, a, repeats=3 if quick else 5)

    n = 128 if quick else 256
    t = run(n)
    if t < target_s:  # time grows as n^3: size for about target_s
        grown = int(n * (target_s / t) ** (1 / 3)) // 128 * 128
        n2 = min(max(grown, n), max_n)
        if n2 != n:
            n, t = n2, run(n2)
    return 2.0 * n**3 / t, n


def measure_memory_bandwidth(mesh, *, quick=False, rounds=None) -> tuple[float, list[int]]:
    """Per-device bytes/s of ``x + 1`` (one read, one write): the slope over several sizes,
    each size's time the fastest over ``rounds`` interleaved passes over the sizes (a slope
    through single figures swings several-fold with the host's load)."""
    sizes = [256 << 10, 1 << 20] if quick else [256 << 10, 1 << 20, 4 << 20, 16 << 20]
    rounds = rounds or (1 if quick else 3)
    fn = _per_device(mesh, lambda v: v + 1.0)
    inputs = [_filled(mesh, (nbytes // 4,), jnp.float32) for nbytes in sizes]
    times = fastest_interleaved(fn, inputs, rounds=rounds, repeats=5)
    return 1.0 / fit_slope([2 * b for b in sizes], times), sizes


def measure_transpose_bandwidth(
    mesh, *, quick=False, dispatch=0.0, rounds=None
) -> tuple[tuple[tuple[float, float], ...], list[int]]:
    """Per-device bytes/s of a transposing copy as compilers emit one, fused into the op
    that makes the value (``(x * 0.5 + 1).T`` on square float32 arrays), at several sizes:
    ``((array bytes, bytes/s), ...)`` with bytes read and written / (time - ``dispatch``,
    the fixed cost of running a program), each size the fastest over ``rounds``
    interleaved passes. Transposes slow down as they leave the caches (several-fold from
    64 KiB to 16 MiB on a CPU), so the simulator prices each copy at its own size."""
    sides = [128, 256] if quick else [128, 256, 512, 1024, 2048]
    rounds = rounds or (1 if quick else 2)
    fn = _per_device(mesh, lambda v: (v * 0.5 + 1.0).T)
    inputs = [_filled(mesh, (m, m), jnp.float32) for m in sides]
    times = fastest_interleaved(fn, inputs, rounds=rounds, repeats=3 if quick else 5)
    sizes = [4 * m * m for m in sides]
    rates = [2 * b / max(t - dispatch, t / 2) for b, t in zip(sizes, times)]
    # a smaller array transposes no slower than a larger one (it fits the same caches or
    # better): where the host's noise says otherwise, the smaller keeps the larger's rate
    for i in reversed(range(len(rates) - 1)):
        rates[i] = max(rates[i], rates[i + 1])
    return tuple(zip(map(float, sizes), rates)), sizes


#: glibc's largest mmap threshold on 64-bit Linux: a block above it is always mapped fresh
#: (mallopt(3), M_MMAP_THRESHOLD: "DEFAULT_MMAP_THRESHOLD_MAX: ... 4*1024*1024*sizeof(long)
#: on 64-bit systems"; below it, glibc raises the threshold to the largest block freed).
GLIBC_MMAP_THRESHOLD_MAX = 4 * 1024 * 1024 * 8


def fresh_buffer_threshold() -> tuple[float | None, str]:
    """Bytes above which this process's ``malloc`` maps a block fresh on every call (see
    `Hardware.fresh_buffer_bytes`), and where that comes from; None where it is not known
    (a C library other than glibc) or never happens (``mmap_max`` set to 0)."""
    libc, version = libc_ver()
    if libc != "glibc":
        return None, f"not modelled: the C library is {libc or 'unknown'}, not glibc"
    tunables = dict(
        kv.split("=", 1) for kv in os.environ.get("GLIBC_TUNABLES", "").split(":") if "=" in kv
    )
    if "0" in (tunables.get("glibc.malloc.mmap_max"), os.environ.get("MALLOC_MMAP_MAX_")):
        return None, "malloc maps no blocks (mmap_max set to 0)"
    given = tunables.get("glibc.malloc.mmap_threshold") or os.environ.get("MALLOC_MMAP_THRESHOLD_")
    try:
        return float(int(given, 0)), f"mmap_threshold set to {given} in the environment"
    except (TypeError, ValueError):
        pass
    return float(GLIBC_MMAP_THRESHOLD_MAX), (
        f'glibc {version}: mallopt(3), M_MMAP_THRESHOLD: "DEFAULT_MMAP_THRESHOLD_MAX: '
        "... 4*1024*1024*sizeof(long) on 64-bit systems\" (XLA's CPU runtime mallocs each "
        "run's temporaries and outputs)"
    )


def measure_first_touch_bandwidth(threads: int, nbytes: int, *, quick=False) -> float:
    """Per-device bytes/s of first touching fresh memory: ``threads`` threads at once (one
    per device, as in a step) each ``malloc`` a block of ``nbytes`` (above the threshold, so
    freshly mapped), write it and free it; the time less that of writing a block already
    touched, each the fastest of several rounds."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]
    kept = [libc.malloc(nbytes) for _ in range(threads)]
    if not all(kept):
        raise MemoryError(f"could not allocate {threads} blocks of {nbytes} bytes")

    def fresh(_):
        block = libc.malloc(nbytes)
        if block:  # ctypes releases the GIL around each call
            ctypes.memset(block, 1, nbytes)
            libc.free(block)

    def reuse(i):
        ctypes.memset(kept[i], 1, nbytes)

    try:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(reuse, range(threads)))  # touch the kept blocks once
            best = {fresh: math.inf, reuse: math.inf}
            for _ in range(2 if quick else 5):
                for fn in best:
                    start = time.perf_counter()
                    list(pool.map(fn, range(threads)))
                    best[fn] = min(best[fn], time.perf_counter() - start)
    finally:
        for block in kept:
            libc.free(block)
    return nbytes / max(best[fresh] - best[reuse], best[fresh] / 100)


_TRIVIAL_HLO = frozenset(
    {"parameter", "constant", "bitcast", "tuple", "get-tuple-element", "after-all",
     "partition-id", "replica-id"}
)  # fmt: skip


def count_kernels(hlo_text: str) -> int:
    """Instructions of a compiled HLO module's entry computation that launch work: every
    instruction but parameters, constants, bitcasts and tuple plumbing."""
    entry = hlo_text[hlo_text.index("\nENTRY") :] if "\nENTRY" in hlo_text else hlo_text
    n = 0
    for line in entry.splitlines()[1:]:
        m = re.search(r"= (?:\([^=]*\)|\S+) ([a-z][a-z0-9\-]*)\(", line)
        n += bool(m) and m.group(1) not in _TRIVIAL_HLO
    return n


def measure_op_overhead(mesh, *, quick=False) -> tuple[float, float, str]:
    """Seconds per kernel launched, the dispatch time of a program, and the chain lengths.

    Chains of k dependent ``v * 0.5 + max(v)`` steps on 8 elements per device (a reduction
    then an elementwise op: no compiler fuses the chain into one kernel); the per-kernel
    time is the least-squares slope of time against the kernels the compiled program has.
    """
    lengths = (1, 32) if quick else (1, 64, 128)
    x = _filled(mesh, (8,), jnp.float32)
    kernels, times = [], []
    for k in lengths:

        def body(v, k=k):
            for _ in range(k):
                v = v * 0.5 + jnp.max(v)
            return v

        compiled = _per_device(mesh, body).lower(x).compile()
        kernels.append(count_kernels(compiled.as_text()))
        times.append(fastest_time(compiled, x, repeats=7 if quick else 15))
    if max(kernels) == min(kernels):  # everything fused: nothing to measure
        return 0.0, min(times), "/".join(map(str, lengths))
    slope, intercept = np.polyfit(np.asarray(kernels, float), np.asarray(times, float), 1)
    return max(float(slope), 0.0), max(float(intercept), 0.0), "/".join(map(str, lengths))


def _chain_link(kind: str, g: int):
    """One link of a chain of ``kind`` over axis "g", shaped for the next link: an
    all-gather keeps a slice of its own share (one small kernel between links), and a
    reduce-scatter is followed by the all-gather that restores its input (its own time is
    that pair's less the all-gather's); the others keep their shape."""
    if kind == "all-reduce":
        return lambda v: jax.lax.psum(v, "g")
    if kind == "all-gather":
        return lambda v: jax.lax.all_gather(v, "g", tiled=True)[: v.shape[0]]
    if kind == "reduce-scatter":
        return lambda v: jax.lax.all_gather(
            jax.lax.psum_scatter(v, "g", tiled=True), "g", tiled=True
        )
    if kind == "all-to-all":
        return lambda v: jax.lax.all_to_all(v, "g", 0, 0, tiled=True)
    return lambda v: jax.lax.ppermute(v, "g", [(i, (i + 1) % g) for i in range(g)])


def chain_time(mesh, link, x, spec, *, extra: int, repeats: int) -> float:
    """Seconds per link of ``link`` (a collective over mesh axis "g" that keeps its input's
    shape) on ``x``: the slope between the fastest runs of chains of 1 and 1 + ``extra``
    dependent links, so a program's dispatch is not part of it and the devices' rendezvous
    at each link is."""
    times = []
    for length in (1, 1 + extra):

        def chain(v, length=length):
            for _ in range(length):
                v = link(v)
            return v

        fn = jax.shard_map(chain, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
        times.append(fastest_time(jax.jit(fn), x, repeats=repeats))
    return (times[1] - times[0]) / extra


def measure_collectives(mesh, *, quick=False, op_overhead=0.0) -> tuple[list[Sample], str]:
    """Every collective kind at several sizes over groups of 2, 4, ... devices, every group
    at once (as a mesh axis runs), timed where a step runs them: inside a program, one after
    another. Each sample is the slope of time against the length of a chain of dependent
    collectives (1 and 1 + k links, see ``_chain_link``; an all-gather's slice between
    links less ``op_overhead``), so a program's dispatch is not part of it and the devices'
    rendezvous at each collective is. Bytes follow the convention of `hardware`
    (all-gather: the gathered output; the rest: the input). Returns the samples and the
    chain lengths."""
    devices = mesh.devices.reshape(-1)
    n = devices.size
    repeats = 5 if quick else 9
    extra = 4 if quick else 8  # links the long chain adds
    sizes = [256, 64 << 10] if quick else [256, 256 << 10, 2 << 20]
    groups = [g for g in (2, 4, 8, 16, 32, 64) if g < n and n % g == 0] + [n]
    if quick:
        groups = sorted({groups[0], n})
    samples = []
    for g in groups:
        sub = jax.sharding.Mesh(devices.reshape(n // g, g), ("r", "g"))
        spec = P(("r", "g"))
        gathers = {}  # bytes -> seconds of one all-gather link at that size
        for kind in KINDS:  # all-gather first: a reduce-scatter is timed less its all-gather
            link = _chain_link(kind, g)
            for nbytes in sizes:
                # every kind moves `size` bytes, a whole number of shares of the group (an
                # all-gather's input is one share, a reduce-scatter's input splits into g)
                share = max(nbytes // 4 // g, 1)
                size = 4 * share * g
                elems = share if kind == "all-gather" else share * g
                x = jax.jit(
                    lambda e=elems: jnp.ones((n * e,), jnp.float32),
                    out_shardings=NamedSharding(sub, spec),
                )()
                seconds = chain_time(sub, link, x, spec, extra=extra, repeats=repeats)
                if kind == "all-gather":
                    gathers[size] = seconds = seconds - op_overhead
                elif kind == "reduce-scatter":  # the pair less its all-gather
                    seconds -= gathers[size] + op_overhead
                samples.append(Sample(kind, g, size, max(seconds, 1e-9)))
    return samples, f"1 and {1 + extra}"


def memory_capacity(devices) -> tuple[float, str]:
    """Bytes of memory per device, and where the figure comes from."""
    stats = None
    try:
        stats = devices[0].memory_stats()
    except Exception:  # some backends do not report memory
        stats = None
    if stats and stats.get("bytes_limit"):
        return float(stats["bytes_limit"]), "device.memory_stats()['bytes_limit']"
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return float(host / len(devices)), "host RAM (os.sysconf) divided among the devices"
