"""A collective inside a step against the same collective in a chain of collectives.

``calibrate()`` times each collective as the slope over chains of dependent collectives:
the devices arrive at every rendezvous together. In a step, a collective follows a stretch
of compute, and every device must finish its own before any can go on. On devices that
run side by side (accelerators) what that adds is the skew between them; on virtual CPU
devices sharing a few cores, the host's threads reach the rendezvous at different times and the early ones
wait for the late ones. This benchmark measures that cost on the attached devices, in two
tables.

Per group size (groups of 2, 4, ... over all devices, every group at once) and per stretch
of compute (a chain of small matmul, tanh and row-max kernels on every device), it times a
program that runs the stretch then all-reduces a buffer, against one that runs the stretch
then updates the buffer locally, in interleaved rounds. *extra* is what the all-reduce adds
(median over rounds, and the difference of the 10th percentiles); *in a chain* is the same
all-reduce timed as ``calibrate()`` times it (slope over chains, fastest runs).

The second table does the same on a model: the tiny zoo LM's training step under batch
parallelism at batch b, against the unsharded step at batch b / 2, whose local shapes are
the same, so the difference is what BP's one (combined) gradient all-reduce costs in the
step, beside that all-reduce timed in a chain.

    python benchmarks/collective_context.py [--rounds 200] [--kilobytes 80]
"""

import argparse
import datetime
import functools
import statistics
import sys
import time
from pathlib import Path

import _common
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import workbench as wb
from workbench.core.hardware.measure import chain_time
from workbench.core.lowering.run import TrainingStep, example_inputs
from workbench.models import build, lm

#: Links per stretch of compute, each three kernels (a matmul, tanh with the add, a row max).
LINKS = (10, 50, 150)


def stretch(x, w, links: int):
    for _ in range(links):
        x = jnp.tanh(x @ w) + jnp.max(x, axis=1, keepdims=True)
    return x


def programs(mesh: Mesh, links: int):
    """(stretch then all-reduce, stretch then a local update) over mesh axis "g"."""

    def body(x, w, v, *, reduce):
        x = stretch(x, w, links)
        v = jax.lax.psum(v + x[0, 0], "g") if reduce else v * 0.5 + x[0, 0]
        return x, v

    specs = dict(mesh=mesh, in_specs=(P(), P(), P()), out_specs=(P(), P()), check_vma=False)
    return [jax.jit(jax.shard_map(functools.partial(body, reduce=r), **specs)) for r in (1, 0)]


def chained(mesh: Mesh, v) -> float:
    """Seconds of one all-reduce of ``v`` as calibrate times it: the slope over chains."""
    link = functools.partial(jax.lax.psum, axis_name="g")
    return max(chain_time(mesh, link, v, P(), extra=8, repeats=9), 0.0)


def interleaved(fns, args, rounds: int) -> list[list[float]]:
    for fn in fns:
        jax.block_until_ready(fn(*args))
    times = [[] for _ in fns]
    for _ in range(rounds):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            ts.append(time.perf_counter() - t0)
    return times


def same_local_shapes(devices, rounds: int, repeats: int = 10) -> list[list]:
    """Rows of the second table: the tiny LM under BP at batch b against unsharded at b / 2."""
    n = devices.size
    mesh = wb.Mesh({"batch": 2, "model": n // 2})
    pairs = Mesh(devices.reshape(n // 2, 2), ("r", "g"))
    rows = []
    for batch in (8, 16):
        steps, reduced = [], 0
        for schedule, b in (([], batch // 2), ([wb.BP("batch")], batch)):
            ex = build("lm", lm.Config.preset("tiny", batch=b))
            s = wb.Session(wb.capture(ex.fn, *ex.args), mesh, schedule)
            steps.append(TrainingStep(s, example_inputs(s.program)))
            reduced += sum(c.bytes for c in s.collectives() if c.kind == "all-reduce")
        times = [[] for _ in steps]
        for _ in range(rounds):
            for step, ts in zip(steps, times):
                ts.append(_common.median_time(step, repeats))
        alone, bp = (statistics.median(ts) for ts in times)
        chain_s = chained(pairs, jnp.ones((reduced // 4,), jnp.float32))
        rows.append(
            [
                batch,
                f"{alone * 1e3:.2f}",
                f"{bp * 1e3:.2f}",
                f"{(bp - alone) * 1e3:.2f}",
                f"{reduced >> 10} KiB",
                f"{chain_s * 1e6:.0f}",
            ]
        )
    return rows


def p10(xs) -> float:
    return sorted(xs)[len(xs) // 10]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--kilobytes", type=int, default=80, help="per device, all-reduced")
    args = parser.parse_args()
    devices = np.array(jax.devices())
    n = devices.size
    groups = [g for g in (2, 4, 8, 16) if g < n and n % g == 0] + [n]
    x = jnp.ones((128, 32), jnp.float32)
    w = jnp.full((32, 32), 0.01, jnp.float32)
    v = jnp.ones((args.kilobytes * 256,), jnp.float32)
    rows = []
    for g in groups:
        mesh = Mesh(devices.reshape(n // g, g), ("r", "g"))
        chain_s = chained(mesh, v)
        for links in LINKS:
            with_ar, alone = interleaved(programs(mesh, links), (x, w, v), args.rounds)
            extra = statistics.median(with_ar) - statistics.median(alone)
            rows.append(
                [
                    g,
                    3 * links,
                    f"{statistics.median(alone) * 1e3:.2f}",
                    f"{chain_s * 1e6:.0f}",
                    f"{extra * 1e6:.0f}",
                    f"{(p10(with_ar) - p10(alone)) * 1e6:.0f}",
                    f"{extra / chain_s:.1f}" if chain_s > 0 else "-",
                ]
            )
            print(f"group {g}, {3 * links} kernels: extra {extra * 1e6:.0f} us", flush=True)
    today = datetime.date.today().isoformat()
    print(
        f"\nMeasured {today}: {n} x {devices.flat[0].device_kind}, {_common.machine()}; "
        f"a {args.kilobytes} KiB all-reduce per device; {args.rounds} interleaved rounds\n"
    )
    print(
        _common.table(
            [
                "group",
                "kernels before",
                "stretch ms",
                "in a chain us",
                "extra us (median)",
                "extra us (p10)",
                "median / chain",
            ],
            rows,
        )
    )
    n_rounds = max(args.rounds // 16, 4)
    print(
        f"\nThe tiny LM's step, BP at batch b against unsharded at b / 2 (the same local "
        f"shapes), on mesh {{batch: 2, model: {n // 2}}}; median over {n_rounds} interleaved "
        "rounds of the median of 10 steps\n"
    )
    print(
        _common.table(
            [
                "b",
                "unsharded at b / 2 ms",
                "BP at b ms",
                "difference ms",
                "all-reduced",
                "in a chain us",
            ],
            same_local_shapes(devices, n_rounds),
        )
    )


if __name__ == "__main__":
    main()
