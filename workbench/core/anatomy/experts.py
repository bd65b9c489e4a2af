"""Mixture-of-experts layers from structure: experts, their dimension, the router, and the
dispatch/combine pair.

Read from the forward pass and the dimension classes, never from names:

- an *expert* matmul reads a parameter with a dimension of size E > 1 it keeps per expert
  while contracting another: E a batch dimension of a ``dot_general``, or the group
  dimension of a grouped matmul (``ragged_dot``: a factor only the parameter carries,
  or a blocked one it shares with the group sizes); parameters a matmul reads carrying
  that class (a dense MoE's "BSM,EMH->BSEH") are experts too; one experts class per MoE
  layer;
- the *router* is a parameter projection of the residual stream whose output, through
  ops other than matmuls, reaches an op making integers from floats (``top_k``,
  ``argmax``, an argsort): the decision; what the decision and the router's floats (the
  gates) reach before the residual stream must touch that layer's experts;
- the *dispatch* ops meet the tokens with the decision on the way into the first expert
  matmul (a one-hot einsum, a gather by token index); none when every expert sees every
  token; the *combine* ops lie between the last expert matmul and the op that weights its
  output by the gates (a gather back, an einsum with the combine tensor).

The router's output dimension and the experts' dimension are one experts dimension
(``Experts.classes``) even where the decision's integers cut the dataflow between them; a
grouped matmul's group dims (each its own factor) join it through the group sizes they read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.core.dtypes import is_extended
from workbench.core.ops import traits as traits_of


@dataclass(frozen=True, slots=True)
class Experts:
    """One MoE layer: its router, expert parameters with their experts dim, and the ops
    that dispatch tokens to the experts and combine their outputs."""

    router: int | None  # parameter [D, E] (None: not found)
    router_dim: int | None  # its experts dim
    experts: tuple[tuple[int, int], ...]  # (expert parameter, experts dim)
    size: int  # E
    classes: frozenset[int]  # the experts dimension's classes (the router's output's too)
    dispatch: tuple[int, ...]  # op ids
    combine: tuple[int, ...]  # op ids
    routing: tuple[int, ...]  # matmuls of activations that build or apply the routing
    form: str  # "einsum", "gather", "ragged", "dense" or "other"


def _integer(value) -> bool:
    dt = value.dtype
    return not is_extended(dt) and np.issubdtype(np.dtype(dt), np.integer)


def _float(value) -> bool:
    dt = value.dtype
    return not is_extended(dt) and np.issubdtype(np.dtype(dt), np.floating)


def _expert_dim(program, classes, op, operand, origin) -> tuple[int, int] | None:
    """``(operand dim, class)`` of an experts dim ``op`` keeps on ``operand`` (a parameter):
    a batch dim of a matmul, or a grouped matmul's group dim; None if it has none."""
    values = program.values
    shape = values[operand].shape
    others = [v for v in op.operands if isinstance(v, int) and v != operand]
    if not others or any(v in origin for v in others[:1]):
        return None
    if traits_of(op.primitive).contraction:
        (lc, rc), (lb, rb) = op.params["dimension_numbers"]
        side = op.operands.index(operand)
        contract, batch = (lc, lb) if side == 0 else (rc, rb)
        free = [d for d in range(len(shape)) if d not in contract and d not in batch]
        for d in batch:
            if shape[d] > 1 and contract and free:
                return d, classes.of(operand, d)
        return None
    mapping = program.mappings[op.id]
    if not mapping.contracting or len(op.operands) < 3:
        return None
    side = op.operands.index(operand)
    elsewhere = {f for i, dims in enumerate(mapping.operands) if i != side for d in dims for f in d}
    for d, factors in enumerate(mapping.operands[side]):
        f = factors[0] if factors and shape[d] > 1 else None
        if f is None or any(f in r for r in mapping.results[0]):
            continue
        shared = f in mapping.blocked and f in elsewhere  # groups kept whole
        own = f in mapping.contracting and f not in elsewhere  # groups that may be tiled
        if not (shared or own):
            continue
        sizes = [v for v in others if _integer(values[v]) and values[v].shape]
        if own and sizes:  # keyed by the group sizes' class, which every group dim reads
            return d, classes.of(sizes[0], len(values[sizes[0]].shape) - 1)
        return d, classes.of(operand, d)
    return None


