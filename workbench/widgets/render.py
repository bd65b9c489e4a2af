"""HTML text for the workbench's panels, from core objects: formatting only.

Every name, sharding and message is escaped: value names come from user code and may hold
anything.
"""

from __future__ import annotations

import html
import traceback

from workbench.core.units import format_bytes, format_seconds
from workbench.viz import style

ERROR_STYLE = "color:#b00020;white-space:pre-wrap;font-family:monospace"
MUTED = "color:#666"
SHOWN = 12  # notes of a step listed under the schedule; the rest counted


def esc(x) -> str:
    return html.escape(str(x), quote=True)


def pre(text: str, style: str = "") -> str:
    return (
        f'<pre style="margin:0;white-space:pre-wrap;overflow-wrap:anywhere;{style}">'
        f"{esc(text)}</pre>"
    )


def status(session) -> str:
    """``step 2 of 3: MP('model')`` and the conflicts, if any."""
    total = session.step + len(session.redo_stack)
    last = str(session.history[-1]) if session.step else "nothing applied"
    text = f"<b>step {session.step} of {total}</b>: {esc(last)}"
    if n := len(session.state.conflicts):
        text += f' · <span style="color:#b00020">{n} conflict{"s" * (n != 1)}</span>'
    if changed := len(session.state.changed) if session.step else 0:
        text += f' · <span style="{MUTED}">{changed} values changed</span>'
    return text


def notes(step: int, said) -> str:
    """What step ``step`` could not do, as core said it (``Session.notes``): empty when
    it did all it targeted."""
    if not said:
        return ""
    items = "".join(f"<li>{esc(n)}</li>" for n in said[:SHOWN])
    if len(said) > SHOWN:
        items += f"<li>... and {len(said) - SHOWN} more (Session.notes({step}))</li>"
    return (
        f'<div style="color:#8a5300;font-size:12px"><b>step {step} left {len(said)} '
        f"value{'s' * (len(said) != 1)} it targets whole:</b>"
        f'<ul style="margin:2px 0 0 16px;padding:0">{items}</ul></div>'
    )


def header(session, hardware) -> str:
    p = session.program
    return (
        f"<b>{esc(p.name)}</b> · {len(p.ops)} ops · {len(p.values)} values · "
        f"mesh {esc(session.mesh)} · simulated on {esc(hardware.name)}"
    )


def estimate(e) -> str:
    """One line of the estimate: step, compute, each collective kind, memory and the verdict."""
    kinds = " · ".join(f"{esc(k)} {format_seconds(v)}" for k, v in e.by_kind.items() if v)
    m = e.memory
    verdict = (
        '<span style="color:#2e7d32">fits</span>'
        if m.fits
        else '<span style="color:#b00020"><b>does not fit</b></span>'
    )
    return (
        f"<b>step {format_seconds(e.step_s)}</b> per device on {esc(e.hardware)} "
        f"(overlap {esc(e.overlap)}) · compute {format_seconds(e.compute_s)} · "
        f"communication {format_seconds(e.communication_s)}"
        + (f" ({kinds})" if kinds else "")
        + f" · memory {format_bytes(m.peak)} of {format_bytes(m.capacity)}: {verdict}"
        + (pipeline(e.pipeline) if e.pipeline else "")
        + (breakdown(e.breakdown) if e.breakdown else "")
        + (f' · <span style="color:#8a5300">note: {esc(e.note)}</span>' if e.note else "")
    )


def answers(rows) -> str:
    """A sweep's answers (``viz.whatif.answer_rows``) as a two-column table."""
    body = "".join(
        f"<tr><td style='padding:2px 8px 2px 0;vertical-align:top'><b>{esc(r['question'])}</b>"
        f"</td><td style='padding:2px 0'>{esc(r['answer'])}</td></tr>"
        for r in rows
    )
    return f"<table style='font-size:12px'>{body}</table>"


def breakdown(b) -> str:
    """MFU, and where the step's time goes, each part a share of the step."""
    step = b.step_s or 1.0
    parts = " · ".join(f"{esc(what)} {s / step:.0%}" for what, s in b.rows())
    return f"<br><b>MFU {b.mfu:.1%}</b> (HFU {b.hfu:.1%}) · {parts}"


def pipeline(pe) -> str:
    """A pipelined step's stages, microbatches, schedule and bubble."""
    s = pe.schedule
    return (
        f" · pipeline: {s.stages} stages x {s.microbatches} microbatches, {esc(s.kind)}, "
        f"bubble {format_seconds(pe.bubble_s / s.stages)} per stage ({pe.bubble_share:.0%})"
    )


def conflicts(reports) -> str:
    """The conflicts, folded under a line that counts them."""
    if not reports:
        return ""
    n = len(reports)
    head = (
        f'<summary style="color:#b00020">{n} conflict{"s" * (n != 1)}: propagation stopped '
        "there; the plan redistributes (priced in the estimate)</summary>"
    )
    return f"<details>{head}{''.join(pre(str(r), 'color:#b00020') for r in reports)}</details>"


COLUMNS = (  # the collective table's columns: header, width (fixed layout: the panel's width)
    ("kind", "9%"),
    ("value", "18%"),
    ("axes", "7%"),
    ("bytes/device", "9%"),
    ("count", "5%"),
    ("time", "7%"),
    ("tactic", "11%"),
    ("code", "14%"),
    ("why", "20%"),
)


