"""Parse compiled HLO text into computations of instructions (``parse_module``), with what
the readers of collectives and transposes share: array sizes, loop trip counts.

A line outside every computation that is an instruction parses too (a bare snippet);
anything else unparseable raises ``ValueError`` naming the line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Array:
    """An array type: element type (``f32``) and dimensions."""

    dtype: str
    dims: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Instr:
    """One instruction: its result shape (an ``Array`` or a tuple of them), opcode, operand
    names and attributes (as text), where it sits."""

    name: str
    shape: Array | tuple
    opcode: str
    operands: tuple[str, ...]
    attrs: Mapping[str, str]
    computation: str
    line: int


@dataclass(frozen=True, slots=True)
class Module:
    """Every computation's instructions by name, the roots, the computations ``async-start``
    calls, and who reads each value."""

    computations: Mapping[str, Mapping[str, Instr]]
    roots: Mapping[str, str]
    async_computations: frozenset[str]
    users: Mapping[tuple[str, str], tuple[tuple[Instr, int], ...]]  # (comp, name) -> uses


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


def split_top(text: str) -> list[str]:
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


def _parse_shape(text: str, i: int) -> tuple[Array | tuple, int]:
    while text[i] == " ":
        i += 1
    if text[i] == "(":
        end = _closing(text, i)
        inner = text[i + 1 : end]
        elements = tuple(_parse_shape(part, 0)[0] for part in split_top(inner))
        return elements, end + 1
    m = _ARRAY_RE.match(text, i)
    if not m:
        raise ValueError(f"no shape at {text[i : i + 30]!r}")
    dims = tuple(int(d.strip().lstrip("<=")) for d in m.group(2).split(",") if d.strip())
    i = m.end()
    if i < len(text) and text[i] == "{":  # layout
        i = _closing(text, i) + 1
    return Array(m.group(1), dims), i


def _parse_attrs(text: str) -> dict[str, str]:
    attrs: dict[str, str] = {}
    previous = ""
    for part in split_top(text):
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


def _parse_instruction(text: str, line: int, computation: str) -> Instr:
    try:
        head = _INSTR_RE.match(text)
        shape, i = _parse_shape(text, head.end())
        op = _OPCODE_RE.match(text, i)
        end = _closing(text, op.end() - 1)
        operands = tuple(
            m.group(1) if (m := _NAME_RE.match(part)) else part
            for part in split_top(text[op.end() : end])
        )
        attrs = _parse_attrs(text[end + 1 :].lstrip(" ,"))
    except (AttributeError, ValueError, IndexError) as err:
        raise ValueError(f"line {line}: cannot parse HLO instruction {_clip(text)!r}") from err
    return Instr(head.group(2), shape, op.group(1), operands, attrs, computation, line)


def _clip(text: str, n: int = 160) -> str:
    text = text.strip()
    return text if len(text) <= n else text[:n] + "..."


def parse_module(hlo_text: str) -> Module:
    """Every instruction of every computation; lines outside computations are skipped
    unless they are instructions themselves (so a bare snippet parses too)."""
    comps: dict[str, dict[str, Instr]] = {}
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
    users: dict[tuple[str, str], list[tuple[Instr, int]]] = {}
    for comp, instrs in comps.items():
        for instr in instrs.values():
            for k, op in enumerate(instr.operands):
                users.setdefault((comp, op), []).append((instr, k))
    frozen = {key: tuple(uses) for key, uses in users.items()}
    return Module(comps, roots, async_comps, frozen)


def ints(text: str) -> list[int]:
    return [int(t) for t in re.findall(r"-?\d+", text)]


def _bits(dtype: str) -> int:
    if dtype == "pred":
        return 8
    if dtype == "token":
        return 0
    m = re.match(r"[a-z]+(\d+)", dtype)
    if not m:
        raise ValueError(f"unknown HLO element type {dtype!r}")
    return int(m.group(1))


def array_bytes(arrays: Iterable[Array]) -> int:
    return sum(math.ceil(math.prod(a.dims) * _bits(a.dtype) / 8) for a in arrays)


def elements(shape: Array | tuple) -> list[Array]:
    return [shape] if isinstance(shape, Array) else [e for s in shape for e in elements(s)]


_TRIP_RE = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')


def loop_counts(module: Module) -> dict[str, int]:
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
