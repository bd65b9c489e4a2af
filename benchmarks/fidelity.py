"""The simulator against published training runs, split before anything is fitted.

Each run is set up as its source states it (widths, depth, batch, sequence, parallelism,
chips), built from shapes only and estimated on the chip's preset (vendor figures): no
constant is fitted to any run. The published step time follows from each source's own
FLOPs accounting and its published throughput, and MFU is compared in that accounting.

- **Megatron-LM, Table 1** (Narayanan et al. 2021, arXiv 2104.04473): all ten rows, A100
  80GB on Selene. Rows with p = 1: ``[BP("data"), MP("model")]`` on {data: n/t, model: t};
  pipelined rows as ``benchmarks/pipeline.py`` plans them. The paper's FLOPs per
  iteration (its eq. 3, recomputation counted) over the GPUs and 312 TFLOP/s. The runs'
  kernels (PyTorch 20.12's container, fp16, attention unfused with dropout) are priced
  at ``PYTORCH_2012`` of the A100's roofline, a fitted constant.
- **MaxText on TPU v5e** (its README's table, 15 runs: 16B, 32B and 64B on 1 to 16
  v5e-256 slices), as ``benchmarks/published_runs.py`` sets them up; matmuls at
  ``V5E_MATMUL`` of the chip's peak, a fitted constant.
- **MaxText on TPU v5p** (its README's v5p table at 2024-03-22, the 8 runs of 32B to 1,024B
  on 64 to 2,048 chips whose scripts it publishes), as ``benchmarks/published_v5p.py``
  sets them up: FSDP with tensor parallelism, remat policies, flash attention; matmuls
  at ``V5P_MATMUL`` of the chip's peak, a fitted constant.
- **H100** (``benchmarks/published_h100.py``, attention fused): Megatron-LM's README
  weak-scaling table (9 runs, 1.7B to 462B on up to 6,144 H100s, 5 pipelined), Llama 3
  405B's two 8K rows of Table 4 (8,192 and 16,384 H100s, TP 8, PP 16 interleaved), and
  NeMo AutoModel's mixture of experts, Qwen3 30B-A3B on 8 H100s (EP 8, FSDP 8), and Llama
  3 70B with context parallelism on 64 (CP 2, FSDP 32).

**The split** (fixed before any constant was fitted): within each source, in table order,
the even rows fit and the odd rows are held out. Three constants are fitted, each on its
source's "fit" rows alone (``--fit`` fits them again): ``PYTORCH_2012`` on Table 1's,
``V5E_MATMUL`` and ``V5P_MATMUL`` on MaxText's v5e and v5p rows. The H100 runs use the
preset as it is (none fitted), so both their halves are held out in effect.

    python benchmarks/fidelity.py [--source megatron h100 maxtext v5p] [--fit]
"""

import argparse
import dataclasses
import functools
import statistics
import time

import _common
import pipeline
import published_h100
import published_runs
import published_v5p

import workbench as wb
from workbench.core import hardware as hw
from workbench.models import build, lm

A100_PEAK = 312e12
# The one fitted constant (``--fit``, on the "fit" rows alone): the share of the roofline
# that the kernels of Table 1's runs reached (PyTorch 20.12's container, the scripts'
# fp16, attention unfused with dropout), applied to A100's peak FLOP/s and memory bandwidth
PYTORCH_2012 = 0.751
# The second (``--fit``, on MaxText's fit rows alone): the share of TPU v5e's bfloat16 peak
# its matmuls reach (the preset prices them at the peak: no published measurement found)
V5E_MATMUL = 0.894
# The third (``--fit``, on MaxText's v5p fit rows alone): the same for TPU v5p
V5P_MATMUL = 0.88
# Table 1's rows without pipelining: params (B): (heads, hidden, layers, t, p, GPUs, batch,
# TFLOP/s per GPU); the pipelined rows are pipeline.MEGATRON
MEGATRON_FLAT = {
    "1.7": (24, 2304, 24, 1, 1, 32, 512, 137),
    "3.6": (32, 3072, 30, 2, 1, 64, 512, 138),
    "7.5": (32, 4096, 36, 4, 1, 128, 512, 142),
    "18.4": (48, 6144, 40, 8, 1, 256, 1024, 135),
}
MEGATRON = {**MEGATRON_FLAT, **pipeline.MEGATRON}