def collective_table(rows, limit: int = 200) -> str:
    """The collective plan as an HTML table (rows from ``viz.collective_rows``). Fixed
    columns that fit the panel: long values and reasons wrap, and say all on hover; the
    code column shows the user's line (and the library's) short, the whole lines on hover."""
    if not rows:
        return f'<span style="{MUTED}">No collectives: every device runs its part alone.</span>'
    cells = []
    for r in rows[:limit]:
        seconds = "" if r["seconds"] is None else format_seconds(r["seconds"])
        value, why = esc(r["value"]), esc(r["why"])
        cells.append(
            "<tr>"
            f'<td>{esc(r["kind"])}</td><td title="{value}"><code>{value}</code></td>'
            f"<td>{esc(', '.join(r['axes']))}</td><td>{format_bytes(r['bytes'])}</td>"
            f"<td>{r['count']}</td><td>{seconds}</td><td>{esc(r['tactic'])}</td>"
            f'<td class="wb-clip wb-code" title="{esc(r["code_path"])}">'
            f"<code>{esc(r['code'])}</code></td>"
            f'<td title="{why}">{why}</td></tr>'
        )
    more = f'<p style="{MUTED}">… and {len(rows) - limit} more.</p>' if len(rows) > limit else ""
    cols = "".join(f'<col style="width:{width}">' for _, width in COLUMNS)
    head = "".join(f"<th>{h}</th>" for h, _ in COLUMNS)
    return (
        '<table style="border-collapse:collapse;font-size:12px;table-layout:fixed;width:100%;'
        'overflow-wrap:anywhere" class="wb-table">'
        f"<colgroup>{cols}</colgroup><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(cells)}</tbody></table>{more}"
    )


def inspector(name: str, sharding, why, local_shape, grid_text: str) -> str:
    return (
        f"<b><code>{esc(name)}</code></b>: <code>{esc(sharding)}</code> · local shape "
        f"<code>{esc(local_shape)}</code>"
        + pre(str(why))
        + "<p><b>Who holds which block</b></p>"
        + pre(grid_text)
    )


def run_result(result, predicted_s: float | None, spec_name: str | None) -> str:
    ok = (
        '<span style="color:#2e7d32"><b>outputs agree</b></span>'
        if result.matches
        else '<span style="color:#b00020"><b>outputs DIFFER</b></span>'
    )
    mem = result.memory.get("peak_memory_in_bytes") or result.memory.get("temp_size_in_bytes", 0)
    rows = [
        f"{ok} with the unpartitioned program, both judged against float64 "
        f"(partitioned against unpartitioned: max abs error {result.max_abs_error:.3g}, "
        f"max rel error {result.max_rel_error:.3g})",
        f"measured step <b>{format_seconds(result.step_time_s)}</b> "
        f"(median of {len(result.times_s)}{esc(result.loop_text())} on {esc(result.device)}, "
        f"{esc(result.lowering)} lowering); compile {format_seconds(result.compile_time_s)}",
    ]
    if result.differing:
        rows.append(
            f'<span style="color:#b00020">{esc(result.differing_text().lstrip("; "))}</span>'
        )
    if predicted_s is not None:
        rows.append(
            f"predicted {format_seconds(predicted_s)} on {esc(spec_name)} "
            f"(predicted / measured {predicted_s / result.step_time_s:.2f})"
        )
    rows.append(f"peak memory per device as XLA reports it: {format_bytes(mem)}")
    return "<br>".join(rows)


def error(what: str, exc: BaseException, *, trace: bool) -> str:
    """The message of a failed action; a traceback (folded) for errors that are not the
    user's (anything but a ``WorkbenchError``)."""
    text = f"{what} failed: {type(exc).__name__}: {exc}"
    out = pre(text, ERROR_STYLE)
    if trace:
        tb = "".join(traceback.format_exception(exc))
        out += f"<details><summary>traceback</summary>{pre(tb, 'font-size:11px')}</details>"
    return out


def note(text: str) -> str:
    return f'<span style="{MUTED}">{esc(text)}</span>'


def collective_why(collectives, program) -> str:
    """What a collective node in the graph stands for, and why each is there."""
    rows = []
    for c in collectives[:12]:
        what = f"{c.kind} of {program.values[c.value].name} over {','.join(c.axes)}"
        rows.append(f"<li><b>{esc(what)}</b> ({esc(format_bytes(c.bytes))}): {esc(c.why)}</li>")
    more = len(collectives) - 12
    tail = f"<li>… and {more} more</li>" if more > 0 else ""
    return f"<p><b>Why these collectives</b></p><ul>{''.join(rows)}{tail}</ul>"


def axis_legend(mesh) -> str:
    """The program graph's colours: one per mesh axis (its size), replicated, pending sum."""
    colors = style.axis_colors(mesh)
    items = [(c, f"━━ {a} ({mesh.axis_size(a)})") for a, c in colors.items()]
    items += [(style.REPLICATED, "━━ replicated"), ("#333", "╌╌ pending sum")]
    spans = "".join(f'<span style="color:{c};margin-right:12px">{esc(t)}</span>' for c, t in items)
    return f'<div style="font-size:12px;line-height:1.6">{spans}</div>'
