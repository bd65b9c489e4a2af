"""What-if questions on the 70B step, answered by a sweep of simulated steps.

The zoo LM's "huge" preset (70B-shaped: d 8192, 64 heads, d_ff 28672, 80 layers under
``lax.scan``, remat, bfloat16 with float32 master weights and Adam), 256 sequences a step,
from shapes only, swept (`workbench.core.whatif.sweep`) over chip kinds, chip counts, mesh
shapes (a model axis of 1 to 8 inside a node, pipeline stages, the rest data parallel),
ZeRO-3 or not, and the sequence length; recaptured once per sequence length. Prints the
grid's size and wall time, and the answers: the smallest cluster on which the step fits,
the best MFU per chip count, and what the step costs at twice the sequence length.

    python benchmarks/whatif.py [--chips 64 128 ...] [--hardware H100 A100] [--stages 1 4 8]
"""

import argparse
from collections import Counter

import _common

from workbench.core.units import format_bytes, format_seconds
from workbench.core.whatif import sweep
from workbench.models import build, lm


def model(seq_len):
    config = lm.Config.preset("huge", n_layers=80, batch=256, seq_len=seq_len, remat=True)
    ex = build("lm_scan", config, abstract=True)
    return (ex.fn, *ex.args)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chips", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 2048])
    parser.add_argument("--hardware", nargs="+", default=["H100", "A100"])
    parser.add_argument("--stages", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--seqs", type=int, nargs="+", default=[4096, 8192])
    args = parser.parse_args()
    result = sweep(
        model,
        hardware=args.hardware,
        chips=args.chips,
        shapes={"seq_len": args.seqs},
        stages=args.stages,
        microbatches=(4,),
    )
    priced = [p for p in result.points if p.priced]
    print(f"\nWhat if, the 70B step; {_common.machine()}")
    print(
        f"{len(result.points)} plans ({len(priced)} priced, {sum(p.fits for p in priced)} fit, "
        f"{len(result.points) - len(priced)} not plannable) in {result.seconds:.1f} s\n"
    )
    for kind in sorted({p.hardware for p in priced}):
        small = result.smallest_fitting(hardware=kind)
        if small is not None:
            print(f"smallest that fits on {kind}: {_row(small)}")
    reasons = Counter(p.error.split(":")[0] for p in result.points if not p.priced)
    for why, n in reasons.most_common():
        print(f"not plannable ({n}): {why}")
    print()
    rows = []
    for (kind, chips), p in result.best_mfu().items():
        rows.append(
            [
                kind,
                chips,
                _mesh(p),
                p.plan,
                dict(p.shapes)["seq_len"],
                format_seconds(p.step_s),
                f"{p.mfu:.1%}",
                format_bytes(p.peak),
            ]
        )
    headers = ["chips of", "chips", "mesh", "plan", "seq", "step", "MFU", "peak"]
    print(_common.table(headers, rows))
    median, low, high, n = result.scaling("seq_len")
    print(
        f"\ntwice the sequence (4,096 to 8,192): the step takes {median:.2f}x (median of {n} "
        f"plans priced at both; {low:.2f}x to {high:.2f}x)"
    )


def _mesh(p):
    return " x ".join(f"{k} {v}" for k, v in p.mesh)


def _row(p):
    return (
        f"{p.chips} chips ({_mesh(p)}), {p.plan}, seq {dict(p.shapes)['seq_len']}: step "
        f"{format_seconds(p.step_s)}, MFU {p.mfu:.1%}, peak {format_bytes(p.peak)}"
    )


if __name__ == "__main__":
    main()
