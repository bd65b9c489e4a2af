"""Expert and context parallelism priced: the simulator's collectives beside closed forms.

Programs from shapes only (zoo LM, bfloat16, Adam, float32 master weights) on the ``H100``
preset; closed forms priced with its own formulas (``hardware/collectives.py``).

**EP** (Mixtral widths: d 4096, 8 experts of d_ff 14336, top-2, capacity 1.25, a 4,096-token
sequence a device, n = 8). Textbook: a dispatch and a combine all-to-all a layer each way,
of tokens x top_k x capacity x d x 2 bytes. EP then BP (EP fences the experts dim where it
meets the tokens) makes exactly those, with both capacity forms; BP then EP on one axis is
refused. EP alone all-reduces the combined tokens; the dropless (ragged) form also its
experts' hidden (each device's rows are a pending sum the plan reduces before the
activation). What XLA makes of EP then BP's shardings (tiny ``moe`` preset).

**CP** (Llama 3 8B widths, multi-head so d_kv = d; ``CP('seq', dim=1)``, one sequence).
Each device projects K and V on its part of the sequence and each layer's attention
gathers them; backward gathers them again (remat) and reduce-scatters their gradients.
The zoo attention materialises its scores. The ring kind passes K and V C - 1 times each
way and their float32 gradients C times, each step behind its block; under remat its
recomputation's output is the forward ring's, kept. Balanced (``balance=True``), each step
of a causal ring costs its busiest device's unmasked pairs of chunks.

**Expert load** (``estimate(expert_load=skew)``): the capacity form's step is static and
drops the choices over its slots; the dropless form's grouped matmuls run the busiest
device's rows.

**Published**: Llama 3 405B (Grattafiori et al. 2024, Table 4): 16,384 H100, TP 8, PP 16:
400 TFLOP/s a GPU (CP 1), 380 (CP 16, 128K). DeepSeek-V3 (report, 2024): 180K H800 GPU
hours a trillion tokens (EP 64, PP 16, FP8). Ours: a layer's marginal cost (4 layers less
2) scaled to all layers, no pipeline, no data parallelism.

    python benchmarks/experts_context.py [--skip-xla] [--seqs 8192 ...]
"""

import argparse
import math
from collections import Counter

import _common

import workbench as wb
from workbench.core import hardware as hw
from workbench.core.hardware.collectives import collective_time
from workbench.core.layout.redistribute import wire_bytes
from workbench.models import build, lm

H100, BF16 = hw.H100, 2
MIXTRAL = dict(d_model=4096, n_heads=32, d_head=128, d_ff=14336, vocab=32000)
MOE = dict(n_experts=8, top_k=2, capacity_factor=1.25)
LLAMA8B = dict(d_model=4096, n_heads=32, d_head=128, d_ff=14336, vocab=128256)


def capture(**kw):
    base = dict(dtype="bfloat16", master_weights=True, n_layers=2)
    ex = build("lm", lm.Config(**{**base, **kw}), abstract=True)
    return wb.capture(ex.fn, *ex.args)


