"""A pipeline schedule's step drawn from its simulated `Timeline`: who computes what, when.

- ``pipeline_timeline(timeline_or_estimate)``: stages as rows (stage 0 on top) against time;
  each work item a bar from its start to its end, coloured by pass (F, B, W) and labelled
  with its microbatch (``m.c`` for chunk c when interleaved); each stage's idle time shaded
  grey; a dashed line at the makespan.
- ``pipeline_memory(timeline_or_estimate)``: activations held per stage over the step (a
  step line per stage, in full-stage microbatches as ``Timeline.peak_in_flight`` counts
  them), each stage's peak marked.

Both take a ``Timeline`` (``estimate.simulate``) or a ``PipelineEstimate``
(``estimate.price_pipeline``, whose ``.timeline`` they draw). Every number is the
timeline's own (seconds); the charts only place them.
"""

from __future__ import annotations

import plotly.graph_objects as go

from workbench.core.errors import InputError, given
from workbench.core.estimate.pipelined import PipelineEstimate
from workbench.core.estimate.timeline import Timeline
from workbench.core.units import format_seconds
from workbench.viz.charts import TIME_AXIS, _finish
from workbench.viz.style import CATEGORY_COLORS, COMPUTE, PALETTE, REPLICATED

#: One colour per pass: forward as compute everywhere; the input gradient as gradients; the
#: weight gradient as what the optimizer reads.
PASS_COLORS = {"F": COMPUTE, "B": CATEGORY_COLORS["gradients"], "W": CATEGORY_COLORS["optimizer"]}
PASS_TEXT = {"F": "white", "B": "black", "W": "black"}
IDLE = REPLICATED
ROW_HEIGHT = 46  # pixels per stage row


def pipeline_timeline(timeline_or_estimate, *, title: str | None = None) -> go.Figure:
    """Stages against time: a bar per work item (by pass, labelled with its microbatch), the
    idle time grey, a dashed line at the makespan; the subtitle says schedule, S, M, v and
    the bubble share."""
    tl, est = _timeline(timeline_or_estimate, "pipeline_timeline")
    sched = tl.schedule
    rows = [f"stage {s}" for s in range(sched.stages)]
    names = _pass_names(sched.split_backward)
    fig = go.Figure()
    for kind in names:
        slots = [slot for row in tl.slots for slot in row if slot.work.kind == kind]
        if not slots:
            continue
        fig.add_trace(
            go.Bar(
                name=names[kind],
                y=[rows[slot.stage] for slot in slots],
                x=[slot.end - slot.start for slot in slots],
                base=[slot.start for slot in slots],
                orientation="h",
                marker=dict(color=PASS_COLORS[kind], line=dict(color="white", width=0.5)),
                text=[_label(slot.work, sched.virtual_stages) for slot in slots],
                textposition="inside",
                insidetextanchor="middle",
                textfont=dict(color=PASS_TEXT[kind]),
                customdata=[_hover(slot, names[kind], sched.virtual_stages) for slot in slots],
                hovertemplate="%{customdata}<extra></extra>",
            )
        )
    gaps = [(s, a, b) for s in range(sched.stages) for a, b in _gaps(tl.slots[s], tl.makespan)]
    if gaps:
        fig.add_trace(
            go.Bar(
                name="idle (bubble)",
                y=[rows[s] for s, _, _ in gaps],
                x=[b - a for _, a, b in gaps],
                base=[a for _, a, _ in gaps],
                orientation="h",
                marker=dict(color=IDLE, opacity=0.35),
                customdata=[
                    f"stage {s} idle {format_seconds(b - a)} "
                    f"({format_seconds(a)} to {format_seconds(b)}); "
                    f"idle in the step {format_seconds(tl.idle[s])}"
                    for s, a, b in gaps
                ],
                hovertemplate="%{customdata}<extra></extra>",
            )
        )
    fig.add_vline(
        x=tl.makespan,
        line=dict(color="black", dash="dash", width=1.5),
        annotation_text=f"makespan {format_seconds(tl.makespan)}",
        annotation_position="top right",
    )
    fig.update_layout(
        barmode="overlay",
        bargap=0.15,
        height=140 + ROW_HEIGHT * sched.stages,
        uniformtext=dict(minsize=8, mode="hide"),
    )
    fig.update_xaxes(title_text="time", range=[0, tl.makespan * 1.04 or 1], **TIME_AXIS)
    fig.update_yaxes(categoryorder="array", categoryarray=rows[::-1])
    head = title or (
        f"Pipeline {sched.kind}: makespan {format_seconds(tl.makespan)}"
        + (f" on {est.hardware}" if est is not None else "")
    )
    return _finish(fig, head, _subtitle(tl, est))


