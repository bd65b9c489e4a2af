"""The collective plan as plain rows (dicts of strings and numbers, JSON-ready): what the
command line prints and ``viz.collective_table`` draws."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from workbench.core.ir.source_lines import where
from workbench.core.layout.collectives import Collective

#: Row keys, in column order. ``bytes`` are per device per run, ``seconds`` per step (every
#: run); ``tactic`` names the tactic behind it; ``index`` is its place in the plan; ``code``
#: the user's line it comes from and the library's, by file name (``lm.py:42 (mlp)``),
#: ``code_path`` the whole lines, one a line, the library's second (``ir.source_lines``).
COLUMNS = (
    "index",
    "kind",
    "value",
    "axes",
    "bytes",
    "count",
    "seconds",
    "tactic",
    "code",
    "why",
    "code_path",
)


def collective_rows(
    items: Iterable[tuple[Collective, float | None]],
    program=None,
    schedule: Sequence | None = None,
) -> list[dict]:
    """One dict per ``(collective, seconds per run or None)``, keys ``COLUMNS``, in plan order.

    ``program`` names the values (else ``#<id>``); ``schedule`` names the tactics (else
    ``#<index>``).
    """
    rows = []
    for i, (c, seconds) in enumerate(items):
        rows.append(
            dict(
                index=i,
                kind=c.kind,
                value=program.values[c.value].name if program is not None else f"#{c.value}",
                axes=c.axes,
                bytes=c.bytes,
                count=c.count,
                seconds=None if seconds is None else seconds * c.count,
                tactic=_tactic(c.tactic, schedule),
                code=where(c.source, c.library),
                why=c.why,
                code_path=where(c.source, c.library, full=True),
            )
        )
    return rows


def _tactic(index: int | None, schedule: Sequence | None) -> str:
    if index is None:
        return ""
    if schedule is not None and 0 <= index < len(schedule):
        return str(schedule[index])
    return f"#{index}"
