"""``Collectives``: the collectives a partitioned program performs, as a list (each a
``Collective``) that displays in a few lines: the count, the bytes by kind and mesh axes,
the largest; in a notebook, a table with every collective folded beneath."""

from __future__ import annotations

from collections.abc import Iterable

from workbench.core import display as d
from workbench.core.layout.collectives import Collective

TOP = 3  # the largest collectives a repr names
GROUPS = 5  # the most (kind, axes) lines it shows


class Collectives(list):
    """A list of ``Collective`` that says what it holds. ``program`` and ``tactics`` (the
    schedule) name values, ops and tactics; without them their ids are shown."""

    def __init__(self, items: Iterable[Collective] = (), program=None, tactics=()):
        super().__init__(items)
        self.program = program
        self.tactics = tuple(tactics)

    # -- the numbers ----------------------------------------------------------------------
    @property
    def bytes(self) -> int:
        """Bytes per device per step, every collective's count included."""
        return sum(c.bytes * c.count for c in self)

    def by_kind(self) -> dict[tuple[str, tuple[str, ...]], tuple[int, int]]:
        """``(kind, axes) -> (collectives per step, bytes per device per step)``, largest first."""
        out: dict = {}
        for c in self:
            n, b = out.get((c.kind, c.axes), (0, 0))
            out[c.kind, c.axes] = (n + c.count, b + c.bytes * c.count)
        return dict(sorted(out.items(), key=lambda kv: -kv[1][1]))

    def largest(self, top: int = TOP) -> list[Collective]:
        return sorted(self, key=lambda c: -c.bytes * c.count)[:top]

    # -- names ------------------------------------------------------------------------------
    def value_name(self, c: Collective) -> str:
        return self.program.values[c.value].name if self.program is not None else f"#{c.value}"

    def op_name(self, c: Collective) -> str:
        if c.op is None:
            return "(an output)"
        return self.program.ops[c.op].name if self.program is not None else f"op {c.op}"

    def tactic_text(self, c: Collective) -> str:
        if c.tactic is None:
            return ""
        if c.tactic < len(self.tactics):
            return f"#{c.tactic} {self.tactics[c.tactic]}"
        return f"#{c.tactic}"

    # -- displays ---------------------------------------------------------------------------
    def _head(self) -> str:
        runs = sum(c.count for c in self)
        if not self:
            return "Collectives: none (every op runs on the layouts it is given)"
        return (
            f"Collectives: {len(self)} ({runs} runs per step), "
            f"{d.format_bytes(self.bytes)} per device per step"
        )

    @staticmethod
    def _axes(axes) -> str:
        return "+".join(axes) or "-"

    def __repr__(self) -> str:
        if not self:
            return self._head()
        groups = [
            f"{kind} over {self._axes(axes)}: {n}, {d.format_bytes(b)}"
            for (kind, axes), (n, b) in self.by_kind().items()
        ]
        if len(groups) > GROUPS:
            groups = [*groups[: GROUPS - 1], f"... and {len(groups) - GROUPS + 1} more kinds"]
        rows = [
            (
                c.kind,
                self._axes(c.axes),
                d.format_bytes(c.bytes) + (f" x{c.count}" if c.count > 1 else ""),
                c.why or self.value_name(c),
            )
            for c in self.largest()
        ]
        body = [*groups, "largest:"] + ["  " + r for r in d.text_table(rows, (14, 12, 14, 72))]
        return d.lines(self._head(), body, hint="index the list, or see its HTML table")

    def _repr_html_(self) -> str:
        groups = d.table(
            ("kind", "axes", "per step", "bytes per device"),
            (
                (kind, self._axes(axes), n, d.format_bytes(b))
                for (kind, axes), (n, b) in self.by_kind().items()
            ),
        )
        every = d.table(
            ("#", "kind", "value", "axes", "bytes", "count", "at", "tactic", "why"),
            (
                (
                    i,
                    c.kind,
                    self.value_name(c),
                    self._axes(c.axes),
                    d.format_bytes(c.bytes),
                    c.count,
                    self.op_name(c),
                    self.tactic_text(c),
                    c.why,
                )
                for i, c in enumerate(self)
            ),
        )
        return d.panel(self._head(), groups, d.details(f"all {len(self)} collectives", every))
