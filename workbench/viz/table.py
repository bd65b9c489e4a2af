"""The collective plan as plain rows and as a plotly table: kind, value, axes, bytes, the
code it comes from, why.

``collective_rows`` gives a list of dicts (built by ``core.plan.rows``, as the command line
prints them; ``pandas.DataFrame(rows)`` works where pandas is installed);
``collective_table`` draws the same rows. Either takes a session (its collectives, value
names and schedule), an ``Estimate`` (adds each collective's time), or collectives
themselves (``Collective`` or ``CollectiveEstimate``).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

import plotly.graph_objects as go

from workbench.core.errors import WorkbenchError
from workbench.core.estimate import CollectiveEstimate, Estimate
from workbench.core.ir.source_lines import short, split
from workbench.core.layout.collectives import Collective
from workbench.core.plan.rows import COLUMNS  # noqa: F401  (re-exported: the rows' keys)
from workbench.core.plan.rows import collective_rows as plan_rows
from workbench.core.session import Session
from workbench.core.units import format_bytes, format_seconds
from workbench.viz.charts import FONT
from workbench.viz.style import KIND_COLORS

_HEADERS = ("#", "kind", "value", "axes", "bytes", "count", "time", "tactic", "code", "why")
_WIDTHS = (4, 10, 30, 6, 8, 5, 7, 9, 20, 35)


def collective_rows(
    source: Session | Estimate | Iterable[Collective | CollectiveEstimate],
    program=None,
    *,
    schedule: Sequence | None = None,
    hardware=None,
) -> list[dict]:
    """One dict per collective, keys ``COLUMNS``, in plan order.

    ``program`` names the values (else ``#<id>``); ``schedule`` names the tactics (else
    ``#<index>``). A session gives both; with ``hardware`` its rows carry times.
    """
    items = _items(source, hardware)
    if isinstance(source, Session):
        program = source.program if program is None else program
        schedule = source.history if schedule is None else schedule
    return plan_rows(items, program, schedule)


def collective_table(
    source: Session | Estimate | Iterable[Collective | CollectiveEstimate],
    program=None,
    *,
    schedule: Sequence | None = None,
    hardware=None,
    top: int | None = None,
) -> go.Figure:
    """The rows of ``collective_rows`` as a plotly table, kinds tinted as in the charts.

    ``top``: show only the ``top`` costliest (by time where known, else bytes moved per step).
    """
    rows = collective_rows(source, program, schedule=schedule, hardware=hardware)
    total_bytes = sum(r["bytes"] * r["count"] for r in rows)
    timed = all(r["seconds"] is not None for r in rows)
    title = f"{len(rows)} collectives, {format_bytes(total_bytes)} per device per step"
    if timed and rows:
        title += f", {format_seconds(sum(r['seconds'] for r in rows))}"
    if top is not None and len(rows) > top:
        rows = sorted(
            rows, key=lambda r: r["seconds"] if timed else r["bytes"] * r["count"], reverse=True
        )
        rows = sorted(rows[:top], key=lambda r: r["index"])
        title += f" (the {top} costliest shown)"
    cells = [
        [r["index"] for r in rows],
        [r["kind"] for r in rows],
        [r["value"] for r in rows],
        [",".join(r["axes"]) for r in rows],
        [format_bytes(r["bytes"]) for r in rows],
        [r["count"] for r in rows],
        [format_seconds(r["seconds"]) if r["seconds"] is not None else "" for r in rows],
        [r["tactic"] for r in rows],
        [_code_cell(r) for r in rows],
        [r["why"].removesuffix(f" (at {r['code']})") for r in rows],  # the code column says it
    ]
    white = ["white"] * len(rows)
    fill = [white, [_tint(KIND_COLORS.get(r["kind"], "#BBBBBB")) for r in rows]]
    fill += [white] * (len(_HEADERS) - 2)
    headers = _HEADERS
    fig = go.Figure(
        go.Table(
            columnwidth=list(_WIDTHS),
            header=dict(
                values=[f"<b>{h}</b>" for h in headers], align="left", fill_color="#EEEEEE"
            ),
            cells=dict(values=cells, align="left", fill_color=fill, height=24),
        )
    )
    fig.update_layout(
        template="plotly_white",
        font=FONT,
        title=dict(text=title, x=0.01, xanchor="left"),
        margin=dict(t=50, l=10, r=10, b=10),
        height=min(100 + 46 * len(rows), 720),
    )
    return fig


def _items(source, hardware) -> list[tuple[Collective, float | None]]:
    if isinstance(source, Session):
        if hardware is None:
            return [(c, None) for c in source.collectives()]
        source = source.estimate(hardware)
    if isinstance(source, Estimate):
        return [(c.collective, c.seconds) for c in source.collectives]
    items = []
    for c in source:
        if isinstance(c, CollectiveEstimate):
            items.append((c.collective, c.seconds))
        elif isinstance(c, Collective):
            items.append((c, None))
        else:
            raise WorkbenchError(
                f"collective_rows expected a Session, an Estimate or Collectives; found a "
                f"{type(c).__name__} among them: pass session.collectives() or session.estimate(hw)."
            )
    return items


def _code_cell(row: dict) -> str:
    """The user's line over the library's, by file name (narrow); plotly tables have no
    tooltips, so each links to its whole path (the rows' ``code_path``)."""
    lines = row["code_path"].split("\n") if row["code_path"] else []
    cells = []
    for i, line in enumerate(lines):
        text = short(line, library=i == 1) or "(no line of yours)"
        path = html.escape(split(line)[0] if split(line) else line, quote=True)
        cells.append(f'<a href="file://{path}">{html.escape(text)}</a>' if line else text)
    return "<br>".join(cells)


def _tint(hex_color: str, alpha: float = 0.35) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"
