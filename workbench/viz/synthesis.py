"""Reductions synthesised per level (``core/hardware/synthesis.py``), as small timelines.

`synthesis_rows`: an estimate's reductions that carry a ``synthesis`` (a group spanning
levels), one row per program (collectives combined into one bucket share theirs), the
most time first. `synthesis_timeline`: the first few as an SVG, each as its program's
steps in order (``RS nvlink``, ``AR infiniband``, ``AG nvlink``, in core's words) beside
the default (one collective over the whole group, one flat ring), with both times; each
step as wide as its time, both lanes on one scale (a step too short for its label keeps it
in its tooltip).
"""

from __future__ import annotations

from html import escape

from workbench.core.hardware.synthesis import default as default_program
from workbench.core.units import format_bytes, format_seconds
from workbench.viz.style import KIND_COLORS, REPLICATED

SHOWN = 4  # programs `synthesis_timeline` draws
_LEFT, _LANE, _BAR, _ROW = 120.0, 480.0, 20.0, 82.0  # points
COPY = "copy"  # the permutation a reduce-scatter's program may start with


def _steps(program, names) -> list[tuple[str, str]]:
    """``(label, kind)`` per step, in order, labelled as ``Program.describe`` says."""
    labels = program.describe(names).split(", ")
    kinds = [COPY] * program.permuted + [s.kind for s in program.steps]
    return list(zip(labels, kinds, strict=True))


def synthesis_rows(estimate) -> list[dict]:
    """One dict per synthesised program of ``estimate``'s collectives, the most time
    first: ``kind``, ``bytes`` (the program's: a bucket's where collectives combine),
    ``group`` (``nvlink 2 x infiniband 2``), ``axes`` (the mesh axes of its collectives),
    ``collectives`` (how many runs of the plan it stands for), ``total_s`` (their seconds
    per step), ``seconds`` and ``default_s`` (one run of the program and of the default),
    ``speedup``, ``steps`` and ``default_steps`` (``(label, kind)`` in order), ``step_s``
    (each step's seconds, in that order), ``text``
    (core's sentence) and ``synthesis``."""
    rows: dict = {}
    for c in estimate.collectives:
        s = c.synthesis
        if s is None:
            continue
        row = rows.get(s)
        if row is None:
            names = [n for n, _ in s.levels]
            row = rows[s] = dict(
                kind=s.kind,
                bytes=s.nbytes,
                group=" x ".join(f"{n} {k}" for n, k in s.levels),
                axes=[],
                collectives=0,
                total_s=0.0,
                seconds=s.seconds,
                default_s=s.default_s,
                speedup=s.speedup,
                steps=_steps(s.program, names),
                step_s=s.step_s,
                default_steps=_steps(default_program(s.kind, len(s.levels)), names),
                text=str(s),
                synthesis=s,
            )
        axes = "+".join(c.collective.axes)
        if axes not in row["axes"]:
            row["axes"].append(axes)
        row["collectives"] += c.collective.count
        row["total_s"] += c.total_s
    return sorted(rows.values(), key=lambda r: -r["total_s"])


def _lane(label: str, steps, times, y: float, scale: float, css: str) -> list[str]:
    """One lane: its label, its steps in order, each ``scale`` points a second wide, and
    its time."""
    out = [f'<g class="{css}"><text x="0" y="{y + 14:.1f}" font-size="11">{escape(label)}</text>']
    x = _LEFT
    for i, ((text, kind), t) in enumerate(zip(steps, times, strict=True)):
        w = max(t * scale, 2.0)
        fill = KIND_COLORS.get(kind, REPLICATED)
        shown = text if 6.2 * len(text) + 6 <= w else ""
        out.append(
            f'<g class="wb-synthesis-step" data-kind="{escape(kind)}" data-order="{i}" '
            f'data-label="{escape(text)}" data-seconds="{t:.6g}">'
            f"<title>{escape(f'step {i + 1}: {text} ({kind}), {format_seconds(t)}')}</title>"
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w - 1, 1):.1f}" height="{_BAR:.1f}" '
            f'fill="{fill}" stroke="white"/>'
            f'<text x="{x + w / 2:.1f}" y="{y + 14:.1f}" text-anchor="middle" '
            f'font-size="10">{escape(shown)}</text></g>'
        )
        x += w
    out.append(
        f'<text x="{x + 6:.1f}" y="{y + 14:.1f}" font-size="11">{format_seconds(sum(times))}</text></g>'
    )
    return out


def synthesis_timeline(rows, top: int = SHOWN) -> str:
    """The SVG of the first ``top`` of ``rows`` (`synthesis_rows`): per program a title
    (kind, bytes, group, collectives it stands for), its steps in order
    (``wb-synthesis-step``, coloured by kind) and its time, then the default's one step
    and time; each step as wide as its time, on one scale for the picture (the slowest
    lane ``_LANE`` points wide)."""
    shown = list(rows)[:top]
    slowest = max([max(r["seconds"], r["default_s"]) for r in shown] + [1e-30])
    scale = _LANE / slowest
    width = _LEFT + _LANE + 80
    parts, y, heads = [], 0.0, []
    for r in shown:
        runs = r["collectives"]
        head = (
            f"{r['kind']} of {format_bytes(r['bytes'])} over {r['group']} "
            f"({', '.join(r['axes'])}; {runs} run{'s' * (runs != 1)} a step): "
            + (
                f"{r['speedup']:.2f}x the default"
                if len(r["steps"]) > 1
                else "the default is the fastest"
            )
        )
        heads.append(head)
        parts.append(
            f'<g class="wb-synthesis-row" data-kind="{escape(r["kind"])}">'
            f"<title>{escape(r['text'])}</title>"
            f'<text x="0" y="{y + 13:.1f}" font-size="12" font-weight="bold">{escape(head)}'
            "</text>"
        )
        parts += _lane(
            "synthesised", r["steps"], r["step_s"], y + 20, scale, "wb-synthesis-program"
        )
        parts += _lane(
            "default (one ring)", r["default_steps"], (r["default_s"],), y + 46, scale,
            "wb-synthesis-default",
        )  # fmt: skip
        parts.append("</g>")
        y += _ROW
    more = len(rows) - len(shown)
    caption = (
        "Steps in order, each as wide as its time (one scale for the picture); hover a step "
        "for its time."
    ) + (f" And {more} more program{'s' * (more != 1)}." if more > 0 else "")
    parts.append(
        f'<text class="wb-synthesis-caption" x="0" y="{y + 10:.1f}" font-size="10" '
        f'fill="#555">{escape(caption)}</text>'
    )
    height = y + 18
    width = max(width, 5.6 * len(caption), *(6.8 * len(h) for h in heads))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" '
        f'class="wb-synthesis-timeline">' + "".join(parts) + "</svg>"
    )
