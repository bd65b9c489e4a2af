"""Placements: the ways a mesh's axes lie on the levels of a cluster, ranked by the simulated
step (``Session.placements``), and how long ranking them takes.

A 70B-shaped LM step (zoo ``huge`` preset: d 8192, 64 heads, d_ff 28672, remat, bfloat16
with float32 master weights; abstract inputs) on 2,048 H100 (8 a node on NVLink, nodes on
InfiniBand) under three plans, and the same widths on 2,048 TPU v5p chips (one ICI ring,
and an 8x16x16 slice whose torus dimensions the collectives use). For each plan:
how many placements the mesh has, the seconds to price and rank them all, the fastest and
slowest step and their ratio (the spread P2 measured up to 448x on its GPU clusters,
arXiv 2110.10548; these are simulated), and where the mesh order's placement ranks.

    python benchmarks/placements.py [--layers 80]
"""

import argparse
import time

import _common

import workbench as wb
from workbench.core import hardware as hw
from workbench.core.hardware.placement import row_major
from workbench.core.strategies.pipeline import PP
from workbench.models import build, lm

PLANS = {
    "BP+MP+Z3": ({"data": 512, "model": 4}, lambda: [wb.BP("data"), wb.MP("model"), wb.Z3("data")]),
    "PP8+CP+MP": (
        {"stage": 8, "data": 64, "model": 4},
        lambda: [PP("stage", microbatches=64, schedule="zero-bubble"), wb.CP("data"), wb.MP("model")],
    ),
    "BP+MP": ({"data": 256, "model": 8}, lambda: [wb.BP("data"), wb.MP("model")]),
}  # fmt: skip


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=80)
    args = ap.parse_args()
    t = time.perf_counter()
    config = lm.Config.preset("huge", n_layers=args.layers, batch=512, remat=True)
    ex = build("lm", config, abstract=True)
    program = wb.capture(ex.fn, *ex.args)
    print(f"# {args.layers}-layer 70B-shaped step captured in {time.perf_counter() - t:.1f} s")
    rows = []
    chips = (
        ("H100", hw.H100),
        ("TPU v5p", hw.TPU_V5P),
        ("TPU v5p 8x16x16", hw.TPU_V5P.with_torus((8, 16, 16))),  # the slice's shape known
    )
    for label, chip in chips:
        for name, (axes, plan) in PLANS.items():
            mesh = wb.Mesh(axes)
            s = wb.Session(program, mesh, plan())
            s.plan()
            t = time.perf_counter()
            ranked = s.placements(chip)
            seconds = time.perf_counter() - t
            first = row_major(mesh, chip.links)
            rank = [r.placement for r in ranked].index(first) + 1 if first else "-"
            best, worst = ranked[0].estimate.step_s, ranked[-1].estimate.step_s
            rows.append(
                (label, name, ranked.total, f"{seconds:.2f}", f"{best * 1e3:.0f}",
                 f"{worst * 1e3:.0f}", f"{worst / best:.2f}", rank, str(ranked[0].placement))
            )  # fmt: skip
    print(_common.table(
        ("chip", "plan", "placements", "rank s", "best ms", "worst ms", "worst/best",
         "mesh order's rank", "best placement"),
        rows,
    ))  # fmt: skip


if __name__ == "__main__":
    main()
