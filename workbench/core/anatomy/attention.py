"""Attention regions: the ops of one attention from its scores to its context, forward and
backward, as ring attention replaces them (``CP(kind="ring")``, ``lowering/ring.py``).

Found from structure, for an attention of ``layers.Attention`` (its two dots):

- forward: the scores dot, a *chain* of elementwise ops and transposes to the logits (a
  scale, a mask or bias broadcast against the scores, casts), a softmax over the keys (one max, exp, sum, divide; casts), the
  probabilities into the context dot; values it leaves for the backward pass (residuals);
- backward: the four dots that transpose the two (``dP = dO·V``, ``dV = P·dO``, ``dQ = dS·K``,
  ``dK = dS·Q``), the softmax's and the chain's transposes between them, and the relayouts
  that give the cotangents of the queries, keys and values in their own layouts.

``region`` returns a `Region`, or a sentence saying why the attention is not one: a loop
around it, rematerialisation, a dropout or anything else between the dots that ring
attention's blocks would not compute alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core import ops as registry
from workbench.core.anatomy.layers import downstream
from workbench.core.ops import traits as traits_of

#: The op families a softmax over the keys is made of (no dot, no loop, no draw)
SOFTMAX_FAMILIES = frozenset({"elementwise", "reduce", "shape"})


def relayout(op) -> bool:
    """Whether ``op`` only transposes or casts (between a backward dot and its gradient)."""
    t = traits_of(op.primitive)
    return t.permutes or t.cast


@dataclass(frozen=True, slots=True)
class Region:
    """One attention as ring attention computes it (op and value ids)."""

    scores: int  # the scores dot
    context: int  # the context dot
    queries: int
    keys: int
    values: int
    out: int  # the context dot's result
    chain: tuple[int, ...]  # elementwise ops from the scores' result to the logits, in order
    sides: tuple[tuple[int, int | None], ...]  # (array, its keys' dim or None): a mask, a bias
    logits: int  # what the softmax's max reads
    key_dim: int  # the keys' dim of the logits and the probabilities
    probs: int  # the context dot's operand index of the probabilities
    keys_seq: int  # the keys' (and the values') sequence dim
    values_seq: int
    forward: frozenset[int]  # forward ops ring attention replaces (the two dots included)
    backward: frozenset[int]  # backward ops it replaces
    first_backward: int  # the op where the backward ring runs (the first of ``backward``)
    cotangent: int  # dO, the cotangent of ``out``
    grads: tuple[int, int, int]  # the cotangents of queries, keys and values it gives


def reached(program, scores: int, context: int) -> tuple[set[int], list[int]]:
    """What the scores' result reaches (in their pass), and which operands of the context
    dot are among it (the probabilities)."""
    op, context = program.ops[scores], program.ops[context]
    reach = downstream(program, op.results[0], phase=op.phase)
    return reach, [i for i, x in enumerate(context.operands) if x in reach]


def rows_of(program, context, probs: list[int]) -> tuple[int, int] | None:
    """`query_rows` once the probabilities' operand indexes are known."""
    if len(probs) != 1:
        return None
    (i,) = probs
    (contracted, batch) = (context.params["dimension_numbers"][0][i],
                           context.params["dimension_numbers"][1][i])  # fmt: skip
    v = context.operands[i]
    shape = program.values[v].shape
    free = [d for d in range(len(shape)) if d not in (*contracted, *batch) and shape[d] > 1]
    return (v, free[0]) if len(free) == 1 else None


def query_rows(program, scores: int, context: int) -> tuple[int, int] | None:
    """(probabilities, their queries' dim): the context dot's operand the scores reach, and
    its one free dim longer than 1 (None where there is not exactly one)."""
    return rows_of(program, program.ops[context], reached(program, scores, context)[1])


def keys_values(program, scores: int, context: int) -> tuple[int, int]:
    """The keys and the values an attention's dots (op ids) read: the scores operand whose
    length the context dot contracts (the right one unless the probabilities say
    otherwise), and the context operand the scores do not reach."""
    reach, probs = reached(program, scores, context)
    scores, context = program.ops[scores], program.ops[context]
    values = next(x for x in context.operands if x not in reach)
    keys = scores.operands[1]
    if len(probs) == 1:
        i = probs[0]
        contracted = context.params["dimension_numbers"][0][i]
        (cl, _), (bl, _) = scores.params["dimension_numbers"]
        shape = program.values[scores.results[0]].shape
        if program.values[context.operands[i]].shape == shape and len(contracted) == 1:
            lhs_free = len(program.values[scores.operands[0]].shape) - len(cl) - len(bl)
            if len(bl) <= contracted[0] < len(bl) + lhs_free:
                keys = scores.operands[0]
    return keys, values


