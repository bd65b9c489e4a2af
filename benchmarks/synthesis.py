"""Reductions synthesised per level (``hardware/synthesis.py``, after P2: Xie et al., MLSys
2022, arXiv 2110.10548) over a grid of placements x requested reductions, against the
default (one flat ring over the whole group at the slowest link's figures). Simulated, not
measured: every time is the alpha-beta model's, on the presets' cited figures (printed).

Grid: DGX-H100 clusters (8 GPUs a node on NVLink, nodes on InfiniBand) of 16, 64, 256 and
2,048 GPUs; TPU v5p in one slice (256 and 2,048 chips: one ICI level, nothing to
synthesise), two slices of the preset's largest (6,144 chips) over DCN, and 2,048 chips as
8 slices of 256 (the ICI level's group size set to 256 here, a multislice job's shape).
For each cluster, meshes of 2 and 3 axes; each mesh's every placement
(``placements(mesh, links)``, capped at ``--limit``); every requested reduction (all-reduce
and reduce-scatter over each non-empty subset of the mesh's axes) at 64 KiB, 1 MiB,
64 MiB and 1 GiB per device. A pair: one placement and one requested reduction (kind, axes, bytes).

Reported per cluster: the pairs whose group spans more than one level; the share where
the synthesised program beats the default (speedup above 1 by more than 1e-9), the max
and mean speedup (over all pairs, as P2 reports it, and over those spanning levels); the
spread between placements (per mesh and reduction, the slowest placement's time over the
fastest's, synthesised and default); the most frequent winning programs; how often the
synthesised all-reduce beats the hierarchical one (RS inner, AR outer, AG back), and what
share of a permuted reduce-scatter's time its copy takes.

    python benchmarks/synthesis.py [--limit 256] [--spreads]
"""

import argparse
import itertools
import statistics
import time
from collections import Counter

import _common

import workbench as wb
from workbench.core import hardware as hw
from workbench.core.hardware.collectives import synthesised
from workbench.core.hardware.placement import LIMIT, placements
from workbench.core.hardware.synthesis import REDUCTIONS, Program, Step, price

