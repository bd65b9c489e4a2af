"""The ``workbench`` command: apply a strategy to a zoo model and print what it costs.

    workbench plan --model lm:tiny --strategy examples/strategies/lm_bp_mp.json
    workbench plan --model lm:small --mesh batch=2,model=4 --strategy strategy.json \\
        --hardware h100 --overlap 0.5 --top 10
    workbench plan --model lm:tiny --mesh batch=2,model=4 --tactics "BP('batch')" "MP('model')"
    workbench plan --model lm:tiny --strategy strategy.json --json     # one JSON object
    workbench sweep --model lm_scan:huge --hardware H100,A100 --chips 64,256  # cli_sweep.py
    workbench models       # the zoo's models and presets; hardware: the presets

``plan`` builds the model from shapes alone (nothing is allocated, so large presets plan on
a laptop), captures it, applies the schedule and prints the simulator's estimate of one
step per device (time by compute and collective kind, peak memory against capacity) and
the ``--top`` costliest collectives (0: all; ``--json``: every one). ``--strategy`` reads a
JSON strategy as ``Session.save`` writes it, which names its mesh (``--mesh``, if given,
must agree); ``--tactics`` are calls with literal arguments, parsed, never evaluated
(neither: the program unpartitioned on ``--mesh``). Both are data: the loader builds
tactics from the registered classes and executes nothing. ``--hardware`` is a preset,
case-insensitive (default: the host CPU placeholder); ``--overlap`` is none, full,
prefetch (weights' gathers, gradients' reductions) or the fraction hidden behind compute.

Bad input prints what was wrong to stderr and exits with status 2 (a strategy file is
checked by ``io.schema`` before the model is built); a bug prints one line and exits 1
(``WORKBENCH_TRACEBACK=1``: the traceback). Planning needs no accelerator: unless
``JAX_PLATFORMS`` is set, JAX runs on the CPU.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
from dataclasses import fields, replace

from workbench import cli_sweep
from workbench.cli_text import FUSED_HELP, UsageError, table

USAGE_ERROR = 2
INTERNAL_ERROR = 1
INTERRUPTED = 130


# -- parsing the arguments ---------------------------------------------------------------------
def parse_mesh(text: str) -> dict[str, int]:
    """``"batch=2,model=4"`` -> ``{"batch": 2, "model": 4}``."""
    from workbench.core.errors import MeshError
    from workbench.core.layout.mesh import Mesh

    axes: dict[str, int] = {}
    for part in text.split(","):
        name, eq, size = (s.strip() for s in part.partition("="))
        if not (eq and name and re.fullmatch(r"\d+", size)):
            raise UsageError(
                f"--mesh {text!r}: {part.strip()!r} is not AXIS=SIZE; "
                "write the axes major to minor, e.g. --mesh batch=2,model=4."
            )
        if name in axes:
            raise UsageError(f"--mesh {text!r}: axis {name!r} appears twice.")
        axes[name] = int(size)
    try:
        Mesh(axes)
    except MeshError as err:
        raise UsageError(f"--mesh {text!r}: {err}") from err
    return axes


def parse_overlap(text: str) -> str | float:
    from workbench.core.estimate.overlap import OVERLAPS

    if text in OVERLAPS:
        return text
    try:
        fraction = float(text)
    except ValueError:
        fraction = -1.0
    if not 0.0 <= fraction <= 1.0:
        raise UsageError(
            f"--overlap {text!r}: use 'none', 'full', 'prefetch' or the fraction of communication "
            "hidden behind compute, a number from 0 to 1 (e.g. 0.5)."
        )
    return fraction


def _literal(node: ast.expr):
    """A literal argument as strategy-file data (tuples become lists)."""

    def plain(value):
        if isinstance(value, tuple | list):
            return [plain(v) for v in value]
        return value

    return plain(ast.literal_eval(node))


def parse_tactic(text: str, classes: dict[str, type]) -> dict:
    """``"MP('model', hidden='params/layers/0/w')"`` -> its strategy-file entry, ``{"tactic":
    "MP", "axis": "model", "hidden": ...}``; nothing is evaluated."""
    example = "write e.g. \"BP('batch')\" or \"Tile('params/**/w_in', -1, 'model')\""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        node = None
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        raise UsageError(f"--tactics {text!r} is not a tactic call; {example}.")
    name = node.func.id
    if name not in classes:
        raise UsageError(
            f"--tactics {text!r} names no known tactic {name!r}; known tactics are "
            f"{', '.join(sorted(classes))}."
        )
    allowed = [f.name for f in fields(classes[name]) if f.init and not f.name.startswith("_")]
    if len(node.args) > len(allowed):
        raise UsageError(
            f"--tactics {text!r}: {name} takes at most {len(allowed)} arguments "
            f"({', '.join(allowed)}); got {len(node.args)}."
        )
    entry = {"tactic": name}
    try:
        for field_name, arg in zip(allowed, node.args):
            entry[field_name] = _literal(arg)
        for kw in node.keywords:
            if kw.arg not in allowed:
                raise UsageError(
                    f"--tactics {text!r}: {name} has no field {kw.arg!r}; "
                    f"it takes {', '.join(allowed)}."
                )
            if kw.arg in entry:
                raise UsageError(f"--tactics {text!r}: {name} gets {kw.arg!r} twice.")
            entry[kw.arg] = _literal(kw.value)
    except ValueError as err:
        raise UsageError(
            f"--tactics {text!r}: arguments must be literals (strings, numbers, lists); {example}."
        ) from err
    return entry


def parse_tactics(texts: list[str], mesh: dict[str, int]) -> list:
    """The tactics ``--tactics`` writes as calls, checked by the loader of strategy files (the
    same fixed table of classes), whose messages name ``--tactics`` and the tactic's place."""
    from workbench.core.io import schema

    classes = schema.tactic_classes()
    schedule = [parse_tactic(text, classes) for text in texts]
    data = {"format": schema.FORMAT, "version": schema.VERSION, "mesh": mesh}
    return schema.tactics_from_data({**data, "schedule": schedule}, source="--tactics")[1]