def per_layer(program, estimate, mesh, axis, layers, scope):
    """``{phase: (kinds, wire bytes, seconds)}`` per layer of the collectives over ``axis``
    made for ops whose value name holds ``scope``."""
    out = {}
    for phase in ("forward", "backward"):
        kinds, sent, secs = Counter(), 0.0, 0.0
        for ce in estimate.collectives:
            c = ce.collective
            if c.op is None or program.ops[c.op].phase != phase or axis not in c.axes:
                continue
            if scope not in program.values[c.value].name:
                continue
            n = math.prod(mesh.axis_size(a) for a in c.axes)
            kinds[c.kind] += c.count
            sent += wire_bytes(c.kind, c.bytes, n) * c.count
            secs += ce.total_s
        kinds = {k: v // layers for k, v in kinds.items()}
        out[phase] = (kinds, sent / layers, secs / layers)
    return out


def short(kinds) -> str:
    abbrev = {"all-to-all": "A2A", "all-gather": "AG", "reduce-scatter": "RS", "all-reduce": "AR"}
    return " ".join(f"{v} {abbrev.get(k, k)}" for k, v in sorted(kinds.items())) or "none"


def mb(x):
    return f"{x / 1e6:.0f}"


def ms(x):
    return f"{x * 1e3:.3f}"


# -- EP -----------------------------------------------------------------------------------


def ep_rows(n=8, seq=4096):
    """Per MoE layer collectives against the closed form, and the whole 2-layer step."""
    rows, steps = [], []
    mesh = wb.Mesh({"expert": n})
    a2a = seq * MOE["top_k"] * MOE["capacity_factor"] * MIXTRAL["d_model"] * BF16
    reduce = n * seq * MIXTRAL["d_model"] * BF16  # EP alone: every token on each device
    for dispatch in ("einsum", "gather", "ragged"):
        program = capture(batch=n, seq_len=seq, **MIXTRAL, **MOE, dispatch=dispatch)
        plans = {
            "EP, BP": ([wb.EP("expert"), wb.BP("expert")], "all-to-all", 2 * a2a),
            "EP alone": ([wb.EP("expert")], "all-reduce", reduce),
        }
        if dispatch == "ragged":  # dropless: the tokens stay whole on the experts' axis
            del plans["EP, BP"]
        for name, (schedule, kind, textbook) in plans.items():
            s = wb.Session(program, mesh, schedule)
            e = s.estimate(H100)
            got = per_layer(program, e, mesh, "expert", 2, "/moe/experts/")
            count = 2 if kind == "all-to-all" else 1
            closed_s = count * collective_time(kind, textbook / count, ("expert",), mesh, H100)
            closed_b = wire_bytes(kind, textbook / count, n) * count
            for phase in ("forward", "backward"):
                kinds, sent, secs = got[phase]
                rows.append(
                    [
                        f"{name} ({dispatch})",
                        phase,
                        short(kinds),
                        mb(sent),
                        ms(secs),
                        f"{count} {'A2A' if count == 2 else 'AR'}",
                        mb(closed_b),
                        ms(closed_s),
                        f"{secs / closed_s:.2f}",
                    ]
                )
            grads = sum(
                ce.total_s
                for ce in e.collectives
                if "grads/" in program.values[ce.collective.value].name
                and "/moe/experts/" in program.values[ce.collective.value].name
            )
            steps.append(
                [
                    f"{name} ({dispatch})",
                    len(s.conflicts),
                    f"{e.step_s * 1e3:.1f}",
                    f"{e.compute_s * 1e3:.1f}",
                    ", ".join(
                        f"{short({k: 1})[2:]} {v * 1e3:.1f}" for k, v in e.by_kind.items() if v
                    )
                    or "none",
                    f"{grads * 1e3:.1f}",
                    str(s.sharding("opt_state/master/layers/0/moe/experts/w_in")),
                    f"{e.memory.peak / 2**30:.1f}",
                ]
            )
    return rows, steps


def load_rows(n=8, seq=4096, loads=(1.0, 1.5, 2.0, 4.0)):
    """The 2-layer step under expert loads (skew: the busiest expert's token choices over
    the mean): the capacity form (gather, EP then BP) drops choices over its slots at an
    unchanged step; the dropless form (ragged) under EP alone runs the busiest device's
    rows."""
    mesh = wb.Mesh({"expert": n})
    capped = capture(batch=n, seq_len=seq, **MIXTRAL, **MOE, dispatch="gather")
    s = wb.Session(capped, mesh, [wb.EP("expert"), wb.BP("expert")])
    ragged = capture(batch=n, seq_len=seq, **MIXTRAL, **MOE, dispatch="ragged")
    r = wb.Session(ragged, mesh, [wb.EP("expert")])
    rows = []
    for load in loads:
        e = s.estimate(H100, expert_load=load)
        c = e.experts[0]
        row = [f"{load:g}", f"{c.capacity}", f"{c.dropped:.1%}", f"{e.step_s * 1e3:.1f}"]
        f = r.estimate(H100, expert_load=load)
        row += [f"{f.experts[0].device_load:.2f}x", f"{f.compute_s * 1e3:.1f}"]
        row += [f"{f.step_s * 1e3:.1f}"]
        rows.append(row)
    return rows


def xla_row():
    """Collectives per kind over the expert axis for EP then BP on the tiny ``moe`` preset:
    the plan's, and XLA's when every decided value is constrained."""
    from workbench.core.xla.crosscheck import compiled_collectives

    ex = build("lm", lm.Config.preset("moe", dispatch="einsum"))
    program = wb.capture(ex.fn, *ex.args)
    s = wb.Session(program, wb.Mesh({"data": 2, "expert": 4}), [wb.EP("expert"), wb.BP("expert")])
    ours = Counter(c.kind for c in s.collectives() for _ in range(c.count))
    xla = Counter(c.kind for c in compiled_collectives(s, "constrained") for _ in range(c.count))
    return [["plan (explicit lowering)", short(ours)], ["XLA, constrained", short(xla)]]


# -- CP -----------------------------------------------------------------------------------


def cp_rows(seqs, c=8, layers=2):
    """Per attention layer collectives against the closed form (``layers`` layers)."""
    rows = []
    d_kv = LLAMA8B["n_heads"] * LLAMA8B["d_head"]
    mesh = wb.Mesh({"seq": c})
    for seq in seqs:
        program = capture(batch=1, seq_len=seq, remat=True, n_layers=layers, **LLAMA8B)
        s = wb.Session(program, mesh, [wb.CP("seq", dim=1)])
        got = per_layer(program, s.estimate(H100), mesh, "seq", layers, "attn")
        closed_b = 2 * seq / c * d_kv * BF16 * (c - 1)
        closed_s = 2 * collective_time("all-gather", seq * d_kv * BF16, ("seq",), mesh, H100)
        closed_rs = 2 * collective_time("reduce-scatter", seq * d_kv * BF16, ("seq",), mesh, H100)
        (fk, fb, fs), (bk, bb, bs) = got["forward"], got["backward"]
        rows.append(
            [
                seq,
                short(fk),
                mb(fb),
                ms(fs),
                mb(closed_b),
                ms(closed_s),
                short(bk),
                mb(bb),
                ms(bs),
                ms(closed_rs),
                len(s.conflicts),
            ]
        )
    return rows


def ring_rows(seqs, c=8, layers=2):
    """Ring against all-gather per attention layer, remat: bytes against the closed forms,
    the seconds the step waits for them (a ring step's transfers run behind its block),
    and the whole step's time and peak."""
    rows = []
    d_kv = LLAMA8B["n_heads"] * LLAMA8B["d_head"]
    mesh = wb.Mesh({"seq": c})
    for seq in seqs:
        program = capture(batch=1, seq_len=seq, remat=True, n_layers=layers, **LLAMA8B)
        block = seq / c * d_kv  # elements of one device's keys (or values)
        for kind in ("all-gather", "ring"):
            s = wb.Session(program, mesh, [wb.CP("seq", kind=kind, dim=1)])
            e = s.estimate(H100)
            got = per_layer(program, e, mesh, "seq", layers, "")
            if kind == "ring":
                closed_f = 2 * (c - 1) * block * BF16
                closed_b = closed_f + 2 * c * block * 4  # gradients as float32
            else:  # backward: gathered again for the recomputation, gradients scattered
                closed_f = 2 * (c - 1) * block * BF16
                closed_b = 2 * closed_f
            (fk, fb, fs), (bk, bb, bs) = got["forward"], got["backward"]
            rows.append(
                [
                    seq,
                    kind,
                    short(fk),
                    mb(fb),
                    mb(closed_f),
                    ms(fs),
                    short(bk),
                    mb(bb),
                    mb(closed_b),
                    ms(bs),
                    f"{e.step_s * 1e3:.1f}",
                    f"{e.memory.peak / 2**30:.1f}",
                ]
            )
    return rows


def balance_rows(seqs, c=8, layers=2):
    """The ring in order against the balanced ring (causal, remat): the whole step, the
    part of a block each balanced step costs on its busiest device against the closed
    form (3 + 2(C - 1)) / 4C, the inputs' transfers into the balanced order, and the peak."""
    rows = []
    mesh = wb.Mesh({"seq": c})
    closed = (3 + 2 * (c - 1)) / (4 * c)
    for seq in seqs:
        program = capture(batch=1, seq_len=seq, remat=True, n_layers=layers, **LLAMA8B)
        plain, e = (
            wb.Session(program, mesh, [wb.CP("seq", kind="ring", dim=1, balance=b)]).estimate(H100)
            for b in (False, True)
        )
        share = e.note.split("each step costs ")[1].split(" of a block")[0]
        into = sum(
            ce.collective.bytes for ce in e.collectives if "load balancing" in ce.collective.why
        )
        rows.append(
            [
                seq,
                f"{plain.step_s * 1e3:.1f}",
                f"{e.step_s * 1e3:.1f}",
                f"{plain.step_s / e.step_s:.2f}x",
                share,
                f"{closed:.0%}",
                f"{into / 1e3:.1f}",
                f"{plain.memory.peak / 2**30:.1f}",
                f"{e.memory.peak / 2**30:.1f}",
            ]
        )
    return rows


def cp_steps(seqs, devices=16, layers=32):
    """Llama 3 8B's shape, ``layers`` layers, remat, a fixed 131,072 tokens a step on
    ``devices``: B = tokens / seq sequences; without CP, BP over B devices and the rest
    repeating their work; with CP, each sequence over C = devices / B; Z3 over every axis."""
    rows, tokens = [], devices * 8192

    def fit(m):
        return f"{m.peak / 2**30:.1f}" + ("" if m.fits else " (no)")

    for seq in seqs:
        b, c = tokens // seq, devices // (tokens // seq)
        program = capture(batch=b, seq_len=seq, remat=True, n_layers=layers, **LLAMA8B)
        mesh = wb.Mesh({k: v for k, v in {"data": b, "seq": c}.items() if v > 1})
        bp = [wb.BP("data")] if b > 1 else []
        z3 = [wb.Z3(a) for a, _ in mesh.axes]
        alone = wb.Session(program, mesh, bp + z3).estimate(H100)
        row = [seq, f"B {b}, C {c}", f"{alone.step_s:.2f}", fit(alone.memory)]
        if c > 1:
            s = wb.Session(program, mesh, [*bp, wb.CP("seq", dim=1), *z3])
            e = s.estimate(H100)
            row += [f"{e.step_s:.2f}", fit(e.memory), f"{e.communication_s / e.step_s:.0%}"]
            row += [f"{alone.step_s / e.step_s:.1f}x", len(s.conflicts)]
        else:
            row += ["-"] * 5
        rows.append(row)
    return rows


# -- published configurations -------------------------------------------------------------


def published_rows():
    rows = []
    ep = [wb.EP("expert"), wb.BP("expert")]
    # Mixtral 8x7B: 32 layers; EP then BP on 8 GPUs, 4,096-token sequences, one a GPU
    mixtral = dict(batch=8, seq_len=4096, **MIXTRAL, **MOE, dispatch="gather")
    rows.append(stack("Mixtral 8x7B, EP 8", mixtral, {"expert": 8}, ep, 32, 4096, "none"))
    # DeepSeek-V3: 256 routed experts top-8 + 1 shared, d 7168, expert d_ff 2048, EP 64
    dsv3 = dict(
        batch=64, seq_len=4096, d_model=7168, n_heads=56, d_head=128, d_ff=18432,
        vocab=129280, n_experts=256, top_k=8, d_expert=2048, n_shared=1, dispatch="gather",
    )  # fmt: skip
    published = "180K H800 GPU h (not comparable)"
    rows.append(
        stack("DeepSeek-V3 (MoE layers), EP 64", dsv3, {"expert": 64}, ep, 61, 4096, published)
    )
    # Llama 3 405B: TP 8 at 8K (CP 1), CP 16 x TP 8 at 128K
    big = dict(d_model=16384, n_heads=128, d_head=128, d_ff=53248, vocab=128256, batch=1)
    tp = [wb.MP("model")]
    rows.append(
        stack("Llama 3 405B 8K, TP 8", {**big, "seq_len": 8192}, {"model": 8}, tp, 126, 8192 / 8,
              "400 TFLOP/s, with PP 16, DP 128")
    )  # fmt: skip
    rows.append(
        stack("Llama 3 405B 128K, CP 16 TP 8", {**big, "seq_len": 131072}, {"seq": 16, "model": 8},
              [*tp, wb.CP("seq", dim=1)], 126, 131072 / 128, "380 TFLOP/s, with PP 16, DP 8")
    )  # fmt: skip
    return rows


def stack(name, config, mesh, schedule, full, tokens_dev, published):
    """One row from estimates at 2 and 4 layers: a layer's marginal time, its FLOP rate and
    communication share, the step of ``full`` layers (2 layers' step plus the rest at the
    marginal time) and its GPU hours per 1e12 tokens."""
    es = [
        wb.Session(capture(**config, n_layers=n), wb.Mesh(mesh), schedule).estimate(H100)
        for n in (2, 4)
    ]
    layer = (es[1].step_s - es[0].step_s) / 2
    flops = (es[1].flops - es[0].flops) / 2 / layer
    comm = (es[1].communication_s - es[0].communication_s) / 2 / layer
    step = es[0].step_s + (full - 2) * layer
    return [
        name,
        f"{layer * 1e3:.1f}",
        f"{flops / 1e12:.0f} ({flops / H100.flops['bfloat16']:.0%})",
        f"{comm:.0%}",
        f"{step:.2f}",
        f"{step / tokens_dev * 1e12 / 3600 / 1e3:.0f}K",
        f"{(es[1].memory.peak - es[0].memory.peak) / 2 / 2**30:.1f}",
        published,
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-xla", action="store_true")
    parser.add_argument("--seqs", type=int, nargs="+", default=[8192, 16384, 32768, 65536, 131072])
    parser.add_argument("--balance-only", action="store_true", help="only the balanced ring")
    args = parser.parse_args()
    if args.balance_only:
        return print_balance(args.seqs)
    print(f"\nExperts and long context on the H100 preset; {_common.machine()}")
    print("\nEP per MoE layer (Mixtral widths, n = 8 over NVLink), MB sent and ms per device\n")
    headers = ["plan", "phase", "simulated", "MB", "ms", "closed form", "MB", "ms"]
    rows, steps = ep_rows()
    print(_common.table([*headers, "sim / closed"], rows))
    print("\nThe same plans, whole 2-layer step (ms; GiB)\n")
    headers = ["plan", "conflicts", "step", "compute", "collectives by kind"]
    headers += ["expert grads reduced", "expert master weights", "peak"]
    print(_common.table(headers, steps))
    print("\nExpert load, whole 2-layer step (Mixtral widths, EP then BP, n = 8; ms)\n")
    headers = ["skew", "capacity (gather)", "dropped", "step"]
    headers += ["dropless busiest device", "compute", "step"]
    print(_common.table(headers, load_rows()))
    if not args.skip_xla:
        print("\nEP, BP on {data: 2, expert: 4}, tiny moe preset, whole step: collectives\n")
        print(_common.table(["lowering", "collectives"], xla_row()))
    print("\nCP per attention layer (Llama 3 8B widths, C = 8, remat), MB sent and ms per device\n")
    headers = ["seq", "forward", "MB", "ms", "closed MB", "closed ms"]
    headers += ["backward", "MB", "ms", "closed RS ms", "conflicts"]
    print(_common.table(headers, cp_rows(args.seqs)))
    print("\nCP ring against all-gather per attention layer (Llama 3 8B widths, C = 8, remat)")
    print("MB sent and ms waited per device; the whole 2-layer step (ms) and its peak (GiB)\n")
    headers = ["seq", "kind", "forward", "MB", "closed MB", "ms waited", "backward", "MB"]
    headers += ["closed MB", "ms waited", "step", "peak"]
    print(_common.table(headers, ring_rows(args.seqs)))
    print_balance(args.seqs)
    print("\n131,072 tokens a step on 16 devices, 32 layers, remat (s; GiB per device)\n")
    headers = ["seq", "sequences, CP", "no CP step", "no CP peak", "CP step", "CP peak"]
    headers += ["CP comm", "CP speed-up", "conflicts"]
    print(_common.table(headers, cp_steps(args.seqs)))
    print("\nPublished configurations: a layer's marginal cost (2 and 4 layers), scaled\n")
    headers = ["configuration", "layer ms", "layer TFLOP/s per GPU (MFU)", "layer comm"]
    headers += ["full step s", "GPU h / 1e12 tokens", "GiB per layer", "published"]
    print(_common.table(headers, published_rows()))


def print_balance(seqs):
    print(
        f"\nCP ring in order against balanced (causal, Llama 3 8B widths, C = 8, remat); {_common.machine()}"
    )
    print(
        "the whole 2-layer step (ms), a balanced step's share of a block, KB into the order, peak (GiB)\n"
    )
    headers = ["seq", "ring step", "balanced step", "speed-up", "balanced share", "closed form"]
    headers += ["KB into order", "ring peak", "balanced peak"]
    print(_common.table(headers, balance_rows(seqs)))


if __name__ == "__main__":
    main()
