"""Short displays for people: the few lines of a ``__repr__`` and the HTML table of a
``_repr_html_`` (details folded in ``<details>``), shared by what core returns.

Plain strings only: core imports no UI. Every cell goes through ``html.escape`` here, so
a value name is text, never markup.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

from workbench.core.units import format_bytes, format_seconds

__all__ = [
    "LINES",
    "WIDTH",
    "clip",
    "clip_left",
    "details",
    "facts",
    "format_bytes",
    "format_seconds",
    "lines",
    "panel",
    "table",
    "text_table",
]

#: the most lines a repr shows, and the widest line
LINES = 12
WIDTH = 120
#: the most rows an HTML table shows (the rest are counted)
ROWS = 200

_STYLE = "text-align:left;vertical-align:top;padding:1px 8px"


def clip(text, width: int = WIDTH) -> str:
    """``text`` in at most ``width`` characters, its end cut to an ellipsis."""
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def clip_left(text, width: int = 40) -> str:
    """``text`` in at most ``width`` characters, its start cut (``…/layers/3/attn/wq``):
    the end of a value's path says most."""
    text = str(text)
    return text if len(text) <= width else "…" + text[len(text) - width + 1 :]


def lines(head: str, body: Sequence[str], *, limit: int = LINES, hint: str = "") -> str:
    """``head`` then ``body`` indented, in at most ``limit`` lines: the rest counted in a
    last line that says where to look (``hint``)."""
    body = list(body)
    if len(body) > limit - 1:
        keep = max(limit - 2, 0)
        rest = len(body) - keep
        body = [*body[:keep], f"... and {rest} more" + (f" ({hint})" if hint else "")]
    return "\n".join([head] + ["  " + b for b in body])


def text_table(rows: Iterable[Sequence], widths: Sequence[int]) -> list[str]:
    """Rows as aligned plain-text columns, each cell clipped to its width (the last column
    to ``WIDTH`` minus the others)."""
    rows = [[str(c) for c in r] for r in rows]
    if not rows:
        return []
    widths = list(widths)
    fit = [min(w, max(len(r[i]) for r in rows)) for i, w in enumerate(widths[:-1])]
    out = []
    for r in rows:
        cells = [clip(c, w).ljust(w) for c, w in zip(r[:-1], fit)]
        cells.append(clip(r[-1], widths[-1]))
        out.append("  ".join(cells).rstrip())
    return out


def _cell(tag: str, value) -> str:
    return f'<{tag} style="{_STYLE}">{html.escape(str(value))}</{tag}>'


def table(headers: Sequence[str], rows: Iterable[Sequence], *, limit: int = ROWS) -> str:
    """An HTML table of ``rows`` under ``headers``, every cell escaped; past ``limit`` rows
    the rest are counted in a last row."""
    rows = list(rows)
    head = "".join(_cell("th", h) for h in headers)
    body = ["<tr>" + "".join(_cell("td", c) for c in r) + "</tr>" for r in rows[:limit]]
    if len(rows) > limit:
        span = f'<td colspan="{len(headers)}" style="{_STYLE}">'
        body.append(f"<tr>{span}... and {len(rows) - limit} more</td></tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def facts(pairs: Iterable[tuple[str, object]]) -> str:
    """A two-column HTML table of ``(what, value)`` pairs, every cell escaped."""
    body = "".join(f"<tr>{_cell('th', k)}{_cell('td', v)}</tr>" for k, v in pairs)
    return f"<table><tbody>{body}</tbody></table>"


def details(summary: str, body_html: str) -> str:
    """``body_html`` folded under ``summary`` (escaped): open it to see the details."""
    return f"<details><summary>{html.escape(summary)}</summary>{body_html}</details>"


def panel(title: str, *parts: str) -> str:
    """A display: ``title`` (escaped) above ``parts`` (HTML made by the functions here)."""
    return (
        '<div class="workbench-display">'
        f"<strong>{html.escape(title)}</strong>{''.join(parts)}</div>"
    )
