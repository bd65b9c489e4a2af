"""Which node each op is drawn as: itself, or a box for its name scope and phase.

A top-level op belongs to the group ``(phase, scope[:depth])``; ops inside a region
(a loop or branch body) go wherever their top-level region op goes. ``depth=None``
draws every op; ``expand`` names scope prefixes whose ops are drawn one by one at any
depth. A group holding a single op (that is not a loop or branch) is drawn as that op.
Ops of phases left out are not drawn (their node is None): a box still counts the values
it sends to them or gets from them, but no edge leads there.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from workbench.core.errors import WorkbenchError
from workbench.core.ir.program import Program

PHASES = ("forward", "backward", "optimizer")
#: Op nodes an automatic collapse aims to stay under: ``dot`` lays out a training step's
#: graph of this size (with its saved-activation edges) in well under a second.
MAX_NODES = 120


@dataclass(slots=True)
class Group:
    """A collapsed box: the top-level ops of one phase under one scope prefix."""

    node: str  # its DOT node name
    phase: str
    scope: tuple[str, ...]
    roots: list[int] = field(default_factory=list)  # its top-level ops
    ops: list[int] = field(default_factory=list)  # every op it holds, region bodies included
    key: str = ""  # what opens it (folding by blocks, see ``blocks.py``); "" otherwise


@dataclass(slots=True)
class Nodes:
    """The drawing plan: per op the node it is drawn as."""

    depth: int | None  # None: every op is drawn
    node_of: list[str | None]  # per op id: "op<id>", a group's node, or None (phase not drawn)
    drawn: list[int]  # ops drawn as their own node, in program order
    groups: dict[str, Group]  # collapsed boxes by node name
    root: list[int]  # per op id: its top-level op
    region_index: dict[int, int]  # body op id -> index of the region of its parent holding it
    #: opened blocks (folding by blocks): top-level op id -> (key, title) of its cluster
    cluster_of: dict[int, tuple[str, str]] = field(default_factory=dict)

    def is_drawn(self, op_id: int) -> bool:
        return self.node_of[op_id] == f"op{op_id}"


def as_scope(prefix: str | Sequence[str]) -> tuple[str, ...]:
    """``"layer3/attn"`` or ``("layer3", "attn")`` -> ``("layer3", "attn")``."""
    parts = prefix.split("/") if isinstance(prefix, str) else prefix
    return tuple(p for p in parts if p)


def _expanded(scope: tuple[str, ...], expand: tuple[tuple[str, ...], ...]) -> bool:
    return any(scope[: len(e)] == e for e in expand)


def _count(program: Program, roots: list[int], expand, depth: int | None, sizes) -> int:
    """How many nodes the ops take at ``depth`` (regions' end nodes included)."""
    keys, singles = set(), 0
    for r in roots:
        op = program.ops[r]
        if depth is None or _expanded(op.scope, expand):
            singles += sizes[r]
        else:
            keys.add((op.phase, op.scope[:depth]))
    return len(keys) + singles


def choose_depth(program: Program, roots: list[int], expand, max_nodes: int, sizes) -> int | None:
    """The deepest collapse that keeps the ops under ``max_nodes`` nodes (None: no collapse)."""
    if _count(program, roots, expand, None, sizes) <= max_nodes:
        return None
    deepest = max((len(program.ops[r].scope) for r in roots), default=0)
    for depth in range(deepest, 0, -1):
        if _count(program, roots, expand, depth, sizes) <= max_nodes:
            return depth
    return 0


def _root_and_regions(program: Program) -> tuple[list[int], dict[int, int], list]:
    """Per op its top-level op; per body op the index of the region holding it; the walk."""
    root = [0] * len(program.ops)
    region_index: dict[int, int] = {}
    order = list(program.walk())
    for op in order:
        root[op.id] = op.id if op.parent is None else root[op.parent]
        for k, region in enumerate(op.regions):
            region_index.update(dict.fromkeys(region.ops, k))
    return root, region_index, order


def assign_nodes(
    program: Program,
    *,
    phases: Iterable[str] = PHASES,
    collapse: int | str | None = "auto",
    expand: Iterable[str | Sequence[str]] = (),
    max_nodes: int = MAX_NODES,
) -> Nodes:
    """Decide, in one pass over the program, which node every op is drawn as."""
    phases = (phases,) if isinstance(phases, str) else tuple(phases)
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        raise WorkbenchError(
            f"phases={phases!r} names {unknown}, which no op has; "
            f"pick from {', '.join(map(repr, PHASES))}."
        )
    expand = tuple(as_scope(e) for e in ((expand,) if isinstance(expand, str) else expand))
    root, region_index, order = _root_and_regions(program)
    # nodes each shown top-level op takes when drawn: itself, its body and its end node
    sizes = {r: 0 for r in program.body if program.ops[r].phase in phases}
    for op in order:
        if root[op.id] in sizes:
            sizes[root[op.id]] += 2 if op.regions else 1
    roots = list(sizes)

    if collapse == "auto":
        depth = choose_depth(program, roots, expand, max_nodes, sizes)
    elif collapse is None or collapse is False:
        depth = None
    elif isinstance(collapse, int) and not isinstance(collapse, bool) and collapse >= 0:
        depth = collapse
    else:
        raise WorkbenchError(
            f"collapse={collapse!r} is not a collapse; use 'auto', None (every op) or a scope "
            "depth >= 0 (0: one box per phase, 1: one box per top-level scope, ...)."
        )

    groups: dict[tuple, Group] = {}
    node_of: list[str | None] = [""] * len(program.ops)
    for r in roots:
        op = program.ops[r]
        if depth is not None and not _expanded(op.scope, expand):
            key = (op.phase, op.scope[:depth])
            if key not in groups:
                groups[key] = Group(f"g{len(groups)}", *key)
            groups[key].roots.append(r)
    for group in groups.values():
        single = len(group.roots) == 1 and not program.ops[group.roots[0]].regions
        for r in group.roots:
            node_of[r] = f"op{r}" if single else group.node
    drawn = []
    for op in order:
        r = root[op.id]
        if r not in sizes:
            node_of[op.id] = None
        elif node_of[r] in ("", f"op{r}"):
            node_of[op.id] = f"op{op.id}"
            drawn.append(op.id)
        else:
            node_of[op.id] = node_of[r]
            groups[(program.ops[r].phase, program.ops[r].scope[:depth])].ops.append(op.id)
    boxes = {g.node: g for g in groups.values() if g.ops}
    return Nodes(depth, node_of, drawn, boxes, root, region_index)