def split(i: int) -> str:
    """The half a run belongs to, by its index in its source's table (fixed)."""
    return "fit" if i % 2 == 0 else "held out"


@functools.cache
def megatron_session(name: str) -> wb.Session:
    """Table 1's row ``name`` planned as its script ran it (captured once)."""
    heads, h, layers, t, p, gpus, batch, _ = MEGATRON[name]
    d = gpus // (t * p)
    config = lm.Config(
        batch=batch, seq_len=pipeline.SEQ, d_model=h, n_heads=heads, d_head=h // heads,
        d_ff=4 * h, vocab=pipeline.VOCAB, n_layers=layers, dtype="bfloat16",
        master_weights=True, remat=True,
    )  # fmt: skip
    ex = build("lm", config, abstract=True)
    program = wb.capture(ex.fn, *ex.args)
    axes = {"stage": p, "data": d, "model": t}
    mesh = wb.Mesh({k: v for k, v in axes.items() if v > 1})
    plan = [pipeline.megatron_pp(name, p, d, batch)] if p > 1 else []
    plan += [wb.BP("data")] + ([wb.MP("model"), *pipeline.vocab_parallel("model")] if t > 1 else [])
    return wb.Session(program, mesh, plan)


def kernels_at(hardware: hw.Hardware, share: float) -> hw.Hardware:
    """``hardware`` whose kernels reach ``share`` of their roofline: its peak FLOP/s and
    memory bandwidth scaled by it, its links as they are."""
    return dataclasses.replace(
        hardware,
        name=f"{hardware.name}, kernels at {share:.3f} of the roofline",
        flops={k: v * share for k, v in hardware.flops.items()},
        hbm_bandwidth=hardware.hbm_bandwidth * share,
    )


def megatron(name: str, kernels: float = PYTORCH_2012) -> dict:
    _, h, layers, t, p, gpus, batch, tflops = MEGATRON[name]
    e = megatron_session(name).estimate(kernels_at(hw.A100, kernels))
    flops = pipeline.megatron_flops(batch, layers, h)
    return dict(
        source="Megatron-LM Table 1",
        chip="A100",
        run=f"{name}B t{t} p{p} d{gpus // (t * p)}",
        published_s=flops / (gpus * tflops * 1e12),
        step_s=e.step_s,
        mfu=(tflops * 1e12 / A100_PEAK, flops / (gpus * e.step_s * A100_PEAK)),
    )


def matmuls_at(hardware: hw.Hardware, share: float) -> hw.Hardware:
    """``hardware`` whose bfloat16 matmuls reach ``share`` of its peak."""
    return dataclasses.replace(
        hardware,
        name=f"{hardware.name}, matmuls at {share:.3f} of the peak",
        matmul_efficiency={**hardware.matmul_efficiency, "bfloat16": share},
    )


def fit(rows, low: float = 0.5, high: float = 1.0, steps: int = 12) -> float:
    """The share (in [low, high]) at which the median ratio of ``rows(share)`` (simulated
    over published) is 1: bisection, since a lower share only lengthens a step."""
    for _ in range(steps):
        share = (low + high) / 2
        ratio = statistics.median(r["step_s"] / r["published_s"] for r in rows(share))
        low, high = (share, high) if ratio > 1 else (low, share)
        print(f"  at {share:.3f}: median ratio {ratio:.3f}", flush=True)
    return round((low + high) / 2, 3)


def fitted() -> tuple[float, float, float]:
    """The fitted constants again, each on its source's "fit" rows alone."""
    megatron_fit = [n for i, n in enumerate(sorted(MEGATRON, key=float)) if split(i) == "fit"]
    kernels = fit(lambda share: [megatron(n, share) for n in megatron_fit])
    maxtext_fit = [run for i, run in enumerate(maxtext_runs()) if split(i) == "fit"]
    mxu = fit(lambda share: [maxtext(*run, share) for run in maxtext_fit])
    v5p_fit = [run[:2] for i, run in enumerate(published_v5p.PUBLISHED) if split(i) == "fit"]
    v5p = fit(lambda share: [v5p_run(*run, share) for run in v5p_fit])
    return kernels, mxu, v5p


def v5p_run(size: str, chips: int, matmuls: float = V5P_MATMUL) -> dict:
    return published_v5p.run(size, chips, matmuls_at(published_v5p.FUSED_V5P, matmuls))


