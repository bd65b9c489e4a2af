"""Pipelined plans priced: Megatron-LM's pipelined runs, and PP against ZeRO-3 on a 70B step.

**Megatron-LM, Table 1** (Narayanan et al. 2021, arXiv 2104.04473): GPT models on Selene's
A100 80GB (DGX A100 nodes of 8 over NVLink, InfiniBand between), sequence 2,048, vocabulary
51,200, mixed precision (16 bytes of model state a parameter), activation recomputation,
tensor parallel t = 8 inside a node, pipeline p stages, data parallel over the rest. The
table publishes TFLOP/s per GPU; the step time follows from the paper's own FLOPs per
iteration, F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) (recomputation counted), as
F / (GPUs x TFLOP/s). Here the zoo LM at the same widths (d_ff = 4h, heads of h/heads),
bfloat16 with float32 master weights and Adam, ``remat=True``, from shapes only, planned
``[PP("stage", ...), BP("data"), MP("model")]`` with the embeddings split on the vocabulary
(Megatron's vocabulary-parallel layers) on a mesh {stage: p, data: d, model: 8} and estimated on the ``A100`` preset (vendor figures; NCCL's measured bus bandwidth). Each
row's pipeline is as the authors' scripts ran it (NVIDIA/Megatron-LM examples/sc21): B /
(d x micro-batch) microbatches, interleaved over 2-3 model chunks for 76B-530B, 1F1B
otherwise. Our MFU is the paper's F over our step and 312 TFLOP/s per GPU.

**70B at 2,048 H100** (the zoo LM's "huge" preset, 80 layers, remat, batch 64 x 4,096
tokens): BP+MP+Z3 on {data: 512, model: 4} against PP+BP+MP on {stage: S, data:
2048/(4S), model: 4}, on the ``H100`` preset (nodes of 8 over NVLink, InfiniBand between).
The batch of 64 does not divide 512 ways, so BP splits the sequence (``dim=1``), as
`search_scale.py` does. ``--auto SECONDS``: also ``Auto(("stage", "data", "model"))`` on
{stage: 8, data: 64, model: 4} from nothing, within the H100's memory, with its wall time.

    python benchmarks/pipeline.py [--rows 39.1 ...] [--stages 4 8 16] [--skip-70b] [--auto 240]
"""

import argparse
import time

import _common

import workbench as wb
from workbench.core import hardware as hw
from workbench.core.units import format_bytes, format_seconds
from workbench.models import build, lm

SEQ, VOCAB, PEAK = 2048, 51200, 312e12
# Table 1's pipelined rows: params (B): (heads, hidden, layers, t, p, GPUs, batch, TFLOP/s)
MEGATRON = {
    "39.1": (64, 8192, 48, 8, 2, 512, 1536, 138),
    "76.1": (80, 10240, 60, 8, 4, 1024, 1792, 140),
    "145.6": (96, 12288, 80, 8, 8, 1536, 2304, 148),
    "310.1": (128, 16384, 96, 8, 16, 1920, 2160, 155),
    "529.6": (128, 20480, 105, 8, 35, 2520, 2520, 163),
    "1008.0": (160, 25600, 128, 8, 64, 3072, 3072, 163),
}


# How the authors ran each row of Table 1 (NVIDIA/Megatron-LM examples/sc21/run_table_1.sh,
# "scripts that were used to produce the results in the Megatron paper"): params (B):
# (micro-batch size, model chunks per stage; 1: 1F1B, more: the interleaved schedule, from
# --num-layers-per-virtual-pipeline-stage). Dropout 0.1 on attention probabilities and
# hidden states (the defaults of megatron/arguments.py at the commit the scripts name).
MEGATRON_RUN = {
    "1.7": (16, 1),
    "3.6": (16, 1),
    "7.5": (16, 1),
    "18.4": (8, 1),
    "39.1": (4, 1),
    "76.1": (2, 3),
    "145.6": (2, 2),
    "310.1": (1, 2),
    "529.6": (1, 3),
    "1008.0": (1, 1),
}
DROPOUT = 0.1


def megatron_pp(name: str, stages: int, replicas: int, batch: int) -> "wb.PP":
    """The row's pipeline as its script ran it: B / (d x micro-batch) microbatches, 1F1B or
    interleaved over its model chunks."""
    mbs, chunks = MEGATRON_RUN[name]
    m = batch // (replicas * mbs)
    if chunks > 1:
        return wb.PP("stage", microbatches=m, schedule="interleaved", virtual_stages=chunks)
    return wb.PP("stage", microbatches=m, schedule="1f1b")


def vocab_parallel(axis: str) -> list:
    """Megatron-LM's vocabulary-parallel input and output embeddings over ``axis``: the
    tables split on the vocabulary, the logits and the loss's softmax with them."""
    return [wb.EMB(axis), wb.Tile("params/unembed", 1, axis)]


def megatron_flops(batch: int, layers: int, h: int) -> float:
    """The paper's FLOPs per iteration (its eq. 3), recomputation included."""
    return 96 * batch * SEQ * layers * h**2 * (1 + SEQ / (6 * h) + VOCAB / (16 * layers * h))


