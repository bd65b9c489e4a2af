"""Where a mesh's devices lie on a hardware's levels (``core/hardware/placement.py``).

`placement_rows`: the ranked placements of ``Session.placements`` as plain dicts (step,
ratio to the fastest, whether it is the session's). `placement_picture`: one placement as
an SVG, one small drawing per mesh axis: the devices in their level groups (a node's
devices in a box, a box per group of each level but the outermost), each device filled
with the colour of its group of that axis (the devices one collective over the axis
joins), so an axis whose groups stay in a node reads as boxes of one colour, and one
whose groups cross nodes as colours repeated across boxes. Device ids and the levels'
groups are core's (``Placement.device_ids``).
"""

from __future__ import annotations

import math
from html import escape

import numpy as np

from workbench.core.layout.mesh import Mesh
from workbench.viz.style import STAGE_FILLS, axis_colors

SHOWN = 10  # placements `placement_rows` lists by default, fastest first
MAX_DEVICES = 256  # beyond this the cells are too many to read one by one
GROUP_FILLS = STAGE_FILLS  # pale fills under black text, distinct for colour-blind readers
_CELL, _PITCH, _PAD, _LABEL, _GAP, _WIDTH = 22.0, 26.0, 4.0, 13.0, 8.0, 640.0
_PER_ROW = 8  # a node's devices per row
_HEAD = 20.0  # an axis's title line


def placement_rows(ranked, current=None, top: int = SHOWN) -> list[dict]:
    """The first ``top`` of ``ranked`` (``Session.placements(hardware)``, fastest first),
    one dict each: ``rank`` (1 for the fastest), ``placement`` (the `Placement`), ``text``
    (its ``str``), ``step_s``, ``ratio`` (its step over the fastest's) and ``current``
    (whether it is ``current``, the session's placement)."""
    rows = []
    fastest = ranked[0].estimate.step_s if len(ranked) else 0.0
    for i, r in enumerate(list(ranked)[:top]):
        step = r.estimate.step_s
        rows.append(
            dict(
                rank=i + 1,
                placement=r.placement,
                text=str(r.placement),
                step_s=step,
                ratio=step / fastest if fastest > 0 else 1.0,
                current=current is not None and r.placement == current,
            )
        )
    return rows


def level_sizes(placement) -> tuple[int, ...]:
    """Devices of one group of each level, innermost first: the product of the axes'
    factors there."""
    return tuple(
        math.prod(fs[j] for _, fs in placement.factors) for j in range(len(placement.levels))
    )


def _boxed(j: int, k: int) -> bool:
    """Whether level ``j``'s groups get a box: all but the outermost (the whole mesh),
    and a single level's (the mesh is its one group)."""
    return j == 0 or j < k - 1


