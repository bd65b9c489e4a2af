"""``Place``: where the mesh's axes lie on a hardware's levels, fixed as a step of the schedule.

A `Placement` (``hardware/placement.py``) as plain data, so undo, save and export rebuild it
like any tactic. It partitions nothing (``moves_nothing``: applying it keeps every sharding
and appends it to the schedule); ``State.placement`` reads the last one, the estimate prices
under it and the lowerings lay the devices out by it (``Placement.device_ids``).
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral

from workbench.core.errors import given
from workbench.core.hardware.levels import HardwareError
from workbench.core.hardware.placement import Placement
from workbench.core.propagate.tactics import Tactic, TacticInputError
from workbench.core.strategies.named import register

#: the levels' link names, innermost first
Levels = tuple[str, ...]
#: per mesh axis, in mesh order: (axis, its factor on each level, innermost first)
Factors = tuple[tuple[str, tuple[int, ...]], ...]

_EXAMPLE = "Place(('nvlink', 'infiniband'), (('data', (2, 4)), ('model', (4, 1))))"


@register()
@dataclass(frozen=True, slots=True)
class Place(Tactic):
    """Fix where the mesh's axes lie on a hardware's ``levels`` (link names, innermost
    first): ``factors`` gives each mesh axis, in mesh order, its factor on each level, the
    factors multiplying to the axis's size. ``Place.of(placement)`` makes one from a
    `Placement` (``Session.placements(hardware)`` ranks them); ``Session.place`` applies it.
    """

    levels: Levels
    factors: Factors

    #: a fact about where the step runs: applying it changes no sharding (``apply_tactic``)
    moves_nothing = True

    def __post_init__(self):
        shown = f"Place(levels={given(self.levels)}, factors={given(self.factors)})"
        levels = self.levels
        if not (
            isinstance(levels, list | tuple)
            and levels
            and all(isinstance(x, str) and x for x in levels)
            and len(set(levels)) == len(levels)
        ):
            raise TacticInputError(
                f"{shown}: levels must be the hardware's link names, innermost first, each "
                f"once (hardware.links names them, e.g. ('nvlink', 'infiniband')); write e.g. "
                f"{_EXAMPLE}."
            )
        if not isinstance(self.factors, list | tuple) or not self.factors:
            raise TacticInputError(
                f"{shown}: factors must list each mesh axis, in mesh order, with its factor "
                f"on each level; write e.g. {_EXAMPLE}."
            )
        factors = []
        for entry in self.factors:
            axis, fs = entry if isinstance(entry, list | tuple) and len(entry) == 2 else (0, 0)
            if not (isinstance(axis, str) and axis.isidentifier()):
                raise TacticInputError(
                    f"{shown}: each entry of factors is (mesh axis name, factors), e.g. "
                    f"('data', (2, 4)); got {given(entry)}."
                )
            ok = isinstance(fs, list | tuple) and len(fs) == len(levels)
            if not (ok and all(isinstance(f, Integral) and not isinstance(f, bool) for f in fs)):
                raise TacticInputError(
                    f"{shown}: axis {axis!r} has factors {given(fs)}; give one int per level "
                    f"({', '.join(levels)}), innermost first."
                )
            if any(f < 1 for f in fs):
                raise TacticInputError(
                    f"{shown}: axis {axis!r} has factors {given(fs)}, and a factor is the "
                    "number of the axis's devices on a level: at least 1 (1 where the axis "
                    "does not cross that level)."
                )
            factors.append((axis, tuple(int(f) for f in fs)))
        axes = [a for a, _ in factors]
        if len(set(axes)) != len(axes):
            twice = next(a for a in axes if axes.count(a) > 1)
            raise TacticInputError(f"{shown}: axis {twice!r} is placed twice; place each once.")
        object.__setattr__(self, "levels", tuple(levels))
        object.__setattr__(self, "factors", tuple(factors))

    @classmethod
    def of(cls, placement) -> Place:
        """The step fixing ``placement``: a `Placement`, or a `Ranked` of
        ``Session.placements(hardware)`` (what holds one as its ``placement``)."""
        held = getattr(placement, "placement", None)
        placement = held if isinstance(held, Placement) else placement
        if not isinstance(placement, Placement):
            raise TacticInputError(
                f"a placement to fix is a Placement, or one of session.placements(hardware) "
                f"(e.g. session.place(session.placements('h100')[0]), the fastest); got "
                f"{given(placement)}. Or write the step itself: {_EXAMPLE}."
            )
        return cls(placement.levels, placement.factors)

    @property
    def placement(self) -> Placement:
        return Placement(self.levels, self.factors)

    def __str__(self) -> str:
        return f"Place({self.placement})"

    def expand(self, program, mesh, state):
        """Nothing to tile: it checks that it places ``mesh`` (``check_mesh``)."""
        self.check_mesh(mesh)
        return []

    def check_mesh(self, mesh) -> None:
        """Raise unless it places ``mesh``'s axes, in mesh order, at their sizes."""
        try:
            self.placement.check_axes(mesh)
        except HardwareError as err:
            raise TacticInputError(f"{self}: {err}") from err
