"""What the ``workbench`` commands share: their usage error and their text tables."""

from __future__ import annotations

#: The help of ``--fused-attention`` (``workbench plan`` and ``workbench sweep``).
FUSED_HELP = (
    "price attention as fused flash-style kernels (the program calls them, or XLA rewrites it)"
)


class UsageError(Exception):
    """Input the command cannot use; the message says what was given and what would work."""


def table(rows: list[list[str]], right: set[int] = frozenset()) -> list[str]:
    """Rows of cells as aligned text; the last column is left unpadded."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))
        ]
        cells[-1] = r[-1]
        lines.append("  ".join(cells).rstrip())
    return lines