MiB = 2**20
SIZES = {"64 KiB": MiB // 16, "1 MiB": MiB, "64 MiB": 64 * MiB, "1 GiB": 1024 * MiB}
TPU_SLICES = hw.TPU_V5P.with_group_sizes({"ici": 256})
CLUSTERS = [  # (name, hardware, meshes); every mesh of a cluster has its device count
    ("H100 x16 (2 nodes)", hw.H100, [
        {"data": 2, "model": 8}, {"data": 4, "model": 4}, {"data": 2, "fsdp": 2, "model": 4}]),
    ("H100 x64 (8 nodes)", hw.H100, [
        {"data": 8, "model": 8}, {"data": 4, "model": 16}, {"data": 4, "fsdp": 4, "model": 4}]),
    ("H100 x256 (32 nodes)", hw.H100, [
        {"data": 32, "model": 8}, {"data": 16, "model": 16}, {"data": 8, "fsdp": 8, "model": 4}]),
    ("H100 x2048 (256 nodes)", hw.H100, [
        {"data": 256, "model": 8}, {"data": 128, "model": 16},
        {"data": 64, "fsdp": 8, "model": 4}, {"data": 32, "fsdp": 16, "model": 4}]),
    ("TPU v5p x256 (1 slice)", hw.TPU_V5P, [
        {"data": 32, "model": 8}, {"data": 8, "fsdp": 8, "model": 4}]),
    ("TPU v5p x2048 (1 slice)", hw.TPU_V5P, [
        {"data": 256, "model": 8}, {"data": 64, "fsdp": 8, "model": 4}]),
    ("TPU v5p x2048 (8 slices of 256)", TPU_SLICES, [
        {"data": 256, "model": 8}, {"data": 128, "model": 16},
        {"data": 64, "fsdp": 8, "model": 4}, {"data": 32, "fsdp": 16, "model": 4}]),
    ("TPU v5p x12288 (2 slices of 6144)", hw.TPU_V5P, [
        {"data": 1536, "model": 8}, {"data": 96, "fsdp": 16, "model": 8}]),
]  # fmt: skip
P2 = {  # Xie et al., MLSys 2022, arXiv 2110.10548: measured on their GPU clusters
    "beats the default": "69% of (placement, reduction) pairs",
    "max speedup": "2.04x",
    "mean speedup": "1.27x",
    "placement spread": "up to 448x (all-reduce time)",
    "simulator's top-10 holds the best": "over 90% of the time",
}


def requests(mesh: wb.Mesh):
    """Every requested reduction: (kind, axes, size name, bytes per device)."""
    names = mesh.names
    subsets = [c for r in range(1, len(names) + 1) for c in itertools.combinations(names, r)]
    for kind, axes, (label, nbytes) in itertools.product(REDUCTIONS, subsets, SIZES.items()):
        yield kind, axes, label, nbytes


def inputs(name: str, chip) -> list[str]:
    """Each level's alpha-beta figures and their sources."""
    lines = [f"{name}:"]
    for x in chip.links:
        group = x.group_size if x.group_size is not None else "the rest"
        lines.append(
            f"  {x.name}: {x.bandwidth:.3g} B/s per device, {x.latency:.0e} s a step, "
            f"group {group}, {x.topology}"
        )
        for key, text in x.sources.items():
            if key == "group_size" and chip is TPU_SLICES:
                text = f"256 set by this benchmark (256-chip slices, v5p-512); the preset's: {text}"
            lines.append(f"    {key}: {text}")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=LIMIT, help="placements per mesh at most")
    ap.add_argument("--spreads", action="store_true", help="print every mesh x reduction's spread")
    args = ap.parse_args()
    t0 = time.perf_counter()
    stats, spreads, capped = [], [], []
    for cluster, chip, meshes in CLUSTERS:
        st = {"cluster": cluster, "meshes": len(meshes), "placements": 0, "speedups": [],
              "spanning": [], "won": Counter(), "widest": (1.0, 1.0, "-"),
              "over_hier": [], "copy": [], "top": (1.0, "-")}  # fmt: skip
        for axes_sizes in meshes:
            mesh = wb.Mesh(axes_sizes)
            placed = placements(mesh, chip.links, args.limit + 1)
            if len(placed) > args.limit:
                capped.append(f"{cluster} {mesh}")
                placed = placed[: args.limit]
            st["placements"] += len(placed)
            chips = [chip.with_placement(p) for p in placed]
            for kind, axes, label, nbytes in requests(mesh):
                found = [synthesised(kind, nbytes, axes, mesh, c) for c in chips]
                for c, s in zip(chips, found):
                    st["speedups"].append(s.speedup)
                    if len(s.levels) > 1:
                        st["spanning"].append(s.speedup)
                        _against_known(kind, nbytes, axes, mesh, c, s, st)
                    if s.speedup > st["top"][0]:
                        st["top"] = (
                            s.speedup,
                            f"{kind} over {'+'.join(axes)}, {label}, {c.placement}",
                        )
                    if s.speedup > 1 + 1e-9:
                        st["won"][s.program.describe([n for n, _ in s.levels])] += 1
                times = [s.seconds for s in found]
                flats = [s.default_s for s in found]
                synth, flat = max(times) / min(times), max(flats) / min(flats)
                what = f"{kind} over {'+'.join(axes)}, {label}, {mesh}"
                spreads.append((cluster, what, len(found), synth, flat))
                if synth > st["widest"][0]:
                    st["widest"] = (synth, flat, what)
        stats.append(st)
    seconds = time.perf_counter() - t0

    print("# alpha-beta inputs (per level, innermost first; the default runs one ring at")
    print("# the slowest bandwidth and largest latency of the levels its group spans)")
    seen = set()
    for _, chip, _ in CLUSTERS:
        if id(chip) not in seen:
            seen.add(id(chip))
            name = chip.name + (" (ici group 256 set here)" if chip is TPU_SLICES else "")
            print("\n".join("# " + line for line in inputs(name, chip)))
    print()
    print("Simulated (alpha-beta model), per cluster:")
    rows = []
    for st in stats:
        sp, span = st["speedups"], st["spanning"]
        wins, wins_span = _wins(sp), _wins(span)
        rows.append((
            st["cluster"], st["meshes"], st["placements"], len(sp), len(span),
            f"{wins / len(sp):.0%}", f"{wins_span / len(span):.0%}" if span else "-",
            f"{max(sp):.2f}", f"{statistics.fmean(sp):.2f}",
            f"{statistics.fmean(span):.2f}" if span else "-",
            f"{st['widest'][0]:.2f}", f"{st['widest'][1]:.2f}",
        ))  # fmt: skip
    print(_common.table(
        ("cluster", "meshes", "placements", "pairs", "span levels", "beats default",
         "beats, spanning", "max speedup", "mean speedup", "mean, spanning",
         "widest spread", "its default's"),
        rows,
    ))  # fmt: skip
    print()
    print("Widest placement spread per cluster (slowest placement / fastest, synthesised):")
    for st in stats:
        synth, flat, what = st["widest"]
        print(f"- {st['cluster']}: {synth:.2f}x ({flat:.2f}x by default), {what}")
    print()
    print("Largest speedup per cluster (the default's time / the synthesised program's):")
    for st in stats:
        if st["top"][0] > 1:
            print(f"- {st['cluster']}: {st['top'][0]:.2f}x, {st['top'][1]}")
    print()
    print("Most frequent winning programs (pairs won):")
    for st in stats:
        if st["won"]:
            top = "; ".join(f"{p} ({n})" for p, n in st["won"].most_common(3))
            print(f"- {st['cluster']}: {top}")
    over = [x for st in stats for x in st["over_hier"]]
    copies = [x for st in stats for x in st["copy"]]
    print(
        f"All-reduces spanning levels ({len(over)}): the synthesised program beats the "
        f"hierarchical one (RS inner, AR outer, AG back) in {_wins(over)}, by up to "
        f"{max(over):.9f}x. Reduce-scatters won by a permuted program ({len(copies)}): the "
        f"copy is a median {statistics.median(copies):.1%} of its time, at most "
        f"{max(copies):.1%}."
    )
    print()
    print("P2 (measured on GPU clusters) beside ours (simulated; the clusters whose groups")
    print("can span levels, i.e. all but the one-slice TPU pods):")
    print(_common.table(("figure", "P2, measured", "ours, simulated"), _beside(stats, spreads)))
    if args.spreads:
        print()
        print(_common.table(
            ("cluster", "reduction", "placements", "spread synthesised", "spread default"),
            [(c, w, n, f"{a:.2f}", f"{b:.2f}") for c, w, n, a, b in spreads],
        ))  # fmt: skip
    n_pairs = sum(len(st["speedups"]) for st in stats)
    print(
        f"\ngrid: {len(CLUSTERS)} clusters, {sum(st['meshes'] for st in stats)} meshes, "
        f"{sum(st['placements'] for st in stats)} placements, {len(spreads)} mesh x reduction "
        f"cells, {n_pairs} (placement, reduction) pairs; placements capped at {args.limit} a "
        f"mesh ({len(capped)} meshes reached the cap); {seconds:.1f} s"
    )


