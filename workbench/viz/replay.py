"""Watching propagation: a tactic's events as frames over a drawn graph, and a filmstrip.

``replay_frames(picture, program, events, mesh)`` says, per event of ``Session.events``,
which SVG elements it lights (the edges carrying the value, or the box holding it; the
node of the op it flowed over) and in which colour (its axis's; red for a conflict). The
notebook panel plays them; ``filmstrip`` draws a few of them side by side, as a static
picture for docs and the course.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from workbench.core.errors import UnknownValueError
from workbench.core.gcpause import without_gc
from workbench.core.ir.program import Program
from workbench.core.layout.mesh import Mesh
from workbench.core.propagate.explain import Event
from workbench.viz import style
from workbench.viz.graph import Picture

NEW = 4.5  # stroke width of what the current event lit
LIT = 3.0  # stroke width of what earlier events lit


def value_elements(picture: Picture, program: Program, vid: int) -> tuple[str, ...]:
    """The elements showing value ``vid``: its edges, else the node or box making it."""
    if vid in picture.value_elements:
        return picture.value_elements[vid]
    producer = program.values[vid].producer
    node = None if producer is None else picture.op_element.get(producer)
    return (node,) if node else ()


def find_value(program: Program, text: str, *, exact: bool = False) -> int | None:
    """The value named ``text``; else (unless ``exact``) the first whose name holds it."""
    text = text.strip()
    if not text:
        return None
    try:
        return program.value(text).id
    except UnknownValueError:
        if exact:
            return None
    low = text.lower()
    return next((v.id for v in program.values if low in v.name.lower()), None)


def event_frames(events: Sequence[Event], mesh: Mesh) -> list[dict]:
    """Per event (in order): ``index``, ``kind``, ``axis``, ``color`` (its axis's; red for a
    conflict), ``text``, the ``value`` name and id (``vid``), the op's id (``oid``) and
    whether it is a ``conflict``. Independent of the drawing."""
    colors = style.axis_colors(mesh)
    return [
        dict(
            index=e.index,
            kind=e.kind,
            axis=e.axis,
            color=style.CONFLICT if e.kind == "conflict" else colors.get(e.axis, style.REPLICATED),
            text=e.text,
            value=e.value,
            vid=e.value_id,
            oid=e.op_id,
            conflict=e.kind == "conflict",
        )
        for e in events
    ]


@without_gc
def event_elements(picture: Picture, program: Program, events: Sequence[Event]) -> dict:
    """Where the events land in the drawing: ``"v<id>"`` -> the elements showing that value,
    ``"o<id>"`` -> the node of that op (only for the values and ops the events name)."""
    where: dict[str, list[str]] = {}
    for e in events:
        if e.value_id is not None and f"v{e.value_id}" not in where:
            where[f"v{e.value_id}"] = list(value_elements(picture, program, e.value_id))
        if e.op_id is not None and f"o{e.op_id}" not in where:
            node = picture.op_element.get(e.op_id)
            where[f"o{e.op_id}"] = [node] if node else []
    return where


def replay_frames(
    picture: Picture, program: Program, events: Sequence[Event], mesh: Mesh
) -> list[dict]:
    """``event_frames`` with, per event, the elements it lights: ``values`` (the value's
    edges, or the box holding it) and ``op`` (the op's node, or None)."""
    where = event_elements(picture, program, events)
    frames = event_frames(events, mesh)
    for f in frames:
        f["values"] = where.get(f"v{f['vid']}", [])
        f["op"] = (where.get(f"o{f['oid']}") or [None])[0]
    return frames


def cut_points(n_events: int, frames: int) -> list[int]:
    """``frames`` event counts spread over ``1..n_events`` (the last one included)."""
    if n_events == 0:
        return [0]
    frames = max(1, min(frames, n_events))
    return sorted({max(1, round(n_events * (j + 1) / frames)) for j in range(frames)})


def _frame_css(prefix: str, frames: Sequence[dict], upto: int) -> str:
    """CSS lighting what events ``1..upto`` reached (the last one thicker)."""
    color: dict[str, tuple[str, float]] = {}
    for f in frames[:upto]:
        for el in (*f["values"], f["op"]):
            if el:
                color[el] = (f["color"], LIT)
    if upto:
        last = frames[upto - 1]
        for el in (*last["values"], last["op"]):
            if el:
                color[el] = (last["color"], NEW)
    frame = prefix.rstrip("-")
    rules = [f"#{frame} g.edge, #{frame} g.node {{opacity: 0.3}}"]  # the rest, faded
    for el, (c, w) in color.items():
        rules.append(
            f"#{prefix}{el} {{opacity: 1 !important}} #{prefix}{el} path, #{prefix}{el} polygon, "
            f"#{prefix}{el} ellipse {{stroke: {c} !important; stroke-width: {w}px !important}}"
        )
    return "\n".join(rules)


def filmstrip(
    svg: str,
    frames: Sequence[dict],
    *,
    count: int = 6,
    columns: int = 3,
    title: str = "",
    width: float = 420.0,
) -> str:
    """``count`` frames of a replay side by side, as one SVG: each a copy of ``svg`` (a
    `Picture` rendered with ``to_svg``) with what the events so far reached drawn in their
    axis colours, the newest thicker, the rest faded, under a caption saying which event it
    is. Draw ``svg`` with ``changed=()`` so nothing is bold before its event."""
    svg = svg[svg.index("<svg") :]
    view = re.search(r'viewBox="([^"]+)"', svg)
    _, _, w, h = (float(x) for x in view.group(1).split())
    body = svg[svg.index(">") + 1 : svg.rindex("</svg>")]
    scale = width / w
    cell_h = h * scale + 34
    cuts = cut_points(len(frames), count)
    rows = -(-len(cuts) // columns)
    parts = []
    top = 28 if title else 0
    for j, k in enumerate(cuts):
        prefix = f"f{j}-"
        x, y = (j % columns) * (width + 16), top + (j // columns) * (cell_h + 12)
        framed = re.sub(r'\bid="([^"]+)"', lambda m, p=prefix: f'id="{p}{m[1]}"', body)
        caption = "before the tactic" if k == 0 else f"event {k} of {len(frames)}"
        text = frames[k - 1]["text"] if k else ""
        parts.append(
            f'<g transform="translate({x:.1f},{y:.1f})">'
            f'<text x="0" y="13" font-family="Helvetica" font-size="13" font-weight="bold">'
            f"{_xml(caption)}</text>"
            f'<text x="0" y="28" font-family="Helvetica" font-size="10" fill="#444">'
            f"{_xml(_cut(text, int(width / 5.6)))}</text>"
            f'<svg id="f{j}" x="0" y="34" width="{width:.1f}" height="{h * scale:.1f}" '
            f'viewBox="{view.group(1)}">'
            f"<style>{_frame_css(prefix, frames, k)}</style>{framed}</svg></g>"
        )
    total_w = columns * width + (columns - 1) * 16
    total_h = top + rows * (cell_h + 12)
    head = (
        f'<text x="0" y="18" font-family="Helvetica" font-size="15" font-weight="bold">'
        f"{_xml(title)}</text>"
        if title
        else ""
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" '
        f'width="{total_w:.0f}" height="{total_h:.0f}" viewBox="0 0 {total_w:.0f} {total_h:.0f}">'
        f'<rect width="100%" height="100%" fill="white"/>{head}{"".join(parts)}</svg>'
    )


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
