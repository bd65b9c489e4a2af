"""Attention as written against fused kernels (``Hardware.fused_attention``), on the H100.

Llama 3 8B's widths (GQA: 32 heads, 8 KV heads; SwiGLU), 4 layers, bfloat16 with float32
master weights and Adam, one sequence a device on 8 devices (``BP``, ``Z3``), with and
without rematerialisation, at 2K to 32K tokens: the step, attention's part of it, MFU and
the peak, as the program writes attention and as one flash-style kernel per pass.

    python benchmarks/fused_attention.py [--seqs 2048 8192 32768]
"""

import argparse
import dataclasses

import _common

import workbench as wb
from workbench.core import hardware as hw
from workbench.models import build, lm

LLAMA3_8B = dict(
    d_model=4096, n_heads=32, n_kv_heads=8, d_head=128, d_ff=14336, mlp="swiglu",
    vocab=128256, n_layers=4, dtype="bfloat16", master_weights=True,
)  # fmt: skip
FUSED = dataclasses.replace(hw.H100, fused_attention=True)


def rows(seqs):
    out = []
    for seq in seqs:
        for remat in (True, False):
            ex = build(
                "lm", lm.Config(**LLAMA3_8B, batch=8, seq_len=seq, remat=remat), abstract=True
            )
            program = wb.capture(ex.fn, *ex.args)
            s = wb.Session(program, wb.Mesh({"data": 8}), [wb.BP("data"), wb.Z3("data")])
            row = [seq, "yes" if remat else "no"]
            for spec in (hw.H100, FUSED):
                e = s.estimate(spec)
                b = e.breakdown
                row += [
                    f"{e.step_s * 1e3:.0f}",
                    f"{b.attention_s / e.step_s:.0%}",
                    f"{b.mfu:.0%}",
                    f"{e.memory.peak / 2**30:.1f}",
                ]
            out.append(row)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[2048, 8192, 32768])
    args = parser.parse_args()
    print(f"\nAttention as written and fused, H100 preset; {_common.machine()}\n")
    headers = ["tokens", "remat"]
    for how in ("written", "fused"):
        headers += [f"{how}: step ms", "attention", "MFU", "peak GiB"]
    print(_common.table(headers, rows(args.seqs)))


if __name__ == "__main__":
    main()