def maxtext_runs() -> list[tuple[str, int]]:
    """MaxText's runs in its table's order: (size, slices)."""
    return [(s, n) for n in published_runs.PUBLISHED for s in published_runs.MODELS]


def maxtext(size: str, slices: int, matmuls: float = V5E_MATMUL) -> dict:
    chip = matmuls_at(hw.TPU_V5E, matmuls)
    published, e, flops = published_runs.compare(size, slices, hardware=chip)
    return dict(
        source="MaxText v5e",
        chip="TPU v5e",
        run=f"{size} {slices} x v5e-256",
        published_s=published,
        step_s=e.step_s,
        mfu=(
            published_runs.PUBLISHED[slices][size][1] / 100,
            flops / (e.step_s * published_runs.PEAK),
        ),
    )


def runs(sources, kernels=PYTORCH_2012, matmuls=V5E_MATMUL, v5p=V5P_MATMUL):
    """Every run of ``sources``, each with its split (the fitted constants as given)."""
    out = []
    if "megatron" in sources:
        for i, name in enumerate(sorted(MEGATRON, key=float)):
            out.append({**megatron(name, kernels), "split": split(i)})
            print(f"estimated Megatron {name}B", flush=True)
    if "h100" in sources:
        for source, table in published_h100.runs():
            for i, (name, run) in enumerate(table):
                out.append({**run(), "split": split(i)})
                print(f"estimated {source}: {name}", flush=True)
    if "v5p" in sources:
        for i, (size, chips, _) in enumerate(published_v5p.PUBLISHED):
            out.append({**v5p_run(size, chips, v5p), "split": split(i)})
            print(f"estimated MaxText {size} on {chips} v5p chips", flush=True)
    if "maxtext" in sources:
        for i, (size, slices) in enumerate(maxtext_runs()):
            out.append({**maxtext(size, slices, matmuls), "split": split(i)})
            print(f"estimated MaxText {size} on {slices} slices", flush=True)
    return out


def summary(rows) -> list[list]:
    """Per chip family and split: runs, median and largest error, bias (median ratio)."""
    out = []
    for chip in dict.fromkeys(r["chip"] for r in rows):
        for half in ("fit", "held out"):
            ratios = [
                r["step_s"] / r["published_s"]
                for r in rows
                if r["chip"] == chip and r["split"] == half
            ]
            if not ratios:
                continue
            errors = [abs(x - 1) for x in ratios]
            out.append(
                [
                    chip,
                    half,
                    len(ratios),
                    f"{statistics.median(errors):.0%}",
                    f"{max(errors):.0%}",
                    f"{statistics.median(ratios):.2f}",
                ]
            )
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sources = ["megatron", "h100", "maxtext", "v5p"]
    parser.add_argument("--source", nargs="+", default=sources, choices=sources)
    parser.add_argument("--fit", action="store_true", help="fit both constants again first")
    args = parser.parse_args()
    start = time.perf_counter()
    kernels, mxu, v5p = fitted() if args.fit else (PYTORCH_2012, V5E_MATMUL, V5P_MATMUL)
    if args.fit:
        print(f"fitted: PYTORCH_2012 {kernels}, V5E_MATMUL {mxu}, V5P_MATMUL {v5p} (used below)")
    rows = runs(args.source, kernels, mxu, v5p)
    print(
        f"\nPublished runs against the presets; {_common.machine()}; {time.perf_counter() - start:.0f} s\n"
    )
    table = [
        [
            r["source"],
            r["chip"],
            r["run"],
            r["split"],
            f"{r['published_s']:.3g}",
            f"{r['step_s']:.3g}",
            f"{r['step_s'] / r['published_s']:.2f}",
            f"{r['mfu'][0]:.0%} / {r['mfu'][1]:.0%}",
        ]
        for r in rows
    ]
    headers = ["source", "chip", "run", "split", "published s", "simulated s", "ratio"]
    print(_common.table([*headers, "MFU published / ours"], table))
    print(
        f"\nFitted constants: 3, each on its source's fit rows (A100: Table 1's kernels at "
        f"{kernels} of the roofline; TPU v5e and v5p: matmuls at {mxu} and {v5p} of the "
        "peak). "
        "Per chip family and half:\n"
    )
    headers = ["chip", "half", "runs", "median error", "largest error", "bias (median ratio)"]
    print(_common.table(headers, summary(rows)))


if __name__ == "__main__":
    main()