def pipeline_memory(timeline_or_estimate, *, title: str | None = None) -> go.Figure:
    """Activations held per stage over the step (full-stage microbatches: chunks / v), a step
    line per stage, each stage's peak marked."""
    tl, _ = _timeline(timeline_or_estimate, "pipeline_memory")
    sched = tl.schedule
    v = sched.virtual_stages
    fig = go.Figure()
    for s in range(sched.stages):
        color = PALETTE[s % len(PALETTE)]
        series = tl.in_flight[s]
        xs = [0.0, *(t for t, _ in series), tl.makespan]
        held = [0, *(h for _, h in series)]
        held.append(held[-1])
        fig.add_trace(
            go.Scatter(
                name=f"stage {s}",
                legendgroup=f"stage {s}",
                x=xs,
                y=[h / v for h in held],
                mode="lines",
                line=dict(color=color, shape="hv", width=2),
                customdata=[_held(h, v) for h in held],
                hovertemplate=f"stage {s}: %{{customdata}} from %{{x:.3s}}s<extra></extra>",
            )
        )
        peak = tl.peak_chunks[s]
        at = next((t for t, h in series if h == peak), 0.0)
        fig.add_trace(
            go.Scatter(
                name=f"stage {s} peak",
                legendgroup=f"stage {s}",
                showlegend=False,
                x=[at],
                y=[tl.peak_in_flight[s]],
                mode="markers+text",
                marker=dict(color=color, size=10, symbol="diamond"),
                text=[f"{tl.peak_in_flight[s]:g}"],
                textposition="top center",
                hovertemplate=(
                    f"stage {s} peak: {tl.peak_in_flight[s]:g} microbatches' activations "
                    f"({peak} chunks), first at {format_seconds(at)}<extra></extra>"
                ),
            )
        )
    unit = "microbatches" + (f" (chunks / {v})" if v > 1 else "")
    fig.update_layout(height=360, hovermode="closest")
    fig.update_xaxes(title_text="time", range=[0, tl.makespan * 1.04 or 1], **TIME_AXIS)
    fig.update_yaxes(title_text=f"activations held, {unit}", rangemode="tozero")
    release = "W (the weight gradient)" if sched.split_backward else "B"
    subtitle = (
        f"{sched.kind}, S={sched.stages} M={sched.microbatches} v={v}: a microbatch's "
        f"activations are held from its F to the end of its {release} on that stage; "
        f"peaks {', '.join(f'{p:g}' for p in tl.peak_in_flight)} (stage 0 first)"
    )
    head = title or f"Activations in flight, pipeline {sched.kind}"
    return _finish(fig, head, subtitle)


# -- helpers -------------------------------------------------------------------------------------
def _timeline(obj, name: str) -> tuple[Timeline, PipelineEstimate | None]:
    if isinstance(obj, PipelineEstimate):
        return obj.timeline, obj
    if isinstance(obj, Timeline):
        return obj, None
    raise InputError(
        f"{name} draws a pipeline Timeline or PipelineEstimate, got {given(obj)}; build one "
        "with estimate.simulate(estimate.schedule(kind, stages, microbatches), forward, "
        "backward) or estimate.price_pipeline(program, stages, microbatches, hardware)"
    )


def _pass_names(split: bool) -> dict[str, str]:
    if split:
        return {"F": "F: forward", "B": "B: input gradient", "W": "W: weight gradient"}
    return {"F": "F: forward", "B": "B: backward"}


def _label(work, v: int) -> str:
    return f"{work.microbatch}.{work.chunk}" if v > 1 else f"{work.microbatch}"


def _hover(slot, pass_name: str, v: int) -> str:
    w = slot.work
    chunk = f", chunk {w.chunk}" if v > 1 else ""
    return (
        f"{pass_name}, microbatch {w.microbatch}{chunk}, stage {slot.stage}<br>"
        f"{format_seconds(slot.start)} to {format_seconds(slot.end)} "
        f"({format_seconds(slot.end - slot.start)})"
    )


def _held(chunks: int, v: int) -> str:
    if v == 1:
        return f"{chunks} microbatches' activations held"
    return f"{chunks} chunks' activations held ({chunks / v:g} microbatches)"


def _gaps(row, makespan: float) -> list[tuple[float, float]]:
    """The spans of [0, makespan] that a stage's slots (in run order) leave uncovered."""
    out, at = [], 0.0
    for slot in row:
        if slot.start > at:
            out.append((at, slot.start))
        at = max(at, slot.end)
    if makespan > at:
        out.append((at, makespan))
    return out


def _subtitle(tl: Timeline, est: PipelineEstimate | None) -> str:
    s = tl.schedule
    text = (
        f"{s.kind} schedule, S={s.stages} stages, M={s.microbatches} microbatches, "
        f"v={s.virtual_stages} chunks per stage; bubble {tl.bubble_share:.1%} of the stages' "
        f"time ({format_seconds(tl.bubble)} idle, added over the stages)"
    )
    if est is not None:
        text += f"; step {format_seconds(est.step_s)} with the optimizer after the flush"
    return text
