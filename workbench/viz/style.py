"""Colours and short texts shared by every picture: one colour per mesh axis, grey for replicated.

The palette is Okabe and Ito's, which stays distinct under the common colour-vision
deficiencies; axes take its colours in mesh order, so ``batch`` has the same colour in the
program graph, the device grid and the charts.
"""

from __future__ import annotations

from collections.abc import Iterable

from workbench.core.layout.mesh import Mesh
from workbench.core.layout.sharding import REDUCTIONS, Sharding

#: Colours for mesh axes, in mesh order (Okabe-Ito; vermillion late, so red means "conflict").
PALETTE = (
    "#0072B2",  # blue
    "#E69F00",  # orange
    "#009E73",  # bluish green
    "#CC79A7",  # reddish purple
    "#56B4E9",  # sky blue
    "#F0E442",  # yellow
    "#D55E00",  # vermillion
    "#000000",  # black
)
REPLICATED = "#9E9E9E"  # a value whole on every device
CONFLICT = "#D62728"  # an op where propagation stopped
CONFLICT_FILL = "#FDE0DD"


#: Fills of pipeline stages in the program graph, stage 0 first (Paul Tol's "light" scheme,
#: ordered so neighbours contrast: pale enough under black text, distinct under the common
#: colour-vision deficiencies; each node also says its stage in words).
STAGE_FILLS = (
    "#77AADD",  # light blue
    "#EEDD88",  # light yellow
    "#44BBAA",  # mint
    "#FFAABB",  # pink
    "#99DDFF",  # light cyan
    "#BBCC33",  # pear
    "#EE8866",  # orange
    "#AAAA00",  # olive
)


def stage_fill(stage: int) -> str:
    """The fill of pipeline stage ``stage`` (the scheme repeats past eight stages)."""
    return STAGE_FILLS[stage % len(STAGE_FILLS)]


def axis_colors(mesh: Mesh) -> dict[str, str]:
    """Mesh axis -> colour, in mesh order (the palette repeats past eight axes)."""
    return {a: PALETTE[i % len(PALETTE)] for i, a in enumerate(mesh.names)}


def axes_of(shardings: Iterable[Sharding], mesh: Mesh) -> tuple[tuple[str, ...], frozenset]:
    """The axes any of ``shardings`` is tiled on (mesh order), and their pending reductions."""
    tiled: set[str] = set()
    partial: set[tuple[str, str]] = set()
    for s in shardings:
        tiled.update(s.tiled_axes)
        partial.update(s.partial)
    return tuple(a for a in mesh.names if a in tiled), frozenset(partial)


def reductions_text(partial: Iterable[tuple[str, str]]) -> str:
    """``{(model, sum)}`` -> ``{sum: model}``, as ``str(Sharding)`` prints pending reductions."""
    partial = sorted(partial)
    notes = [
        f"{kind}: {','.join(a for a, k in partial if k == kind)}"
        for kind in REDUCTIONS
        if any(k == kind for _, k in partial)
    ]
    return "{" + "; ".join(notes) + "}" if notes else ""


def partial_note(sharding: Sharding) -> str:
    """One sentence on what a pending reduction means for the devices, or ``""``."""
    if not sharding.partial:
        return ""
    axes = ", ".join(a for a, _ in sharding.partial)
    kinds = sorted({k for _, k in sharding.partial})
    return (
        f"{reductions_text(sharding.partial)}: every device holds a partial term; "
        f"the value is the {'/'.join(kinds)} of the terms over {axes}"
    )


# -- charts: what a step's time and memory go to ------------------------------------------------
# Paul Tol's "muted" (time) and "bright" (memory) schemes, also safe for colour-vision
# deficiencies; kept apart from the axis palette, since a chart's colours name parts of a
# step, not mesh axes.
COMPUTE = "#332288"  # indigo
#: the compute bar split by kind (`Estimate.breakdown`): the matmuls in the compute colour
COMPUTE_PARTS = {
    "matmuls": COMPUTE,
    "attention": "#117733",  # green
    "elementwise and copies": "#999933",  # olive
}
KIND_COLORS = {
    "all-gather": "#88CCEE",  # cyan
    "reduce-scatter": "#44AA99",  # teal
    "all-reduce": "#CC6677",  # rose
    "all-to-all": "#DDCC77",  # sand
    "collective-permute": "#AA4499",  # purple
}
CATEGORY_COLORS = {
    "parameters": "#4477AA",  # blue
    "gradients": "#EE6677",  # red
    "optimizer": "#CCBB44",  # yellow
    "activations": "#228833",  # green
    "temporaries": "#BBBBBB",  # grey
}
FITS = "#1A7F37"  # a plan that fits in memory
DOES_NOT_FIT = CONFLICT
