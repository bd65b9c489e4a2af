"""Read the collectives out of XLA's compiled HLO text and map them back to mesh axes.

``parse_collectives(compiled.as_text(), (("batch", 2), ("model", 4)))`` lists every
collective instruction of the per-device (post-partitioning) HLO as an `HloCollective`,
so the collective plan in `workbench.core.layout.collectives` can be checked against what XLA
actually compiled. Conventions:

- **Kinds** come from the opcode, never the instruction name (under ``shard_map`` an
  all-reduce is named ``psum.7``). The async ``-start`` forms count once (their
  ``-done`` halves are skipped) and set ``is_async``; so does an op inside a computation
  called by ``async-start``.
- **Device positions.** Replica-group ids are positions in the mesh's row-major device
  order (the program is assumed to run one replica, so partition id = position), not
  ``Device.id``. ``groups`` always holds the expanded groups, whichever of the three
  syntaxes the HLO used: explicit ``{{0,1},{2,3}}`` (``{}`` or no attribute: one group
  of all devices), iota ``[2,4]<=[4,2]T(1,0)``, or mesh axes
  ``mesh['axis_0'=2,'axis_1'=4], device_ids=([4,2]T(1,0)) {'axis_1'}`` (XLA's own
  axis names, unrelated to the user's; sub-axes ``'a':(1)2`` are understood).
- **Axes.** ``axes`` names the user's mesh axes a group varies over, major to minor, when
  every group is exactly the set of devices that differ only along those axes; the order
  is the one the group lists its members in (``{0,4,1,5,...}`` on a 2x4 mesh is
  ``("model", "batch")``), or mesh order when the listing follows no axis order. ``None``
  when the groups are not such a product. A collective-permute has no groups: its
  ``axes`` are the axes any source/target pair differs in, in mesh order.
- **Bytes** are per device, as in `workbench.core.layout.collectives`: all-gather the output,
  reduce-scatter the input, the others the array. Shapes are per-device shard shapes;
  ``operand_shapes`` are derived from the result and the group size.
- **Combined (tuple) collectives**, as XLA's combiners emit them, give one record per
  tuple element with ``index`` set; records sharing ``(computation, name)`` are one
  instruction, and `bytes_by_kind` sums them. The exception is the tuple form of
  all-to-all (no ``dimensions``; what CPU emits): its elements are pieces of one
  array, so it is one record whose bytes are their sum and whose ``dimensions`` is None.
- A collective inside a loop body is listed once, not once per iteration.
- **CPU.** Where GPU/TPU builds emit a reduce-scatter, CPU emits an all-reduce whose
  result only feeds a dynamic-slice (usually inside a fusion) at offsets computed from
  ``partition-id``. `normalize_cpu` reports those as reduce-scatters with
  ``via_dynamic_slice=True``. (``lax.psum_scatter`` under ``shard_map`` stays a real
  reduce-scatter on CPU: only partitioner-inserted ones take the detour.)

``parse_transposes`` lists the kernels that transpose an array in memory (fusions holding a
``transpose``) with the bytes each reads and writes, to check the simulator's transposed
copies against.

Unparseable input raises ``ValueError`` naming the line.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from workbench.core.layout.collectives import KINDS

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


# ----------------------------------------------------------------------------- text


@dataclass(frozen=True, slots=True)
class _Array:
    dtype: str
    dims: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Instr:
    name: str
    shape: _Array | tuple
    opcode: str
    operands: tuple[str, ...]
    attrs: Mapping[str, str]
    computation: str
    line: int


@dataclass(frozen=True, slots=True)
class _Module:
    computations: Mapping[str, Mapping[str, _Instr]]
    roots: Mapping[str, str]
    async_computations: frozenset[str]
    users: Mapping[tuple[str, str], tuple[tuple[_Instr, int], ...]]  # (comp, name) -> uses


_OPEN, _CLOSE = "([{", ")]}"
_INSTR_RE = re.compile(r"\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_HEADER_RE = re.compile(r"\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*[({]")
_OPCODE_RE = re.compile(r"\s*([a-z][a-z0-9\-]*)\(")
_ARRAY_RE = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")
_NAME_RE = re.compile(r"(?:.*\s)?%?([\w.\-]+)$")
_COMMENT_RE = re.compile(r"/\*.*?\*/")


def _scan(text: str, start: int = 0):
    """Yield (index, char, depth) outside quoted strings; depth counts open brackets."""
    depth, quote, i = 0, "", start
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        else:
            if ch in _CLOSE:
                depth -= 1
            yield i, ch, depth
            if ch in _OPEN:
                depth += 1
        i += 1


def _depth_at_end(text: str) -> int:
    return sum((ch in _OPEN) - (ch in _CLOSE) for _, ch, _ in _scan(text))


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets and quotes."""
    parts, last = [], 0
    for i, ch, depth in _scan(text):
        if ch == "," and depth == 0:
            parts.append(text[last:i].strip())
            last = i + 1
    tail = text[last:].strip()
    return [*parts, tail] if tail or parts else []


