"""``Role``: a correction of what the workbench sees in the program, kept in the schedule; and
``roles``, the anatomy as the schedule so far corrected it (what every strategy reads)."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.errors import TacticError, closest_names, given
from workbench.core.ir.selectors import select
from workbench.core.propagate.tactics import Tactic, TacticInputError, _freeze, check_dim
from workbench.core.strategies.named import register

ROLES = ("data", "parameter", "none", "embedding", "heads", "hidden")
_NEEDS_DIM = ("data", "embedding", "heads", "hidden")  # the roles about one dim of a value


def roles(program, state):
    """The program's anatomy with the corrections the schedule so far made (``Role``)."""
    corrections = tuple(t for t in state.schedule if isinstance(t, Role))
    anatomy = program.anatomy()
    if not corrections:
        return anatomy
    resolved = tuple((r.role, tuple(select(program, r.selector)), r.dim) for r in corrections)
    return anatomy.corrected(resolved)


@register()
@dataclass(frozen=True, slots=True)
class Role(Tactic):
    """A correction of what the workbench sees in the program, kept in the schedule like a
    tactic (undo, save and export rebuild it). ``role`` is one of ``ROLES``:

    - ``"data"``: the values are data inputs, batch on ``dim``;
    - ``"parameter"``: the values are parameters; ``"none"``: neither data nor parameter;
    - ``"embedding"``: embedding tables, vocabulary on ``dim``;
    - ``"heads"`` / ``"hidden"``: projections MP splits on ``dim`` (attention heads, MLP).

    It changes no sharding; the named strategies after it read the corrected roles.
    """

    selector: str | tuple
    role: str
    dim: int | None = None
    axis: str = ""

    def __post_init__(self):
        object.__setattr__(self, "selector", _freeze(self.selector, self))
        if self.role not in ROLES:
            hint = closest_names(self.role, ROLES) if isinstance(self.role, str) else []
            raise TacticInputError(
                f"{self}: role must be one of {list(ROLES)}; got {given(self.role)}"
                + (f"; did you mean {hint[0]!r}?" if hint else ".")
            )
        check_dim(self, "dim", optional=True)  # a role about a dim needs one: checked when applied
        if not isinstance(self.axis, str):
            raise TacticInputError(f"{self}: axis must be a string; got {given(self.axis)}.")

    def __str__(self) -> str:
        sel = list(self.selector) if isinstance(self.selector, tuple) else self.selector
        return f"Role({sel!r}, {self.role!r}" + (
            f", dim={self.dim})" if self.dim is not None else ")"
        )

    def expand(self, program, mesh, state):
        needs_dim = self.role in _NEEDS_DIM
        if needs_dim and self.dim is None:
            raise TacticError(
                f"{self}: role {self.role!r} needs dim=<the dimension it is about> (an int, "
                "e.g. dim=0 for a batch or vocabulary dim); got none."
            )
        for v in select(program, self.selector):
            shape = program.values[v].shape
            if needs_dim and not -len(shape) <= self.dim < len(shape):
                raise TacticError(
                    f"{self}: {program.values[v].name} has shape {shape}, so dim {self.dim} is "
                    f"out of range; use a dim in [{-len(shape)}, {len(shape) - 1}]."
                )
        return []
