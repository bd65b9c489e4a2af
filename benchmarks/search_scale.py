"""Automatic search at scale: Auto on the 70B-shaped LM step against the expert compositions.

The zoo LM at the "huge" preset's widths (d 8192, 64 heads, ffn 28672, batch 64 x 4096
tokens, bf16 compute with f32 master weights and Adam), from shapes only, on a 2,048 x 4
mesh {data, model}, at several depths. For each depth: the simulated step time and peak
memory per device (H100 preset) of the expert compositions (BP+MP+Z3 and its variants), and
of ``Auto(("data", "model"), memory_limit=<the H100's memory>)`` deciding both axes from
nothing (never seeded with the experts' plans) within ``--seconds``, with its wall time (the
search and the replay of its decisions) and its evaluations.

The batch of 64 does not divide 2,048 ways, so BP("data") alone tiles nothing here: the
experts split the data inputs on their sequence dim (``BP("data", dim=1)``), as a user must.

``--remat`` recomputes each block in the backward pass (``jax.checkpoint``), as 70B models
are trained: without it, no plan of the 80-layer step fits an H100.

Target (issue "Auto at scale"): at 80 layers, within 120 s, a plan that fits whose step
time is within 10% of the best expert composition's.

    python benchmarks/search_scale.py [--layers 8 16 24 80] [--seconds 120]
"""

import argparse
import time

import _common

import workbench as wb
from workbench.core import hardware as hw
from workbench.core.units import format_bytes, format_seconds
from workbench.models import build, lm

MESH = {"data": 2048, "model": 4}


def experts(batch: int) -> dict[str, list]:
    # the batch when it divides 2,048 ways, else the sequence
    bp = wb.BP("data") if batch % MESH["data"] == 0 else wb.BP("data", dim=1)
    return {
        "BP+MP+Z3": [bp, wb.MP("model"), wb.Z3("data")],
        "BP+MP+Z3+SP": [bp, wb.MP("model"), wb.Z3("data"), wb.SP("model")],
        "BP+MP+Z3+EMB": [bp, wb.MP("model"), wb.Z3("data"), wb.EMB("model")],
        "BP+MP+Z2": [bp, wb.MP("model"), wb.Z2("data")],
        "BP+MP": [bp, wb.MP("model")],
        "BP+Z3": [bp, wb.Z3("data")],
    }


def cell(e) -> str:
    return f"{format_seconds(e.step_s)}/{format_bytes(e.memory.peak)}"


def one(layers: int, seconds: float, batch: int, remat: bool = False) -> list:
    config = lm.Config.preset("huge", n_layers=layers, batch=batch, remat=remat)
    ex = build("lm", config, abstract=True)
    program = wb.capture(ex.fn, *ex.args)
    mesh = wb.Mesh(MESH)
    limit = hw.H100.memory_bytes
    results = {
        name: wb.Session(program, mesh, schedule).estimate(hw.H100)
        for name, schedule in experts(batch).items()
    }
    fitting = {n: e for n, e in results.items() if e.memory.peak <= limit}
    best_name = min(fitting or results, key=lambda n: results[n].step_s)
    progress = []
    auto = wb.Auto(
        ("data", "model"),
        memory_limit=limit,
        budget=10**9,
        seconds=seconds,
        callback=progress.append,
    )
    t0 = time.perf_counter()
    session = wb.Session(program, mesh, [auto])
    searched = time.perf_counter() - t0
    e = session.estimate(hw.H100)
    best = results[best_name]
    return [
        layers,
        ", ".join(f"{n} {cell(x)}" for n, x in results.items()),
        f"{best_name}{'' if fitting else ' (none fits)'}",
        cell(e) + ("" if e.memory.peak <= limit else " (does not fit)"),
        f"{e.step_s / best.step_s:.3f}",
        f"{e.memory.peak / best.memory.peak:.3f}",
        f"{searched:.0f}",
        progress[-1].evaluations if progress else 0,
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[8, 16, 24, 80])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--batch", type=int, default=64, help="sequences of 4,096 tokens")
    parser.add_argument(
        "--remat", action="store_true", help="the step recomputes each block in the backward pass"
    )
    args = parser.parse_args()
    rows = []
    for layers in args.layers:
        rows.append(one(layers, args.seconds, args.batch, args.remat))
        print(f"measured {layers} layers", flush=True)
    print(
        f"\n70B-shaped LM{' with remat' if args.remat else ''} on {MESH}, {args.batch} "
        f"sequences, H100 preset (memory limit "
        f"{format_bytes(hw.H100.memory_bytes)}); {_common.machine()}\n"
    )
    print(
        _common.table(
            [
                "layers",
                "experts: step / peak memory",
                "best expert",
                "Auto",
                "Auto / best: step",
                "peak",
                "search s",
                "evaluations",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
