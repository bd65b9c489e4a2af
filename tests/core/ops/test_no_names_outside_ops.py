"""Core asks the records, not names: outside ``ops/`` no module keeps a list of primitive
names or compares an op's primitive with a string (an AST scan)."""

from __future__ import annotations

import ast
import pathlib

import workbench as wb
from workbench.core.ops import RECORDS

CORE = pathlib.Path(wb.__file__).parent / "core"

#: Modules that still name primitives, each with who moves it to the records' queries.
NOT_YET: dict[str, str] = {}

#: Primitive names that are also the reductions a sharding holds pending (``sum``, ``max``,
#: ``min``): a list of those is not a list of primitives.
REDUCTIONS = {"max", "min"}

#: Names under which a primitive's name is held (``op.primitive``, ``eqn.primitive.name``).
PRIMITIVE_NAMES = {"primitive", "prim", "primitive_name"}


def _is_primitive(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        if node.attr == "primitive":
            return True
        if node.attr == "name" and isinstance(node.value, ast.Attribute):
            return node.value.attr == "primitive"  # eqn.primitive.name
    return isinstance(node, ast.Name) and node.id in PRIMITIVE_NAMES


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [
            e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
        ]
    return []


def violations(source: str) -> list[str]:
    """``line: what`` for each comparison of a primitive with a string and each literal
    collection holding two or more registered primitive names."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_primitive(s) for s in sides) and any(_strings(s) for s in sides):
                out.append(f"{node.lineno}: compares a primitive with {ast.unparse(node)[:60]}")
        keys = node.keys if isinstance(node, ast.Dict) else []
        elts = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else []
        names = [
            e.value
            for e in [*keys, *elts]
            if isinstance(e, ast.Constant)
            and isinstance(e.value, str)
            and e.value in RECORDS
            and e.value not in REDUCTIONS
        ]
        if len(names) >= 2:
            out.append(f"{node.lineno}: a list of primitive names {names[:4]}")
    return out


def failing_modules() -> dict[str, list[str]]:
    out = {}
    for path in sorted(CORE.rglob("*.py")):
        rel = path.relative_to(CORE).as_posix()
        if rel.startswith("ops/"):
            continue
        found = violations(path.read_text())
        if found:
            out[rel] = found
    return out


def _excused(rel: str) -> bool:
    return any(rel == key or rel.startswith(key + "/") for key in NOT_YET)


def test_no_module_outside_ops_names_primitives():
    failing = failing_modules()
    bad = {rel: found for rel, found in failing.items() if not _excused(rel)}
    assert not bad, "ask ops.record / ops.traits instead:\n" + "\n".join(
        f"{rel}:{line}" for rel, found in bad.items() for line in found
    )


def test_the_scan_finds_what_it_looks_for():
    sample = """
if op.primitive == "dot_general": pass
if prim in ("jit", "pjit"): pass
TABLE = frozenset({"exp", "log"})
if eqn.primitive.name != "scan": pass
KINDS = ("all-gather", "reduce-scatter")
"""
    found = violations(sample)
    assert {f.split(":")[0] for f in found} == {"2", "3", "4", "5"}, found