def _param_dim(program, classes, param, operand, d) -> int:
    """The dim of ``param`` that ``operand`` (the parameter or a slice of it) has as ``d``."""
    pdims = classes.dims_of(param, len(program.values[param].shape))
    c = classes.of(operand, d)
    if c in pdims:
        return pdims.index(c)
    return d + len(program.values[param].shape) - len(program.values[operand].shape)


def _reach(program, classes, starts, model, keep, limit: int = 4000) -> set[int]:
    """Values reached forward from ``starts`` through values ``keep`` accepts, not going on
    from values carrying the model class (the residual stream)."""
    values = program.values
    seen, frontier = set(starts), list(starts)
    while frontier and len(seen) < limit:
        v = frontier.pop()
        if v not in starts and model in classes.dims_of(v, len(values[v].shape)):
            continue
        for u in program.users[v]:
            op = program.ops[u]
            if op.phase != "forward" or op.regions:
                continue
            for r in op.results:
                if r not in seen and keep(values[r]):
                    seen.add(r)
                    frontier.append(r)
    return seen


def _path(program, start: int, goal, forward: bool, limit: int = 64) -> list[int]:
    """Op ids from ``start`` to the first op ``goal`` accepts (included), breadth first."""
    ops, values = program.ops, program.values
    parent: dict[int, int | None] = {start: None}
    frontier = [start]
    while frontier and len(parent) < limit:
        nxt = []
        for v in frontier:
            nexts = program.users[v] if forward else [values[v].producer]
            for o in nexts:
                if o is None or ops[o].phase != "forward" or ops[o].regions:
                    continue
                if goal(ops[o]):
                    out, w = [o], v
                    while parent[w] is not None:
                        out.append(parent[w][0])
                        w = parent[w][1]
                    return out
                for w in ops[o].results if forward else ops[o].operands:
                    if isinstance(w, int) and w not in parent:
                        parent[w] = (o, v)
                        nxt.append(w)
        frontier = nxt
    return []


def find_experts(anatomy, origin, projections, model) -> tuple[Experts, ...]:
    """The MoE layers of ``anatomy``'s program (see the module docstring)."""
    program, classes = anatomy.program, anatomy.classes
    values, ops = program.values, program.ops
    expert_ops: dict[int, list[tuple[int, int, int, int]]] = {}  # class -> (op, param, dim, op dim)
    for op in ops:
        if op.phase != "forward" or op.regions:
            continue
        for v in op.operands:
            if isinstance(v, int) and v in origin:
                found = _expert_dim(program, classes, op, v, origin)
                if found:
                    d, c = found
                    param = origin[v]
                    pd = _param_dim(program, classes, param, v, d)
                    expert_ops.setdefault(c, []).append((op.id, param, pd, d))
                break
    if not expert_ops:
        return ()
    # matmuls of a parameter carrying an experts class as a free dim (a dense MoE)
    seen_ops = {o for group in expert_ops.values() for o, *_ in group}
    for p in projections:
        if p.op in seen_ops or len(values[p.operand].shape) < 3:
            continue
        dims = classes.dims_of(p.operand, len(values[p.operand].shape))
        for c in expert_ops:
            if c in p.free:
                d = dims.index(c)
                pd = _param_dim(program, classes, p.param, p.operand, d)
                expert_ops[c].append((p.op, p.param, pd, d))
    expert_params = {param for g in expert_ops.values() for _, param, _, _ in g}
    out = []
    taken: set[int] = set()
    for p in projections:  # routers: in the order the forward pass reads them
        if p.param in expert_params or p.kind != "up" or len(p.free) != 1:
            continue
        r = ops[p.op].results[0]
        floats = _reach(program, classes, {r}, model, _float)
        choice = [
            res
            for v in floats
            for u in program.users[v]
            if ops[u].phase == "forward"
            and not ops[u].regions
            and not traits_of(ops[u].primitive).cast
            for res in ops[u].results
            if _integer(values[res])
        ]
        if not choice:
            continue
        decided = _reach(program, classes, set(choice), model, lambda _: True)
        routed = floats | decided
        hits = {
            c: sum(1 for o, *_ in g if any(x in routed for x in ops[o].operands))
            + sum(1 for v in routed if c in classes.dims_of(v, len(values[v].shape)))
            for c, g in expert_ops.items()
            if c not in taken
        }
        hits = {c: n for c, n in hits.items() if n}
        if not hits:
            continue
        c = max(hits, key=hits.get)
        taken.add(c)
        out.append(_layer(program, classes, origin, model, p, c, expert_ops[c], floats, routed))
    return tuple(out)