def read_strategy(path: str):
    """``(mesh dict, tactics)`` of a strategy file, with the loader ``Session.load`` uses
    (``io.schema``): its errors say what is wrong with the file."""
    from workbench.core.io.export import read

    mesh, tactics = read(path, source=f"--strategy {path!r}")
    return mesh.shape, tactics


def find_hardware(name: str):
    """The preset ``--hardware`` names (``hardware.resolve``: case-insensitive)."""
    from workbench.core.hardware import resolve

    return resolve(name, what="--hardware")


def build_model(spec: str):
    """``"lm:small"`` -> the zoo example at that preset, built from shapes alone."""
    from workbench.models import ConfigError, build

    name, _, preset = spec.partition(":")
    try:
        return build(name.strip(), preset.strip() or "tiny", abstract=True)
    except ConfigError as err:
        raise UsageError(f"--model {spec!r}: {err} (`workbench models` lists them)") from err


# -- plan ---------------------------------------------------------------------------------------
def make_session(args):
    """The session ``plan`` prints, and the example it was built from."""
    import workbench as wb
    from workbench.core.errors import WorkbenchError

    mesh = parse_mesh(args.mesh) if args.mesh is not None else None
    if args.strategy is not None:
        file_mesh, tactics = read_strategy(args.strategy)
        if mesh is not None and list(mesh.items()) != list(file_mesh.items()):
            raise UsageError(
                f"--mesh {args.mesh!r} disagrees with the mesh of {args.strategy!r}, "
                f"{','.join(f'{k}={v}' for k, v in file_mesh.items())}; drop --mesh to use "
                "the file's mesh, or save the strategy on the mesh you want."
            )
        mesh = file_mesh
    elif mesh is None:
        raise UsageError(
            "plan needs a mesh: pass --mesh (e.g. --mesh batch=2,model=4), or a --strategy "
            "file, which names its mesh."
        )
    else:
        tactics = parse_tactics(args.tactics or [], mesh)
    ex = build_model(args.model)
    program = wb.capture(ex.fn, *ex.args)
    where = f"--strategy {args.strategy!r}" if args.strategy is not None else "--tactics"
    try:
        return wb.Session(program, mesh, tactics), ex
    except WorkbenchError as err:
        raise UsageError(f"{where} on {args.model}: {err}") from err
    except (TypeError, ValueError, AttributeError) as err:  # a field the loader passed as data
        raise UsageError(
            f"{where} on {args.model}: applying it failed ({type(err).__name__}: {err}); "
            "check its tactics' fields against those Session.save writes."
        ) from err


def collective_rows(session, est) -> list[dict]:
    """The collective plan as rows (``core.plan.rows``), with each collective's time per step."""
    from workbench.core.plan.rows import collective_rows as rows

    timed = [(ce.collective, ce.seconds) for ce in est.collectives]
    return rows(timed, session.program, session.history)


