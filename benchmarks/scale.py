"""Planning at scale: each step of a session on a 70B-shaped LM step, by depth.

The zoo LM at the "huge" preset's widths (d 8192, 64 heads, ffn 28672, bf16 compute with
f32 master weights and Adam) and 2,048 sequences of 4,096 tokens, planned from shapes only on a 2,048 x 4 mesh, at 8 to 80
layers: capture, then BP, MP, Z3, SP and EMB each applied to the state before it, undo,
redo, jump, the collective plan and the estimate. Each row is the median of ``--repeats``
fresh sessions; the last columns are the time per op of BP+MP+Z3 and the whole plan
(BP+MP+Z3+estimate) against the capture time.

Then a LLaMA-3-405B-shaped step (Hugging Face's Flax LLaMA: 126 layers, d 16,384, ffn
53,248, 128 heads, 8 KV heads, vocab 128,256, 4,096 sequences of 4,096 tokens, AdamW) built
from shapes, captured and planned with BP, MP and Z3 on a 2,048 x 8 mesh and estimated on
H100s, in one fresh process: the whole time and the process's peak memory.

Targets (issue "Plans at the scale people train"): at 80 layers each tactic, history move,
``collectives()`` and ``estimate()`` under 1 s, BP+MP+Z3+estimate under the capture time,
and time per op flat (within 1.5x) across depths; the 405B step under 60 s in all, under
4 GiB.

Then the estimate's linearity: the 70B-shaped step unrolled and under ``lax.scan`` at 8, 32
and 126 layers, BP+MP+Z3 on H100s: step time, time per layer between depths (target: the
same within 5%) and unrolled over scan; and the scan form's whole plan time (target < 2 s).

    python benchmarks/scale.py [--layers 8 16 32 80 126] [--repeats 3] [--no-405b] [--no-linearity] [--linearity-only]
"""

import argparse
import resource
import statistics
import subprocess
import sys
import time
import warnings

import _common

import workbench as wb
from workbench.core import hardware
from workbench.models import build, lm

STEPS = ("BP", "MP", "Z3", "SP", "EMB")
BATCH = 2048  # sequences of 4,096 tokens: 8M tokens a step, one sequence per data-parallel rank


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def one(layers: int) -> dict[str, float]:
    ex = build("lm", lm.Config.preset("huge", n_layers=layers, batch=BATCH), abstract=True)
    out = {}
    program = None

    def capture():
        nonlocal program
        program = wb.capture(ex.fn, *ex.args)

    out["capture"] = timed(capture)
    out["ops"] = len(program.ops)
    _ = program.anatomy().layers  # read once per program, as the first strategy does
    s = wb.Session(program, wb.Mesh({"data": 2048, "model": 4}))
    tactics = {
        "BP": wb.BP("data"),
        "MP": wb.MP("model"),
        "Z3": wb.Z3("data"),
        "SP": wb.SP("model"),
        "EMB": wb.EMB("model"),
    }
    for name in STEPS:
        out[name] = timed(lambda t=tactics[name]: s.apply(t))
    out["undo"] = timed(s.undo)
    out["redo"] = timed(s.redo)
    out["jump"] = timed(lambda: s.jump(1))
    s.jump(3)  # BP+MP+Z3
    out["collectives"] = timed(s.collectives)
    out["estimate"] = timed(lambda: s.estimate(hardware.H100))
    return out


