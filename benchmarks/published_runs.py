"""The simulator against published training runs: MaxText's measured throughput on TPU v5e.

MaxText (github.com/AI-Hypercomputer/maxtext) published, for the decoder-only transformers
it trains on synthetic data on TPU v5e-256 slices, the model TFLOP/s each chip sustained and
the MFU (its README's table; the single-slice rows first at commit 9bc243c9, 2023-10-27,
the multi-slice rows at 28816574, 2023-12-08; run scripts ``MaxText/configs/v5e/16b.sh``,
``32b.sh``, ``64b.sh`` and ``largest_job/*.sh`` there). Each run is pure FSDP
(``ici_fsdp_parallelism=-1`` inside a slice, data parallel over the data-center network
across slices), full rematerialisation, bfloat16 activations with float32 parameters and
AdamW, sequences of 2,048 tokens, ``per_device_batch_size`` 6, 4 and 2, and that era's
``base.yml``: attention materialised (flash attention off), multi-head attention with
head_dim 256, a ReLU MLP, tied embeddings, vocabulary 32,768, widths scaled by
``global_parameter_scale`` 16, 32 and 64.

Here the zoo LM at the same widths, depth, batch and sequence (its MLP is GELU and its
embeddings are untied: the same matmuls), bfloat16 with float32 master weights and Adam,
``remat=True``, from shapes only, on a mesh {slices, data: 256} (the slices over the
data-center network, as the preset maps an axis past its 256 chips), planned with BP over
both axes and Z3 over ``data``, and estimated on the ``TPU v5e`` preset (vendor figures,
nothing calibrated), overlapped as XLA's scheduler overlaps FSDP (``overlap="prefetch"``:
each layer's weights gathered ahead of their use and its gradients reduced behind later
work; the step without overlap is shown too). The published step time is MaxText's model FLOPs per device (its formula
then, ``6 N T B + 12 H L hd T^2 B``: N all parameters, attention counted whole) over the
published TFLOP/s per chip; our MFU is the same FLOPs over our estimated step and the
chip's 197 TFLOP/s.

    python benchmarks/published_runs.py [--slices 1 2 4 8 16]
"""

import argparse
import functools

import _common

import workbench as wb
from workbench.core import hardware as hw
from workbench.models import build, lm

PEAK = 197e12  # TPU v5e bfloat16 FLOP/s per chip (the preset's, from Google's page)
SEQ, VOCAB, HEAD_DIM = 2048, 32768, 256
# size: (d_model, heads, d_ff, layers, per-device batch), from base.yml x global_parameter_scale
MODELS = {
    "16B": (5120, 32, 32768, 32, 6),
    "32B": (10240, 32, 32768, 32, 4),
    "64B": (10240, 32, 32768, 64, 2),
}
# slices: {size: (TFLOP/s per chip, MFU %)} as published
PUBLISHED = {
    1: {"16B": (120, 61.10), "32B": (132, 66.86), "64B": (118, 59.90)},
    2: {"16B": (117, 59.37), "32B": (128, 64.81), "64B": (112, 56.66)},
    4: {"16B": (117, 59.14), "32B": (126, 64.10), "64B": (110, 55.85)},
    8: {"16B": (115, 58.27), "32B": (125, 63.67), "64B": (108, 54.96)},
    16: {"16B": (111, 56.56), "32B": (123, 62.26), "64B": (105, 53.29)},
}


def maxtext_flops(d: int, heads: int, d_ff: int, layers: int, batch: int) -> float:
    """MaxText's model FLOPs per device per step then: 6 N T B + 12 H L hd T^2 B, with N
    every parameter (tied embeddings: one vocabulary table)."""
    n = layers * (4 * d * heads * HEAD_DIM + 2 * d * d_ff) + VOCAB * d
    return 6 * n * SEQ * batch + 12 * heads * layers * HEAD_DIM * SEQ**2 * batch


@functools.cache
def session(size: str, slices: int) -> wb.Session:
    """One run's step from shapes, planned as MaxText runs it (captured once)."""
    d, heads, d_ff, layers, per_device = MODELS[size]
    config = lm.Config(
        batch=per_device * 256 * slices,
        seq_len=SEQ,
        d_model=d,
        n_heads=heads,
        d_head=HEAD_DIM,
        d_ff=d_ff,
        vocab=VOCAB,
        n_layers=layers,
        dtype="bfloat16",
        master_weights=True,
        remat=True,
    )
    ex = build("lm", config, abstract=True)
    program = wb.capture(ex.fn, *ex.args)
    # FSDP inside a slice; across slices, data parallel over the data-center network
    if slices == 1:
        mesh, schedule = {"data": 256}, [wb.BP("data"), wb.Z3("data")]
    else:
        mesh = {"slices": slices, "data": 256}
        schedule = [wb.BP("slices"), wb.BP("data"), wb.Z3("data")]
    return wb.Session(program, wb.Mesh(mesh), schedule)


def compare(size: str, slices: int, overlap="prefetch", hardware=hw.TPU_V5E):
    """``(published step s, the estimate, MaxText's FLOPs per device)`` for one run."""
    d, heads, d_ff, layers, per_device = MODELS[size]
    # overlapped as XLA's scheduler on TPU overlaps FSDP: weights gathered ahead of their
    # use, gradients reduced behind later work, nothing else hidden
    estimate = session(size, slices).estimate(hardware, overlap=overlap)
    flops = maxtext_flops(d, heads, d_ff, layers, per_device)
    return flops / (PUBLISHED[slices][size][0] * 1e12), estimate, flops


def one(size: str, slices: int) -> list:
    published, e, flops = compare(size, slices)
    return [
        size,
        f"{slices} x v5e-256",
        f"{published:.2f}",
        f"{e.step_s:.2f}",
        f"{e.step_s / published:.2f}",
        f"{e.compute_s + e.communication_s:.2f}",
        f"{PUBLISHED[slices][size][1]:.1f}",
        f"{100 * flops / (e.step_s * PEAK):.1f}",
        f"{e.compute_s:.2f}",
        f"{e.communication_s:.2f}",
        f"{e.memory.peak / 2**30:.1f}",
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slices", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    args = parser.parse_args()
    rows = []
    for slices in args.slices:
        for size in MODELS:
            rows.append(one(size, slices))
            print(f"estimated {size} on {slices} slices", flush=True)
    print(f"\nMaxText on TPU v5e against the TPU v5e preset; {_common.machine()}\n")
    print(
        _common.table(
            [
                "model",
                "chips",
                "published step s",
                "estimated step s",
                "estimated / published",
                "with no overlap s",
                "published MFU %",
                "estimated MFU %",
                "estimated compute s",
                "estimated communication s",
                "estimated peak GiB",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
