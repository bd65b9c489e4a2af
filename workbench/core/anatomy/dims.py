"""Dimension classes: which dimensions of which values must be split together.

Union-find over every op's factor mapping (TOAST's named dimension analysis): two
dimensions whose *major* factor is the same factor of one op are one class, so tiling one
of them on an axis can reach the other by propagation. A dimension merged from several
factors (``[B, S*D]``) joins the class of its major factor, as a tile of it lands there
first. A class that one op carries on two different factors (the queries' and the keys'
sequence in attention scores) is a *conflict*: one axis cannot tile both.
"""

from __future__ import annotations

from dataclasses import dataclass


class UnionFind:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        parent = self.parent
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            if ra < rb:
                ra, rb = rb, ra
            self.parent[ra] = rb

    def roots(self) -> tuple[int, ...]:
        """Every node's root (the smallest node of its set). Links only ever point to a
        smaller node, so one pass upward resolves them all."""
        parent = self.parent
        for i in range(len(parent)):
            parent[i] = parent[parent[i]]
        return tuple(parent)


@dataclass(frozen=True, slots=True)
class DimClasses:
    """``of(value, dim)`` is the class id of a dimension."""

    base: tuple[int, ...]  # per value, the node id of its dim 0
    cls: tuple[int, ...]  # per node, its class (the smallest node id in it)
    conflicts: dict[int, tuple[int, ...]]  # class -> ops carrying it on two factors

    def of(self, value: int, dim: int) -> int:
        return self.cls[self.base[value] + dim]

    def dims_of(self, value: int, rank: int) -> tuple[int, ...]:
        b = self.base[value]
        return self.cls[b : b + rank]

    def __len__(self) -> int:
        return len(set(self.cls))


def _majors(mapping) -> tuple[tuple[int, int, int], ...]:
    """``(tensor position, dim, factor)`` of each dimension of an op whose major factor
    is not of size 1, in tensor order; the same for every op with this mapping."""
    dims = (*mapping.operands, *mapping.results)
    return tuple(
        (t, d, factors[0])
        for t, tdims in enumerate(dims)
        for d, factors in enumerate(tdims)
        if factors and mapping.sizes[factors[0]] != 1
    )


def dimension_classes(program) -> DimClasses:
    """The dimension classes of ``program``: one pass over its ops' factor mappings."""
    values = program.values
    base, n = [], 0
    for v in values:
        base.append(n)
        n += len(v.shape)
    uf = UnionFind(n)
    union = uf.union
    patterns: dict[int, tuple] = {}  # per class of ops alike, its majors
    majors: list[list[tuple[int, int]]] = []  # per op, (factor, node) of each major dim
    for op, alike, mapping in zip(program.ops, program.alike, program.mappings):
        pattern = patterns.get(alike)
        if pattern is None:
            pattern = patterns[alike] = _majors(mapping)
        tensors = (*op.linked_operands, *op.linked_results)
        first: dict[int, int] = {}
        seen = []
        for t, d, f in pattern:
            v = tensors[t]
            if not isinstance(v, int):
                continue
            node = base[v] + d
            seen.append((f, node))
            other = first.setdefault(f, node)
            if other != node:
                union(other, node)
        majors.append(seen)
    cls = uf.roots()
    conflicts: dict[int, list[int]] = {}
    for oid, seen in enumerate(majors):
        if len(seen) < 2:
            continue
        by_class: dict[int, int] = {}
        for f, node in seen:
            c = cls[node]
            if by_class.setdefault(c, f) != f and (not conflicts.get(c) or conflicts[c][-1] != oid):
                conflicts.setdefault(c, []).append(oid)
    return DimClasses(
        tuple(base),
        cls,
        {c: tuple(o) for c, o in conflicts.items()},
    )
