"""Simulator fidelity: predicted against measured step time, per model and strategy.

First ``calibrate()`` measures the attached devices (matmul rate, kernel overhead, memory,
transpose and first-touch bandwidth, every collective kind); then, for each model, every
strategy is estimated on that spec and run on the devices with the explicit lowering, as
a training loop runs it: the inputs an output replaces are donated and the next step
reads that output (as the simulator's memory assumes; the first step's outputs are
checked against the unpartitioned program). Strategies of one model are timed in interleaved
rounds, so a change in the machine's load hits them alike; a measured step is the median
over rounds of the median of ``--repeats`` runs; its fastest run is shown beside it (the
host's other load only adds time, so the fastest run is the step on the devices alone).
Per model: Spearman's rank correlation between predicted and measured times across its
strategies (also against the fastest runs), the rank correlation of the measurement with
itself (the medians of odd rounds against those of even rounds: where strategies differ by
less than the host's noise, no prediction ranks them better), and the median relative
error |predicted - measured| / measured. Target: rank correlation >= 0.9 for every model.

The mesh is {batch: 2, model: n/2} over the n attached devices (8 virtual CPU devices by
default: see _common.py; set JAX_PLATFORMS to run on an accelerator instead).

    python benchmarks/simulator.py [--models lm:tiny lm:small ...] [--rounds 3] [--repeats 3]
"""

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

import _common
import jax

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import workbench as wb
from tests.core.lowering.strategies import MP_FOR
from workbench.core.hardware.calibrate import calibrate
from workbench.core.lowering.run import TrainingStep, compare, example_inputs, reference_outputs
from workbench.core.strategies.named import BP, Z3
from workbench.core.units import format_bytes
from workbench.models import build, lm

#: Model sizes: zoo presets, plus an LM between "small" and "large".
SIZES = {
    "mid": lm.Config.preset("small", d_model=256, n_heads=8, d_head=32, d_ff=1024, n_layers=4),
}
DEFAULT_MODELS = ["lm:tiny", "lm:small", "lm:mid", "mlp:small", "cnn:small", "gnn:small"]


def strategies(model: str) -> dict[str, list]:
    mp = MP_FOR[model]
    return {
        "none": [],  # everything replicated: every device computes the whole step
        "BP": [BP("batch")],
        "MP": [mp],
        "BP+MP": [BP("batch"), mp],
        "Z3": [Z3("batch")],
        "BP+Z3": [BP("batch"), Z3("batch")],
        "BP+MP+Z3": [BP("batch"), mp, Z3("batch")],
    }


