"""A ring all-reduce, step by step: n devices on a ring, and the chunk each one sends to its
neighbour in every step, as one SVG.

The schedule and the bytes are core's (``hardware.collectives.ring_all_reduce_steps``):
the array cut into n chunks, n-1 reduce-scatter steps then n-1 all-gather steps, each
device sending one chunk per step.
"""

from __future__ import annotations

import math
from html import escape

from workbench.core.errors import LimitError
from workbench.core.hardware.collectives import ring_all_reduce_steps
from workbench.core.units import format_bytes
from workbench.viz.style import PALETTE

MAX_DEVICES = 16  # beyond this the panels are too small to read
_R, _PANEL = 46.0, 140.0  # ring radius and panel size, in points


def ring_frames(n: int, nbytes: float = 1.0) -> list[dict]:
    """The steps of a ring all-reduce of ``nbytes`` per device over ``n`` devices, as core
    schedules them (``hardware.collectives.ring_all_reduce_steps``), for up to
    `MAX_DEVICES`."""
    if isinstance(n, int) and not isinstance(n, bool) and n > MAX_DEVICES:
        raise LimitError(
            f"n={n} devices: a ring of more than {MAX_DEVICES} is too small to read; "
            "draw a smaller group (the steps repeat the same pattern)."
        )
    return ring_all_reduce_steps(n, nbytes)


def _panel(frame: dict, n: int, x0: float, y0: float) -> list[str]:
    cx, cy = x0 + _PANEL / 2, y0 + _PANEL / 2 + 8
    at = [
        (cx + _R * math.sin(2 * math.pi * i / n), cy - _R * math.cos(2 * math.pi * i / n))
        for i in range(n)
    ]
    title = f"{frame['phase']} {frame['step']}/{n - 1}"
    out = [
        f'<g class="wb-ring-step" data-phase="{frame["phase"]}" data-step="{frame["step"]}">',
        f'<text x="{cx:.1f}" y="{y0 + 12:.1f}" text-anchor="middle" font-size="11">'
        f"{escape(title)}</text>",
    ]
    for src, dst, chunk in frame["sends"]:
        (x1, y1), (x2, y2) = at[src], at[dst]
        colour = PALETTE[chunk % len(PALETTE)]
        mx, my = (x1 + x2) / 2, (y1 + y2) / 2
        lx, ly = cx + (mx - cx) * 1.35, cy + (my - cy) * 1.35
        out.append(
            f'<g class="wb-ring-send" data-chunk="{chunk}"><title>device {src} sends chunk '
            f"{chunk} to device {dst}</title>"
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{colour}" '
            'stroke-width="2.5" marker-end="url(#wb-ring-arrow)"/>'
            f'<text x="{lx:.1f}" y="{ly + 3:.1f}" text-anchor="middle" font-size="9" '
            f'fill="{colour}">c{chunk}</text></g>'
        )
    for i, (x, y) in enumerate(at):
        out.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="9" fill="white" stroke="#444"/>'
            f'<text x="{x:.1f}" y="{y + 3:.1f}" text-anchor="middle" font-size="9">{i}</text>'
        )
    out.append("</g>")
    return out


def ring_allreduce(n: int, nbytes: float = 1.0) -> str:
    """The SVG of a ring all-reduce over ``n`` devices (``ring_frames``): the reduce-scatter
    steps in the first row, the all-gather steps in the second; arrows coloured and
    labelled by chunk. With ``nbytes`` (per device, e.g. a ``Collective.bytes``) the caption
    gives each step's and the whole's bytes sent per device."""
    frames = ring_frames(n, nbytes)
    cols = n - 1
    width, height = cols * _PANEL, 2 * _PANEL + 24
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" class="wb-ring">',
        '<defs><marker id="wb-ring-arrow" viewBox="0 0 10 10" refX="9" refY="5" '
        'markerWidth="5" markerHeight="5" orient="auto-start-reverse">'
        '<path d="M 0 0 L 10 5 L 0 10 z" fill="#444"/></marker></defs>',
    ]
    for f in frames:
        row = 0 if f["phase"] == "reduce-scatter" else 1
        parts += _panel(f, n, (f["step"] - 1) * _PANEL, row * _PANEL)
    step, total = frames[0]["bytes"], sum(f["bytes"] for f in frames)
    caption = (
        f"{n} devices, {len(frames)} steps: each sends one chunk of {format_bytes(step)} "
        f"per step, {format_bytes(total)} in all"
    )
    parts.append(
        f'<text class="wb-ring-caption" x="{width / 2:.1f}" y="{height - 8:.1f}" '
        f'text-anchor="middle" font-size="11">{escape(caption)}</text></svg>'
    )
    return "".join(parts)
