"""MaxText's published TPU v5p runs, set up as their scripts ran them (``fidelity.py``).

MaxText's README (AI-Hypercomputer/maxtext at 04262f3c, 2024-03-22, "TPU v5p") publishes
the TFLOP/s each chip sustained for models of 32B to 1,160B on v5p slices; the scripts are
``MaxText/configs/v5p/{32b,64b,128b,256b,512b,1024b}.sh`` there (the 1,160B rows have
none, so they are left out). Each script runs ``base.yml`` of that commit scaled by
``global_parameter_scale`` (``pyconfig.get_individual_scales``: embedding 2048, 16 heads
of 128, MLP 7,168 and 16 layers, each doubled as the scale says), a Llama-2 block
(SwiGLU, multi-head attention), vocabulary 32,000, sequences of 2,048, float32 weights
computed in bfloat16, AdamW, flash attention, ``ici_fsdp_parallelism=-1`` with
``ici_tensor_parallelism`` 4, 8 or 16, and ``remat_policy`` "minimal"
(``checkpoint_dots_with_no_batch_dims``: the projections' outputs kept) or "full".

Here the zoo LM at the same widths (its norms are LayerNorms, its positions learned: the
same matmuls), bfloat16 with float32 master weights and Adam, the same remat policy, on a
mesh {data, model} planned ``[BP("data"), MP("model"), SP("model"), Z3("data")]``:
MaxText's rules then shard the residual stream's embedding over "tensor"
(``activation_embed``), where ``SP`` shards it on its sequence, the same bytes a device
holds; attention fused where the workbench can read its region, ``overlap="prefetch"``
as in ``published_runs.py``. A "v5p-N" slice has N/2 chips (two
TensorCores a chip). The published step is MaxText's FLOPs per device then
(``maxtext_utils.calculate_tflops_training_per_device``: ``6 N T B`` with N every
parameter, plus causal attention ``6 H L hd T^2 B``) over the published TFLOP/s.
"""

import dataclasses
import functools

import workbench as wb
from workbench.core import hardware as hw
from workbench.models import build, lm

PEAK = 459e12  # TPU v5p bfloat16 FLOP/s per chip (the preset's)
SEQ, VOCAB, HEAD_DIM = 2048, 32000, 128
BASE = dict(emb=2048, heads=16, mlp=7168, layers=16)
FUSED_V5P = dataclasses.replace(hw.TPU_V5P, fused_attention=True)
# size: (global_parameter_scale, per_device_batch_size, ici_tensor_parallelism, remat_policy)
SCRIPTS = {
    "32B": (32, 6, 4, "minimal"),
    "64B": (64, 3, 4, "minimal"),
    "128B": (128, 1, 8, "minimal"),
    "256B": (256, 1, 8, "minimal"),
    "512B": (512, 2, 8, "full"),
    "1024B": (1024, 2, 16, "full"),
}
# the README's rows: (size, chips, TFLOP/s per chip)
PUBLISHED = [
    ("32B", 64, 328),
    ("64B", 64, 323),
    ("128B", 128, 315),
    ("128B", 256, 315),
    ("256B", 512, 316),
    ("512B", 512, 294),
    ("1024B", 1024, 249),
    ("1024B", 2048, 297),
]
POLICIES = {"minimal": "dots_with_no_batch_dims_saveable", "full": None}


def dims(scale: int) -> dict:
    """``pyconfig.get_individual_scales``: widths and depth for a global parameter scale."""
    base, rem = divmod(scale.bit_length() - 1, 3)
    heads = mlp = base + int(rem > 0)
    emb = base + int(rem > 1)
    return dict(
        emb=BASE["emb"] << emb,
        heads=BASE["heads"] << heads,
        mlp=BASE["mlp"] << mlp,
        layers=BASE["layers"] << base,
    )


def config(size: str, chips: int) -> lm.Config:
    scale, per_device, _, policy = SCRIPTS[size]
    d = dims(scale)
    return lm.Config(
        batch=per_device * chips, seq_len=SEQ, d_model=d["emb"], n_heads=d["heads"],
        d_head=HEAD_DIM, d_ff=d["mlp"], mlp="swiglu", vocab=VOCAB, n_layers=d["layers"],
        dtype="bfloat16", master_weights=True, remat=True, remat_policy=POLICIES[policy],
    )  # fmt: skip


def maxtext_flops(c: lm.Config, per_device: int) -> float:
    """MaxText's FLOPs per device per step then: 6 N T B + 6 H L hd T^2 B (causal)."""
    layer = 4 * c.d_model * c.n_heads * c.d_head + 3 * c.d_model * c.d_ff + 2 * c.d_model
    n = c.n_layers * layer + 2 * c.vocab * c.d_model + c.d_model
    attention = 6 * c.n_heads * c.n_layers * c.d_head * SEQ**2 * per_device
    return 6 * n * SEQ * per_device + attention


@functools.cache
def session(size: str, chips: int) -> wb.Session:
    tp = SCRIPTS[size][2]
    ex = build("lm", config(size, chips), abstract=True)
    program = wb.capture(ex.fn, *ex.args)
    mesh = wb.Mesh({"data": chips // tp, "model": tp})
    plan = [wb.BP("data"), wb.MP("model"), wb.SP("model"), wb.Z3("data")]
    return wb.Session(program, mesh, plan)


def run(size: str, chips: int, hardware=FUSED_V5P) -> dict:
    """One run's row: the published step, ours, and MFU in MaxText's accounting."""
    tflops = dict(((s, n), t) for s, n, t in PUBLISHED)[(size, chips)]
    e = session(size, chips).estimate(hardware, overlap="prefetch")
    flops = maxtext_flops(config(size, chips), SCRIPTS[size][1])
    return dict(
        source="MaxText v5p",
        chip="TPU v5p",
        run=f"{size} v5p-{2 * chips}",
        published_s=flops / (tflops * 1e12),
        step_s=e.step_s,
        mfu=(tflops * 1e12 / PEAK, flops / (e.step_s * PEAK)),
        note=e.note,
        fits=e.memory.fits,
    )