def mesh_for(devices) -> wb.Mesh:
    n = len(devices)
    batch = 2 if n % 2 == 0 else 1
    return wb.Mesh({"batch": batch, "model": n // batch})


def ranks(xs) -> list[float]:
    """Ranks from 1, ties sharing their average rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a, b) -> float:
    """Spearman's rank correlation: Pearson's correlation of the ranks."""
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else float("nan")


def compiled_step(session):
    """One training step of the explicit lowering on the attached devices, as a training
    loop runs it (and as the simulator's memory assumes): the inputs an output replaces
    are donated and the next step reads that output in their place (``TrainingStep``).
    Returns the step (a function of nothing) and whether the first step's outputs match
    the unpartitioned program's, with their largest relative error."""
    flat = example_inputs(session.program)
    step = TrainingStep(session, flat)
    expected = reference_outputs(session.program, flat, cache_key="example")
    _, rel, ok = compare(step(), expected)  # also the warm-up
    return step, ok, rel


def measure_model(name: str, size: str, mesh: wb.Mesh, hardware, rounds: int, repeats: int):
    config = SIZES.get(size, size)
    ex = build(name, config)
    program = wb.capture(ex.fn, *ex.args)
    rows = []
    for strategy, schedule in strategies(name).items():
        s = wb.Session(program, mesh, schedule)
        e = s.estimate(hardware)
        step, ok, rel = compiled_step(s)
        rows.append(dict(strategy=strategy, estimate=e, step=step, ok=ok, rel=rel))
    times = {r["strategy"]: [] for r in rows}
    fastest = {r["strategy"]: float("inf") for r in rows}
    for _ in range(rounds):  # interleaved: drifting load hits every strategy alike
        for r in rows:
            runs = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                jax.block_until_ready(r["step"]())
                runs.append(time.perf_counter() - t0)
            times[r["strategy"]].append(statistics.median(runs))
            fastest[r["strategy"]] = min(fastest[r["strategy"]], *runs)
    for r in rows:
        r["measured"] = statistics.median(times[r["strategy"]])
        r["fastest"] = fastest[r["strategy"]]
        # the measurement against itself: medians of alternate rounds
        r["halves"] = [statistics.median(times[r["strategy"]][k::2]) for k in (0, 1)]
        r["spread"] = (max(times[r["strategy"]]) - min(times[r["strategy"]])) / r["measured"]
        del r["step"]
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS, help="name:size pairs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick-calibration", action="store_true")
    args = parser.parse_args()
    if args.rounds < 2:  # the measurement is ranked against itself over alternate rounds
        parser.error(f"--rounds {args.rounds}: give at least 2 (odd rounds against even ones)")
    devices = jax.devices()
    mesh = mesh_for(devices)
    t0 = time.perf_counter()
    hardware = calibrate(quick=args.quick_calibration)
    print(f"calibrated in {time.perf_counter() - t0:.1f} s: {hardware}", flush=True)
    figures = hardware.figures()
    print(
        "  op overhead {:.1f} us, first touch {} above {}, transpose {} B/s, per-kind links: {}".format(
            hardware.op_overhead * 1e6,
            f"{hardware.first_touch_bandwidth or 0:.2g} B/s",
            format_bytes(hardware.fresh_buffer_bytes or 0),
            ", ".join(
                f"{format_bytes(size)} {rate:.2g}" for size, rate in hardware.transpose_bandwidth
            )
            if isinstance(hardware.transpose_bandwidth, tuple)
            else f"{hardware.copy_bandwidth():.2g}",
            ", ".join(
                f"{k} {figures[f'links.{hardware.links[0].name}.{k}.bandwidth']:.2g} B/s"
                for k, *_ in hardware.links[0].kinds
            )
            or "none",
        ),
        flush=True,
    )
    table, summary = [], []
    for spec_ in args.models:
        name, _, size = spec_.partition(":")
        t1 = time.perf_counter()
        rows = measure_model(name, size or "small", mesh, hardware, args.rounds, args.repeats)
        predicted = [r["estimate"].step_s for r in rows]
        measured = [r["measured"] for r in rows]
        errors = [abs(p - m) / m for p, m in zip(predicted, measured)]
        rho = spearman(predicted, measured)
        rho_fastest = spearman(predicted, [r["fastest"] for r in rows])
        repeat = spearman(*zip(*(r["halves"] for r in rows)))
        summary.append(
            [
                f"{name}:{size}",
                len(rows),
                f"{rho:.2f}",
                f"{rho_fastest:.2f}",
                f"{repeat:.2f}",
                f"{statistics.median(errors):.0%}",
            ]
        )
        for r in rows:
            e = r["estimate"]
            table.append(
                [
                    f"{name}:{size}",
                    r["strategy"],
                    f"{e.step_s * 1e3:.2f}",
                    f"{e.compute_s * 1e3:.2f}",
                    f"{e.communication_s * 1e3:.2f}",
                    f"{e.fresh_memory_s * 1e3:.2f}",
                    e.kernels,
                    f"{r['measured'] * 1e3:.2f}",
                    f"{r['fastest'] * 1e3:.2f}",
                    f"{r['spread']:.0%}",
                    f"{e.step_s / r['measured']:.2f}",
                    "yes" if r["ok"] else f"no ({r['rel']:.0e})",
                ]
            )
        print(
            f"measured {name}:{size} in {time.perf_counter() - t1:.0f} s: rank correlation "
            f"{rho:.2f}, median error {statistics.median(errors):.0%}",
            flush=True,
        )
    today = datetime.date.today().isoformat()
    print(
        f"\nMeasured {today}: {len(devices)} x {devices[0].device_kind} on mesh {mesh}, "
        f"{_common.machine()}; spec from calibrate() in the same run; measured: median over "
        f"{args.rounds} interleaved rounds of the median of {args.repeats} steps\n"
    )
    print(
        _common.table(
            [
                "model",
                "strategy",
                "predicted ms",
                "compute ms",
                "comm ms",
                "fresh ms",
                "kernels",
                "measured ms",
                "fastest ms",
                "spread",
                "pred / meas",
                "outputs match",
            ],
            table,
        )
    )
    print()
    print(
        _common.table(
            [
                "model",
                "strategies",
                "rank correlation",
                "vs fastest runs",
                "measured vs itself",
                "median error",
            ],
            summary,
        )
    )
    worst = min(float(r[2]) for r in summary)
    worst_fastest = min(float(r[3]) for r in summary)
    print(
        f"\nlowest rank correlation {worst:.2f}, against the fastest runs {worst_fastest:.2f} "
        "(target >= 0.9)"
    )


if __name__ == "__main__":
    main()