def _layer(program, classes, origin, model, router, c, group, floats, routed) -> Experts:
    """One MoE layer: its experts class ``c``, ``group`` its expert matmuls."""
    ops, values = program.ops, program.values
    group_ops = {o for o, *_ in group}
    logits = ops[router.op].results[0]
    pdims = classes.dims_of(router.param, len(values[router.param].shape))
    router_dim = pdims.index(router.free[0]) if router.free[0] in pdims else None
    experts = tuple(dict.fromkeys((param, pd) for _, param, pd, _ in sorted(group)))
    size = values[experts[0][0]].shape[experts[0][1]]

    def reads_routing(op) -> bool:
        return any(isinstance(v, int) and v in routed for v in op.operands)

    def meets(op) -> bool:  # the decision meets the tokens (the residual stream's values)
        ins = [v for v in op.operands if isinstance(v, int)]
        return (
            op.id not in group_ops
            and any(v in routed for v in ins)
            and any(
                v not in routed and model in classes.dims_of(v, len(values[v].shape)) for v in ins
            )
        )

    dispatch, combine = [], []
    grouped = False
    for o, *_ in group:
        op = ops[o]
        grouped |= not traits_of(op.primitive).contraction
        acts = [v for v in op.operands if isinstance(v, int) and v not in origin]
        fed_by_experts = any(
            _path(program, v, lambda x: x.id in group_ops, forward=False, limit=32) for v in acts
        )
        if not fed_by_experts:  # an entry: what brought the tokens here
            for v in acts:
                if model in classes.dims_of(v, len(values[v].shape)):
                    path = _path(program, v, meets, forward=False, limit=32)
                    dispatch += path[:1]
        feeds = _path(program, op.results[0], lambda x: x.id in group_ops, forward=True, limit=32)
        if not feeds:  # an exit: to the op the gates weight
            path = _path(
                program,
                op.results[0],
                lambda x: any(isinstance(v, int) and v in floats for v in x.operands),
                forward=True,
            )
            combine += [
                x
                for x in reversed(path)
                if reads_routing(ops[x]) and not traits_of(ops[x].primitive).transparent
            ]
    dispatch, combine = tuple(dict.fromkeys(dispatch)), tuple(dict.fromkeys(combine))
    routing = tuple(
        op.id
        for op in ops
        if op.phase == "forward"
        and traits_of(op.primitive).contraction
        and op.id not in group_ops
        and op.id != router.op
        and not any(v in origin for v in op.operands)
        and reads_routing(op)
    )
    if grouped:
        form = "ragged"
    elif not dispatch:
        form = "dense"
    elif traits_of(ops[dispatch[0]].primitive).contraction:
        form = "einsum"
    elif traits_of(ops[dispatch[0]].primitive).lookup:
        form = "gather"
    else:
        form = "other"
    out_class = classes.of(logits, len(values[logits].shape) - 1)
    own = {classes.of(param, pd) for _, param, pd, _ in group} if grouped else set()
    return Experts(
        router.param,
        router_dim,
        experts,
        size,
        frozenset({c, out_class, *own}),
        dispatch,
        combine,
        routing,
        form,
    )
