"""Published training runs on H100s, set up as their sources state them (``fidelity.py``).

- **Megatron-LM on H100** (NVIDIA/Megatron-LM README, its weak-scaling table, Megatron-Core
  r0.8.0, "All models use a vocabulary size of 131,072 and a sequence length of 4096",
  up to 6,144 H100s): GPT models (d_ff = 4h), TP inside a node, PP, DP over the rest.
  The README overlaps data-parallel communication (``--overlap-grad-reduce
  --overlap-param-gather``: its gradient reductions hide, ``overlap="prefetch"``, but a
  pipelined estimate hides none: there they are exposed; the
  distributed optimizer's sharding is left out, since 48 divides no dim) and tensor-parallel
  communication (``--tp-comm-overlap``, not modelled: TP is priced exposed) with compute,
  and runs fused attention (Transformer Engine). Not stated, assumed: bfloat16 (the TFLOP/s
  over MFU gives the 989 TFLOP/s dense peak), micro-batches of one sequence, 1F1B, no
  recomputation. The published step is Megatron's own FLOPs per iteration
  (``megatron/training/training.py``, ``num_floating_point_operations``) over the GPUs
  and the published TFLOP/s per GPU.
- **Llama 3 405B** (Grattafiori et al. 2024, Table 4, BF16 on H100s, 8K rows): ``llama3``.
- **NeMo AutoModel's BF16 H100 table**: Qwen3 30B-A3B, a mixture of experts
  (``qwen3_moe``), and Llama 3 70B with context parallelism (``llama3_70b_cp``).
"""

import dataclasses

import pipeline

import workbench as wb
from workbench.core import hardware as hw
from workbench.models import build, lm

H100_PEAK = 989.5e12
FUSED_H100 = dataclasses.replace(hw.H100, fused_attention=True)
SEQ, VOCAB = 4096, 131072
# params (B): (heads, hidden, layers, TP, PP, DP, batch, TFLOP/s per GPU)
MEGATRON_H100 = {
    "1.7": (16, 2048, 24, 1, 1, 48, 192, 408.8),
    "7.1": (32, 4096, 30, 2, 1, 48, 192, 465.9),
    "16": (48, 6144, 32, 4, 1, 48, 192, 489.1),
    "32": (56, 7168, 48, 8, 1, 48, 192, 459.6),
    "70": (64, 8192, 84, 8, 2, 48, 384, 419.7),
    "119": (80, 10240, 92, 8, 4, 48, 768, 420.5),
    "177": (96, 12288, 96, 8, 6, 48, 1152, 432.8),
    "314": (128, 16384, 96, 8, 8, 48, 1536, 474.4),
    "462": (144, 18432, 112, 8, 16, 48, 3072, 459.9),
}


def megatron_core_flops(batch, seq, layers, h, ffn, vocab, heads, groups=None, glu=False):
    """Megatron-Core's FLOPs per iteration (``num_floating_point_operations``, 2024):
    12 B s L h^2 ((1 + g/H + s/h) + ffn/h x (3/2 if gated) + V / (2 L h)), heads of h/H."""
    groups = heads if groups is None else groups
    attention = 1 + groups / heads + seq / h
    mlp = ffn / h * (1.5 if glu else 1.0)
    return 12 * batch * seq * layers * h * h * (attention + mlp + vocab / (2 * layers * h))


def runs() -> list:
    """Every H100 run, by source, in table order: ``(source, [(name, estimate fn)])``."""
    return [
        ("Megatron-LM README", [(n, lambda n=n: megatron_h100(n)) for n in MEGATRON_H100]),
        ("Llama 3 405B", [(n, lambda n=n: llama3(n)) for n in LLAMA3_RUNS]),
        ("NeMo AutoModel", [("Qwen3 30B-A3B", qwen3_moe), ("Llama 3 70B, CP 2", llama3_70b_cp)]),
    ]