def plan_json(args, session, ex, est) -> dict:
    m = est.memory
    return {
        "model": args.model,
        "params": ex.n_params,
        "mesh": session.mesh.shape,
        "schedule": [str(t) for t in session.history],
        "hardware": est.hardware,
        "overlap": est.overlap,
        "fused_attention": args.fused_attention,
        "estimate": {
            "step_s": est.step_s,
            "compute_s": est.compute_s,
            "communication_s": est.communication_s,
            "by_kind": dict(est.by_kind),
            "flops": est.flops,
            **({"breakdown": breakdown_json(est.breakdown)} if est.breakdown else {}),
            "note": est.note,  # how it was priced, where a reader must know ("" if nothing)
            # under --expert-load: per MoE layer its capacity, drops and busiest device
            **(
                {"experts": [{f.name: getattr(r, f.name) for f in fields(r)} for r in est.experts]}
                if est.experts
                else {}
            ),
            "memory": {
                "peak": m.peak,
                "capacity": m.capacity,
                "fits": m.fits,
                "at_peak": dict(m.at_peak),
                "arguments": m.arguments,
                "outputs": m.outputs,
                "temporaries": m.temporaries,
                "states": dict(m.states),
            },
        },
        "collectives": collective_rows(session, est),
        "conflicts": [str(c) for c in session.conflicts],
    }


def breakdown_json(b) -> dict:
    """The estimate's breakdown as plain numbers: MFU, HFU, and seconds by part."""
    return {"mfu": b.mfu, "hfu": b.hfu, "model_flops": b.model_flops,
            "peak_flops": b.peak_flops, "seconds": dict(b.rows())}  # fmt: skip


def _label(label: str, value: str) -> list[str]:
    return [f"{label:<22}{value}"]


def plan_text(args, session, ex, est) -> list[str]:
    from workbench.core.units import format_bytes, format_seconds

    mesh = session.mesh
    m = est.memory
    schedule = ", ".join(str(t) for t in session.history) or "(none: everything replicated)"
    out = [
        f"model     {args.model} ({ex.description}), {ex.n_params:,} parameters",
        f"mesh      {', '.join(f'{k}={v}' for k, v in mesh.axes)} ({mesh.size} devices)",
        f"schedule  {schedule}",
        f"hardware  {est.hardware}, overlap {est.overlap}"
        + (", attention fused" if args.fused_attention else ""),
        *([f"note      {est.note}"] if est.note else []),
        *([f"experts   {est.moe}"] if est.experts else []),
        "",
        *_label("step time", format_seconds(est.step_s)),
        *_label("  compute", f"{format_seconds(est.compute_s)} ({est.flops:.3g} FLOP per device)"),
        *_label("  communication", format_seconds(est.communication_s)),
    ]
    b = est.breakdown
    if b is not None:
        out = out[:-3] + _label("MFU", f"{b.mfu:.1%} (HFU {b.hfu:.1%})") + out[-3:]
    rows = collective_rows(session, est)
    for kind, seconds in est.by_kind.items():
        n = sum(r["count"] for r in rows if r["kind"] == kind)
        if seconds or n:
            out += _label(f"    {kind}", f"{format_seconds(seconds)} ({n} per step)")
    if b is not None:
        out += _label("where it goes", "")
        out += [f"  {what:<28}{format_seconds(t)} ({t / (b.step_s or 1):.0%} of the step)"
                for what, t in b.rows()]  # fmt: skip
    verdict = "fits" if m.fits else "DOES NOT FIT"
    peak = f"peak {format_bytes(m.peak)} of {format_bytes(m.capacity)} per device: {verdict}"
    out += _label("memory", peak)
    for k, v in m.at_peak.items():
        if v:
            out += _label(f"  {k}", format_bytes(v))
    conflicts = session.conflicts
    for c in conflicts[:3]:
        out += ["", *str(c).splitlines()]
    if len(conflicts) > 3:
        out += ["", f"... and {len(conflicts) - 3} more conflicts (--json lists them all)"]

    moved = sum(r["bytes"] * r["count"] for r in rows)
    out += ["", f"{len(rows)} collectives, {format_bytes(moved)} per device per step"]
    shown = rows
    if args.top and len(rows) > args.top:
        costliest = sorted(rows, key=lambda r: r["seconds"], reverse=True)[: args.top]
        shown = sorted(costliest, key=lambda r: r["index"])
        out[-1] += f"; the {args.top} costliest (--top 0 lists all):"
    if shown:
        head = ["#", "kind", "value", "axes", "bytes", "count", "time", "tactic", "why"]
        cells = [
            [
                str(r["index"]),
                r["kind"],
                r["value"],
                ",".join(r["axes"]),
                format_bytes(r["bytes"]),
                str(r["count"]),
                format_seconds(r["seconds"]),
                r["tactic"],
                r["why"],
            ]
            for r in shown
        ]
        out += table([head, *cells], right={0, 4, 5, 6})
    return out


def parse_expert_load(text: str | None):
    """``--expert-load``: a skew (``2``) or relative loads, one per expert (``2,1,1,1``)."""
    if text is None:
        return None
    try:
        loads = [float(x) for x in text.split(",")]
    except ValueError:
        raise UsageError(
            f"--expert-load {text!r}: give a skew >= 1 (e.g. 2: the busiest expert's tokens "
            "over the mean) or relative loads, one per expert, joined by commas (e.g. 2,1,1,1)."
        ) from None
    return loads[0] if len(loads) == 1 else loads


