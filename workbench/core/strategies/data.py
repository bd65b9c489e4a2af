"""Batch (data) parallelism: ``BP`` tiles every data input on its batch dimension."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.errors import TacticError
from workbench.core.propagate.tactics import Tactic, Tile, _check_axis
from workbench.core.strategies.base import by_dim, check_fields, strict_text
from workbench.core.strategies.named import register
from workbench.core.strategies.roles import roles


@register(axes="data", place=1)
@dataclass(frozen=True, slots=True)
class BP(Tactic):
    """Batch (data) parallelism: every data input tiled on its batch dimension over ``axis``
    (or dim ``dim`` of the values ``inputs`` selects)."""

    axis: str
    inputs: str | None = None
    dim: int | None = None
    strict: bool = False  # any value it targets left whole is an error

    def __post_init__(self):
        check_fields(self, selectors=("inputs",), optional_dims=("dim",))

    def __str__(self) -> str:
        extra = [f"inputs={self.inputs!r}"] * (self.inputs is not None)
        extra += [f"dim={self.dim}"] * (self.dim is not None)
        return strict_text(self, f"BP({', '.join([repr(self.axis), *extra])})")

    def expand(self, program, mesh, state):
        _check_axis(self, mesh)
        if self.inputs is not None:
            return [Tile(self.inputs, 0 if self.dim is None else self.dim, self.axis)]
        view = roles(program, state)
        data = [(v, d if self.dim is None else self.dim) for v, d in view.data]
        tiles = by_dim(program, mesh, state, self.axis, data, "batch")
        if not any(d is not None for _, d in data):
            one = (
                " It holds one sequence a step (a batch of 1): split the sequence with CP(axis)."
                if view.sequence_class is not None and view.batch_class is None
                else ""
            )
            raise TacticError(
                f"{self}: the workbench sees no data input with a batch dimension in "
                f"{program.name} (program.anatomy() shows what it sees); pass inputs= and dim=, "
                f"or apply Role(selector, 'data', dim=...) first.{one}"
            )
        return tiles
