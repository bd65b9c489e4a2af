"""Simulator speed: one estimate beside one tactic's propagation, on the LM training step.

For the zoo LM ("large" preset widths) at 2, 8 and 24 layers, unrolled and under `scan`:
the time to apply one tactic (MP after BP) and propagate it, to build the execution plan of
the new state, and to estimate it on the H100 preset, warm (the program's static facts and
op costs cached, as in a search that revisits layouts) and cold (a fresh program). Medians
of 3. Target: an estimate takes well under the time to propagate a tactic.

    python benchmarks/estimate.py
"""

import statistics
import time

import _common

import workbench as wb
from workbench.core import hardware as hw
from workbench.core.plan import build_plan
from workbench.core.simulator import estimate
from workbench.models import build, lm

MESH = wb.Mesh({"batch": 2, "model": 4})


def once(ex) -> tuple[float, float, float, float, int]:
    """Seconds to apply MP after BP, to plan the result, and to estimate it cold and warm,
    on a freshly captured program (nothing cached); and the program's op count."""
    program = wb.capture(ex.fn, *ex.args)
    s = wb.Session(program, MESH, [wb.BP("batch")])
    t0 = time.perf_counter()
    s.apply(wb.MP("model"))
    t1 = time.perf_counter()
    plan = build_plan(program, MESH, s.state)
    t2 = time.perf_counter()
    estimate(program, MESH, s.state, plan, hw.H100)
    t3 = time.perf_counter()
    estimate(program, MESH, s.state, plan, hw.H100)
    t4 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2, t4 - t3, len(program.ops)


def measure(name: str, layers: int) -> list:
    ex = build(name, lm.Config.preset("large", n_layers=layers), abstract=True)
    runs = [once(ex) for _ in range(3)]
    tactic, plan, cold, warm, ops = (statistics.median(x) for x in zip(*runs))
    return [
        name,
        layers,
        ops,
        f"{tactic * 1e3:.0f}",
        f"{plan * 1e3:.0f}",
        f"{cold * 1e3:.0f}",
        f"{warm * 1e3:.0f}",
        f"{(plan + warm) / tactic:.2f}",
    ]


def main():
    rows = [measure(name, n) for name in ("lm", "lm_scan") for n in (2, 8, 24)]
    print(f"\nMeasured on {_common.machine()}, mesh {MESH}, H100 preset; medians of 3\n")
    headers = ["model", "layers", "ops", "tactic ms", "plan ms", "estimate cold ms"]
    headers += ["estimate warm ms", "(plan + warm) / tactic"]
    print(_common.table(headers, rows))


if __name__ == "__main__":
    main()
