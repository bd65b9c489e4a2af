"""Automatic search against the expert compositions, by the simulator.

For the LM (stacked under scan, mixed precision) at three sizes, on {batch: 2, model: 4} and
on a simulated {batch: 8, model: 16}: the simulated step time and peak memory per device of
BP, BP+MP, BP+Z3 and BP+MP+Z3 beside Auto deciding both axes from nothing, with its search
seconds and evaluations. Hardware: the H100 preset. Target: Auto within 5% of the best
expert composition, or better, in every case, within 60 seconds.

    python benchmarks/search.py [--seconds 60]
"""

import argparse
import time

import _common

import workbench as wb
from workbench.core import hardware as hw
from workbench.core.units import format_bytes, format_seconds
from workbench.models import build, lm

SIZES = {
    "S (d 512)": dict(
        d_model=512, n_heads=16, d_head=32, d_ff=2048, vocab=8192, batch=16, seq_len=512
    ),
    "M (d 1024)": dict(
        d_model=1024, n_heads=16, d_head=64, d_ff=4096, vocab=16384, batch=16, seq_len=1024
    ),
    "L (d 4096)": dict(
        d_model=4096, n_heads=32, d_head=128, d_ff=16384, vocab=32768, batch=32, seq_len=2048
    ),
}
MESHES = [{"batch": 2, "model": 4}, {"batch": 8, "model": 16}]
EXPERTS = {
    "BP": [wb.BP("batch")],
    "BP+MP": [wb.BP("batch"), wb.MP("model")],
    "BP+Z3": [wb.BP("batch"), wb.Z3("batch")],
    "BP+MP+Z3": [wb.BP("batch"), wb.MP("model"), wb.Z3("batch")],
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    rows, worst = [], 0.0
    for size, fields in SIZES.items():
        config = lm.Config(n_layers=8, dtype="bfloat16", master_weights=True, **fields)
        ex = build("lm_scan", config, abstract=True)
        program = wb.capture(ex.fn, *ex.args)
        for axes in MESHES:
            mesh = wb.Mesh(axes)
            results = {}
            for name, schedule in EXPERTS.items():
                e = wb.Session(program, mesh, schedule).estimate(hw.H100)
                results[name] = e
            progress = []
            auto = wb.Auto(
                ("batch", "model"), budget=10**9, seconds=args.seconds, callback=progress.append
            )
            t0 = time.perf_counter()
            session = wb.Session(program, mesh, [auto])
            seconds = time.perf_counter() - t0
            e_auto = session.estimate(hw.H100)
            best_name = min(results, key=lambda n: results[n].step_s)
            ratio = e_auto.step_s / results[best_name].step_s
            worst = max(worst, ratio)
            experts = ", ".join(
                f"{n} {format_seconds(e.step_s)}/{format_bytes(e.memory.peak)}"
                for n, e in results.items()
            )
            rows.append(
                [
                    size,
                    "x".join(str(v) for v in axes.values()),
                    experts,
                    f"{format_seconds(e_auto.step_s)}/{format_bytes(e_auto.memory.peak)}",
                    f"{ratio:.3f} ({best_name})",
                    f"{seconds:.0f}",
                    progress[-1].evaluations if progress else 0,
                ]
            )
            print(f"measured {size} on {axes}", flush=True)
    print(
        f"\nLM (scan, 8 layers, bf16 + fp32 master weights) on the H100 preset; {_common.machine()}\n"
    )
    print(
        _common.table(
            [
                "LM",
                "mesh",
                "experts: step / peak memory",
                "Auto",
                "Auto / best expert",
                "search s",
                "evaluations",
            ],
            rows,
        )
    )
    print(f"\nworst Auto / best expert: {worst:.3f}")


if __name__ == "__main__":
    main()
