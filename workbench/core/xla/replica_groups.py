"""Replica groups: any of HLO's three syntaxes expanded to device positions, and the mesh
axes a set of groups (or a collective-permute's pairs) varies over (see README.md)."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence

import numpy as np

from workbench.core.xla.hlo_text import ints, split_top


def _iota(reshape: list[int], perm: list[int] | None) -> np.ndarray:
    ids = np.arange(math.prod(reshape)).reshape(reshape)
    return (ids.transpose(perm) if perm else ids).reshape(-1)


_IOTA_RE = re.compile(r"\[([\d,\s]*)\]<=\[([\d,\s]*)\](?:T\(([\d,\s]*)\))?$")
_MESH_RE = re.compile(
    r"mesh\[(?P<axes>[^\]]*)\](?:,\s*device_ids=\((?P<ids>.*)\))?\s*\{(?P<group>[^}]*)\}$"
)
_DEVICE_IOTA_RE = re.compile(r"\[([\d,\s]*)\](?:T\(([\d,\s]*)\))?$")
_AXIS_REF_RE = re.compile(r"""\s*['"]?([^'":]+)['"]?\s*(?::\((\d+)\)(\d+))?\s*$""")


def parse_groups(value: str | None, n: int) -> tuple[tuple[int, ...], ...]:
    """Expand any replica_groups syntax to tuples of device positions."""
    value = (value or "{}").strip()
    if value.startswith("{") and value.endswith("}"):
        inner = value[1:-1]
        if re.sub(r"\{[^{}]*\}|[\s,]", "", inner):
            raise ValueError(f"replica groups {value!r} are not a list of {{...}} groups")
        groups = [tuple(ints(g)) for g in re.findall(r"\{([^{}]*)\}", inner)]
        if not all(groups):
            raise ValueError(f"replica groups {value!r} hold an empty group")
        return tuple(groups) if groups else (tuple(range(n)),)
    if m := _IOTA_RE.match(value):
        shape, reshape = ints(m.group(1)), ints(m.group(2))
        perm = ints(m.group(3)) if m.group(3) else None
        if len(shape) != 2 or math.prod(shape) != math.prod(reshape):
            raise ValueError(f"iota replica groups {value!r} do not describe a [groups,size] list")
        ids = _iota(reshape, perm).reshape(shape)
        return tuple(tuple(int(i) for i in row) for row in ids)
    if m := _MESH_RE.match(value):
        return _mesh_groups(m, value)
    raise ValueError(f"unknown replica_groups syntax {value!r}")


def _mesh_groups(m: re.Match, value: str) -> tuple[tuple[int, ...], ...]:
    names, sizes = [], []
    for item in split_top(m.group("axes")):
        name, _, size = item.rpartition("=")
        names.append(name.strip().strip("'\""))
        sizes.append(int(size))
    total = math.prod(sizes)
    ids_text = (m.group("ids") or "").strip()
    if not ids_text:
        ids = np.arange(total)
    elif d := _DEVICE_IOTA_RE.match(ids_text):
        ids = _iota(ints(d.group(1)), ints(d.group(2)) if d.group(2) else None)
    else:
        ids = np.array(ints(ids_text))
    if ids.size != total:
        raise ValueError(f"mesh replica groups {value!r}: device_ids do not fill the mesh")
    # Each grouped (sub-)axis becomes its own dimension of a refined mesh; the grouped
    # dimensions move last, in the order listed, and consecutive runs form the groups.
    refs: list[tuple[int, int, int]] = []  # (mesh axis, pre-size, size)
    for item in split_top(m.group("group")):
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


def axes_of_groups(groups, names: Sequence[str], sizes: Sequence[int]) -> tuple[str, ...] | None:
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


def axes_of_pairs(pairs, names: Sequence[str], sizes: Sequence[int]) -> tuple[str, ...]:
    coords = _coords(math.prod(sizes), sizes)
    moved = {a for s, t in pairs for a in range(len(sizes)) if coords[s][a] != coords[t][a]}
    return tuple(names[a] for a in sorted(moved))
