"""Simulator memory against XLA: temporaries per device, zoo models x strategies.

For each zoo model and strategy the simulator's temporaries (the peak of everything but
inputs and returned outputs) beside XLA's ``memory_analysis().temp_size_in_bytes`` for
the explicit lowering of the same plan on 8 virtual CPU devices, compiled twice: as is,
and with the inputs donated that the simulator assumes a training loop donates (outputs
written over the parameters and optimizer state they replace). Argument and output bytes
are equal by construction (tested); temporaries are where buffer assignment differs.
Target: within 25%.

    python benchmarks/memory.py [--sizes tiny small]
"""

import argparse
import statistics
import sys
from pathlib import Path

import _common

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import workbench as wb
from tests.core.lowering.strategies import strategies
from workbench.core import hardware as hw
from workbench.core.crosscheck import abstract_inputs
from workbench.core.lowering.explicit import lower_explicit
from workbench.core.simulator import donations
from workbench.models import build

MESH = wb.Mesh({"batch": 2, "model": 4})
MODELS = ("mlp", "lm", "lm_scan", "cnn", "gnn")
STRATEGIES = ("none", "BP", "MP", "BP+MP", "Z3", "BP+MP+Z3")


def xla_temporaries(s: wb.Session, *, donate: bool) -> int:
    donated = sorted(donations(s.program, s.state).values()) if donate else ()
    fn, jmesh = lower_explicit(s.program, s.mesh, s.state, s.plan(), donate=donated)
    return fn.lower(*abstract_inputs(s, jmesh)).compile().memory_analysis().temp_size_in_bytes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    args = parser.parse_args()
    rows, ratios = [], {False: [], True: []}
    for model in MODELS:
        for size in args.sizes:
            ex = build(model, size, abstract=True)
            program = wb.capture(ex.fn, *ex.args)
            for name in STRATEGIES:
                schedule = [] if name == "none" else strategies(model)[name]
                s = wb.Session(program, MESH, schedule)
                ours = s.estimate(hw.CPU).memory.temporaries
                row = [f"{model}:{size}", name, f"{ours / 2**20:.2f}"]
                for donate in (False, True):
                    xla = xla_temporaries(s, donate=donate)
                    ratio = ours / xla if xla else float("inf")
                    ratios[donate].append(ratio)
                    row += [f"{xla / 2**20:.2f}", f"{ratio:.2f}"]
                rows.append(row)
                print(" | ".join(row), flush=True)
    print(f"\nMeasured on {_common.machine()}, mesh {MESH}\n")
    headers = ["model", "strategy", "ours MiB", "XLA MiB", "ours / XLA"]
    headers += ["XLA donated MiB", "ours / XLA donated"]
    print(_common.table(headers, rows))
    for donate, rs in ratios.items():
        within = sum(0.75 <= r <= 1.25 for r in rs)
        print(
            f"\n{'donated' if donate else 'as is'}: within 25% in {within} of {len(rs)} cases; "
            f"median ratio {statistics.median(rs):.2f}, range {min(rs):.2f}-{max(rs):.2f}"
        )


if __name__ == "__main__":
    main()
