"""Bytes moved per collective kind: our explicit lowering against XLA, for the same shardings.

For each zoo model and named strategy on a 2x4 mesh of virtual CPU devices, three
compiled programs are read back from their HLO: our explicit lowering (what our plan
says); XLA compiling our constrained lowering (every decided value constrained); and XLA
propagating from the input shardings alone. Bytes are per device as executed (a
collective in a loop body counts once per iteration); the ratio compares the bytes each
device sends (ring algorithms: an all-reduce sends twice its buffer). Target: ours moves
no more bytes than XLA's own propagation in any case.

    python benchmarks/xla_crosscheck.py [--size tiny|small]
"""

import argparse
import sys
from pathlib import Path

import _common

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import workbench as wb
from tests.core.lowering.strategies import CASES, strategies
from workbench.core.xla.crosscheck import (
    compiled_collectives,
    crosscheck,
    executed_bytes,
    executed_wire_bytes,
)
from workbench.models import build

MESH = wb.Mesh({"batch": 2, "model": 4})
SHORT = {
    "all-gather": "AG",
    "reduce-scatter": "RS",
    "all-reduce": "AR",
    "all-to-all": "A2A",
    "collective-permute": "CP",
}


def fmt(by_kind: dict) -> str:
    parts = [
        f"{SHORT[k]} {v / 1024:.0f}K" if v >= 1024 else f"{SHORT[k]} {v}"
        for k, v in by_kind.items()
        if v
    ]
    return ", ".join(parts) or "none"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small")
    args = parser.parse_args()
    rows, wins, losses = [], 0, 0
    programs = {}
    for model, strategy in CASES:
        if model not in programs:
            ex = build(model, args.size, abstract=True)
            programs[model] = wb.capture(ex.fn, *ex.args)
        s = wb.Session(programs[model], MESH, strategies(model)[strategy])
        check = crosscheck(s)
        constrained = executed_bytes(compiled_collectives(s, "constrained"))
        xla_collectives = compiled_collectives(s, "propagated")
        propagated = executed_bytes(xla_collectives)
        ours = executed_wire_bytes(s.collectives(), MESH)
        xla = executed_wire_bytes(xla_collectives, MESH)
        wins += ours < xla
        losses += ours > xla
        rows.append(
            [
                model,
                strategy,
                fmt(check.ours),
                "yes" if check.identical else "NO",
                fmt(constrained),
                fmt(propagated),
                f"{ours / xla:.2f}" if xla else ("-" if not ours else "inf"),
            ]
        )
        print(f"measured {model} {strategy}", flush=True)
    print(f"\nZoo models ({args.size}) on {MESH}, {_common.machine()}; bytes per device per kind\n")
    print(
        _common.table(
            [
                "model",
                "strategy",
                "ours (explicit)",
                "HLO = plan",
                "XLA, constrained",
                "XLA, inputs only",
                "sent: ours / XLA",
            ],
            rows,
        )
    )
    print(f"\nours moves fewer bytes than XLA's propagation in {wins} cases, more in {losses}")


if __name__ == "__main__":
    main()