def _closing(text: str, start: int) -> int:
    """Index of the bracket closing the one at ``start``."""
    for i, ch, depth in _scan(text, start):
        if ch in _CLOSE and depth == 0:
            return i
    raise ValueError("unbalanced brackets")


def _parse_shape(text: str, i: int) -> tuple[_Array | tuple, int]:
    while text[i] == " ":
        i += 1
    if text[i] == "(":
        end = _closing(text, i)
        inner = text[i + 1 : end]
        elements = tuple(_parse_shape(part, 0)[0] for part in _split_top(inner))
        return elements, end + 1
    m = _ARRAY_RE.match(text, i)
    if not m:
        raise ValueError(f"no shape at {text[i : i + 30]!r}")
    dims = tuple(int(d.strip().lstrip("<=")) for d in m.group(2).split(",") if d.strip())
    i = m.end()
    if i < len(text) and text[i] == "{":  # layout
        i = _closing(text, i) + 1
    return _Array(m.group(1), dims), i


def _parse_attrs(text: str) -> dict[str, str]:
    attrs: dict[str, str] = {}
    previous = ""
    for part in _split_top(text):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep:
            continue
        if key == "device_ids" and attrs.get(previous, "").startswith("mesh["):
            attrs[previous] += f", device_ids={value.strip()}"  # part of mesh replica groups
            continue
        attrs[key] = value.strip()
        previous = key
    return attrs


def _parse_instruction(text: str, line: int, computation: str) -> _Instr:
    try:
        head = _INSTR_RE.match(text)
        shape, i = _parse_shape(text, head.end())
        op = _OPCODE_RE.match(text, i)
        end = _closing(text, op.end() - 1)
        operands = tuple(
            m.group(1) if (m := _NAME_RE.match(part)) else part
            for part in _split_top(text[op.end() : end])
        )
        attrs = _parse_attrs(text[end + 1 :].lstrip(" ,"))
    except (AttributeError, ValueError, IndexError) as err:
        raise ValueError(f"line {line}: cannot parse HLO instruction {_clip(text)!r}") from err
    return _Instr(head.group(2), shape, op.group(1), operands, attrs, computation, line)


def _clip(text: str, n: int = 160) -> str:
    text = text.strip()
    return text if len(text) <= n else text[:n] + "..."


