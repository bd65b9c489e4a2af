"""One step as two lanes, compute and communication: what hides behind compute and what sits on
the critical path, under an overlap policy.

- ``timeline_segments(session, hardware, overlap)``: the drawing's numbers as plain dicts.
- ``overlap_timeline(session, hardware, overlap)``: the plotly figure of them.

Every length is the simulator's (``session.estimate``): the compute lane is the compute of each
phase (the ops' times by the phase they run in; local steps, copies and fresh memory as
"other"); the communication lane holds the collectives grouped by kind and by the phase of the
op that needs them. The estimate adds up amounts, it does not time ops: hidden communication
runs beside compute and the exposed rest after it (step = max(compute, hidden) + exposed). So
the picture draws a hidden group from the start of the phase it can run in (a weight's gather:
the phase using it; a gradient's reduction: the backward pass), packed in order and never past
the hidden span, and the exposed groups after that span. Where an exposed collective falls
inside the step is not in the estimate; the picture says so rather than guess.

"prefetch" says which collectives hide (``CollectiveEstimate.hidden``); "full" and a
fraction say only how much: the groups are then hidden in order of need until that much is
hidden.
"""

from __future__ import annotations

import plotly.graph_objects as go

from workbench.core.errors import InputError, given
from workbench.core.hardware.names import resolve
from workbench.core.layout.collectives import KINDS
from workbench.core.units import format_seconds
from workbench.viz.charts import TIME_AXIS, _finish, overlap_text, step_line
from workbench.viz.style import COMPUTE, KIND_COLORS

PHASES = ("forward", "backward", "optimizer")
#: The phase a hidden collective can run in, by the phase of the op that needs it: a gradient's
#: reduction (needed by the update) runs during the backward pass.
RUNS_IN = {"forward": "forward", "backward": "backward", "optimizer": "backward"}
OTHER = "other compute"
PHASE_SHADES = {"forward": COMPUTE, "backward": "#6C71C4", OTHER: "#B0B3D6", "optimizer": "#8E92CF"}


def timeline_segments(session, hardware=None, overlap="prefetch") -> list[dict]:
    """The timeline's bars: per bar ``lane`` ("compute" or "communication"), ``label``,
    ``start`` and ``seconds`` (s), ``kind`` (a phase, or a collective kind), ``phase`` (where
    a collective's reader runs; "output": a program output), ``count`` (collectives), and for
    communication ``hidden`` (True: behind compute; False: on the critical path)."""
    if not hasattr(session, "estimate") or not hasattr(session, "plan"):
        raise InputError(
            f"timeline_segments needs a Session (it reads the estimate and its plan); got "
            f"{given(session)}. Pass wb.Session(program, mesh, tactics)."
        )
    hw = resolve(hardware)
    e = session.estimate(hw, overlap=overlap)
    program = session.program
    compute = dict.fromkeys(PHASES, 0.0)
    for o in e.ops:
        phase = program.ops[o.op].phase
        compute[phase if phase in compute else "optimizer"] += o.total_s
    compute[OTHER] = max(e.compute_s - sum(compute.values()), 0.0)
    out, at, span = [], 0.0, {}
    for phase in (*PHASES, OTHER):
        span[phase] = at
        if compute[phase] > 0:
            label = phase if phase == OTHER else f"{phase} pass"
            out.append(_bar("compute", label, at, compute[phase], phase, phase, 0))
            at += compute[phase]

    groups = _groups(e, program)
    hides = _hiding(e, groups)
    hidden_s = sum(g["seconds"] for g, h in zip(groups, hides) if h)
    end_hidden = max(e.compute_s, hidden_s)
    placed = _pack(
        [(g, span.get(RUNS_IN.get(g["phase"], OTHER), 0.0)) for g, h in zip(groups, hides) if h],
        end_hidden,
    )
    for g, start in placed:
        out.append(_bar("communication", g["label"], start, g["seconds"], g["kind"], g["phase"],
                        g["count"], hidden=True))  # fmt: skip
    at = end_hidden
    for g, h in zip(groups, hides):
        if not h:
            out.append(_bar("communication", g["label"], at, g["seconds"], g["kind"], g["phase"],
                            g["count"], hidden=False))  # fmt: skip
            at += g["seconds"]
    return out


