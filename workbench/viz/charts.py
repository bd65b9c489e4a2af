"""Plotly charts of the simulator's estimates: where one step's time and memory go.

- ``time_breakdown(estimate)``: one step as a timeline: compute, then the collectives by
  kind; the overlap policy pulls communication under compute, and a line marks the step.
- ``memory_breakdown(estimate)``: the peak per device, stacked by category, against the
  hardware's capacity, saying whether it fits.
- ``compare_strategies({name: estimate})``: strategies side by side, time and memory.
- ``schedule_estimates(estimates, labels)``: the same across a schedule's steps;
  ``estimates_over_schedule(session, hardware)`` and ``schedule_labels(session)`` make its
  arguments without moving the session.

Figures hold the estimate's own numbers (seconds, bytes per device); axes and hovers print
them in human units. Colours come from ``style``: one per collective kind and per memory
category, the same in every chart.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.core.errors import WorkbenchError
from workbench.core.estimate import CATEGORIES, Estimate
from workbench.core.layout.collectives import KINDS
from workbench.core.units import format_bytes, format_seconds
from workbench.viz.style import (
    CATEGORY_COLORS,
    COMPUTE,
    COMPUTE_PARTS,
    DOES_NOT_FIT,
    FITS,
    KIND_COLORS,
)

FONT = dict(family="Helvetica, Arial, sans-serif", size=12)
TIME_AXIS = dict(tickformat="~s", ticksuffix="s", rangemode="tozero")
#: A capacity more than this many times the highest peak is left off the memory axis (noted),
#: so that a small model's bars stay readable.
OFF_SCALE = 20
LABEL_CHARS = 28  # a schedule step's label is cut past this many characters
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


# -- public charts ------------------------------------------------------------------------------
def time_breakdown(estimate: Estimate) -> go.Figure:
    """One step as a timeline: a compute bar, and a communication bar split by collective kind.

    Communication runs after compute when nothing overlaps; an overlap policy slides it back
    under compute by the time it hides (shaded). A dashed line marks the step time.
    """
    e = estimate
    start = e.step_s - e.communication_s
    fig = go.Figure()
    b = e.breakdown
    parts = [("compute", e.compute_s)] if b is None or e.pipeline is not None else [
        ("matmuls", b.matmul_s), ("attention", b.attention_s),
        ("elementwise and copies", b.other_s),
    ]  # fmt: skip
    at = 0.0
    for name, seconds in parts:
        if seconds or name == "compute":
            fig.add_trace(_hbar(name, COMPUTE_PARTS.get(name, COMPUTE), seconds, at, "compute"))
            at += seconds
    at = start
    for kind in KINDS:
        if seconds := e.by_kind.get(kind, 0.0):
            fig.add_trace(_hbar(kind, KIND_COLORS[kind], seconds, at, "communication"))
            at += seconds
    hidden = e.compute_s + e.communication_s - e.step_s
    if hidden > 0:
        fig.add_vrect(
            x0=start,
            x1=start + hidden,
            fillcolor="#000000",
            opacity=0.08,
            line_width=0,
            layer="below",
            annotation_text=f"overlapped {format_seconds(hidden)}",
            annotation_position="bottom left",
        )
    step_line(fig, e.step_s)
    fig.update_layout(barmode="overlay", height=280, showlegend=True)
    fig.update_xaxes(
        title_text="time per step", range=[0, e.step_s * 1.04] if e.step_s else None, **TIME_AXIS
    )
    fig.update_yaxes(categoryorder="array", categoryarray=["communication", "compute"])
    subtitle = (
        f"compute {format_seconds(e.compute_s)}, communication "
        f"{format_seconds(e.communication_s)}; {overlap_text(e.overlap)}"
    )
    mfu = f", MFU {b.mfu:.1%}" if b is not None else ""
    return _finish(fig, f"Step time on {e.hardware}: {format_seconds(e.step_s)}{mfu}", subtitle)


def memory_breakdown(estimate: Estimate) -> go.Figure:
    """The peak memory per device stacked by category, a capacity line, and the verdict."""
    e, m = estimate, estimate.memory
    fig = go.Figure()
    _memory_bars(fig, [e.hardware], [e])
    fig.update_layout(barmode="stack", bargap=0.55, width=520, height=480)
    # the legend below the bars, wrapping: beside them it is cut where the panel is narrow
    fig.update_layout(legend=dict(orientation="h", x=0, xanchor="left", y=-0.12, yanchor="top"))
    title = f"Peak memory per device: {format_bytes(m.peak)}, {_verdict(m, color=True)}"
    subtitle = (
        f"capacity {format_bytes(m.capacity)} on {e.hardware} ({_share(m.peak, m.capacity)} "
        f"used); arguments {format_bytes(m.arguments)}, outputs {format_bytes(m.outputs)}"
    )
    return _finish(fig, title, subtitle)


def compare_strategies(estimates: Mapping[str, Estimate]) -> go.Figure:
    """Strategies side by side: step time (compute and collectives) and peak memory."""
    names, es = list(estimates), list(estimates.values())
    if not es:
        raise WorkbenchError(
            "compare_strategies got no estimates; pass {name: session.estimate(hardware)}, "
            "e.g. {'BP': bp.estimate(hw.H100), 'BP+MP': bp_mp.estimate(hw.H100)}."
        )
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("step time per device", "peak memory per device"),
        horizontal_spacing=0.14,
    )
    _time_bars(fig, names, es, row=1, col=1)
    _memory_bars(fig, names, es, row=1, col=2)
    fig.update_yaxes(TIME_AXIS, row=1, col=1)
    fig.update_layout(barmode="stack", height=460)
    return _finish(fig, "Strategies" + _on(es), _summary(names, es))


def schedule_estimates(estimates: Sequence[Estimate], labels: Sequence[str] | None = None):
    """The estimate after each step of a schedule: step time above, peak memory below.

    ``labels``: one per estimate (default ``step 0``, ``step 1``, ...); see ``schedule_labels``.
    """
    es = list(estimates)
    labels = [f"step {i}" for i in range(len(es))] if labels is None else list(labels)
    if not es or len(labels) != len(es):
        raise WorkbenchError(
            f"schedule_estimates got {len(es)} estimates and {len(labels)} labels; pass one "
            "label per estimate, e.g. schedule_estimates(estimates_over_schedule(s, hw), "
            "schedule_labels(s))."
        )
    if len(set(labels)) != len(labels):
        raise WorkbenchError(f"schedule_estimates needs distinct labels; got {labels}.")
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.1,
        subplot_titles=("step time per device", "peak memory per device"),
    )
    _time_bars(fig, labels, es, row=1, col=1)
    _memory_bars(fig, labels, es, row=2, col=1)
    fig.update_yaxes(TIME_AXIS, row=1, col=1)
    fig.update_layout(barmode="stack", height=620)
    first, last = es[0], es[-1]
    subtitle = (
        f"from {labels[0]} to {labels[-1]}: step {format_seconds(first.step_s)} → "
        f"{format_seconds(last.step_s)}, peak {format_bytes(first.memory.peak)} → "
        f"{format_bytes(last.memory.peak)}; {overlap_text(last.overlap)}"
    )
    return _finish(fig, "Across the schedule" + _on(es), subtitle)


def estimates_over_schedule(
    session, hardware=None, *, overlap="none", steps: Iterable[int] | None = None
) -> list[Estimate]:
    """The estimate at each step (default: 0, nothing applied, to the session's current step).

    Reads ``session.estimate(..., step=i)`` (cached per state): the session is not moved.
    ``hardware`` defaults to the host CPU preset, as ``session.estimate`` does.
    """
    if hardware is None:
        from workbench.core import hardware as presets

        hardware = presets.CPU
    steps = range(session.step + 1) if steps is None else steps
    return [session.estimate(hardware, overlap=overlap, step=i) for i in steps]


def schedule_labels(session, steps: Iterable[int] | None = None) -> list[str]:
    """``["0 · nothing", "1 · BP('batch')", ...]``: each step and the tactic it applied."""
    labels = []
    for i in range(session.step + 1) if steps is None else steps:
        text = str(session.state_at(i).schedule[-1]) if i else "nothing"
        if len(text) > LABEL_CHARS:
            text = text[: LABEL_CHARS - 1] + "…"
        labels.append(f"{i} · {text}")
    return labels


def step_line(fig: go.Figure, step_s: float) -> None:
    """A dashed line at the step's end, labelled with its time."""
    fig.add_vline(
        x=step_s,
        line=dict(color="black", dash="dash", width=1.5),
        annotation_text=f"step {format_seconds(step_s)}",
        annotation_position="top right",
    )


def overlap_text(overlap) -> str:
    """The overlap policy in words."""
    if overlap == "none":
        return "no overlap: step = compute + communication"
    if overlap == "full":
        return "full overlap: step = the longer of compute and communication"
    if overlap == "prefetch":
        return "prefetch overlap: weights' gathers and gradients' reductions hide behind compute"
    return f"overlap {float(overlap):.0%}: that share of the shorter hides behind the longer"


def byte_ticks(top: float, n: int = 5) -> dict:
    """Axis ticks at round binary units from 0 to ``top`` bytes (``tickvals``, ``ticktext``)."""
    top = max(float(top), 1.0)
    k = 0
    while k < len(_UNITS) - 1 and top >= 1024 ** (k + 1):
        k += 1
    unit = 1024**k
    raw = top / unit / n
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(f * mag for f in (1, 2, 2.5, 5, 10) if f * mag >= raw)
    count = int(top / unit / step + 1e-9)
    vals = [i * step for i in range(count + 1)]
    return dict(
        tickvals=[v * unit for v in vals],
        ticktext=[f"{v:g} {_UNITS[k]}" if v else "0" for v in vals],
    )


# -- traces shared by the charts ----------------------------------------------------------------
def _hbar(name: str, color: str, seconds: float, base: float, row: str) -> go.Bar:
    return go.Bar(
        name=name,
        y=[row],
        x=[seconds],
        base=[base],
        orientation="h",
        marker_color=color,
        customdata=[format_seconds(seconds)],
        hovertemplate=f"{name}: %{{customdata}}<extra></extra>",
    )


def _time_bars(fig: go.Figure, xs: list[str], es: list[Estimate], *, row: int, col: int):
    """Stacked bars of compute and each collective kind present, and the step time on top."""
    kinds = [k for k in KINDS if any(e.by_kind.get(k, 0.0) for e in es)]
    parts = [("compute", COMPUTE, [e.compute_s for e in es])]
    parts += [(k, KIND_COLORS[k], [e.by_kind.get(k, 0.0) for e in es]) for k in kinds]
    for i, (name, color, ys) in enumerate(parts):
        fig.add_trace(
            go.Bar(
                name=name,
                x=xs,
                y=ys,
                marker_color=color,
                customdata=[format_seconds(y) for y in ys],
                hovertemplate=f"%{{x}}<br>{name}: %{{customdata}}<extra></extra>",
                legendgroup="time",
                legendgrouptitle_text="time" if i == 0 else None,
            ),
            row=row,
            col=col,
        )
    fig.add_trace(
        go.Scatter(
            name="step time",
            x=xs,
            y=[e.step_s for e in es],
            mode="markers+text",
            text=[format_seconds(e.step_s) for e in es],
            textposition="top center",
            cliponaxis=False,
            customdata=[overlap_text(e.overlap) for e in es],
            hovertemplate="%{x}<br>step %{text}<br>%{customdata}<extra></extra>",
            marker=dict(symbol="line-ew", size=30, line=dict(width=2.5, color="black")),
            legendgroup="time",
        ),
        row=row,
        col=col,
    )
    top = max(max(e.compute_s + e.communication_s, e.step_s) for e in es)
    fig.update_yaxes(range=[0, top * 1.18] if top else None, row=row, col=col)


def _memory_bars(fig: go.Figure, xs: list[str], es: list[Estimate], *, row=None, col=None):
    """Stacked bars by category at the peak, the capacity, and each peak's verdict on top."""
    for i, cat in enumerate(CATEGORIES):
        ys = [e.memory.at_peak.get(cat, 0) for e in es]
        fig.add_trace(
            go.Bar(
                name=cat,
                x=xs,
                y=ys,
                marker_color=CATEGORY_COLORS[cat],
                customdata=[format_bytes(y) for y in ys],
                hovertemplate=f"%{{x}}<br>{cat}: %{{customdata}}<extra></extra>",
                legendgroup="memory",
                legendgrouptitle_text="memory at the peak" if i == 0 else None,
            ),
            row=row,
            col=col,
        )
    peaks = [e.memory.peak for e in es]
    fig.add_trace(
        go.Scatter(
            name="peak",
            x=xs,
            y=peaks,
            mode="text",
            text=[
                f"{format_bytes(e.memory.peak)}{' ' if e.memory.fits else '<br>'}"
                f"{_verdict(e.memory, short=True)}"
                for e in es
            ],
            textposition="top center",
            cliponaxis=False,
            textfont=dict(color=[FITS if e.memory.fits else DOES_NOT_FIT for e in es]),
            hoverinfo="skip",
            showlegend=False,
        ),
        row=row,
        col=col,
    )
    capacities = [e.memory.capacity for e in es]
    top = max(max(peaks), 1)
    off_scale = max(capacities) > OFF_SCALE * top
    top = top * 1.25 if off_scale else max(top, max(capacities)) * 1.15
    if len(set(capacities)) == 1:  # one line across, labelled
        fig.add_hline(
            y=capacities[0],
            line=dict(color="black", dash="dash", width=1.5),
            row=row,
            col=col,
            **(
                {}
                if off_scale
                else dict(
                    annotation_text=f"capacity {format_bytes(capacities[0])}",
                    annotation_position="top left",
                )
            ),
        )
    else:  # a mark per bar
        fig.add_trace(
            go.Scatter(
                name="capacity",
                x=xs,
                y=capacities,
                mode="markers",
                marker=dict(symbol="line-ew", size=40, line=dict(width=2, color="black")),
                customdata=[format_bytes(c) for c in capacities],
                hovertemplate="%{x}<br>capacity %{customdata}<extra></extra>",
            ),
            row=row,
            col=col,
        )
    if off_scale:
        fig.add_annotation(
            text=f"capacity {format_bytes(max(capacities))}: off the scale",
            x=1,
            y=1,
            xref="x domain",
            yref="y domain",
            xanchor="right",
            yanchor="top",
            showarrow=False,
            font=dict(size=11, color="#555555"),
            row=row,
            col=col,
        )
    fig.update_yaxes(range=[0, top], **byte_ticks(top), row=row, col=col)


# -- texts and layout ---------------------------------------------------------------------------
def _verdict(memory, *, short: bool = False, color: bool = False) -> str:
    if memory.fits:
        text = "✓" if short else "✓ fits"
    else:
        over = format_bytes(memory.peak - memory.capacity)
        text = "✗ does not fit" if short else f"✗ does not fit ({over} over)"
    if color:
        text = f"<span style='color:{FITS if memory.fits else DOES_NOT_FIT}'>{text}</span>"
    return text


def _share(part: float, whole: float) -> str:
    share = part / whole if whole else float("inf")
    return "<0.01%" if 0 < share < 1e-4 else f"{share:.2%}" if share < 0.1 else f"{share:.0%}"


def _on(es: list[Estimate]) -> str:
    names = {e.hardware for e in es}
    return f" on {names.pop()}" if len(names) == 1 else ""


def _summary(names: list[str], es: list[Estimate]) -> str:
    """Which is fastest (among those that fit) and which needs the least memory."""
    fitting = [i for i, e in enumerate(es) if e.memory.fits] or range(len(es))
    fast = min(fitting, key=lambda i: es[i].step_s)
    small = min(range(len(es)), key=lambda i: es[i].memory.peak)
    which = "fastest that fits" if any(e.memory.fits for e in es) else "fastest (none fits)"
    return (
        f"{which}: {names[fast]} ({format_seconds(es[fast].step_s)}); least memory: "
        f"{names[small]} ({format_bytes(es[small].memory.peak)}); {overlap_text(es[0].overlap)}"
    )


def _finish(fig: go.Figure, title: str, subtitle: str = "") -> go.Figure:
    text = f"{title}<br><sup>{subtitle}</sup>" if subtitle else title
    fig.update_layout(
        template="plotly_white",
        font=FONT,
        title=dict(text=text, x=0.01, xanchor="left"),
        margin=dict(t=90, l=70, r=30, b=50),
        legend=dict(groupclick="toggleitem", traceorder="grouped"),
    )
    return fig
