"""A sweep's points as pictures (`workbench.core.whatif.Sweep`): the cost of a step against
its time, the Pareto front marked, and the answers as rows."""

from __future__ import annotations

import plotly.graph_objects as go

from workbench.core.units import format_bytes, format_seconds
from workbench.viz.charts import TIME_AXIS, _finish
from workbench.viz.style import DOES_NOT_FIT

#: one colour per chip kind, in the order they appear (Paul Tol's "bright")
KIND_COLORS = ("#4477AA", "#EE6677", "#228833", "#CCBB44", "#66CCEE", "#AA3377")


def pareto_chart(sweep) -> go.Figure:
    """Every priced point: step time (x) against chip-seconds a step (y), log-log; a colour
    per chip kind, hollow where it does not fit; the Pareto front joined by a line."""
    fig = go.Figure()
    priced = [p for p in sweep.points if p.priced]
    kinds = list(dict.fromkeys(p.hardware for p in priced))
    for i, kind in enumerate(kinds):
        for fits in (True, False):
            pts = [p for p in priced if p.hardware == kind and p.fits == fits]
            if not pts:
                continue
            color = KIND_COLORS[i % len(KIND_COLORS)]
            fig.add_trace(
                go.Scatter(
                    name=f"{kind}{'' if fits else ' (does not fit)'}",
                    x=[p.step_s for p in pts],
                    y=[p.chip_seconds for p in pts],
                    mode="markers",
                    marker=dict(
                        color=color if fits else "rgba(0,0,0,0)",
                        line=dict(color=color if fits else DOES_NOT_FIT, width=1.5),
                        size=8,
                    ),
                    text=[_label(p) for p in pts],
                    hovertemplate="%{text}<extra></extra>",
                )
            )
    front = sweep.pareto()
    if front:
        fig.add_trace(
            go.Scatter(
                name="Pareto front",
                x=[p.step_s for p in front],
                y=[p.chip_seconds for p in front],
                mode="lines",
                line=dict(color="black", width=1, dash="dot"),
                hoverinfo="skip",
            )
        )
    fig.update_xaxes(title_text="step time", type="log", **TIME_AXIS)
    fig.update_yaxes(title_text="chip-seconds a step", type="log")
    fig.update_layout(height=460)
    n, fit = len(priced), sum(p.fits for p in priced)
    return _finish(
        fig,
        f"What if: {n} plans priced, {fit} fit",
        f"{len(front)} on the Pareto front (no plan both faster and cheaper); "
        f"{len(sweep.points) - n} could not be planned",
    )


def _label(p) -> str:
    mesh = " x ".join(f"{k} {v}" for k, v in p.mesh)
    shapes = ", ".join(f"{k} {v}" for k, v in p.shapes)
    return (
        f"{p.hardware}, {p.chips} chips ({mesh})<br>{p.plan}<br>{shapes}<br>"
        f"step {format_seconds(p.step_s)}, MFU {p.mfu:.1%}, peak {format_bytes(p.peak)}"
    )


def answer_rows(sweep, name: str | None = None) -> list[dict]:
    """The sweep's answers as plain rows: the smallest cluster that fits, the best MFU per
    chip count, and (``name``: a shape argument) what doubling it costs."""
    rows = []
    small = sweep.smallest_fitting()
    rows.append(
        {"question": "smallest cluster that fits", "answer": _short(small) if small else "none"}
    )
    for (kind, chips), p in sweep.best_mfu().items():
        rows.append(
            {"question": f"best MFU on {chips} x {kind}", "answer": f"{p.mfu:.1%}: {_short(p)}"}
        )
    scaling = sweep.scaling(name) if name is not None else None
    if scaling is not None:
        mid, low, high, n = scaling
        rows.append(
            {
                "question": f"twice the {name}",
                "answer": f"the step takes {mid:.2f}x (median of {n} plans; {low:.2f}x to "
                f"{high:.2f}x)",
            }
        )
    return rows


def _short(p) -> str:
    mesh = " x ".join(f"{k} {v}" for k, v in p.mesh)
    shapes = ", ".join(f"{k} {v}" for k, v in p.shapes)
    return (
        f"{p.chips} x {p.hardware} ({mesh}), {p.plan}"
        + (f", {shapes}" if shapes else "")
        + f": step {format_seconds(p.step_s)}, peak {format_bytes(p.peak)}"
    )