def llama_405b() -> None:
    """Build, capture, plan and estimate the 405B step; print one line of figures."""
    from workbench.models.external import Size, build_external

    size = Size(
        batch=4096, seq_len=4096, d_model=16384, n_heads=128, n_kv_heads=8, d_ff=53248,
        vocab=128256, n_layers=126,
    )  # fmt: skip
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = build_external("hf_llama", size, abstract=True)
        built = time.perf_counter() - t0
        program = wb.capture(ex.fn, *ex.args)
    captured = time.perf_counter() - t0 - built
    s = wb.Session(program, wb.Mesh({"data": 2048, "model": 8}))
    t1 = time.perf_counter()
    for tactic in (wb.BP("data"), wb.MP("model"), wb.Z3("data")):
        s.apply(tactic)
    planned = time.perf_counter() - t1
    t2 = time.perf_counter()
    estimate = s.estimate(hardware.H100)
    estimated = time.perf_counter() - t2
    total = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    print(
        _common.table(
            [
                "ops",
                "build s",
                "capture s",
                "BP+MP+Z3 s",
                "estimate s",
                "total s",
                "peak process GiB",
                "estimated step s",
                "per-device GiB",
            ],
            [
                [
                    len(program.ops),
                    f"{built:.1f}",
                    f"{captured:.1f}",
                    f"{planned:.1f}",
                    f"{estimated:.1f}",
                    f"{total:.1f}",
                    f"{peak:.2f}",
                    f"{estimate.step_s:.1f}",
                    f"{estimate.memory.peak / 2**30:.1f}",
                ]
            ],
        )
    )


def linearity(depths=(8, 32, 126)) -> None:
    """The estimate's step time by depth, the step unrolled and under ``lax.scan``: the time
    per layer (slope) between consecutive depths, and the scan form's whole plan
    (BP+MP+Z3+estimate) time."""
    rows, times = [], {}
    for name in ("lm", "lm_scan"):
        for layers in depths:
            ex = build(name, lm.Config.preset("huge", n_layers=layers, batch=BATCH), abstract=True)
            program = wb.capture(ex.fn, *ex.args)
            s = wb.Session(program, wb.Mesh({"data": 2048, "model": 4}))
            t0 = time.perf_counter()
            for tactic in (wb.BP("data"), wb.MP("model"), wb.Z3("data")):
                s.apply(tactic)
            e = s.estimate(hardware.H100)
            plan = time.perf_counter() - t0
            times[name, layers] = e.step_s
            rows.append(
                [
                    name,
                    layers,
                    len(program.ops),
                    f"{plan:.2f}",
                    f"{e.step_s * 1e3:.0f}",
                    f"{e.memory.peak / 2**30:.1f}",
                ]
            )
    for row in rows:
        name, layers = row[0], row[1]
        i = depths.index(layers)
        slope = (
            (times[name, layers] - times[name, depths[i - 1]]) / (layers - depths[i - 1]) * 1e3
            if i
            else float("nan")
        )
        row += [f"{slope:.1f}", f"{times['lm', layers] / times['lm_scan', layers]:.3f}"]
    print(
        _common.table(
            [
                "form",
                "layers",
                "ops",
                "BP+MP+Z3+estimate s",
                "step ms (H100)",
                "peak GiB",
                "ms per layer since previous",
                "unrolled / scan",
            ],
            rows,
        )
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, nargs="+", default=[8, 16, 32, 80, 126])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-405b", action="store_true")
    parser.add_argument("--405b-only", dest="only_405b", action="store_true")
    parser.add_argument("--no-linearity", action="store_true")
    parser.add_argument("--linearity-only", action="store_true")
    args = parser.parse_args()
    if args.only_405b:
        llama_405b()
        return
    if args.linearity_only:
        linearity()
        return
    rows = []
    for layers in args.layers:
        runs = [one(layers) for _ in range(args.repeats)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        plan = med["BP"] + med["MP"] + med["Z3"]
        rows.append(
            [layers, med["ops"], f"{med['capture']:.2f}"]
            + [f"{med[k]:.2f}" for k in (*STEPS, "undo", "redo", "jump", "collectives", "estimate")]
            + [f"{1e6 * plan / med['ops']:.0f}", f"{(plan + med['estimate']) / med['capture']:.2f}"]
        )
    print(_common.machine())
    print(
        _common.table(
            [
                "layers",
                "ops",
                "capture s",
                *[f"{k} s" for k in STEPS],
                "undo s",
                "redo s",
                "jump s",
                "collectives s",
                "estimate s",
                "BP+MP+Z3 µs/op",
                "plan+estimate / capture",
            ],
            rows,
        )
    )
    if not args.no_linearity:
        linearity()
    if not args.no_405b:  # in a fresh process, so its peak memory is its own
        subprocess.run([sys.executable, __file__, "--405b-only"], check=True)


if __name__ == "__main__":
    main()