def overlap_timeline(session, hardware=None, overlap="prefetch") -> go.Figure:
    """The two lanes of `timeline_segments`: compute by phase; collectives hidden (pale, under
    compute) or on the critical path (solid, after it); a dashed line at the estimate's step."""
    segments = timeline_segments(session, hardware, overlap)
    e = session.estimate(hardware, overlap=overlap)
    fig = go.Figure()
    for s in segments:
        comm = s["lane"] == "communication"
        color = KIND_COLORS[s["kind"]] if comm else PHASE_SHADES[s["kind"]]
        state = ("hidden" if s["hidden"] else "critical path") if comm else ""
        name = f"{s['label']} ({state})" if comm else s["label"]
        fig.add_trace(
            go.Bar(
                name=name,
                y=[s["lane"]],
                x=[s["seconds"]],
                base=[s["start"]],
                orientation="h",
                marker=dict(
                    color=color,
                    opacity=0.45 if comm and s["hidden"] else 1.0,
                    line=dict(color="black", width=0 if not comm or s["hidden"] else 1.5),
                ),
                customdata=[format_seconds(s["seconds"])],
                hovertemplate=f"{name}: %{{customdata}}<extra></extra>",
            )
        )
    step_line(fig, e.step_s)
    fig.update_layout(barmode="overlay", height=300, showlegend=True)
    fig.update_xaxes(title_text="time per step", range=[0, e.step_s * 1.04 or 1], **TIME_AXIS)
    fig.update_yaxes(categoryorder="array", categoryarray=["communication", "compute"])
    exposed = sum(
        s["seconds"] for s in segments if s["lane"] == "communication" and not s["hidden"]
    )
    subtitle = (
        f"compute {format_seconds(e.compute_s)}, communication {format_seconds(e.communication_s)}, "
        f"on the critical path {format_seconds(exposed)}; {overlap_text(e.overlap)}; "
        "where a critical collective falls inside the step is not estimated"
    )
    return _finish(fig, f"Overlap on {e.hardware}: step {format_seconds(e.step_s)}", subtitle)


# -- helpers -------------------------------------------------------------------------------------
def _bar(lane, label, start, seconds, kind, phase, count, hidden=None) -> dict:
    return dict(lane=lane, label=label, start=start, seconds=seconds, kind=kind, phase=phase,
                count=count, hidden=hidden)  # fmt: skip


def _groups(e, program) -> list[dict]:
    """Collectives by (phase of the op that needs them, kind), in order of need."""
    order = {p: i for i, p in enumerate((*PHASES, "output"))}
    groups: dict[tuple, dict] = {}
    for c in e.collectives:
        col = c.collective
        phase = "output" if col.op is None else program.ops[col.op].phase
        phase = phase if phase in order else "optimizer"
        g = groups.setdefault(
            (order[phase], KINDS.index(col.kind)),
            dict(label=f"{col.kind} · {phase}", kind=col.kind, phase=phase, seconds=0.0,
                 count=0, members=[]),
        )  # fmt: skip
        g["seconds"] += c.total_s
        g["count"] += col.count
        g["members"].append(c)
    return [groups[k] for k in sorted(groups) if groups[k]["seconds"] > 0]


def _hiding(e, groups) -> list[bool]:
    """Per group, whether it hides: under "prefetch" as the estimate says of each collective
    (a group whose collectives split is cut in two: see `_split`), else in order until the
    policy's amount."""
    if e.overlap == "prefetch":
        _split(groups)
        return [g["hidden"] for g in groups]
    amount = e.compute_s + e.communication_s - e.step_s
    out = []
    for g in list(groups):
        if amount <= 0:
            out.append(False)
        elif g["seconds"] <= amount * (1 + 1e-9):
            out.append(True)
        else:  # cut the group where the hidden amount runs out
            i = groups.index(g)
            rest = dict(g, seconds=g["seconds"] - amount, count=0)
            groups[i] = dict(g, seconds=amount)
            groups.insert(i + 1, rest)
            out += [True, False]
        amount -= g["seconds"]
    return out


def _split(groups) -> None:
    """Give every group ``hidden``; a group with hidden and exposed members becomes two."""
    for g in list(groups):
        flags = [c.hidden for c in g["members"]]
        if all(flags) or not any(flags):
            g["hidden"] = bool(flags and flags[0])
            continue
        i = groups.index(g)
        parts = []
        for flag in (True, False):
            part = [c for c, f in zip(g["members"], flags) if f is flag]
            parts.append(dict(g, seconds=sum(c.total_s for c in part),
                              count=sum(c.collective.count for c in part), hidden=flag))  # fmt: skip
        groups[i : i + 1] = parts


def _pack(items, end: float) -> list[tuple[dict, float]]:
    """Start times for hidden groups: each from its phase's start, after the previous one, and
    pulled back so the last ends by ``end`` (the hidden span)."""
    starts, at = [], 0.0
    for g, earliest in items:
        at = max(at, earliest)
        starts.append(at)
        at += g["seconds"]
    limit = end
    for i in range(len(items) - 1, -1, -1):
        g = items[i][0]
        starts[i] = max(min(starts[i], limit - g["seconds"]), 0.0)
        limit = starts[i]
    return [(g, s) for (g, _), s in zip(items, starts)]