def megatron_row(name: str) -> list:
    heads, h, layers, t, p, gpus, batch, tflops = MEGATRON[name]
    d = gpus // (t * p)
    config = lm.Config(
        batch=batch, seq_len=SEQ, d_model=h, n_heads=heads, d_head=h // heads, d_ff=4 * h,
        vocab=VOCAB, n_layers=layers, dtype="bfloat16", master_weights=True, remat=True,
    )  # fmt: skip
    t0 = time.perf_counter()
    ex = build("lm", config, abstract=True)
    program = wb.capture(ex.fn, *ex.args)
    mesh = wb.Mesh({"stage": p, "data": d, "model": t})
    pp = megatron_pp(name, p, d, batch)
    session = wb.Session(
        program, mesh, [pp, wb.BP("data"), wb.MP("model"), *vocab_parallel("model")]
    )
    e = session.estimate(hw.A100)
    took = time.perf_counter() - t0
    flops = megatron_flops(batch, layers, h)
    published = flops / (gpus * tflops * 1e12)
    return [
        name,
        f"t{t} p{p} d{d}",
        batch // (d * MEGATRON_RUN[name][0]),
        format_seconds(published),
        format_seconds(e.step_s),
        f"{e.step_s / published:.2f}",
        f"{100 * tflops * 1e12 / PEAK:.0f}% / {100 * flops / (gpus * e.step_s * PEAK):.0f}%",
        f"{e.pipeline.bubble_share:.0%}",
        format_bytes(e.memory.peak),
        f"{took:.0f}",
    ]


def seventy_b(stages: list[int]) -> list[list]:
    config = lm.Config.preset("huge", n_layers=80, batch=64, remat=True)
    ex = build("lm", config, abstract=True)
    program = wb.capture(ex.fn, *ex.args)
    plans = {
        "BP+MP+Z3": (
            {"data": 512, "model": 4},
            [wb.BP("data", dim=1), wb.MP("model"), wb.Z3("data")],
        )
    }
    for s in stages:
        mesh = {"stage": s, "data": 2048 // (4 * s), "model": 4}
        for m in (s, 4 * s):
            plans[f"PP{s}(M={m})+BP+MP"] = (
                mesh,
                [wb.PP("stage", microbatches=m), wb.BP("data", dim=1), wb.MP("model")],
            )
    rows = []
    for name, (mesh, schedule) in plans.items():
        t0 = time.perf_counter()
        e = wb.Session(program, wb.Mesh(mesh), schedule).estimate(hw.H100)
        took = time.perf_counter() - t0
        bubble = f"{e.pipeline.bubble_share:.0%}" if e.pipeline else "-"
        fits = "" if e.memory.fits else " (does not fit)"
        rows.append(
            [
                name,
                format_seconds(e.step_s),
                bubble,
                format_bytes(e.memory.peak) + fits,
                f"{took:.0f}",
            ]
        )
    return rows


def auto_70b(seconds: float) -> list:
    config = lm.Config.preset("huge", n_layers=80, batch=64, remat=True)
    ex = build("lm", config, abstract=True)
    program = wb.capture(ex.fn, *ex.args)
    mesh = wb.Mesh({"stage": 8, "data": 64, "model": 4})
    limit = hw.H100.memory_bytes
    auto = wb.Auto(("stage", "data", "model"), memory_limit=limit, budget=100_000, seconds=seconds)
    t0 = time.perf_counter()
    session = wb.Session(program, mesh, [auto])
    took = time.perf_counter() - t0
    e = session.estimate(hw.H100)
    report = session.history[-1].report(program, mesh, session.state_at(0))
    fits = "" if e.memory.fits else " (does not fit)"
    return [
        report.winner.name,
        format_seconds(e.step_s),
        format_bytes(e.memory.peak) + fits,
        len(report.winner.conflicts),
        f"{took:.0f}",
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", default=list(MEGATRON), choices=list(MEGATRON))
    parser.add_argument("--stages", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--skip-70b", action="store_true")
    parser.add_argument("--auto", type=float, default=0.0, help="Auto's seconds (0: skip)")
    args = parser.parse_args()
    print(f"\nPipelined plans priced; {_common.machine()}")
    if args.rows:
        print("\nMegatron-LM Table 1's pipelined rows on the A100 preset\n")
        headers = ["params (B)", "t p d", "M", "published step", "simulated", "ratio"]
        headers += ["MFU published / ours", "bubble", "peak/GPU", "plan+price s"]
        print(_common.table(headers, [megatron_row(r) for r in args.rows]))
    if not args.skip_70b:
        print("\n70B-shaped LM (80 layers, remat) at 2,048 devices on the H100 preset\n")
        headers = ["plan", "step", "bubble", "peak/device", "plan+price s"]
        print(_common.table(headers, seventy_b(args.stages)))
    if args.auto:
        print(f"\nAuto on {{stage: 8, data: 64, model: 4}} within {args.auto:.0f} s\n")
        print(
            _common.table(
                ["Auto chose", "step", "peak/device", "conflicts", "search s"],
                [auto_70b(args.auto)],
            )
        )


if __name__ == "__main__":
    main()
