"""``workbench sweep``: what-if questions on a zoo model over clusters and shapes.

    workbench sweep --model lm_scan:huge --hardware H100,A100 --chips 64,128,256 \\
        --shape batch=256,512 --shape seq_len=4096,8192 --stages 1,4 --double seq_len

Prices every plan of the grid (`workbench.core.whatif.sweep`: mesh shapes with a model
axis inside a node, pipeline stages, data parallelism with and without ZeRO-3) from shapes
alone, and prints the answers: the smallest cluster that fits, the best MFU per chip kind
and count, what doubling a shape costs (``--double``), then the Pareto front (no plan both
faster and cheaper in chip-seconds). ``--shape NAME=V1,V2`` varies a field of the model's
config (``workbench models`` lists the presets); ``--json`` prints every point.
"""

from __future__ import annotations

import dataclasses
import json

from workbench.cli_text import FUSED_HELP, UsageError, table


def shapes(given: list[str] | None) -> dict[str, list[int]]:
    from workbench.core.whatif import counts  # core is imported when a command runs

    out: dict[str, list[int]] = {}
    for text in given or []:
        name, eq, values = text.partition("=")
        if not (eq and name.strip().isidentifier()):
            raise UsageError(f"--shape {text!r}: write NAME=V1,V2, e.g. --shape seq_len=4096,8192")
        out[name.strip()] = counts(values, f"--shape {name.strip()}")
    return out


def cmd_sweep(args) -> int:
    from workbench.core.units import format_seconds
    from workbench.core.whatif import counts, sweep
    from workbench.models import ConfigError, build
    from workbench.viz.whatif import answer_rows

    name, _, preset = args.model.partition(":")
    grid = shapes(args.shape)
    if args.double is not None and args.double not in grid:
        raise UsageError(
            f"--double {args.double!r}: it must be one of the --shape names ({', '.join(grid) or 'none given'})."
        )

    def model(**values):
        try:
            ex = build(name.strip(), preset.strip() or "tiny", abstract=True, **values)
        except ConfigError as err:
            raise UsageError(f"--model {args.model!r}: {err}") from err
        return (ex.fn, *ex.args)

    model()  # a bad model or preset is reported before the sweep starts
    from workbench.core.hardware import resolve

    kinds = [resolve(h.strip(), what="--hardware") for h in args.hardware.split(",")]
    if args.fused_attention:
        kinds = [dataclasses.replace(k, fused_attention=True) for k in kinds]
    result = sweep(
        model,
        hardware=kinds,
        chips=counts(args.chips, "--chips"),
        shapes=grid,
        stages=counts(args.stages, "--stages"),
        microbatches=counts(args.microbatches, "--microbatches"),
    )
    if args.json:
        print(json.dumps({"seconds": result.seconds, "points": result.rows()}, indent=2))
        return 0
    priced = [p for p in result.points if p.priced]
    print(
        f"{len(result.points)} plans, {len(priced)} priced ({sum(p.fits for p in priced)} fit) "
        f"in {result.seconds:.1f} s\n"
    )
    for row in answer_rows(result, args.double):
        print(f"{row['question']}: {row['answer']}")
    front = result.pareto()
    print(f"\nPareto front ({len(front)} plans: none both faster and cheaper)\n")
    rows = [["chips", "hardware", "mesh", "shapes", "plan", "step", "MFU", "chip-s"]]
    for p in front[: args.top or None]:
        rows.append(
            [
                str(p.chips),
                p.hardware,
                " x ".join(f"{k}={v}" for k, v in p.mesh),
                ",".join(f"{k}={v}" for k, v in p.shapes) or "-",
                p.plan,
                format_seconds(p.step_s),
                f"{p.mfu:.1%}",
                f"{p.chip_seconds:.4g}",
            ]
        )
    print("\n".join(table(rows, right={0, 5, 6})))
    return 0


def add_parser(sub) -> None:
    s = sub.add_parser("sweep", help="what-if: price a zoo model over clusters and shapes")
    s.add_argument("--model", required=True, help="NAME[:PRESET], e.g. lm_scan:huge")
    s.add_argument("--hardware", required=True, help="presets joined by commas, e.g. H100,A100")
    s.add_argument("--chips", required=True, help="chip counts, e.g. 64,128,256")
    s.add_argument("--shape", action="append", metavar="NAME=V1,V2", help="a config field to vary")
    s.add_argument("--stages", default="1", help="pipeline stages to try, e.g. 1,4 (1: none)")
    s.add_argument("--microbatches", default="4", help="microbatches per step when pipelined")
    s.add_argument("--double", metavar="NAME", help="what the step costs at twice this shape")
    s.add_argument("--fused-attention", action="store_true", help=FUSED_HELP)
    s.add_argument("--top", type=int, default=20, help="Pareto plans listed (0: all)")
    s.add_argument("--json", action="store_true", help="print every point as JSON")
    s.set_defaults(run=cmd_sweep)
