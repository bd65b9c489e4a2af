"""What the workbench sees in a program, as plain rows and as an HTML table.

``anatomy_rows`` gives one dict per finding of the program's anatomy (``Anatomy.report()``):
the role, how many values it holds, the first few of their names, the dimension it is about,
the confidence in percent and the evidence. Corrections a schedule made (``Role`` steps)
come first, marked ``corrected``. ``anatomy_html`` draws the rows as a table like the
workbench's collective table, every name escaped.
"""

from __future__ import annotations

import html
from collections.abc import Iterable

from workbench.core.anatomy.report import Finding
from workbench.core.errors import WorkbenchError
from workbench.core.session import Session
from workbench.core.strategies.roles import roles

#: Row keys, in column order. ``values`` are the first names (shortened), ``count`` how many
#: values the finding holds; ``confidence`` is in percent; ``corrected`` marks a ``Role`` step.
COLUMNS = ("role", "count", "values", "dim", "confidence", "evidence", "corrected")
CORRECTION = "your correction: a Role step in the schedule; the named strategies after it follow it"
_MUTED = "color:#666"
_CORRECTED = "background:#fff4d6"


def anatomy_rows(program, findings=None, *, first: int = 3, width: int = 40) -> list[dict]:
    """One dict per finding, keys ``COLUMNS``: the corrections first, then the findings.

    ``program`` is a `Program` or a `Session`; ``findings`` an ``Anatomy``, a list of
    ``Finding`` or None: the session's anatomy as the ``Role`` steps so far corrected it
    (``strategies.roles``), or the program's own. ``first`` names are kept per row, each
    cut to ``width`` characters from the left (``…/layers/3/attn/wq``).
    """
    if isinstance(program, Session):
        session, program = program, program.program
        if findings is None:
            findings = roles(program, session.state)
    elif findings is None:
        findings = program.anatomy()
    corrections = getattr(findings, "corrections", ())
    if hasattr(findings, "report"):
        findings = findings.report()
    values = program.values

    def row(role, ids, dim, confidence, evidence, corrected) -> dict:
        return dict(
            role=role,
            count=len(ids),
            values=tuple(shorten(values[v].name, width) for v in ids[:first]),
            dim=dim,
            confidence=round(100 * confidence),
            evidence=evidence,
            corrected=corrected,
        )

    rows = [row(role, tuple(ids), dim, 1.0, CORRECTION, True) for role, ids, dim in corrections]
    for f in findings:
        if not isinstance(f, Finding):
            raise WorkbenchError(
                f"anatomy_rows expected findings (Finding); found a {type(f).__name__}: pass "
                "program.anatomy(), program.anatomy().report() or a session."
            )
        rows.append(row(f.role, f.values, f.dim, f.confidence, f.evidence, False))
    return rows


def shorten(name: str, width: int = 40) -> str:
    """``name`` in at most ``width`` characters, keeping its last path parts: they say most."""
    if len(name) <= width:
        return name
    parts, kept = name.split("/"), ""
    for part in reversed(parts[1:]):
        candidate = f"{part}/{kept}" if kept else part
        if len(candidate) + 2 > width:
            break
        kept = candidate
    if kept:
        return f"…/{kept}"
    half = (width - 1) // 2
    return f"{name[:half]}…{name[len(name) - (width - 1 - half) :]}"


def anatomy_html(rows: Iterable[dict], limit: int = 200) -> str:
    """The rows of ``anatomy_rows`` as an HTML table (corrections tinted), names escaped."""
    rows = list(rows)
    if not rows:
        return f'<span style="{_MUTED}">The workbench sees no roles in this program.</span>'
    cells = []
    for r in rows[:limit]:
        names = ", ".join(f"<code>{_esc(v)}</code>" for v in r["values"])
        if r["count"] > len(r["values"]):
            names += f' <span style="{_MUTED}">… {r["count"] - len(r["values"])} more</span>'
        style = f' style="{_CORRECTED}"' if r["corrected"] else ""
        role = f"<b>{_esc(r['role'])}</b>" + (" (corrected)" if r["corrected"] else "")
        cells.append(
            f"<tr{style}>"
            f"<td>{role}</td><td>{r['count']}</td><td>{names}</td>"
            f"<td>{'' if r['dim'] is None else r['dim']}</td><td>{r['confidence']}%</td>"
            f"<td>{_esc(r['evidence'])}</td></tr>"
        )
    more = f'<p style="{_MUTED}">… and {len(rows) - limit} more.</p>' if len(rows) > limit else ""
    head = "".join(
        f"<th>{h}</th>" for h in ("role", "values", "first names", "dim", "confidence", "evidence")
    )
    return (
        '<table style="border-collapse:collapse;font-size:12px" class="wb-table">'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(cells)}</tbody></table>{more}"
    )


def _esc(x) -> str:
    return html.escape(str(x), quote=True)