def _layout(sizes: tuple[int, ...]) -> list[tuple]:
    """Per level, innermost first: ``(cols, width, height, child width, child height,
    gap)`` of one of its groups."""
    dims: list[tuple] = []
    for j, n in enumerate(sizes):
        if j == 0:
            cw = ch = _CELL
            gap = _PITCH - _CELL
            cols = min(n, _PER_ROW)
        else:
            cw, ch, gap = dims[-1][1], dims[-1][2], _GAP
            cols = int(max(1, min(n, (_WIDTH + gap) // (cw + gap))))
        rows = math.ceil(n / cols)
        width, height = cols * (cw + gap) - gap, rows * (ch + gap) - gap
        if _boxed(j, len(sizes)):
            width, height = width + 2 * _PAD, height + 2 * _PAD + _LABEL
        dims.append((cols, width, height, cw, ch, gap))
    return dims


def _groups(ids: np.ndarray, mesh: Mesh, axis: str) -> dict[int, tuple[int, list[int]]]:
    """Device id -> (its group of ``axis``, the ids in that group): a group is the devices
    whose mesh coordinates differ in ``axis`` alone; groups are numbered in mesh order."""
    p = mesh.names.index(axis)
    moved = np.moveaxis(ids, p, -1).reshape(-1, mesh.axis_size(axis))
    out = {}
    for g, members in enumerate(moved.tolist()):
        for d in members:
            out[int(d)] = (g, [int(m) for m in members])
    return out


def _coords(ids: np.ndarray, mesh: Mesh) -> dict[int, str]:
    """Device id -> its mesh coordinates as text (``batch 1, model 2``)."""
    out = {}
    for index in np.ndindex(*ids.shape):
        out[int(ids[index])] = ", ".join(f"{a} {i}" for a, i in zip(mesh.names, index))
    return out


def _draw_group(j, x, y, first, sizes, dims, levels, out, cell) -> None:
    """The group of level ``j`` whose first device is ``first``, its corner at (x, y)."""
    cols, width, height, cw, ch, gap = dims[j]
    if _boxed(j, len(sizes)):
        index = first // math.prod(sizes[: j + 1])
        name = escape(f"{levels[j]} {index}")
        out.append(
            f'<g class="wb-level-group" data-level="{escape(levels[j])}" data-index="{index}">'
            f"<title>{name}: devices {first} to {first + math.prod(sizes[: j + 1]) - 1}</title>"
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{height:.1f}" rx="4" '
            f'fill="none" stroke="#777" stroke-dasharray="{"" if j == 0 else "4 2"}"/>'
            f'<text x="{x + _PAD:.1f}" y="{y + _LABEL - 2:.1f}" font-size="9" fill="#555">'
            f"{name}</text></g>"
        )
        x, y = x + _PAD, y + _PAD + _LABEL
    stride = math.prod(sizes[:j])
    for i in range(sizes[j]):
        cx, cy = x + (i % cols) * (cw + gap), y + (i // cols) * (ch + gap)
        if j == 0:
            cell(first + i, cx, cy)
        else:
            _draw_group(j - 1, cx, cy, first + i * stride, sizes, dims, levels, out, cell)


def _axis_title(placement, mesh: Mesh, axis: str) -> str:
    on = [f"{lv} {f}" for lv, f in zip(placement.levels, placement.of(axis)) if f > 1]
    n = mesh.size // mesh.axis_size(axis)
    return (
        f"{axis} ({mesh.axis_size(axis)}): {' x '.join(on) or 'one device'} · "
        f"{n} group{'s' * (n != 1)}" + (" (colours repeat)" if n > len(GROUP_FILLS) else "")
    )


def placement_picture(placement, mesh: Mesh) -> str:
    """The SVG of ``placement`` (a `Placement` of ``mesh``): per mesh axis, in mesh order,
    every device once (``wb-device`` with ``data-axis``, ``data-device`` and
    ``data-group``) in its level groups (``wb-level-group`` boxes), filled by its group of
    that axis; each cell says its id, and on hover its mesh coordinates and its group."""
    sizes = level_sizes(placement)
    placement.check(mesh, sizes)  # a placement of another mesh: core's message
    ids = placement.device_ids(mesh)
    if mesh.size > MAX_DEVICES:
        text = (
            f"{mesh.size} devices: more than {MAX_DEVICES}, too many to draw one by one. "
            f"{placement}"
        )
        return (
            '<svg xmlns="http://www.w3.org/2000/svg" width="640" height="24" '
            'class="wb-placement" font-family="sans-serif">'
            f'<text x="4" y="16" font-size="12">{escape(text)}</text></svg>'
        )
    dims = _layout(sizes)
    coords = _coords(ids, mesh)
    colours = axis_colors(mesh)
    titles = {a: _axis_title(placement, mesh, a) for a in mesh.names}
    body, y = [], 0.0
    for axis in mesh.names:
        groups = _groups(ids, mesh, axis)
        body.append(
            f'<g class="wb-placement-axis" data-axis="{escape(axis)}">'
            f'<text x="0" y="{y + 14:.1f}" font-size="12" font-weight="bold" '
            f'fill="{colours[axis]}">{escape(titles[axis])}</text>'
        )

        def cell(d, cx, cy, axis=axis, groups=groups):
            g, members = groups[d]
            tip = f"device {d} · {coords[d]} · {axis} group {g}: devices " + ", ".join(
                map(str, members)
            )
            body.append(
                f'<g class="wb-device" data-axis="{escape(axis)}" data-device="{d}" '
                f'data-group="{g}"><title>{escape(tip)}</title>'
                f'<rect x="{cx:.1f}" y="{cy:.1f}" width="{_CELL:.0f}" height="{_CELL:.0f}" '
                f'rx="3" fill="{GROUP_FILLS[g % len(GROUP_FILLS)]}" stroke="{colours[axis]}"/>'
                f'<text x="{cx + _CELL / 2:.1f}" y="{cy + _CELL / 2 + 3.5:.1f}" '
                f'text-anchor="middle" font-size="10">{d}</text></g>'
            )

        k = len(sizes) - 1
        _draw_group(k, 0.0, y + _HEAD, 0, sizes, dims, placement.levels, body, cell)
        body.append("</g>")
        y += _HEAD + dims[k][2] + 10
    width = max(dims[-1][1], *(7.0 * len(t) for t in titles.values()))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{y:.0f}" '
        f'viewBox="0 0 {width:.0f} {y:.0f}" font-family="sans-serif" class="wb-placement">'
        + "".join(body)
        + "</svg>"
    )
