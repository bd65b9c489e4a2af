"""The device grid: which devices hold which block of one value, for any rank.

What ``jax.debug.visualize_array_sharding`` shows for 2-D arrays, from a ``Sharding`` and a
``Mesh`` alone (no devices needed), extended to N-D by faceting over the leading dims.

A dimension tiled over axes ``(a, b)`` (major to minor) is cut into ``|a|*|b|`` blocks;
the device at mesh coordinates ``(.., ia, .., ib, ..)`` holds block ``ia*|b| + ib``.
Axes that tile no dimension replicate the value. Devices are numbered row-major over
the mesh, as ``np.arange(mesh.size).reshape(mesh.sizes)`` would lay them out. A pending
reduction changes no block: every device holds a partial term of its block, and the
pictures say so.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.core.errors import MeshError
from workbench.core.layout.mesh import Mesh
from workbench.core.layout.sharding import Sharding
from workbench.viz.style import PALETTE, partial_note

MAX_FACETS = 16  # beyond this many leading blocks, they are stacked as rows instead


def _block_of(sharding: Sharding, mesh: Mesh) -> dict[tuple[int, ...], tuple[int, ...]]:
    """Device position -> per dimension the index of the block it holds."""
    where = {a: i for i, a in enumerate(mesh.names)}
    size = dict(mesh.axes)
    missing = [a for a in sharding.tiled_axes if a not in size]
    if missing:
        raise MeshError(
            f"{sharding} is tiled over {missing}, which {mesh} does not have; "
            "draw it with the mesh its session uses."
        )
    out = {}
    for pos in itertools.product(*map(range, mesh.sizes)):
        key = []
        for axes in sharding.dims:
            b = 0
            for a in axes:
                b = b * size[a] + pos[where[a]]
            key.append(b)
        out[pos] = tuple(key)
    return out


def _bounds(sharding: Sharding, mesh: Mesh, dim: int, b: int) -> tuple[int, int]:
    """Start and stop of block ``b`` of dimension ``dim``."""
    n = sharding.shape[dim]
    step = -(-n // sharding.shards(dim, mesh))
    return min(b * step, n), min((b + 1) * step, n)


def device_blocks(sharding: Sharding, mesh: Mesh) -> dict[tuple[int, ...], tuple[slice, ...]]:
    """Device position (mesh coordinates) -> the block of the global array it holds.

    With pending reductions (``sharding.partial``) each device holds a partial term of
    that block, not its value: ``partial_note(sharding)`` says so in words.
    """
    return {
        pos: tuple(slice(*_bounds(sharding, mesh, d, b)) for d, b in enumerate(block))
        for pos, block in _block_of(sharding, mesh).items()
    }


def _runs(ids: list[int]) -> str:
    """``[0, 1, 2, 3]`` -> ``0-3``; ``[0, 1]`` -> ``0,1``."""
    parts, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[i - 1] + 1:
            run = ids[start:i]
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ",".join(map(str, run)))
            start = i
    return ",".join(parts)


def _holders(sharding: Sharding, mesh: Mesh) -> dict[tuple[int, ...], str]:
    """Block -> the devices holding it, as a label: ``"0,1 | 4,5"``.

    Devices are grouped by all replicating axes but the minor-most one, so each ``|``
    part runs along that axis.
    """
    held: dict[tuple[int, ...], list[int]] = {}
    for pos, block in _block_of(sharding, mesh).items():
        held.setdefault(block, []).append(int(np.ravel_multi_index(pos, mesh.sizes)))
    tiled = set(sharding.tiled_axes)
    free = [size for a, size in mesh.axes if a not in tiled]  # sizes of replicating axes
    width = free[-1] if free else 1
    return {
        block: " | ".join(_runs(ids[i : i + width]) for i in range(0, len(ids), width))
        for block, ids in held.items()
    }


def _cells(sharding: Sharding, mesh: Mesh):
    """The 2-D view: per leading block (facet), rows x cols of (label, block index)."""
    rank = sharding.rank
    counts = [sharding.shards(d, mesh) for d in range(rank)]
    rows_d, cols_d = (rank - 2, rank - 1) if rank >= 2 else (None, 0 if rank else None)
    n_rows = counts[rows_d] if rows_d is not None else 1
    n_cols = counts[cols_d] if cols_d is not None else 1
    holders = _holders(sharding, mesh)
    facets = list(itertools.product(*map(range, counts[: max(rank - 2, 0)])))
    grid = {}
    for lead in facets:
        grid[lead] = [
            [
                lead + ((r,) if rows_d is not None else ()) + ((c,) if cols_d is not None else ())
                for c in range(n_cols)
            ]
            for r in range(n_rows)
        ]
    return grid, holders, rows_d, cols_d


def _span(sharding: Sharding, mesh: Mesh, dim: int | None, b: int) -> str:
    """``"0:4"``: block ``b`` of dimension ``dim`` as an index range (``""`` for no dim)."""
    return "" if dim is None else "{}:{}".format(*_bounds(sharding, mesh, dim, b))


def _facet_title(sharding: Sharding, mesh: Mesh, lead: tuple[int, ...], rest=(":", ":")) -> str:
    """``[0:2, :, :]``: the leading block ``lead``, then ``rest``."""
    return (
        "[" + ", ".join([*(_span(sharding, mesh, d, b) for d, b in enumerate(lead)), *rest]) + "]"
    )


def _title(sharding: Sharding, mesh: Mesh) -> str:
    return f"{sharding} on {mesh}"


def device_grid_text(sharding: Sharding, mesh: Mesh) -> str:
    """A compact table: rows and columns are index ranges, cells the devices holding them."""
    grid, holders, rows_d, cols_d = _cells(sharding, mesh)
    lines = [_title(sharding, mesh)]
    if sharding.partial:
        lines.append(partial_note(sharding))
    for lead, rows in grid.items():
        if lead:
            lines.append(_facet_title(sharding, mesh, lead))
        head = [""] + [_span(sharding, mesh, cols_d, c) for c in range(len(rows[0]))]
        table = [head] + [
            [_span(sharding, mesh, rows_d, r)] + [holders[b] for b in row]
            for r, row in enumerate(rows)
        ]
        widths = [max(len(row[i]) for row in table) for i in range(len(head))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
    return "\n".join(lines)


def device_grid(sharding: Sharding, mesh: Mesh) -> go.Figure:
    """A plotly figure of the value's blocks, each labelled with the devices holding it.

    Rank <= 2: one grid (rows: dim 0, columns: dim 1). Higher ranks: one grid of the last
    two dims per block of the leading dims (up to 16 facets), else the leading blocks
    stacked as rows. The title is ``str(sharding)``; pending reductions add a note.
    """
    grid, holders, rows_d, cols_d = _cells(sharding, mesh)
    if len(grid) > MAX_FACETS:  # stack the leading blocks as rows of one grid
        row_titles = [
            _facet_title(sharding, mesh, lead, (_span(sharding, mesh, rows_d, r), ":"))
            for lead, rows in grid.items()
            for r in range(len(rows))
        ]
        grid = {(): [row for rows in grid.values() for row in rows]}
    else:
        row_titles = None
    n = len(grid)
    cols = min(n, 4)
    fig = make_subplots(
        rows=math.ceil(n / cols),
        cols=cols,
        subplot_titles=[_facet_title(sharding, mesh, lead) for lead in grid] if n > 1 else None,
        horizontal_spacing=0.06,
        vertical_spacing=0.12,
    )
    order = {b: i for i, b in enumerate(holders)}
    colorscale = _discrete_scale(len(order))
    for i, rows in enumerate(grid.values()):
        x = [_span(sharding, mesh, cols_d, c) for c in range(len(rows[0]))]
        y = row_titles or [_span(sharding, mesh, rows_d, r) for r in range(len(rows))]
        fig.add_trace(
            go.Heatmap(
                z=[[order[b] for b in row] for row in rows],
                x=x,
                y=y,
                text=[[holders[b] for b in row] for row in rows],
                texttemplate="%{text}",
                hovertemplate="rows %{y}, cols %{x}<br>devices %{text}<extra></extra>",
                colorscale=colorscale,
                zmin=-0.5,
                zmax=len(order) - 0.5,
                showscale=False,
                xgap=2,
                ygap=2,
            ),
            row=i // cols + 1,
            col=i % cols + 1,
        )
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(type="category", side="top")
    title = _title(sharding, mesh)
    if sharding.partial:
        title += f"<br><sup>{partial_note(sharding)}</sup>"
    fig.update_annotations(yshift=20)  # facet titles above the column ranges on top
    fig.update_layout(title=dict(text=title), margin=dict(t=110 if n > 1 else 70))
    return fig


def _discrete_scale(n: int) -> list[list]:
    """A stepwise colour scale: value ``i`` (of ``n``) gets a light version of palette colour i."""
    colors = [_lighten(PALETTE[i % len(PALETTE)]) for i in range(n)]
    if n == 1:
        return [[0, colors[0]], [1, colors[0]]]
    scale = []
    for i, c in enumerate(colors):
        scale += [[i / n, c], [(i + 1) / n, c]]
    return scale


def _lighten(hex_color: str, amount: float = 0.55) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    r, g, b = (round(v + (255 - v) * amount) for v in (r, g, b))
    return f"#{r:02x}{g:02x}{b:02x}"