def hierarchical(k: int) -> Program:
    """The hierarchical all-reduce: reduce-scatter each inner level in turn, all-reduce the
    outermost, all-gather back (NCCL's 2D / Horovod's hierarchical all-reduce)."""
    inner = [Step("reduce-scatter", (j,)) for j in range(k - 1)]
    back = [Step("all-gather", (j,)) for j in reversed(range(k - 1))]
    return Program("all-reduce", (*inner, Step("all-reduce", (k - 1,)), *back))


def _against_known(kind, nbytes, axes, mesh, chip, s, st):
    """Record, for a pair spanning levels, the synthesised program against the
    hierarchical all-reduce, and what share of its time a permutation copy takes."""
    if kind == "all-reduce":
        levels = tuple(chip.spread(mesh, axes))
        st["over_hier"].append(price(hierarchical(len(levels)), levels, nbytes) / s.seconds)
    elif s.program.permuted:
        copy = 2 * nbytes / chip.copy_bandwidth(nbytes) + chip.op_overhead
        st["copy"].append(copy / s.seconds)


def _wins(speedups) -> int:
    return sum(x > 1 + 1e-9 for x in speedups)


def _beside(stats, spreads):
    """P2's figures and ours over the clusters whose groups can span levels."""
    multi = [st for st in stats if st["spanning"]]
    names = {st["cluster"] for st in multi}
    sp = [x for st in multi for x in st["speedups"]]
    span = [x for st in multi for x in st["spanning"]]
    gpu = [x for st in multi if st["cluster"].startswith("H100") for x in st["speedups"]]
    ar = [a for c, w, _, a, _ in spreads if c in names and w.startswith("all-reduce")]
    ar_gpu = [a for c, w, _, a, _ in spreads if c.startswith("H100") and w.startswith("all-r")]
    ar_flat = [b for c, w, _, _, b in spreads if c in names and w.startswith("all-reduce")]
    return [
        ("beats the default", P2["beats the default"],
         f"{_wins(sp) / len(sp):.0%} of {len(sp)} pairs; {_wins(span) / len(span):.0%} of "
         f"the {len(span)} spanning levels; H100 alone {_wins(gpu) / len(gpu):.0%}"),
        ("max speedup", P2["max speedup"], f"{max(sp):.2f}x (H100 {max(gpu):.2f}x)"),
        ("mean speedup", P2["mean speedup"],
         f"{statistics.fmean(sp):.2f}x over all pairs, {statistics.fmean(span):.2f}x over "
         f"those spanning levels; H100 alone {statistics.fmean(gpu):.2f}x"),
        ("placement spread", P2["placement spread"],
         f"up to {max(ar):.2f}x (all-reduce, synthesised; H100 {max(ar_gpu):.2f}x), "
         f"{max(ar_flat):.2f}x (default)"),
        ("simulator's top-10 holds the best", P2["simulator's top-10 holds the best"],
         "not checked (nothing measured here)"),
    ]  # fmt: skip


if __name__ == "__main__":
    main()