def _parse_module(hlo_text: str) -> _Module:
    """Every instruction of every computation; lines outside computations are skipped
    unless they are instructions themselves (so a bare snippet parses too)."""
    comps: dict[str, dict[str, _Instr]] = {}
    roots: dict[str, str] = {}
    current: str | None = None
    pending, pending_line = "", 0
    for number, raw in enumerate(hlo_text.splitlines(), start=1):
        text = _COMMENT_RE.sub("", raw).rstrip()
        if pending:
            pending += " " + text.strip()
        elif current is not None and text.strip() == "}":
            current = None
            continue
        elif _INSTR_RE.match(text):
            pending, pending_line = text, number
        elif current is None and text.endswith("{") and (header := _HEADER_RE.match(text)):
            current = header.group(1)
            comps.setdefault(current, {})
            continue
        elif current is not None and text.strip():
            raise ValueError(f"line {number}: cannot parse HLO line {_clip(text)!r}")
        else:
            continue
        if _depth_at_end(pending) > 0 or pending.endswith(","):
            continue  # an instruction spread over several lines
        comp = "" if current is None else current
        instr = _parse_instruction(pending, pending_line, comp)
        comps.setdefault(comp, {})[instr.name] = instr
        if _INSTR_RE.match(pending).group(1):
            roots[comp] = instr.name
        pending = ""
    if pending:
        raise ValueError(f"line {pending_line}: unterminated HLO instruction {_clip(pending)!r}")
    async_comps = frozenset(
        instr.attrs["calls"].lstrip("%")
        for instrs in comps.values()
        for instr in instrs.values()
        if instr.opcode == "async-start" and "calls" in instr.attrs
    )
    users: dict[tuple[str, str], list[tuple[_Instr, int]]] = {}
    for comp, instrs in comps.items():
        for instr in instrs.values():
            for k, op in enumerate(instr.operands):
                users.setdefault((comp, op), []).append((instr, k))
    frozen = {key: tuple(uses) for key, uses in users.items()}
    return _Module(comps, roots, async_comps, frozen)


# ----------------------------------------------------------------------- replica groups


def _ints(text: str) -> list[int]:
    return [int(t) for t in re.findall(r"-?\d+", text)]


def _iota(reshape: list[int], perm: list[int] | None) -> np.ndarray:
    ids = np.arange(math.prod(reshape)).reshape(reshape)
    return (ids.transpose(perm) if perm else ids).reshape(-1)


_IOTA_RE = re.compile(r"\[([\d,\s]*)\]<=\[([\d,\s]*)\](?:T\(([\d,\s]*)\))?$")
_MESH_RE = re.compile(
    r"mesh\[(?P<axes>[^\]]*)\](?:,\s*device_ids=\((?P<ids>.*)\))?\s*\{(?P<group>[^}]*)\}$"
)
_DEVICE_IOTA_RE = re.compile(r"\[([\d,\s]*)\](?:T\(([\d,\s]*)\))?$")
_AXIS_REF_RE = re.compile(r"""\s*['"]?([^'":]+)['"]?\s*(?::\((\d+)\)(\d+))?\s*$""")


def _parse_groups(value: str | None, n: int) -> tuple[tuple[int, ...], ...]:
    """Expand any replica_groups syntax to tuples of device positions."""
    value = (value or "{}").strip()
    if value.startswith("{") and value.endswith("}"):
        inner = value[1:-1]
        if re.sub(r"\{[^{}]*\}|[\s,]", "", inner):
            raise ValueError(f"replica groups {value!r} are not a list of {{...}} groups")
        groups = [tuple(_ints(g)) for g in re.findall(r"\{([^{}]*)\}", inner)]
        if not all(groups):
            raise ValueError(f"replica groups {value!r} hold an empty group")
        return tuple(groups) if groups else (tuple(range(n)),)
    if m := _IOTA_RE.match(value):
        shape, reshape = _ints(m.group(1)), _ints(m.group(2))
        perm = _ints(m.group(3)) if m.group(3) else None
        if len(shape) != 2 or math.prod(shape) != math.prod(reshape):
            raise ValueError(f"iota replica groups {value!r} do not describe a [groups,size] list")
        ids = _iota(reshape, perm).reshape(shape)
        return tuple(tuple(int(i) for i in row) for row in ids)
    if m := _MESH_RE.match(value):
        return _mesh_groups(m, value)
    raise ValueError(f"unknown replica_groups syntax {value!r}")


