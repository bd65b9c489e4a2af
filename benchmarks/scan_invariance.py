"""The estimate of one step unrolled and under ``lax.scan``: the zoo LM at LLaMA-3-70B's
widths (8 layers, 2,048 sequences on a 2,048 x 4 mesh), per strategy and chip, the step,
its compute and its communication by kind in both forms, and unrolled / scan.

``python benchmarks/scan_invariance.py [--detail]`` (``--detail``: the collectives per kind,
count, bytes and seconds, of each form)."""

from __future__ import annotations

import sys
from collections import defaultdict

import workbench as wb
from workbench.core import hardware as hw
from workbench.models import build, lm

MESH = {"data": 2048, "model": 4}
STRATEGIES = {
    "BP": [wb.BP("data")],
    "BP+MP": [wb.BP("data"), wb.MP("model")],
    "BP+MP+Z2": [wb.BP("data"), wb.MP("model"), wb.Z2("data")],
    "BP+MP+Z3": [wb.BP("data"), wb.MP("model"), wb.Z3("data")],
}
CHIPS = (hw.H100, hw.TPU_V5E)


def programs(layers: int = 8) -> dict[str, wb.Program]:
    out = {}
    for name in ("lm", "lm_scan"):
        ex = build(name, lm.Config.preset("huge", n_layers=layers, batch=2048), abstract=True)
        out[name] = wb.capture(ex.fn, *ex.args)
    return out


def detail(e) -> str:
    rows = defaultdict(lambda: [0, 0.0, 0.0])
    for c in e.collectives:
        r = rows[c.collective.kind, c.collective.axes]
        r[0] += c.collective.count
        r[1] += c.collective.bytes * c.collective.count
        r[2] += c.total_s
    return "\n".join(
        f"    {k[0]:>15} {'x'.join(k[1]):>10} n={n:5d} {b / 2**30:9.2f} GiB {s * 1e3:9.1f} ms"
        for k, (n, b, s) in sorted(rows.items())
    )


def main(show: bool = False) -> None:
    progs = programs()
    print(
        "| strategy | chip | step ms unrolled | step ms scan | compute ratio | comm ratio "
        "| unrolled / scan |\n|---|---|---|---|---|---|---|"
    )
    for sname, tactics in STRATEGIES.items():
        sessions = {n: wb.Session(p, wb.Mesh(MESH), tactics) for n, p in progs.items()}
        for chip in CHIPS:
            u, s = (sessions[n].estimate(chip) for n in ("lm", "lm_scan"))
            print(
                f"| {sname} | {chip.name} | {u.step_s * 1e3:.0f} | {s.step_s * 1e3:.0f} "
                f"| {u.compute_s / s.compute_s:.3f} "
                f"| {u.communication_s / s.communication_s:.3f} | {u.step_s / s.step_s:.3f} |"
            )
            if show:
                for n, e in (("lm", u), ("lm_scan", s)):
                    print(
                        f"  {n}: step {e.step_s * 1e3:.1f} compute {e.compute_s * 1e3:.1f} "
                        f"comm {e.communication_s * 1e3:.1f} ms {dict(e.by_kind)}"
                    )
                    print(detail(e))


if __name__ == "__main__":
    main("--detail" in sys.argv)
