"""Embedding sharding: ``EMB`` splits each embedding table on its vocabulary or feature dim."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.errors import TacticError, given
from workbench.core.propagate.tactics import Tactic, TacticInputError, Tile, _check_axis
from workbench.core.strategies.base import by_dim, check_fields, strict_text
from workbench.core.strategies.named import register
from workbench.core.strategies.roles import roles


@register(axes="model", place=5)
@dataclass(frozen=True, slots=True)
class EMB(Tactic):
    """Embedding sharding: each embedding table on its vocabulary dim (``dim="vocab"``) or
    its feature dim (``"feature"``) over ``axis``; ``table`` selects tables (vocab on dim 0)."""

    axis: str
    dim: str = "vocab"
    table: str | None = None
    strict: bool = False  # any value it targets left whole is an error

    def __post_init__(self):
        check_fields(self, selectors=("table",))
        if self.dim not in ("vocab", "feature"):
            raise TacticInputError(
                f"{self}: dim must be 'vocab' (the vocabulary dim) or 'feature'; got "
                f"{given(self.dim)}; to tile a table on another dim, use Tile(table, dim, axis)."
            )

    def __str__(self) -> str:
        return strict_text(
            self,
            f"EMB({self.axis!r}, dim={self.dim!r}"
            + (f", table={self.table!r})" if self.table is not None else ")"),
        )

    def expand(self, program, mesh, state):
        _check_axis(self, mesh)
        if self.table is not None:
            return [Tile(self.table, 0 if self.dim == "vocab" else -1, self.axis)]
        tables = roles(program, state).embeddings
        if not tables:
            raise TacticError(
                f"{self}: the workbench sees no embedding table in {program.name} (a parameter "
                "a gather looks rows up in); pass table=, or apply Role(selector, 'embedding', "
                "dim=<vocabulary dim>) first."
            )
        picks = []
        for t, vocab in tables:
            rank = len(program.values[t].shape)
            other = [d for d in range(rank) if d != vocab]
            picks.append((t, vocab if self.dim == "vocab" else (other[-1] if other else None)))
        what = "vocabulary" if self.dim == "vocab" else "feature"
        return by_dim(program, mesh, state, self.axis, picks, what)