def _mesh_groups(m: re.Match, value: str) -> tuple[tuple[int, ...], ...]:
    names, sizes = [], []
    for item in _split_top(m.group("axes")):
        name, _, size = item.rpartition("=")
        names.append(name.strip().strip("'\""))
        sizes.append(int(size))
    total = math.prod(sizes)
    ids_text = (m.group("ids") or "").strip()
    if not ids_text:
        ids = np.arange(total)
    elif d := _DEVICE_IOTA_RE.match(ids_text):
        ids = _iota(_ints(d.group(1)), _ints(d.group(2)) if d.group(2) else None)
    else:
        ids = np.array(_ints(ids_text))
    if ids.size != total:
        raise ValueError(f"mesh replica groups {value!r}: device_ids do not fill the mesh")
    # Each grouped (sub-)axis becomes its own dimension of a refined mesh; the grouped
    # dimensions move last, in the order listed, and consecutive runs form the groups.
    refs: list[tuple[int, int, int]] = []  # (mesh axis, pre-size, size)
    for item in _split_top(m.group("group")):
        r = _AXIS_REF_RE.match(item)
        if not r or r.group(1).strip() not in names:
            raise ValueError(f"mesh replica groups {value!r}: unknown axis {item!r}")
        axis = names.index(r.group(1).strip())
        pre, size = (int(r.group(2)), int(r.group(3))) if r.group(2) else (1, sizes[axis])
        refs.append((axis, pre, size))
    dims: list[int] = []
    where: dict[int, int] = {}  # refs index -> refined dimension
    for axis, full in enumerate(sizes):
        covered = 1
        for k, (_, pre, size) in sorted(
            ((k, ref) for k, ref in enumerate(refs) if ref[0] == axis), key=lambda t: t[1][1]
        ):
            if pre != covered:
                dims.append(pre // covered)
            where[k] = len(dims)
            dims.append(size)
            covered = pre * size
        if covered != full:
            dims.append(full // covered)
    grouped = [where[k] for k in range(len(refs))]
    order = [d for d in range(len(dims)) if d not in grouped] + grouped
    size = math.prod(dims[d] for d in grouped)
    flat = ids.reshape(dims).transpose(order).reshape(-1, size)
    return tuple(tuple(int(i) for i in row) for row in flat)


def _coords(n: int, sizes: Sequence[int]) -> np.ndarray:
    return np.stack(np.unravel_index(np.arange(n), sizes), axis=1)


def _axes_of_groups(groups, names: Sequence[str], sizes: Sequence[int]) -> tuple[str, ...] | None:
    """The mesh axes the groups vary over, major to minor, or None if not a product."""
    n = math.prod(sizes)
    coords = _coords(n, sizes)
    members = sorted(i for g in groups for i in g)
    if members != list(range(n)):
        return None
    varying = [a for a in range(len(sizes)) if len({coords[i][a] for i in groups[0]}) > 1]
    fixed = [a for a in range(len(sizes)) if a not in varying]
    size = math.prod(sizes[a] for a in varying)
    for g in groups:
        if len(g) != size or any(len({coords[i][a] for i in g}) != 1 for a in fixed):
            return None
    for perm in itertools.permutations(varying):
        listed = list(itertools.product(*(range(sizes[a]) for a in perm)))
        if all([tuple(coords[i][list(perm)]) for i in g] == listed for g in groups):
            return tuple(names[a] for a in perm)
    return tuple(names[a] for a in varying)


def _axes_of_pairs(pairs, names: Sequence[str], sizes: Sequence[int]) -> tuple[str, ...]:
    coords = _coords(math.prod(sizes), sizes)
    moved = {a for s, t in pairs for a in range(len(sizes)) if coords[s][a] != coords[t][a]}
    return tuple(names[a] for a in sorted(moved))


# --------------------------------------------------------------------------- collectives


def _bits(dtype: str) -> int:
    if dtype == "pred":
        return 8
    if dtype == "token":
        return 0
    m = re.match(r"[a-z]+(\d+)", dtype)
    if not m:
        raise ValueError(f"unknown HLO element type {dtype!r}")
    return int(m.group(1))


def _nbytes(arrays: Iterable[_Array]) -> int:
    return sum(math.ceil(math.prod(a.dims) * _bits(a.dtype) / 8) for a in arrays)


def _elements(shape: _Array | tuple) -> list[_Array]:
    return [shape] if isinstance(shape, _Array) else [e for s in shape for e in _elements(s)]


def _results(instr: _Instr, kind: str) -> list[_Array]:
    """The arrays a collective produces (for -start forms, the output part of the tuple)."""
    shape = instr.shape
    if instr.opcode.endswith("-start") and kind != "all-reduce":
        shape = shape[1]  # (operands, results[, contexts])
    return _elements(shape)


def _mesh(mesh_axes) -> tuple[list[str], list[int]]:
    axes = getattr(mesh_axes, "axes", mesh_axes)  # accepts workbench.core.layout.mesh.Mesh too
    items = list(axes.items()) if isinstance(axes, Mapping) else list(axes)
    if not items:
        raise ValueError("mesh_axes is empty; give (name, size) pairs, e.g. (('batch', 2),)")
    return [str(n) for n, _ in items], [int(s) for _, s in items]


def _kind(opcode: str) -> str | None:
    base = opcode.removesuffix("-start")
    return base if base in KINDS else None


def _reduction(instr: _Instr, module: _Module) -> str | None:
    comp = instr.attrs.get("to_apply", "").lstrip("%")
    root = module.roots.get(comp)
    if root is None:
        return None
    opcode = module.computations[comp][root].opcode
    return _REDUCTIONS.get(opcode, opcode)


def _collectives_of(instr: _Instr, module: _Module, names, sizes) -> list[HloCollective]:
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
        axes = _axes_of_pairs(pairs, names, sizes)
        return _per_element(results, results, base, groups=(), axes=axes, source_target_pairs=pairs)
    groups = _parse_groups(instr.attrs.get("replica_groups"), n)
    _check_ids([i for g in groups for i in g], n)
    common = {**base, "groups": groups, "axes": _axes_of_groups(groups, names, sizes)}
    dims = tuple(_ints(instr.attrs["dimensions"])) if "dimensions" in instr.attrs else None
    g = len(groups[0])
    if kind == "all-to-all" and dims is None:  # tuple form: pieces of one array
        shapes = tuple(a.dims for a in results)
        dtype = results[0].dtype
        nbytes = _nbytes(results)
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
        operands = [_Array(a.dtype, _with(a.dims, d, scale(a.dims[d]))) for a in results]
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
                bytes=_nbytes([counted]),
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
    module = _parse_module(hlo_text)
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


_TRIP_RE = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')


def loop_counts(module: _Module) -> dict[str, int]:
    """How many times each computation runs per execution: a while body its known trip count
    (1 when unknown) times what runs the loop; computations called otherwise inherit."""
    calls: list[tuple[str, str, int]] = []  # (caller, callee, times per call)
    for comp, instrs in module.computations.items():
        for instr in instrs.values():
            if instr.opcode == "while":
                trip = _TRIP_RE.search(instr.attrs.get("backend_config", ""))
                n = int(trip.group(1)) if trip else 1
                calls.append((comp, instr.attrs.get("body", "").lstrip("%"), n))
                calls.append((comp, instr.attrs.get("condition", "").lstrip("%"), n + 1))
            for key in ("calls", "to_apply", "true_computation", "false_computation"):
                if key in instr.attrs and instr.opcode != "while":
                    for callee in re.findall(r"%?([\w.\-]+)", instr.attrs[key]):
                        calls.append((comp, callee, 1))
            if "branch_computations" in instr.attrs:
                for callee in re.findall(r"%?([\w.\-]+)", instr.attrs["branch_computations"]):
                    calls.append((comp, callee, 1))
    counts = {comp: 1 for comp in module.computations}
    for _ in range(len(module.computations)):  # nesting depth is small; iterate to a fixed point
        changed = False
        for caller, callee, n in calls:
            if callee in counts and counts[callee] < counts.get(caller, 1) * n:
                counts[callee] = counts.get(caller, 1) * n
                changed = True
        if not changed:
            break
    return counts


# ------------------------------------------------------------------------------- CPU


def normalize_cpu(collectives: Sequence[HloCollective], hlo_text: str) -> list[HloCollective]:
    """Report CPU's all-reduce + dynamic-slice pairs as the reduce-scatters they stand for.

    An all-reduce (or tuple element) whose value has exactly one use, a dynamic-slice
    (directly or as a fusion's parameter), that cuts one dimension by the group size at
    an offset computed from partition-id / replica-id, becomes kind "reduce-scatter"
    with that dimension, the sliced result shape and ``via_dynamic_slice=True``. Its
    bytes stay the input bytes (the reduce-scatter convention). Others pass unchanged.
    """
    module = _parse_module(hlo_text)
    return [_as_reduce_scatter(c, module) or c for c in collectives]


def _value_uses(module: _Module, comp: str, name: str, index: int | None):
    """The (instruction, operand position) pairs reading element ``index`` of ``name``."""
    uses = []
    for user, k in module.users.get((comp, name), ()):
        if user.opcode.endswith("-done"):
            uses.extend(_value_uses(module, comp, user.name, index))
        elif user.opcode == "get-tuple-element":
            if _ints(user.attrs.get("index", "")) == [index or 0]:
                uses.extend(module.users.get((comp, user.name), ()))
        else:
            uses.append((user, k))
    return uses


def _as_reduce_scatter(c: HloCollective, module: _Module) -> HloCollective | None:
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
            i for i in inner.values() if i.opcode == "parameter" and _ints(i.operands[0]) == [k]
        ]
        inner_uses = module.users.get((where, params[0].name), ()) if len(params) == 1 else ()
        if len(inner_uses) != 1:
            return None
        callers = ((c.computation, user.name),)
        user, k = inner_uses[0]
    if user.opcode != "dynamic-slice" or k != 0 or not isinstance(user.shape, _Array):
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


def _reaches_device_id(module: _Module, comp: str, name: str, callers: tuple) -> bool:
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
            (k,) = _ints(instr.operands[0])
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


# --------------------------------------------------------------------------- transposes


@dataclass(frozen=True, slots=True)
class HloTranspose:
    """One compiled kernel that transposes an array in memory: a fusion holding a
    ``transpose`` (after layout assignment, a transpose that only relabels dimensions is a
    bitcast, so one that is left moves data; XLA emits the layout copies a matmul or
    convolution operand needs this way, with the elementwise ops that make the operand)."""

    name: str
    read: int  # bytes of its operands, per run
    written: int  # bytes of its results, per run
    count: int = 1  # times it runs: the trip counts of the while loops around it


def parse_transposes(hlo_text: str) -> list[HloTranspose]:
    """Every transposing fusion in ``hlo_text`` (compiled, per-device HLO), in text order.

    What a fusion reads and writes inside a loop is what it touches: an operand it only
    dynamic-slices counts its slices, the buffer a dynamic-update-slice writes into
    in place counts nothing read and the update written (a scan's stacked arrays)."""
    module = _parse_module(hlo_text)
    counts = loop_counts(module)
    found = []
    for comp, instrs in module.computations.items():
        for instr in instrs.values():
            if instr.opcode != "fusion" or "calls" not in instr.attrs:
                continue
            called = instr.attrs["calls"].lstrip("%")
            body = module.computations.get(called, {})
            if not any(inner.opcode == "transpose" for inner in body.values()):
                continue
            params = {
                int(_ints(inner.operands[0])[0]): inner.name
                for inner in body.values()
                if inner.opcode == "parameter"
            }
            read, seen = 0, set()
            for k, operand in enumerate(instr.operands):
                if operand in seen:
                    continue
                seen.add(operand)
                uses = module.users.get((called, params.get(k, "")), ())
                read += _touched(uses, instrs[operand].shape)
            root = body.get(module.roots.get(called, ""))
            while root is not None and root.opcode == "bitcast":
                root = body.get(root.operands[0])
            if root is not None and root.opcode == "dynamic-update-slice":
                written = _nbytes(_elements(body[root.operands[1]].shape))
            else:
                written = _nbytes(_elements(instr.shape))
            found.append((instr.line, HloTranspose(instr.name, read, written, counts.get(comp, 1))))
    return [t for _, t in sorted(found, key=lambda pair: pair[0])]


def _touched(uses, shape) -> int:
    """Bytes a fused computation reads of a parameter of ``shape`` used as ``uses``: the
    slices where it only dynamic-slices it, nothing where it only updates it in place."""
    if uses and all(
        u.opcode in ("dynamic-slice", "dynamic-update-slice") and k == 0 for u, k in uses
    ):
        return _nbytes(
            a for u, _ in uses if u.opcode == "dynamic-slice" for a in _elements(u.shape)
        )
    return _nbytes(_elements(shape))
