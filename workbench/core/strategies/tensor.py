"""Tensor parallelism: ``MP`` (Megatron: attention heads and the MLP hidden dim) and ``MQ``
(multi-query attention: queries split on their heads, shared keys and values kept whole)."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.errors import TacticError
from workbench.core.propagate.tactics import Expansion, Replicate, Tactic, _check_axis
from workbench.core.strategies.base import (
    by_dim,
    check_fields,
    matches,
    names_of,
    strict_text,
    unmatched,
)
from workbench.core.strategies.named import register
from workbench.core.strategies.roles import roles


@register(axes="model", place=2)
@dataclass(frozen=True, slots=True)
class MP(Tactic):
    """Megatron tensor parallelism: attention heads and the MLP hidden dim over ``axis``.

    Splits every up projection (queries, keys, values; MLP up and gate) on the hidden class
    it makes (heads first); propagation gives the output and down projections their input
    dim and makes their products pending sums. Attention fed by a fused projection split
    after its matmul keeps that kernel whole: its queries, keys and values are split by
    heads after the split (locally, no communication; the fused matmul is repeated on each
    device). ``heads``/``hidden`` selectors (with ``heads_dim``/``hidden_dim``) override.
    """

    axis: str
    heads: str | None = None
    hidden: str | None = None
    heads_dim: int = -2
    hidden_dim: int = -1
    strict: bool = False  # any value it targets left whole is an error

    def __post_init__(self):
        check_fields(self, selectors=("heads", "hidden"), dims=("heads_dim", "hidden_dim"))

    def __str__(self) -> str:
        if (self.heads, self.hidden, self.heads_dim, self.hidden_dim) == (None, None, -2, -1):
            return strict_text(self, f"MP({self.axis!r})")
        return strict_text(
            self,
            f"MP({self.axis!r}, heads={self.heads!r}, hidden={self.hidden!r}, "
            f"heads_dim={self.heads_dim}, hidden_dim={self.hidden_dim})",
        )

    def expand(self, program, mesh, state):
        _check_axis(self, mesh)
        view = roles(program, state)
        if self.heads is not None:
            heads = [(v, self.heads_dim) for v in matches(program, self.heads)]
        else:
            heads = view.heads_splits()
        if self.hidden is not None:
            hidden = [(v, self.hidden_dim) for v in matches(program, self.hidden)]
        else:
            hidden = [] if self.heads is not None else view.hidden_splits()
        if not heads and not hidden:
            raise TacticError(
                f"{self}: the workbench sees no attention or MLP projection in {program.name} "
                "(program.anatomy() shows what it sees); pass heads=/hidden= selectors naming "
                "your attention projections and MLP input weights, or apply "
                "Role(selector, 'heads'|'hidden', dim=...) first."
            )
        missed = unmatched(program, "heads", self.heads) + unmatched(program, "hidden", self.hidden)
        return (
            Expansion([], missed)
            + by_dim(program, mesh, state, self.axis, heads, "heads")
            + by_dim(program, mesh, state, self.axis, hidden, "hidden")
        )


@register(axes="model", place=7)
@dataclass(frozen=True, slots=True)
class MQ(Tactic):
    """Multi-query attention: queries split on their heads over ``axis``, the shared key and
    value projections kept whole on it."""

    axis: str
    queries: str | None = None
    keys_values: str | None = None
    heads_dim: int = -2
    strict: bool = False  # any value it targets left whole is an error

    def __post_init__(self):
        check_fields(self, selectors=("queries", "keys_values"), dims=("heads_dim",))

    def __str__(self) -> str:
        if (self.queries, self.keys_values, self.heads_dim) == (None, None, -2):
            return strict_text(self, f"MQ({self.axis!r})")
        return strict_text(
            self,
            f"MQ({self.axis!r}, queries={self.queries!r}, keys_values={self.keys_values!r}, "
            f"heads_dim={self.heads_dim})",
        )

    def expand(self, program, mesh, state):
        _check_axis(self, mesh)
        view = roles(program, state)
        if self.queries is not None:
            queries = [(v, self.heads_dim) for v in matches(program, self.queries)]
        else:
            queries = view.heads_splits(only="queries")
        kv = (
            matches(program, self.keys_values)
            if self.keys_values is not None
            else view.keys_values()
        )
        if not queries:
            raise TacticError(
                f"{self}: the workbench sees no attention queries in {program.name}; pass "
                "queries= and keys_values= selectors."
            )
        kv = [v for v in kv if self.axis not in state.shardings[v].replicated]
        keep = [Replicate(names_of(program, kv), self.axis)] if kv else []
        return keep + by_dim(program, mesh, state, self.axis, queries, "heads")
