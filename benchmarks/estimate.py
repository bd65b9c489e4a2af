"""Simulator speed: planning and estimating a state beside propagating the tactic that made it.

For the zoo LM ("large" preset widths) at 2, 8 and 24 layers, unrolled and under `scan`,
as a session runs it: BP applied and its state estimated (what the workbench shows), then
MP applied (*tactic*: propagation), then the new state planned (*plan*) and estimated on
the H100 preset (*estimate*). Each round captures the program afresh.

- *first*: the process's planner and layout caches emptied before the round, so every op
  layout is planned and priced for the first time;
- *steady*: the median of 3 further rounds, with the layouts the earlier rounds planned
  still cached (as in a session after its first tactics, or a search).

Target: planning plus estimating takes well under the time to propagate a tactic.

    python benchmarks/estimate.py
"""

import statistics
import time

import _common

import workbench as wb
from workbench.core import hardware as hw
from workbench.core.caches import clear_caches
from workbench.models import build, lm

MESH = wb.Mesh({"batch": 2, "model": 4})


def once(ex, *, empty_caches: bool) -> tuple[float, float, float, int]:
    """Seconds to apply MP after BP, to plan the new state and to estimate it; op count."""
    if empty_caches:
        clear_caches()
    program = wb.capture(ex.fn, *ex.args)
    s = wb.Session(program, MESH, [wb.BP("batch")])
    s.estimate(hw.H100)
    t0 = time.perf_counter()
    s.apply(wb.MP("model"))
    t1 = time.perf_counter()
    s.plan()
    t2 = time.perf_counter()
    s.estimate(hw.H100)
    t3 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2, len(program.ops)


def columns(tactic, plan, estimate) -> list[str]:
    ratio = (plan + estimate) / tactic
    return [f"{tactic * 1e3:.0f}", f"{plan * 1e3:.0f}", f"{estimate * 1e3:.0f}", f"{ratio:.2f}"]


def measure(name: str, layers: int) -> list:
    ex = build(name, lm.Config.preset("large", n_layers=layers), abstract=True)
    *first, ops = once(ex, empty_caches=True)
    steady = [
        statistics.median(x) for x in zip(*(once(ex, empty_caches=False)[:3] for _ in range(3)))
    ]
    return [name, layers, ops, *columns(*first), *columns(*steady)]


def main():
    rows = [measure(name, n) for name in ("lm", "lm_scan") for n in (2, 8, 24)]
    print(f"\nMeasured on {_common.machine()}, mesh {MESH}, H100 preset\n")
    headers = ["model", "layers", "ops"]
    for when in ("first", "steady"):
        headers += [f"{when}: tactic ms", "plan ms", "estimate ms", "(plan + estimate) / tactic"]
    print(_common.table(headers, rows))


if __name__ == "__main__":
    main()