def megatron_h100(name: str) -> dict:
    heads, h, layers, t, p, d, batch, tflops = MEGATRON_H100[name]
    gpus = t * p * d
    config = lm.Config(
        batch=batch, seq_len=SEQ, d_model=h, n_heads=heads, d_head=h // heads, d_ff=4 * h,
        vocab=VOCAB, n_layers=layers, dtype="bfloat16", master_weights=True,
    )  # fmt: skip
    ex = build("lm", config, abstract=True)
    program = wb.capture(ex.fn, *ex.args)
    axes = {"stage": p, "data": d, "model": t}
    mesh = wb.Mesh({k: v for k, v in axes.items() if v > 1})
    plan = [wb.PP("stage", microbatches=batch // d, schedule="1f1b")] if p > 1 else []
    plan += [wb.BP("data")]
    plan += [wb.MP("model"), *pipeline.vocab_parallel("model")] if t > 1 else []
    overlap = "none" if p > 1 else "prefetch"  # a pipelined estimate hides no reduction
    e = wb.Session(program, mesh, plan).estimate(FUSED_H100, overlap=overlap)
    flops = megatron_core_flops(batch, SEQ, layers, h, 4 * h, VOCAB, heads)
    run = f"{name}B t{t} p{p} d{d}"
    return row("Megatron-LM README (H100)", run, flops, gpus, tflops, e.step_s, e.note)


def row(source, run, flops, gpus, tflops, step_s, note) -> dict:
    """One run's row: the published step (the source's FLOPs over the GPUs at its rate),
    ours, and MFU in the source's accounting, published and ours."""
    return dict(
        source=source,
        chip="H100",
        run=run,
        published_s=flops / (gpus * tflops * 1e12),
        step_s=step_s,
        mfu=(tflops * 1e12 / H100_PEAK, flops / (gpus * step_s * H100_PEAK)),
        note=note,
    )


# Llama 3 405B (Table 3): 126 layers, d 16,384, FFN 53,248 (SwiGLU), 128 heads, 8 KV heads
LLAMA3 = dict(
    d_model=16384, n_heads=128, n_kv_heads=8, d_head=128, d_ff=53248, mlp="swiglu",
    vocab=128256, n_layers=126, dtype="bfloat16", master_weights=True,
)  # fmt: skip
# Table 4: (GPUs, TP, CP, PP, DP, sequence, sequences per DP group, TFLOP/s per GPU)
LLAMA3_RUNS = {
    "8K, 8,192 GPUs": (8192, 8, 1, 16, 64, 8192, 32, 430),
    "8K, 16,384 GPUs": (16384, 8, 1, 16, 128, 8192, 16, 400),
}
CHUNKS = 4  # model chunks per pipeline rank (see ``llama3``)


def llama3(name: str) -> dict:
    """A Llama 3 405B run of Table 4 (Grattafiori et al. 2024, "The Llama 3 Herd of Models").

    As stated: BF16, no activation checkpointing at 8K, TP 8, PP 16 with the interleaved
    schedule, "we reduce one Transformer layer each from the first and the last stages".
    FSDP shards the optimizer state and gradients, not the weights (``Z2``). The paper goes
    on: "the first model chunk on the first stage has only the embedding, and the last
    model chunk on the last stage has only output projection and loss", which with equal
    chunks means 8 chunks of one layer a rank and two chunks of none; ``PP`` needs a layer
    in every chunk, so here 4 chunks of 2 layers a rank, the first and the last of one: a
    bubble of (PP - 1) / (4 M), twice the paper's (PP - 1) / (8 M). Assumed: micro-batches
    of one sequence, fused attention, the PaLM MFU accounting the paper cites (6 N + 12 L d
    s per token, N without the embeddings)."""
    gpus, t, c, p, d, seq, per_dp, tflops = LLAMA3_RUNS[name]
    config = lm.Config(**LLAMA3, batch=per_dp * d, seq_len=seq)
    ex = build("lm", config, abstract=True)
    program = wb.capture(ex.fn, *ex.args)
    mesh = wb.Mesh({"stage": p, "data": d, "model": t})
    starts = [*range(1, config.n_layers - 1, 2), config.n_layers - 1]  # 1, 2, ..., 2, 1
    pp = wb.PP("stage", microbatches=per_dp, schedule="interleaved", virtual_stages=CHUNKS,
               stages=starts)  # fmt: skip
    plan = [pp, wb.BP("data"), wb.MP("model"), *pipeline.vocab_parallel("model"), wb.Z2("data")]
    e = wb.Session(program, mesh, plan).estimate(FUSED_H100)
    n = config.n_params - 2 * config.vocab * config.d_model
    per_token = 6 * n + 12 * config.n_layers * config.d_model * seq
    flops = per_token * seq * per_dp * d
    run = f"{name}: t{t} c{c} p{p} d{d}"
    return row("Llama 3 405B (H100)", run, flops, gpus, tflops, e.step_s, e.note)


# NeMo AutoModel's performance summary (NVIDIA-NeMo/Automodel docs/performance-summary.md,
# "System: DGX-H100, Precision: BF16", mock data, "Fake balanced gate is enabled to simulate
# ideal expert routing"): Qwen3 MoE 30B (30B-A3B: 48 layers, d 2,048, 32 heads of 128, 4 KV
# heads, 128 experts of 768, top-8, vocabulary 151,936) on 8 GPUs, EP 8, FSDP 8, global
# batch 512 of 4,096 tokens, 4 a GPU a micro-step, 16 micro-steps: 21.773 s a step.
QWEN3_MOE = dict(
    d_model=2048, n_heads=32, n_kv_heads=4, d_head=128, d_ff=6144, vocab=151936, n_layers=48,
    n_experts=128, top_k=8, d_expert=768, dispatch="gather", capacity_factor=1.0, dtype="bfloat16",
    master_weights=True, seq_len=4096,
)  # fmt: skip


def qwen3_moe() -> dict:
    """The Qwen3 30B-A3B run: one micro-step of 4 sequences a GPU, ``[EP, BP, Z3]`` over the
    8 GPUs, attention fused; the step is 16 micro-steps and one optimizer update (the
    optimizer's ops priced once: ``16 (micro-step - update) + update``). The run is dropless
    under a balanced gate: every expert gets exactly its share, so the capacity form at
    capacity 1.0 drops nothing and computes what it does (the zoo's dropless "ragged" form
    plans 48 conflicts under EP, a known limit)."""
    gpus, micro, steps, published = 8, 4, 16, 21.773
    config = lm.Config(**QWEN3_MOE, batch=gpus * micro)
    ex = build("lm", config, abstract=True)
    program = wb.capture(ex.fn, *ex.args)
    plan = [wb.EP("expert"), wb.BP("expert"), wb.Z3("expert")]
    e = wb.Session(program, wb.Mesh({"expert": gpus}), plan).estimate(FUSED_H100)
    update = sum(o.total_s for o in e.ops if program.ops[o.op].phase == "optimizer")
    step = steps * (e.step_s - update) + update
    # its FLOPs as the summary counts them, from its step and rate (277 TFLOP/s a GPU)
    flops = 277e12 * gpus * published
    run = "Qwen3 30B-A3B, EP 8, FSDP 8"
    return row("NeMo AutoModel (H100)", run, flops, gpus, 277, step, e.note)


# The same table: Llama3 70B (80 layers, d 8,192, 64 heads of 128, 8 KV heads, FFN 28,672,
# SwiGLU, vocabulary 128,256) on 64 GPUs, GBS 128, LBS 1, GA 4, sequence 8,192, CP 2, FSDP
# 32, "TE + fsdp2_prefetch": 18.90 s a step, 389 TFLOP/s a GPU.
LLAMA3_70B = dict(
    d_model=8192, n_heads=64, n_kv_heads=8, d_head=128, d_ff=28672, mlp="swiglu",
    vocab=128256, n_layers=80, dtype="bfloat16", master_weights=True, seq_len=8192,
)  # fmt: skip


def llama3_70b_cp() -> dict:
    """The Llama 3 70B run with context parallelism: one micro-step, a sequence per pair of
    GPUs, ``[CP(ring, balanced), BP, Z3]`` on {data: 32, context: 2}, attention fused (as
    Transformer Engine's context parallelism runs it: a ring of flash blocks, load-balanced),
    FSDP's gathers prefetched (``overlap="prefetch"``); the step is 4 micro-steps and one
    update. Assumed: full activation checkpointing (without it the estimate's peak is 184
    GiB a GPU, beyond the H100's 80 GB)."""
    gpus, micro_steps, published, tflops = 64, 4, 18.90, 389
    config = lm.Config(**LLAMA3_70B, batch=32, remat=True)
    ex = build("lm", config, abstract=True)
    program = wb.capture(ex.fn, *ex.args)
    plan = [wb.CP("context", kind="ring", balance=True), wb.BP("data"), wb.Z3("data")]
    session = wb.Session(program, wb.Mesh({"data": 32, "context": 2}), plan)
    e = session.estimate(FUSED_H100, overlap="prefetch")
    update = sum(o.total_s for o in e.ops if program.ops[o.op].phase == "optimizer")
    step = micro_steps * (e.step_s - update) + update
    flops = tflops * 1e12 * gpus * published
    return row(
        "NeMo AutoModel (H100)", "Llama 3 70B, CP 2, FSDP 32", flops, gpus, tflops, step, e.note
    )
