"""A captured program: ops (jaxpr equations) and values (jaxpr variables), with stable names.

Calls (``jit``, ``custom_jvp_call``, ``custom_vjp_call``, ``remat``) are inlined: their
ops join the caller's op list and keep their scope. Loops and branches (``scan``,
``while``, ``cond``) stay ops with *regions*: a region has its own input, output and op
list, and its values live in the same value table as everything else.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from workbench.core.errors import UnknownValueError, closest_names
from workbench.core.ops.mapping import FactorMapping, TensorType


@dataclass(frozen=True, slots=True)
class Lit:
    """A literal operand (a constant written into the op, like ``2.0`` in ``mul x 2.0``)."""

    value: Any
    shape: tuple[int, ...]
    dtype: np.dtype


Operand = int | Lit  # a value id, or a literal


@dataclass(frozen=True, slots=True, eq=False)
class Value:
    """One array in the program. ``kind`` is "input", "const", "intermediate" or "region_input"."""

    id: int
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype  # or JAX's extended dtype of typed PRNG keys (see ``ir/dtypes``)
    kind: str
    producer: int | None = None  # the op whose result (or region input) this is
    region_of: int | None = None  # the region op whose body holds this value, None at top level

    @property
    def type(self) -> TensorType:
        return TensorType(self.shape, self.dtype)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def type_sharding(self):
        """This value whole on every device."""
        from workbench.core.layout.sharding import Sharding

        return Sharding.unsharded(self.shape, self.dtype)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


@dataclass(frozen=True, slots=True)
class Region:
    """The body of a loop or branch: ``inputs`` and ``outputs`` are value ids (or literals)."""

    name: str
    inputs: tuple[int, ...]
    outputs: tuple[Operand, ...]
    ops: tuple[int, ...]


@dataclass(frozen=True, slots=True, eq=False)
class Op:
    """One primitive application. ``params`` are the jaxpr equation's parameters."""

    id: int
    name: str
    primitive: str
    params: Mapping[str, Any]
    operands: tuple[Operand, ...]
    results: tuple[int, ...]
    scope: tuple[str, ...]
    phase: str  # "forward", "backward" or "optimizer"
    regions: tuple[Region, ...] = ()
    parent: int | None = None  # the region op this op sits in
    #: "path/file.py:42 (fn)": the user's line that made it, the innermost frame outside
    #: JAX, the libraries and the workbench (``ir.source_lines``); "" where none is
    source: str = ""
    #: the innermost library line under it (Flax, optax, ...; never JAX's own), or ""
    library: str = ""
    jax_primitive: Any = field(default=None, repr=False)  # the jax Primitive, for re-binding
    #: operands then every region's outputs: what the op's factor mapping calls operands
    linked_operands: tuple[Operand, ...] = field(init=False, repr=False)
    #: results then every region's inputs: what the op's factor mapping calls results
    linked_results: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(
            self,
            "linked_operands",
            self.operands + tuple(v for r in self.regions for v in r.outputs),
        )
        object.__setattr__(
            self, "linked_results", self.results + tuple(v for r in self.regions for v in r.inputs)
        )


class DerivedCache:
    """The derived facts of one Program, each built on first use and kept with the Program.

    Stages above ``ir`` keep what they derive from a program here, under a key of their
    own (``"estimate.static"``); they never write into the Program itself.
    """

    __slots__ = ("_facts",)

    def __init__(self):
        self._facts: dict = {}

    def get(self, key, build):
        """The fact under ``key``, built by ``build()`` the first time it is asked for."""
        try:
            return self._facts[key]
        except KeyError:
            fact = self._facts[key] = build()
            return fact

    def keys(self) -> tuple:
        return tuple(self._facts)

    def clear(self) -> None:
        """Forget every derived fact (the next use builds it again)."""
        self._facts.clear()