def free_dims(op, side: int, rank: int) -> list[int]:
    """The dims of a dot's operand ``side`` (0, 1) it neither contracts nor batches."""
    (cl, cr), (bl, br) = op.params["dimension_numbers"]
    taken = (*cl, *bl) if side == 0 else (*cr, *br)
    return [d for d in range(rank) if d not in taken]


def region(program, scores: int, context: int) -> Region | str:
    """The `Region` of the attention whose dots are ``scores`` and ``context`` (op ids), or
    why it is none (a sentence)."""
    ops, values, users = program.ops, program.values, program.users
    top = {o: i for i, o in enumerate(program.body)}
    S, C = ops[scores], ops[context]
    if scores not in top or context not in top:
        return "it runs inside a loop or a branch (a scan over layers, say)"
    reach = downstream(program, S.results[0], limit=1024, phase=S.phase)
    probs = [j for j, x in enumerate(C.operands) if x in reach]
    if len(probs) != 1:
        return "its context dot does not read one array of probabilities"
    i = probs[0]
    k, v = keys_values(program, scores, context)
    q = next((x for x in S.operands if x != k), None)
    if not isinstance(q, int) or not isinstance(k, int) or not isinstance(v, int):
        return "its queries, keys or values are constants"
    kf = free_dims(S, S.operands.index(k), len(values[k].shape))
    (cpc, cvc) = (C.params["dimension_numbers"][0][i], C.params["dimension_numbers"][0][1 - i])
    if len(kf) != 1 or len(cpc) != 1 or len(cvc) != 1:
        return "its keys or values carry more than one sequence dim"
    key_dim = cpc[0]
    s_out = S.results[0]
    maxes = [
        ops[o]
        for x in reach
        for o in dict.fromkeys(users[x])
        if o != context
        and registry.record(ops[o].primitive).family == "reduce"
        and program.mappings[o].reduction == "max"
    ]
    if len(maxes) != 1 or tuple(maxes[0].params["axes"]) != (key_dim,):
        return "no one softmax over the keys lies between its dots"
    logits = maxes[0].operands[0]
    forward_vals = set(reach)
    forward = {values[x].producer for x in reach if values[x].producer is not None} | {context}
    if values[logits].shape != values[C.operands[i]].shape:
        return "its logits are not of its probabilities' shape"
    # the chain: ancestors of the logits that descend from the scores
    chain, todo = set(), [logits]
    while todo:
        x = todo.pop()
        o = values[x].producer
        if x == s_out or o in chain:
            continue
        chain.add(o)
        todo += [y for y in ops[o].operands if isinstance(y, int) and y in forward_vals]
    chain = sorted(chain, key=top.__getitem__)
    (_, _), (bl, _) = S.params["dimension_numbers"]
    side_k = S.operands.index(k)
    lhs_free = free_dims(S, 0, len(values[S.operands[0]].shape))
    kd = {s_out: len(bl) + (len(lhs_free) if side_k == 1 else 0)}
    sides = {}
    for o in chain:
        op = ops[o]
        inner = [y for y in op.operands if isinstance(y, int) and y in kd]
        dims = {kd[y] for y in inner}
        if len(dims) != 1:
            return "its scores reach their softmax along two paths"
        (d,) = dims
        if traits_of(op.primitive).permutes:
            d = list(op.params["permutation"]).index(d)
        elif registry.record(op.primitive).family != "elementwise":
            return f"a {op.primitive} lies between its scores and its softmax"
        shape = values[op.results[0]].shape
        for y in op.operands:
            if not isinstance(y, int) or y in kd:
                continue
            ys = values[y].shape
            if ys and (len(ys) != len(shape) or ys[d] not in (1, shape[d])):
                return "a mask or bias between its scores and its softmax is not of their shape"
            at = d if ys and ys[d] > 1 else None
            if sides.setdefault(y, at) != at:
                return "a mask or bias meets its scores twice, along different keys"
        kd[op.results[0]] = d
    if kd.get(logits) != key_dim:
        return "its softmax does not run over its keys"
    for o in forward - set(chain) - {scores, context}:
        op = ops[o]
        if registry.record(op.primitive).family not in SOFTMAX_FAMILIES or op.regions:
            return f"a {op.primitive} lies between its softmax and its context (a dropout?)"
        if registry.record(op.primitive).family == "reduce" and tuple(
            op.params.get("axes", ())
        ) != (key_dim,):
            return "its softmax reduces over more than its keys"
        if any(isinstance(y, int) and y not in forward_vals for y in op.operands):
            return "its softmax reads an array from outside it (a dropout mask?)"
    # backward: the four transposed dots
    phase = "backward"

    def backward_dots(x):
        return [o for o in dict.fromkeys(users[x]) if ops[o].phase == phase
                and traits_of(ops[o].primitive).contraction]  # fmt: skip

    dp, dq, dk = backward_dots(v), backward_dots(k), backward_dots(q)
    if len(dp) != 1 or len(dq) != 1 or len(dk) != 1:
        return (
            "its backward pass does not read its own queries, keys and values once each "
            "(rematerialised, or no gradient)"
        )
    dp, dq, dk = dp[0], dq[0], dk[0]
    cot = next(x for x in ops[dp].operands if x != v)
    if not isinstance(cot, int) or values[cot].shape != values[C.results[0]].shape:
        return "its backward pass does not start from its output's cotangent"
    dv = [
        o for o in backward_dots(cot) if o != dp and any(y in forward_vals for y in ops[o].operands)
    ]
    if len(dv) != 1:
        return "its values' gradient is not one dot of the probabilities and the cotangent"
    dv = dv[0]
    grads = []
    for dot, target in ((dq, q), (dk, k), (dv, v)):
        x = ops[dot].results[0]
        while len(us := set(users[x])) == 1 and ops[(u := next(iter(us)))].phase == phase:
            if not relayout(ops[u]) or (
                values[x].shape == values[target].shape and not traits_of(ops[u].primitive).permutes
            ):
                break
            x = ops[u].results[0]
        if values[x].shape != values[target].shape:
            return "its gradients do not come out in the queries', keys' and values' layouts"
        grads.append(x)
    # every backward op between the cotangent (or a residual) and the three gradients
    ends = set(grads)
    ancestors, todo = set(), list(grads)
    while todo:
        x = todo.pop()
        o = values[x].producer
        if x == cot or o is None or o in ancestors or ops[o].phase != phase or o not in top:
            continue
        ancestors.add(o)
        todo += [y for y in ops[o].operands if isinstance(y, int)]
    starts = {cot} | forward_vals
    fed, todo = set(starts), list(starts)
    while todo:
        x = todo.pop()
        for o in users[x]:
            if o in ancestors:
                for r in ops[o].results:
                    if r not in fed:
                        fed.add(r)
                        todo.append(r)
    backward = {  # fed by the cotangent or a residual, or by nothing (zeros to select)
        o
        for o in ancestors
        if any(r in fed for r in ops[o].results)
        or not any(isinstance(y, int) for y in ops[o].operands)
    }
    made_b = {r for o in backward for r in ops[o].results}
    for x in made_b - ends:
        if any(o not in backward for o in users[x]):
            return "a value of its backward pass is read outside it"
    for x in forward_vals:
        if any(o not in forward and o not in backward for o in users[x]):
            return "a value between its dots is read elsewhere (the attention weights returned?)"
    first = min(backward, key=top.__getitem__)
    for o in backward:
        for y in ops[o].operands:
            p = values[y].producer if isinstance(y, int) else None
            if (
                p is not None
                and p not in backward
                and p not in forward
                and top.get(p, -1) > top[first]
            ):
                return "its backward pass reads a value made after it starts"
    return Region(
        scores=scores,
        context=context,
        queries=q,
        keys=k,
        values=v,
        out=C.results[0],
        chain=tuple(chain),
        sides=tuple(sorted(sides.items())),
        logits=logits,
        key_dim=key_dim,
        probs=i,
        keys_seq=kf[0],
        values_seq=cvc[0],
        forward=frozenset(forward),
        backward=frozenset(backward),
        first_backward=first,
        cotangent=cot,
        grads=tuple(grads),
    )
