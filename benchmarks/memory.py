"""Simulator memory against XLA: temporaries per device, zoo models x strategies.

For each zoo model and strategy the simulator's temporaries (the peak of everything but
inputs and returned outputs) beside XLA's ``memory_analysis().temp_size_in_bytes`` for
the explicit lowering of the same plan on 8 virtual CPU devices, compiled twice: as is,
and with the inputs donated that the simulator assumes a training loop donates (outputs
written over the parameters and optimizer state they replace); and the simulator's peak
beside the donated compile's (arguments + outputs - aliased + temporaries). Argument and
output bytes are equal by construction (tested); temporaries are where buffer assignment
differs. Target: within 25%.

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
from workbench.core.xla.crosscheck import compiled_memory
from workbench.models import build

MESH = wb.Mesh({"batch": 2, "model": 4})
MODELS = ("mlp", "lm", "lm_scan", "cnn", "gnn")
STRATEGIES = ("none", "BP", "MP", "BP+MP", "Z3", "BP+MP+Z3")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    args = parser.parse_args()
    rows, ratios = [], {False: [], True: [], "peak": []}
    for model in MODELS:
        for size in args.sizes:
            ex = build(model, size, abstract=True)
            program = wb.capture(ex.fn, *ex.args)
            for name in STRATEGIES:
                schedule = [] if name == "none" else strategies(model)[name]
                s = wb.Session(program, MESH, schedule)
                memory = s.estimate(hw.CPU).memory
                ours = memory.temporaries
                row = [f"{model}:{size}", name, f"{ours / 2**20:.2f}"]
                for donate in (False, True):
                    xla, peak = compiled_memory(s, donate=donate)
                    ratio = ours / xla if xla else float("inf")
                    ratios[donate].append(ratio)
                    row += [f"{xla / 2**20:.2f}", f"{ratio:.2f}"]
                ratios["peak"].append(memory.peak / peak)
                row += [f"{memory.peak / peak:.2f}"]
                rows.append(row)
                print(" | ".join(row), flush=True)
    print(f"\nMeasured on {_common.machine()}, mesh {MESH}\n")
    headers = ["model", "strategy", "ours MiB", "XLA MiB", "ours / XLA"]
    headers += ["XLA donated MiB", "ours / XLA donated", "peak: ours / XLA donated"]
    print(_common.table(headers, rows))
    for what, rs in ratios.items():
        within = sum(0.75 <= r <= 1.25 for r in rs)
        label = {False: "temporaries as is", True: "temporaries donated", "peak": "peak donated"}
        print(
            f"\n{label[what]}: within 25% in {within} of {len(rs)} cases; "
            f"median ratio {statistics.median(rs):.2f}, range {min(rs):.2f}-{max(rs):.2f}"
        )


if __name__ == "__main__":
    main()