@dataclass(eq=False)
class Program:
    """A captured JAX function. Built by ``workbench.capture``; treat as read-only."""

    values: tuple[Value, ...]
    ops: tuple[Op, ...]
    body: tuple[int, ...]  # top-level op ids in program order
    inputs: tuple[int, ...]
    outputs: tuple[Operand, ...]
    output_names: tuple[str, ...]
    consts: Mapping[int, np.ndarray]
    scalars: Mapping[int, np.ndarray] = field(
        default_factory=dict
    )  # rank-0 values known statically
    in_tree: Any = None
    out_tree: Any = None
    jaxpr: Any = None  # the ClosedJaxpr it was captured from
    example_args: tuple | None = None  # flat input arrays, when capture was given arrays
    fn: Any = None
    name: str = "program"
    _by_name: dict[str, int] = field(default_factory=dict, repr=False)
    #: what the stages above derive from this program (``DerivedCache``)
    cache: DerivedCache = field(default_factory=DerivedCache, repr=False)

    def __post_init__(self):
        self._by_name = {v.name: v.id for v in self.values}

    # -- lookup ----------------------------------------------------------------------------
    def value(self, name_or_id: str | int) -> Value:
        if isinstance(name_or_id, int):
            return self.values[name_or_id]
        vid = self._by_name.get(name_or_id)
        if vid is None:
            hint = closest_names(name_or_id, self._by_name)
            raise UnknownValueError(
                f"the program has no value named {name_or_id!r}"
                + (f"; did you mean {', '.join(map(repr, hint))}?" if hint else ".")
                + " Program.names() lists every value name."
            )
        return self.values[vid]

    def has_value(self, name: str) -> bool:
        return name in self._by_name

    def names(self, pattern: str | None = None) -> list[str]:
        """Value names in id order, optionally filtered by a glob (see ``select``)."""
        if pattern is None:
            return [v.name for v in self.values]
        from workbench.core.ir.selectors import select

        return [self.values[i].name for i in select(self, pattern)]

    def op(self, name_or_id: str | int) -> Op:
        if isinstance(name_or_id, int):
            return self.ops[name_or_id]
        for op in self.ops:
            if op.name == name_or_id:
                return op
        raise UnknownValueError(f"the program has no op named {name_or_id!r}.")

    def walk(self, op_ids: Sequence[int] | None = None) -> Iterator[Op]:
        """Ops in program order, each region op followed by its regions' ops."""
        for oid in self.body if op_ids is None else op_ids:
            op = self.ops[oid]
            yield op
            for region in op.regions:
                yield from self.walk(region.ops)

    @property
    def input_values(self) -> list[Value]:
        return [self.values[i] for i in self.inputs]

    # -- graph structure -------------------------------------------------------------------
    @cached_property
    def users(self) -> tuple[tuple[int, ...], ...]:
        """Per value, the ops that read it (as an operand or a linked region output)."""
        users: list[list[int]] = [[] for _ in self.values]
        for op in self.ops:
            for v in op.linked_operands:
                if isinstance(v, int) and (not users[v] or users[v][-1] != op.id):
                    users[v].append(op.id)
        return tuple(tuple(u) for u in users)

    @cached_property
    def writers(self) -> tuple[tuple[int, ...], ...]:
        """Per value, the ops that produce it (as a result or a linked region input)."""
        writers: list[list[int]] = [[] for _ in self.values]
        for op in self.ops:
            for v in op.linked_results:
                if not writers[v] or writers[v][-1] != op.id:
                    writers[v].append(op.id)
        return tuple(tuple(w) for w in writers)

    @cached_property
    def top_level(self) -> tuple[int, ...]:
        """Per op, the top-level op it sits in (itself at top level): a loop or branch for
        the ops of its regions."""
        top = list(range(len(self.ops)))
        for op in self.walk():
            if op.parent is not None:
                top[op.id] = top[op.parent]
        return tuple(top)

    def neighbours(self, value_id: int) -> tuple[int, ...]:
        return self.users[value_id] + self.writers[value_id]

    @cached_property
    def alike(self) -> tuple[int, ...]:
        """Per op, its class of ops alike: one primitive, equal params, equal operand and
        result types (known literal values included). The ops of repeated layers are alike,
        so what depends on nothing else (a factor mapping, a cost) is computed once per
        class. Ops whose params cannot be hashed are each a class of their own."""
        values, scalars = self.values, self.scalars
        plain = [(v.shape, v.dtype) for v in values]  # a value's key without a known literal

        def operand_key(v) -> tuple:
            if isinstance(v, int) and v not in scalars:
                return plain[v]
            t = self.operand_type(v)
            return (
                t.shape,
                t.dtype,
                None if t.literal is None else np.asarray(t.literal).tobytes(),
            )

        classes: dict = {}
        params: dict = {}  # params -> a number, so each distinct params is hashed once here
        out = []
        for op in self.ops:
            try:
                p = params.setdefault(tuple(sorted(op.params.items())), len(params))
            except TypeError:  # params only this op has (arrays, callables)
                p = ("op", op.id)
            key = (
                op.primitive,
                p,
                tuple(operand_key(v) for v in op.linked_operands),
                tuple(plain[v] for v in op.linked_results),
            )
            out.append(classes.setdefault(key, len(classes)))
        return tuple(out)

    @cached_property
    def mappings(self) -> tuple[FactorMapping, ...]:
        """Each op's factor mapping from its sharding rule, computed once per class of ops
        alike (``alike``)."""
        from workbench.core.ops import mapping_of

        first: dict[int, FactorMapping] = {}
        out = []
        for op, c in zip(self.ops, self.alike):
            mapping = first.get(c)
            if mapping is None:
                mapping = first[c] = mapping_of(self, op)
            out.append(mapping)
        return tuple(out)

    def anatomy(self):
        """What the program is made of, read from its structure (``core.anatomy``); built once."""
        from workbench.core.anatomy.build import build_anatomy

        return self.cache.get("anatomy", lambda: build_anatomy(self))

    def mapping(self, op: Op | int) -> FactorMapping:
        return self.mappings[op if isinstance(op, int) else op.id]

    @cached_property
    def primitives(self) -> frozenset[str]:
        return frozenset(op.primitive for op in self.ops)

    def operand_type(self, operand: Operand) -> TensorType:
        if isinstance(operand, Lit):
            return TensorType(operand.shape, operand.dtype, operand.value)
        v = self.values[operand]
        return TensorType(v.shape, v.dtype, self.scalars.get(operand))

    def __len__(self) -> int:
        return len(self.ops)

    def summary(self) -> str:
        n_params = sum(self.values[i].size for i in self.inputs)
        return (
            f"Program {self.name!r}: {len(self.inputs)} inputs ({n_params:,} elements), "
            f"{len(self.outputs)} outputs, {len(self.ops)} ops, {len(self.values)} values"
        )

    def _phases(self) -> str:
        counts: dict[str, int] = {}
        for op in self.ops:
            counts[op.phase] = counts.get(op.phase, 0) + 1
        return ", ".join(f"{phase} {n}" for phase, n in counts.items())

    def __repr__(self) -> str:
        from workbench.core import display as d

        ins = self.input_values
        big = sorted(ins, key=lambda v: -v.nbytes)[:3]
        body = [
            f"inputs {d.format_bytes(sum(v.nbytes for v in ins))}; ops by phase: {self._phases()}",
            "largest inputs: "
            + "; ".join(f"{d.clip_left(v.name, 32)} {v.type_sharding()}" for v in big),
        ]
        return d.lines(f"<{self.summary()}", [d.clip(b) for b in body]) + ">"

    def _repr_html_(self) -> str:
        from workbench.core import display as d

        ins = self.input_values
        prims: dict[str, int] = {}
        for op in self.ops:
            prims[op.primitive] = prims.get(op.primitive, 0) + 1
        return d.panel(
            self.summary(),
            d.facts(
                [
                    ("inputs", f"{len(ins)}: {d.format_bytes(sum(v.nbytes for v in ins))}"),
                    ("outputs", len(self.outputs)),
                    ("ops by phase", self._phases()),
                ]
            ),
            d.details(
                f"{len(ins)} inputs",
                d.table(
                    ("name", "type", "bytes"),
                    ((v.name, v.type_sharding(), d.format_bytes(v.nbytes)) for v in ins),
                ),
            ),
            d.details(
                f"{len(prims)} primitives",
                d.table(("primitive", "ops"), sorted(prims.items(), key=lambda kv: -kv[1])),
            ),
        )