def cmd_plan(args) -> int:
    hardware = find_hardware(args.hardware) if args.hardware else None
    if args.fused_attention:
        hardware = replace(
            find_hardware("cpu") if hardware is None else hardware, fused_attention=True
        )
    overlap = parse_overlap(args.overlap)
    if args.top < 0:
        raise UsageError(f"--top {args.top}: give a number of collectives, or 0 to list all.")
    load = parse_expert_load(args.expert_load)
    session, ex = make_session(args)
    est = session.estimate(hardware, overlap=overlap, expert_load=load)
    if args.json:
        print(json.dumps(plan_json(args, session, ex, est), indent=2))
    else:
        print("\n".join(plan_text(args, session, ex, est)))
    return 0


# -- listings -----------------------------------------------------------------------------------
def cmd_models(args) -> int:
    from workbench.models import ZOO, build

    rows = [["--model", "parameters", "description"]]
    for name, model in ZOO.items():
        for preset in model.config_cls.PRESETS:
            n = build(name, preset, abstract=True).n_params
            rows.append([f"{name}:{preset}", f"{n:,}", model.description])
    print("\n".join(table(rows, right={1})))
    return 0


def cmd_hardware(args) -> int:
    from workbench.core.units import format_bytes

    def rate(hw, dtype):
        return f"{hw.flops[dtype] / 1e12:g}" if dtype in hw.flops else "-"

    rows = [["--hardware", "name", "bf16 TFLOP/s", "f32 TFLOP/s", "HBM", "memory", "links"]]
    notes = []
    from workbench.core.hardware import preset_table

    for full, (hw, short) in preset_table().items():
        links = "; ".join(
            f"{x.name} {x.bandwidth / 1e9:g} GB/s {x.latency * 1e6:g} us" for x in hw.links
        )
        rows.append(
            [
                ", ".join(short) or full,
                full,
                rate(hw, "bfloat16"),
                rate(hw, "float32"),
                f"{hw.hbm_bandwidth / 1e12:g} TB/s",
                format_bytes(hw.memory_bytes),
                f"{links} ({hw.devices_per_node} devices/node)",
            ]
        )
        if hw.notes:
            notes.append(f"{full}: {hw.notes}")
    print("\n".join(table(rows, right={2, 3, 4, 5})))
    print("\nLink bandwidth is per device, one direction; names are case-insensitive.")
    print("\n".join(notes))
    return 0


# -- entry point --------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="workbench",
        description="Plan the partitioning of a zoo model and print its estimated cost.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="{plan,sweep,models,hardware}")
    plan = sub.add_parser("plan", help="estimate a strategy on a zoo model")
    plan.add_argument("--model", required=True, help="NAME[:PRESET], e.g. lm:tiny")
    plan.add_argument("--mesh", help="AXIS=SIZE,... e.g. batch=2,model=4")
    how = plan.add_mutually_exclusive_group()
    how.add_argument("--strategy", metavar="FILE", help="a JSON strategy (Session.save)")
    how.add_argument("--tactics", nargs="+", metavar="EXPR", help="e.g. \"BP('batch')\"")
    plan.add_argument("--hardware", help="a preset from `workbench hardware` (default: cpu)")
    plan.add_argument(
        "--overlap", default="none", help="none, full, prefetch or a fraction (0 to 1)"
    )
    plan.add_argument(
        "--expert-load", help="MoE routing load: a skew >= 1 (e.g. 2) or loads, e.g. 2,1,1,1"
    )
    plan.add_argument("--fused-attention", action="store_true", help=FUSED_HELP)
    plan.add_argument("--top", type=int, default=20, help="collectives listed (0: all)")
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    plan.set_defaults(run=cmd_plan)
    cli_sweep.add_parser(sub)
    sub.add_parser("models", help="list the zoo's models and presets").set_defaults(run=cmd_models)
    sub.add_parser("hardware", help="list the hardware presets").set_defaults(run=cmd_hardware)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as done:  # --help, or argparse's own usage error (status 2)
        return int(done.code or 0)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # planning needs no accelerator
    from workbench.core.errors import WorkbenchError

    try:
        return args.run(args)
    except (UsageError, WorkbenchError) as err:
        print(f"workbench {args.command}: error: {err}", file=sys.stderr)
        return USAGE_ERROR
    except BrokenPipeError:  # the reader stopped early (`| head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"workbench {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except Exception as err:  # a bug, not bad input: one line, no traceback
        if os.environ.get("WORKBENCH_TRACEBACK"):
            raise
        print(
            f"workbench {args.command}: internal error: {type(err).__name__}: {err}\n"
            "This is a bug in workbench: please report it with the command line "
            "(WORKBENCH_TRACEBACK=1 shows where it happened).",
            file=sys.stderr,
        )
        return INTERNAL_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
