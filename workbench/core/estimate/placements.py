"""Placements ranked by the simulated step: `rank` prices one plan under each placement of
its mesh on a hardware's levels (``hardware/placement.py``) and sorts them, fastest first;
each `Ranked` keeps its estimate, so what every collective costs under it can be read.
`placed_for`: the hardware a session's placement (a ``Place`` step) prices under."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from workbench.core.errors import InputError, given
from workbench.core.estimate.step import Estimate
from workbench.core.hardware.levels import HardwareError
from workbench.core.hardware.names import resolve
from workbench.core.hardware.placement import LIMIT, Placement, count, level_sizes, placements
from workbench.core.hardware.spec import Hardware
from workbench.core.layout.mesh import Mesh
from workbench.core.units import format_seconds


@dataclass(frozen=True)
class Ranked:
    """One placement and the step the simulator gives it."""

    placement: Placement
    estimate: Estimate

    def by_axes(self) -> dict[tuple[str, tuple[str, ...]], float]:
        """Seconds per step by (collective kind, mesh axes) under this placement."""
        out: dict[tuple[str, tuple[str, ...]], float] = {}
        for c in self.estimate.collectives:
            key = (c.collective.kind, tuple(c.collective.axes))
            out[key] = out.get(key, 0.0) + c.total_s
        return out

    def __str__(self) -> str:
        parts = ", ".join(
            f"{kind} over {'+'.join(axes)} {format_seconds(s)}"
            for (kind, axes), s in sorted(self.by_axes().items(), key=lambda kv: -kv[1])
            if s > 0
        )
        return f"step {format_seconds(self.estimate.step_s)} with {self.placement}" + (
            f" ({parts})" if parts else ""
        )


class Placements(list):
    """`Ranked` placements, fastest first; ``total``: how many the mesh has on the levels
    (more than were priced where ``limit`` capped them)."""

    def __init__(self, ranked, total: int, limit: int):
        super().__init__(ranked)
        self.total, self.limit = total, limit

    def __str__(self) -> str:
        head = f"{len(self)} placements" + (
            f" (of {self.total}; limit={self.limit})" if self.total > len(self) else ""
        )
        return "\n".join([head + ", fastest first:", *(f"  {r}" for r in self)])

    def _repr_pretty_(self, p, cycle):
        p.text(str(self))


def rank(
    mesh: Mesh,
    hardware: Hardware | str | None,
    price: Callable[[Hardware], Estimate],
    limit: int | None = None,
) -> Placements:
    """``price(hardware placed)`` for each placement of ``mesh`` (at most ``limit``, default
    `LIMIT`) on ``hardware`` (a `Hardware`, a preset's name, None for the CPU's), fastest
    first (ties keep the enumeration's order: the mesh order's placement first). A
    placement moves no compute and no memory, so ``Session.estimate`` reprices the
    collectives alone once it holds one (``estimate.step.repriced``)."""
    hardware = resolve(hardware)  # None: the CPU preset; a preset's name; a spec
    limit = LIMIT if limit is None else limit
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise InputError(
            f"placements(limit={given(limit)}): give how many placements to price at most, "
            f"a positive int (default {LIMIT})."
        )
    chosen = placements(mesh, hardware.links, limit=limit)
    ranked = [Ranked(p, price(hardware.with_placement(p))) for p in chosen]
    ranked.sort(key=lambda r: r.estimate.step_s)
    total = count(mesh, hardware.links)
    return Placements(ranked, total, limit)


def placed_for(mesh: Mesh, placement: Placement | None, hardware: Hardware) -> tuple[Hardware, str]:
    """The hardware to price a state under whose placement is ``placement`` (its last
    ``Place`` step's; None: none), and a note for the estimate ("" when none is needed).
    A hardware with a placement of its own keeps it; otherwise the state's applies where
    it is on the hardware's levels and fits them, and where not the hardware is priced as
    given (the mesh order) and the note says so."""
    if placement is None:
        return hardware, ""
    if hardware.placement is not None:
        if hardware.placement == placement:
            return hardware, ""
        return hardware, (
            f"priced under {hardware.name}'s own placement ({hardware.placement}), not the "
            f"session's ({placement})"
        )
    names = tuple(x.name for x in hardware.links)
    sizes = level_sizes(mesh, hardware.links)
    if placement.levels != names:
        why = f"whose levels are {', '.join(names)}"
    elif sizes is None:
        why = f"whose levels do not divide the mesh's {mesh.size} devices"
    else:
        try:
            placement.check(mesh, sizes)
            return hardware.with_placement(placement), ""
        except HardwareError as err:
            why = f"whose groups it does not fit ({str(err).rstrip('.')})"
    return hardware, (
        f"the session's placement ({placement}; levels {', '.join(placement.levels)}) does "
        f"not apply to {hardware.name}, {why}; priced in mesh order"
    )
