"""Anatomy cost: reading a program's roles beside capturing it.

For the zoo LM at the "huge" preset's widths (d 8192, 64 heads, ffn 28672, bf16 with f32
master weights and Adam: a 70B-class training step, planned from shapes only) at 8 and 80
layers, and the same step under `scan`: the median of 3 captures, and of 3 anatomies of
fresh captures (dimension classes and roles; then the layers: projections, attention,
blocks; then the block interiors SP reads). Each program is captured afresh, so nothing is
cached between rounds.

Target (issue "Your model, not ours"): the anatomy of the 80-layer step costs under a
quarter of its capture time.

    python benchmarks/anatomy.py
"""

import statistics
import time

import _common

import workbench as wb
from workbench.core.anatomy.blocks import block_interior
from workbench.models import build, lm


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def row(model: str, layers: int, repeats: int = 3):
    ex = build(model, lm.Config.preset("huge", n_layers=layers), abstract=True)
    captures, roles, found, interiors = [], [], [], []
    for _ in range(repeats):
        t, program = timed(lambda: wb.capture(ex.fn, *ex.args))
        captures.append(t)
        t, anatomy = timed(program.anatomy)
        roles.append(t)
        t, _ = timed(lambda: anatomy.layers)  # noqa: B023
        found.append(t)
        t, _ = timed(lambda: block_interior(anatomy))  # noqa: B023
        interiors.append(t)
    med = statistics.median
    total = med(roles) + med(found) + med(interiors)
    return [
        model,
        layers,
        len(program.ops),
        f"{med(captures):.2f}",
        f"{med(roles):.3f}",
        f"{med(found):.3f}",
        f"{med(interiors):.3f}",
        f"{total / med(captures):.2f}",
        f"{1e6 * total / len(program.ops):.0f}",
    ]


def main():
    rows = [row(m, n) for m, n in (("lm", 8), ("lm", 80), ("lm_scan", 8), ("lm_scan", 80))]
    print(_common.machine())
    print(
        _common.table(
            [
                "model",
                "layers",
                "ops",
                "capture s",
                "roles s",
                "layers s",
                "interiors s",
                "anatomy / capture",
                "µs per op",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
