"""Factor mappings: what a sharding rule says about one op.

A mapping names *factors* (independent index spaces of an op, like m, k and n of a
matmul) and says which factors make up each dimension of each operand and result,
major to minor. PartIR calls this the op's tile mapping; Shardy its op sharding rule.

- A factor tiled on a mesh axis in one tensor may be tiled on that axis in every
  tensor that carries it.
- A factor absent from every result (a contraction, a reduction) leaves the results
  pending ``reduction`` over that axis when tiled.
- A *blocked* factor cannot be split (sort along a dim, cumsum, a padded dim): propagation
  never carries an axis over it; lowering gathers it.
- ``linear`` lists operand groups the op is linear in: when exactly the operands of
  one group are pending a sum over an axis, the results are too (``add``: one group
  ``(0, 1)``; ``mul``: two groups ``(0,)`` and ``(1,)``).
- ``structural`` ops only move data, so any pending reduction passes through them.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass, field

Dims = tuple[tuple[int, ...], ...]

_NAMES = list(string.ascii_lowercase[8:]) + list(string.ascii_lowercase[:8])


def factor_name(index: int) -> str:
    return _NAMES[index] if index < len(_NAMES) else f"f{index}"


@dataclass(frozen=True, slots=True)
class TensorType:
    """Shape and dtype of an operand or result, as a rule sees it."""

    shape: tuple[int, ...]
    dtype: object = None
    literal: object = None  # the value, for literal operands (e.g. a pad's padding value)

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass(frozen=True, slots=True)
class FactorMapping:
    """Factors of an op and where they sit in its operands and results (see module doc)."""

    sizes: tuple[int, ...]
    operands: tuple[Dims, ...]
    results: tuple[Dims, ...]
    blocked: frozenset[int] = frozenset()
    reduction: str = "sum"
    linear: tuple[tuple[int, ...], ...] = ()
    structural: bool = False
    barrier: bool = False
    _contracting: frozenset[int] = field(default=frozenset(), compare=False, repr=False)
    _hash: int = field(default=0, compare=False, repr=False)

    def __hash__(self) -> int:  # mappings key the planner's caches: hash once
        if not self._hash:
            fields_ = (self.sizes, self.operands, self.results, self.blocked, self.reduction)
            object.__setattr__(
                self,
                "_hash",
                hash((*fields_, self.linear, self.structural, self.barrier)) or 1,
            )
        return self._hash

    def __post_init__(self):
        in_results = {f for dims in self.results for d in dims for f in d}
        in_operands = {f for dims in self.operands for d in dims for f in d}
        object.__setattr__(
            self, "_contracting", frozenset(in_operands - in_results - set(self.blocked))
        )

    @property
    def contracting(self) -> frozenset[int]:
        """Factors that appear in operands only: tiling one leaves the results partial."""
        return self._contracting

    def check(self, operands: Sequence[TensorType], results: Sequence[TensorType]) -> None:
        """Raise ValueError unless factor sizes multiply to every dimension size."""
        for kind, dims_list, types in (
            ("operand", self.operands, operands),
            ("result", self.results, results),
        ):
            if len(dims_list) != len(types):
                raise ValueError(f"{len(dims_list)} {kind} entries for {len(types)} {kind}s")
            for i, (dims, t) in enumerate(zip(dims_list, types)):
                if len(dims) != len(t.shape):
                    raise ValueError(f"{kind} {i}: {len(dims)} dims for shape {t.shape}")
                for d, (factors, n) in enumerate(zip(dims, t.shape)):
                    prod = 1
                    for f in factors:
                        prod *= self.sizes[f]
                    if prod != n:
                        raise ValueError(
                            f"{kind} {i} dim {d}: factors {factors} give {prod}, not {n}"
                        )

    def letters(self) -> dict[int, str]:
        """Factor names in order of first appearance, operands then results: i, j, k, ..."""
        order: dict[int, str] = {}
        for dims in (*self.operands, *self.results):
            for d in dims:
                for f in d:
                    order.setdefault(f, factor_name(len(order)))
        for f in range(len(self.sizes)):
            order.setdefault(f, factor_name(len(order)))
        return order

    def __str__(self) -> str:
        letter = self.letters()

        def dim_text(factors):
            if not factors:
                return "_"
            names = [letter[f] for f in factors]
            return (
                "".join(names) if all(len(n) == 1 for n in names) else "(" + ",".join(names) + ")"
            )

        def side(tensors):
            return ", ".join("[" + ", ".join(dim_text(d) for d in dims) + "]" for dims in tensors)

        text = f"({side(self.operands)})->({side(self.results)})"
        if self.sizes:
            ordered = sorted(
                range(len(self.sizes)),
                key=lambda f: (
                    _NAMES.index(letter[f]) if letter[f] in _NAMES else int(letter[f][1:])
                ),
            )
            text += " {" + ", ".join(f"{letter[f]}={self.sizes[f]}" for f in ordered) + "}"
        if self.contracting:
            names = ", ".join(sorted(letter[f] for f in self.contracting))
            text += f" {self.reduction}: {names}"
        if self.blocked:
            text += " blocked: " + ", ".join(sorted(letter[f] for f in self.blocked))
        if self.linear:
            text += " linear: " + " | ".join("+".join(map(str, g)) for g in self.linear)
        if self.structural:
            text += " structural"
        if self.barrier:
            text += " barrier"
        return text


class MappingBuilder:
    """Builds a FactorMapping factor by factor, for rules an einsum string cannot say."""

    def __init__(self):
        self.sizes: list[int] = []
        self.blocked: set[int] = set()
        self.operands: list[Dims] = []
        self.results: list[Dims] = []

    def factor(self, size: int, *, blocked: bool = False) -> int:
        self.sizes.append(int(size))
        if blocked:
            self.blocked.add(len(self.sizes) - 1)
        return len(self.sizes) - 1

    def dims_for(self, shape: Sequence[int], *, blocked: bool = False) -> list[tuple[int, ...]]:
        """A fresh factor for every dimension of ``shape`` (none for a size-1 dimension)."""
        return [(self.factor(n, blocked=blocked),) if n != 1 else () for n in shape]

    def operand(self, dims) -> None:
        self.operands.append(tuple(tuple(d) for d in dims))

    def result(self, dims) -> None:
        self.results.append(tuple(tuple(d) for d in dims))

    def build(self, **kwargs) -> FactorMapping:
        return FactorMapping(
            sizes=tuple(self.sizes),
            operands=tuple(self.operands),
            results=tuple(self.results),
            blocked=frozenset(self.blocked),
            **kwargs,
        )


def einsum_mapping(
    spec: str,
    operands: Sequence[TensorType],
    results: Sequence[TensorType],
    *,
    blocked: str = "",
    **kwargs,
) -> FactorMapping:
    """A mapping from an einsum-like spec: ``"mk,kn->mn"``; ``""`` for a scalar tensor.

    Each letter is one factor; its size is read off the shapes. Letters in ``blocked``
    cannot be split.
    """
    lhs, rhs = spec.split("->")
    in_specs = lhs.split(",") if operands else []
    out_specs = rhs.split(",") if results else []
    if len(in_specs) != len(operands) or len(out_specs) != len(results):
        raise ValueError(
            f"spec {spec!r} does not fit {len(operands)} operands, {len(results)} results"
        )
    letters: dict[str, int] = {}
    sizes: list[int] = []
    for specs, types in ((in_specs, operands), (out_specs, results)):
        for s, t in zip(specs, types):
            if len(s) != len(t.shape):
                raise ValueError(f"spec {s!r} does not fit shape {t.shape}")
            for letter, n in zip(s, t.shape):
                if letter not in letters:
                    letters[letter] = len(sizes)
                    sizes.append(n)
                elif sizes[letters[letter]] != n:
                    raise ValueError(
                        f"factor {letter!r} has sizes {sizes[letters[letter]]} and {n}"
                    )

    def dims(s):
        return tuple((letters[c],) for c in s)

    return FactorMapping(
        sizes=tuple(sizes),
        operands=tuple(dims(s) for s in in_specs),
        results=tuple(dims(s) for s in out_specs),
        blocked=frozenset(letters[c] for c in blocked if c in letters),
        **kwargs,
    )


def barrier_mapping(operands: Sequence[TensorType], results: Sequence[TensorType]) -> FactorMapping:
    """Every dimension its own blocked factor: nothing propagates across the op."""
    b = MappingBuilder()
    for t in operands:
        b.operand(b.dims_for(t.shape, blocked=True))
    for t in results:
        b.result(b.dims_for(t.shape, blocked=True))
    return b.build(barrier=True)
