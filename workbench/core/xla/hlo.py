"""Read the collectives out of XLA's compiled HLO text and map them back to mesh axes.

``parse_collectives(compiled.as_text(), (("batch", 2), ("model", 4)))`` lists every
collective instruction of the per-device (post-partitioning) HLO as an `HloCollective`, so
the collective plan in `workbench.core.layout.collectives` can be checked against what XLA
actually compiled; ``normalize_cpu`` reads CPU's all-reduce + dynamic-slice pairs as the
reduce-scatters they stand for. README.md gives the conventions (kinds, device positions,
axes, bytes, combined collectives, loops, CPU). Unparseable input raises ``ValueError``
naming the line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from workbench.core.layout.collectives import KINDS
from workbench.core.xla.hlo_text import (
    Array,
    Instr,
    Module,
    array_bytes,
    elements,
    ints,
    loop_counts,
    parse_module,
)
from workbench.core.xla.replica_groups import axes_of_groups, axes_of_pairs, parse_groups

_REDUCTIONS = {"add": "sum", "maximum": "max", "minimum": "min", "multiply": "prod"}
_DEVICE_ID_OPS = ("partition-id", "replica-id")


@dataclass(frozen=True, slots=True)
class HloCollective:
    """One collective of a compiled HLO module, mapped onto the user's mesh axes."""

    kind: str  # one of KINDS
    name: str  # the HLO instruction's name
    dtype: str  # HLO element type, e.g. "f32", "bf16"
    operand_shapes: tuple[tuple[int, ...], ...]  # per device
    result_shapes: tuple[tuple[int, ...], ...]  # per device
    bytes: int  # per device, see the module docstring
    groups: tuple[tuple[int, ...], ...]  # device positions; () for collective-permute
    axes: tuple[str, ...] | None  # mesh axes it runs over, major to minor; None: no product
    reduction: str | None = None  # all-reduce / reduce-scatter: "sum", "max", "min", ...
    dimensions: tuple[int, ...] | None = None  # gathered / scattered / split dims
    source_target_pairs: tuple[tuple[int, int], ...] | None = None  # collective-permute
    index: int | None = None  # the tuple element of a combined instruction
    computation: str = ""  # the HLO computation holding the instruction
    line: int = 0  # 1-based line of the instruction in the text
    is_async: bool = False  # a -start form, or inside an async-start computation
    via_dynamic_slice: bool = False  # a reduce-scatter lowered as all-reduce + dynamic-slice
    count: int = 1  # times it runs: the trip counts of the while loops around it, multiplied


def _results(instr: Instr, kind: str) -> list[Array]:
    """The arrays a collective produces (for -start forms, the output part of the tuple)."""
    shape = instr.shape
    if instr.opcode.endswith("-start") and kind != "all-reduce":
        shape = shape[1]  # (operands, results[, contexts])
    return elements(shape)


def _mesh(mesh_axes) -> tuple[list[str], list[int]]:
    axes = getattr(mesh_axes, "axes", mesh_axes)  # accepts workbench.core.layout.mesh.Mesh too
    items = list(axes.items()) if isinstance(axes, Mapping) else list(axes)
    if not items:
        raise ValueError("mesh_axes is empty; give (name, size) pairs, e.g. (('batch', 2),)")
    return [str(n) for n, _ in items], [int(s) for _, s in items]


def _kind(opcode: str) -> str | None:
    base = opcode.removesuffix("-start")
    return base if base in KINDS else None


def _reduction(instr: Instr, module: Module) -> str | None:
    comp = instr.attrs.get("to_apply", "").lstrip("%")
    root = module.roots.get(comp)
    if root is None:
        return None
    opcode = module.computations[comp][root].opcode
    return _REDUCTIONS.get(opcode, opcode)


