"""Propagation speed against XLA's compile, on the LM training step at growing depth.

For 2, 8, 24 and 48 layers (unrolled, and stacked under scan): time to capture; time to
apply and propagate a three-tactic schedule (BP, then Megatron's two tiles); and, in the
same run, the time XLA takes to lower and compile the same step with the same input
shardings on 8 virtual CPU devices. Ratios are compile time over the time of one tactic.

    python benchmarks/propagation.py [--layers 2 8 24 48] [--repeats 3]
"""

import argparse

import _common
import jax
from jax.sharding import NamedSharding

import workbench as wb
from workbench.core.lowering.explicit import jax_mesh, spec
from workbench.core.propagate.propagation import op_index
from workbench.models import build, lm

MESH = wb.Mesh({"batch": 2, "model": 4})
SCHEDULE = [
    wb.Tile("batch/*", 0, "batch"),
    wb.Tile("params/**/mlp/w_in", -1, "model"),
    wb.Tile("params/**/attn/w{q,k,v}", -2, "model"),
]


def measure(model: str, layers: int, repeats: int) -> dict:
    ex = build(model, lm.Config.preset("large", n_layers=layers), abstract=True)
    captured = {}

    def capture():  # with the one-time analysis every later tactic reuses: rules and op index
        captured["p"] = p = wb.capture(ex.fn, *ex.args)
        op_index(p)

    t_capture = _common.median_time(capture, repeats)
    program = captured["p"]

    def propagate():
        captured["s"] = wb.Session(program, MESH, SCHEDULE)

    t_schedule = _common.median_time(propagate, repeats)
    state = captured["s"].state
    jmesh = jax_mesh(MESH)
    shardings = [NamedSharding(jmesh, spec(state.shardings[v])) for v in program.inputs]
    in_shardings = jax.tree_util.tree_unflatten(program.in_tree, shardings)

    def compile_():
        jax.jit(ex.fn, in_shardings=in_shardings).lower(*ex.args).compile()

    t_compile = _common.median_time(compile_, 1)
    return dict(
        model=model,
        layers=layers,
        ops=len(program.ops),
        capture=t_capture,
        schedule=t_schedule,
        tactic=t_schedule / len(SCHEDULE),
        compile=t_compile,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 8, 24, 48])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for model in ("lm", "lm_scan"):
        for layers in args.layers:
            r = measure(model, layers, args.repeats)
            rows.append(
                [
                    r["model"],
                    r["layers"],
                    r["ops"],
                    f"{r['capture']:.2f}",
                    f"{r['schedule']:.3f}",
                    f"{r['tactic'] * 1e3:.1f}",
                    f"{r['tactic'] * 1e6 / r['ops']:.1f}",
                    f"{r['compile']:.2f}",
                    f"{r['compile'] / r['tactic']:.0f}x",
                ]
            )
            print(f"measured {model} at {layers} layers", flush=True)
    print(f"\nLM training step, mesh {MESH}, {_common.machine()}; medians of {args.repeats}\n")
    print(
        _common.table(
            [
                "model",
                "layers",
                "ops",
                "capture s",
                "3 tactics s",
                "per tactic ms",
                "us per op",
                "XLA compile s",
                "compile / tactic",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
