"""Where a layer stack's collectives run, unrolled and under ``lax.scan``: ours against XLA.

The zoo LM ("small" widths) unrolled and under ``lax.scan`` over its layers, under Z3 and
BP+MP+Z3 on a {batch: 2, model: 4} mesh of 8 virtual CPU devices: the collectives each step
launches, by kind, for our plan (what the estimate prices), for what XLA compiles of its
explicit lowering, for XLA compiling our constrained lowering (every value constrained as
the plan decides) and for XLA propagating from the input shardings alone. *loop* counts the
launches inside a loop body (once per iteration), *out* those outside; a combined
instruction (XLA's combiners) is one launch. Each launch pays a collective's latency,
which over a data axis of thousands of ranks is milliseconds: this is what separates the
two forms' estimates (issue "Plans at the scale people train", item 7).

    python benchmarks/loop_collectives.py [--layers 8]
"""

import argparse
import sys
from collections import Counter
from pathlib import Path

import _common

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import workbench as wb
from tests.core.lowering.strategies import strategies
from workbench.core.xla.crosscheck import compiled_collectives
from workbench.models import build, lm

MESH = wb.Mesh({"batch": 2, "model": 4})
KINDS = (("all-gather", "AG"), ("reduce-scatter", "RS"), ("all-reduce", "AR"))


def launches(collectives) -> tuple[Counter, Counter]:
    """Launches per step by kind, inside loops (each runs ``count`` times) and outside."""
    inside, outside = Counter(), Counter()
    for c in collectives:
        (inside if c.count > 1 else outside)[c.kind] += c.count
    return inside, outside


def compiled(session, lowering: str) -> tuple[Counter, Counter]:
    """The same for what XLA compiles: one launch per instruction (a combined one holds
    several arrays), times the trip counts of the loops around it."""
    hlo = compiled_collectives(session, lowering)
    return launches({(c.computation, c.line): c for c in hlo}.values())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    rows = []
    for model, form in (("lm", "unrolled"), ("lm_scan", "scan")):
        ex = build(model, lm.Config.preset("small", n_layers=args.layers), abstract=True)
        program = wb.capture(ex.fn, *ex.args)
        for strategy in ("Z3", "BP+MP+Z3"):
            s = wb.Session(program, MESH, strategies(model)[strategy])
            for lowering, (inside, outside) in (
                ("ours: the plan", launches(s.collectives())),
                ("ours: compiled", compiled(s, "explicit")),
                ("XLA, constrained", compiled(s, "constrained")),
                ("XLA, inputs only", compiled(s, "propagated")),
            ):
                other = sum((inside + outside).values()) - sum(
                    inside[k] + outside[k] for k, _ in KINDS
                )
                rows.append(
                    [form, strategy, lowering]
                    + [f"{inside[k]} / {outside[k]}" for k, _ in KINDS]
                    + [str(other)]
                )
            print(f"measured {form} {strategy}", flush=True)
    print(
        f"\nThe zoo LM (small, {args.layers} layers) on {MESH}, {_common.machine()}; "
        "launches per step, in loop / out of loop\n"
    )
    print(
        _common.table(
            [
                "form",
                "strategy",
                "lowering",
                *[f"{short} loop / out" for _, short in KINDS],
                "other kinds",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