def _collectives_of(instr: Instr, module: Module, names, sizes) -> list[HloCollective]:
    kind = _kind(instr.opcode)
    n = math.prod(sizes)
    results = _results(instr, kind)
    base = {
        "kind": kind,
        "name": instr.name,
        "computation": instr.computation,
        "line": instr.line,
        "is_async": instr.opcode.endswith("-start")
        or instr.computation in module.async_computations,
    }
    if kind == "collective-permute":
        text = instr.attrs.get("source_target_pairs", "")
        pairs = tuple((int(a), int(b)) for a, b in re.findall(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}", text))
        _check_ids([i for p in pairs for i in p], n)
        axes = axes_of_pairs(pairs, names, sizes)
        return _per_element(results, results, base, groups=(), axes=axes, source_target_pairs=pairs)
    groups = parse_groups(instr.attrs.get("replica_groups"), n)
    _check_ids([i for g in groups for i in g], n)
    common = {**base, "groups": groups, "axes": axes_of_groups(groups, names, sizes)}
    dims = tuple(ints(instr.attrs["dimensions"])) if "dimensions" in instr.attrs else None
    g = len(groups[0])
    if kind == "all-to-all" and dims is None:  # tuple form: pieces of one array
        shapes = tuple(a.dims for a in results)
        dtype = results[0].dtype
        nbytes = array_bytes(results)
        return [
            HloCollective(
                dtype=dtype, operand_shapes=shapes, result_shapes=shapes, bytes=nbytes, **common
            )
        ]
    if kind in ("all-gather", "reduce-scatter"):
        (d,) = dims
        scale = (lambda x: x // g) if kind == "all-gather" else (lambda x: x * g)
        if kind == "all-gather" and any(a.dims[d] % g for a in results):
            raise ValueError(f"all-gather {instr.name}: dimension {d} not divisible by {g}")
        operands = [Array(a.dtype, _with(a.dims, d, scale(a.dims[d]))) for a in results]
    else:
        operands = results
    extra = {"dimensions": dims}
    if kind in ("all-reduce", "reduce-scatter"):
        extra["reduction"] = _reduction(instr, module)
    return _per_element(operands, results, common, **extra)


def _with(dims: tuple[int, ...], d: int, size: int) -> tuple[int, ...]:
    return (*dims[:d], size, *dims[d + 1 :])


def _per_element(operands, results, common, **extra) -> list[HloCollective]:
    kind = common["kind"]
    out = []
    for k, (a, r) in enumerate(zip(operands, results)):
        counted = r if kind == "all-gather" else a
        out.append(
            HloCollective(
                dtype=r.dtype,
                operand_shapes=(a.dims,),
                result_shapes=(r.dims,),
                bytes=array_bytes([counted]),
                index=k if len(results) > 1 else None,
                **common,
                **extra,
            )
        )
    return out


def _check_ids(ids: Iterable[int], n: int) -> None:
    bad = [i for i in ids if not 0 <= i < n]
    if bad:
        raise ValueError(f"device position {bad[0]} is outside a mesh of {n} devices")


def parse_collectives(hlo_text: str, mesh_axes: Sequence[tuple[str, int]]) -> list[HloCollective]:
    """Every collective in ``hlo_text`` (compiled, per-device HLO), in text order.

    ``mesh_axes`` is the mesh the program was partitioned over, e.g.
    ``(("batch", 2), ("model", 4))`` (a mapping or a `workbench.core.layout.mesh.Mesh` works too).
    """
    names, sizes = _mesh(mesh_axes)
    module = parse_module(hlo_text)
    found = []
    for comp in module.computations.values():
        for instr in comp.values():
            if _kind(instr.opcode) is None:
                continue
            try:
                found.extend(_collectives_of(instr, module, names, sizes))
            except (ValueError, IndexError, KeyError, TypeError) as err:
                raise ValueError(
                    f"line {instr.line}: cannot read collective {instr.name!r}: {err}"
                ) from err
    counts = loop_counts(module)
    found = [replace(c, count=counts.get(c.computation, 1)) for c in found]
    return sorted(found, key=lambda c: (c.line, c.index or 0))


def normalize_cpu(collectives: Sequence[HloCollective], hlo_text: str) -> list[HloCollective]:
    """Report CPU's all-reduce + dynamic-slice pairs as the reduce-scatters they stand for.

    An all-reduce (or tuple element) whose value has exactly one use, a dynamic-slice
    (directly or as a fusion's parameter), that cuts one dimension by the group size at
    an offset computed from partition-id / replica-id, becomes kind "reduce-scatter"
    with that dimension, the sliced result shape and ``via_dynamic_slice=True``. Its
    bytes stay the input bytes (the reduce-scatter convention). Others pass unchanged.
    """
    module = parse_module(hlo_text)
    return [_as_reduce_scatter(c, module) or c for c in collectives]


def _value_uses(module: Module, comp: str, name: str, index: int | None):
    """The (instruction, operand position) pairs reading element ``index`` of ``name``."""
    uses = []
    for user, k in module.users.get((comp, name), ()):
        if user.opcode.endswith("-done"):
            uses.extend(_value_uses(module, comp, user.name, index))
        elif user.opcode == "get-tuple-element":
            if ints(user.attrs.get("index", "")) == [index or 0]:
                uses.extend(module.users.get((comp, user.name), ()))
        else:
            uses.append((user, k))
    return uses


def _as_reduce_scatter(c: HloCollective, module: Module) -> HloCollective | None:
    if c.kind != "all-reduce" or not c.groups:
        return None
    uses = _value_uses(module, c.computation, c.name, c.index)
    if len(uses) != 1:
        return None
    user, k = uses[0]
    where, callers = c.computation, ()
    if user.opcode == "fusion":
        where = user.attrs.get("calls", "").lstrip("%")
        inner = module.computations.get(where, {})
        params = [
            i for i in inner.values() if i.opcode == "parameter" and ints(i.operands[0]) == [k]
        ]
        inner_uses = module.users.get((where, params[0].name), ()) if len(params) == 1 else ()
        if len(inner_uses) != 1:
            return None
        callers = ((c.computation, user.name),)
        user, k = inner_uses[0]
    if user.opcode != "dynamic-slice" or k != 0 or not isinstance(user.shape, Array):
        return None
    full, part, g = c.operand_shapes[0], user.shape.dims, len(c.groups[0])
    cut = [d for d in range(len(full)) if full[d] != part[d]]
    if len(part) != len(full) or len(cut) != 1 or full[cut[0]] != part[cut[0]] * g:
        return None
    if not _reaches_device_id(module, where, user.operands[1 + cut[0]], callers):
        return None
    return replace(
        c,
        kind="reduce-scatter",
        result_shapes=(part,),
        dimensions=(cut[0],),
        via_dynamic_slice=True,
    )


def _reaches_device_id(module: Module, comp: str, name: str, callers: tuple) -> bool:
    """Whether value ``name`` is computed from partition-id / replica-id, following fusion
    parameters out to the caller and fusions in to their root."""
    stack, seen = [(comp, name, callers)], set()
    while stack:
        comp, name, callers = stack.pop()
        instr = module.computations.get(comp, {}).get(name)
        if instr is None or (comp, name, callers) in seen:
            continue
        seen.add((comp, name, callers))
        if instr.opcode in _DEVICE_ID_OPS:
            return True
        if instr.opcode == "parameter" and callers:
            outer, call = callers[-1]
            (k,) = ints(instr.operands[0])
            stack.append((outer, module.computations[outer][call].operands[k], callers[:-1]))
        elif instr.opcode == "fusion" and "calls" in instr.attrs:
            called = instr.attrs["calls"].lstrip("%")
            if called in module.roots:
                stack.append((called, module.roots[called], (*callers, (comp, name))))
        else:
            stack.extend((comp, op, callers) for op in instr.operands)
    return False


def bytes_by_kind(collectives: Iterable[HloCollective]) -> dict[str, int]:
    """Total per-device bytes per kind (every kind present, zero where none ran)."""
    totals = dict.fromkeys(KINDS, 0)
    for c in collectives:
        totals[c.kind] += c.bytes
    return totals
