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
class Pass:
    """One evaluation of an attention between its dots: the forward's, or its recomputation
    in the backward pass under remat (op and value ids)."""

    scores: int  # the scores dot
    context: int  # the context dot
    queries: int
    keys: int
    values: int
    out: int  # the context dot's result
    chain: tuple[int, ...]  # elementwise ops and transposes from the scores to the logits
    sides: tuple[tuple[int, int | None], ...]  # (array, its keys' dim or None): a mask, a bias
    logits: int  # what the softmax's max reads
    key_dim: int  # the keys' dim of the logits and the probabilities
    probs: int  # the context dot's operand index of the probabilities
    keys_seq: int  # the keys' (and the values') sequence dim
    values_seq: int
    ops: frozenset[int]  # its ops (the two dots included)
    made: frozenset[int]  # the values between its dots


@dataclass(frozen=True, slots=True)
class Region:
    """One attention as ring attention computes it: its forward `Pass`, its recomputation
    under remat (``replay``: its output is the forward's, kept), and the backward ops it
    replaces (op and value ids)."""

    forward: Pass
    replay: Pass | None
    backward: frozenset[int]  # backward ops it replaces
    first_backward: int  # the op where the backward ring runs (the first of ``backward``)
    cotangent: int  # dO, the cotangent of the output
    grads: tuple[int, int, int]  # the cotangents of queries, keys and values it gives

    @property
    def evaluated(self) -> Pass:
        """The pass whose queries, keys, values and chain the backward ring reads."""
        return self.replay or self.forward

    @property
    def skipped(self) -> frozenset[int]:
        """Every op the ring replaces."""
        return self.forward.ops | self.backward | (self.replay.ops if self.replay else frozenset())


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
        if len(contracted) == 1:
            at = _scores_dim(program, context.operands[i], contracted[0], scores.results[0], reach)
            lhs_free = len(program.values[scores.operands[0]].shape) - len(cl) - len(bl)
            if at is not None and len(bl) <= at < len(bl) + lhs_free:
                keys = scores.operands[0]
    return keys, values


def _scores_dim(program, v: int, dim: int, scores: int, reach) -> int | None:
    """The dim of the scores ``dim`` of ``v`` comes from, followed back through transposes
    and same-shaped elementwise ops reached from the scores (a scale, a mask, a softmax);
    None where it cannot be followed so."""
    values, ops = program.values, program.ops
    while v != scores:
        p = values[v].producer
        if p is None:
            return None
        op = ops[p]
        if traits_of(op.primitive).permutes and "permutation" in op.params:
            dim, v = op.params["permutation"][dim], op.operands[0]
            continue
        shape = values[v].shape
        on_path = [
            x for x in op.operands if isinstance(x, int) and x in reach and values[x].shape == shape
        ]
        if registry.record(op.primitive).family != "elementwise" or not on_path:
            return None
        v = on_path[0]
    return dim


def free_dims(op, side: int, rank: int) -> list[int]:
    """The dims of a dot's operand ``side`` (0, 1) it neither contracts nor batches."""
    (cl, cr), (bl, br) = op.params["dimension_numbers"]
    taken = (*cl, *bl) if side == 0 else (*cr, *br)
    return [d for d in range(rank) if d not in taken]


def region(program, scores: int, context: int) -> Region | str:
    """The `Region` of the attention whose dots are ``scores`` and ``context`` (op ids), or
    why it is none (a sentence). Every attention the anatomy finds is looked at once per
    program (``program.cache``): each lookup is then free, and remat's recomputations are
    matched to their attentions in one pass over the program, not one per attention."""
    found = _regions(program)
    key = (scores, context)
    return found[0][key] if key in found[0] else _region(program, scores, context, *found[1:])


def _regions(program) -> tuple[dict, dict, dict]:
    """(every anatomy attention's region, the program's top-level op positions, its
    attentions' recomputations by the weights their queries and keys are made from)."""

    def build():
        ops = program.ops
        top = {o: i for i, o in enumerate(program.body)}
        every = [(a.scores, a.context) for a in program.anatomy().layers.attention]
        again: dict = {}
        for pair in recomputed(program, every):
            made = (x for x in ops[pair[0]].operands if isinstance(x, int))
            again.setdefault(_weights(program, *made), []).append(pair)
        return {pair: _region(program, *pair, top, again) for pair in every}, top, again

    return program.cache.get("anatomy.attention regions", build)


def _region(program, scores: int, context: int, top: dict, again: dict) -> Region | str:
    """`region`, given the top-level positions and the recomputations (`_regions`)."""
    ops, values, users = program.ops, program.values, program.users
    fwd = _pass(program, scores, context, top)
    if isinstance(fwd, str):
        return fwd
    phase = "backward"

    def backward_dots(x):
        return [o for o in dict.fromkeys(users[x]) if ops[o].phase == phase
                and traits_of(ops[o].primitive).contraction]  # fmt: skip

    replay = None
    mine = _weights(program, fwd.queries, fwd.keys)
    replays = again.get(mine, []) if mine else []
    # rematerialised: the backward reads a recomputation (of every op, or, under a policy
    # that keeps the projections, of the dots and softmax on the kept queries and keys)
    if not backward_dots(fwd.values) or len(replays) == 1:
        if len(replays) != 1:
            return "its backward pass reads no recomputation of it that the workbench finds"
        replay = _pass(program, *replays[0], top)
        if isinstance(replay, str):
            return f"its recomputation under remat: {replay}"
    ev = replay or fwd
    q, k, v = ev.queries, ev.keys, ev.values
    dp, dq, dk = ([o for o in backward_dots(x) if o not in ev.ops] for x in (v, k, q))
    if len(dp) != 1 or len(dq) != 1 or len(dk) != 1:
        return "its backward pass does not read its queries, keys and values once each"
    dp, dq, dk = dp[0], dq[0], dk[0]
    cot = next(x for x in ops[dp].operands if x != v)
    if not isinstance(cot, int) or values[cot].shape != values[ev.out].shape:
        return "its backward pass does not start from its output's cotangent"
    dv = [
        o
        for o in backward_dots(cot)
        if o != dp and o not in ev.ops and any(y in ev.made for y in ops[o].operands)
    ]
    if len(dv) != 1:
        return "its values' gradient is not one dot of the probabilities and the cotangent"
    grads = []
    for dot, target in ((dq, q), (dk, k), (dv[0], v)):
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
    ancestors, todo = set(), list(grads)
    while todo:
        x = todo.pop()
        o = values[x].producer
        if x in (cot, ev.out) or o is None or o in ancestors or ops[o].phase != phase:
            continue
        if o not in top:
            return "its backward pass runs inside a loop"
        ancestors.add(o)
        todo += [y for y in ops[o].operands if isinstance(y, int)]
    starts = {cot} | ev.made
    fed, todo = set(starts), list(starts)
    while todo:
        x = todo.pop()
        for o in users[x]:
            if o in ancestors:
                for r in ops[o].results:
                    if r not in fed:
                        fed.add(r)
                        todo.append(r)
    backward = {o for o in ancestors if any(r in fed for r in ops[o].results)}
    backward -= replay.ops if replay else set()
    backward |= {  # made from nothing (zeros to select) for it alone
        o
        for o in ancestors
        if not any(isinstance(y, int) for y in ops[o].operands)
        and all(u in backward for r in ops[o].results for u in users[r])
    }
    if not backward:
        return "its backward pass is not found"
    made_b = {r for o in backward for r in ops[o].results}
    for x in made_b - set(grads):
        if any(o not in backward for o in users[x]):
            return "a value of its backward pass is read outside it"
    inside = fwd.ops | backward | (replay.ops if replay else frozenset())
    for x in fwd.made | (replay.made if replay else frozenset()):
        if any(o not in inside for o in users[x]):
            return "a value between its dots is read elsewhere (the attention weights returned?)"
    first = min(backward, key=top.__getitem__)
    reads = {cot, q, k, v, *(x for x, _ in ev.sides)}
    reads |= {y for o in backward for y in ops[o].operands if isinstance(y, int)}
    for y in reads:
        p = values[y].producer
        if p is not None and p not in inside and top.get(p, -1) > top[first]:
            return "its backward pass reads a value made after it starts"
    return Region(fwd, replay, frozenset(backward), first, cot, tuple(grads))


def _weights(program, *values: int, limit: int = 256) -> frozenset[int]:
    """The program inputs the matmuls that make ``values`` read (their weights: a layer's
    projections, recomputed or not), walking back to the first matmul on each path."""
    ops, vals, inputs = program.ops, program.values, set(program.inputs)
    found, seen, todo = set(), set(values), list(values)
    while todo and len(seen) < limit:
        o = vals[todo.pop()].producer
        if o is None:
            continue
        matmul = traits_of(ops[o].primitive).contraction
        for y in ops[o].operands:
            if not isinstance(y, int) or y in seen:
                continue
            if matmul:  # its weight, read through casts and relayouts
                while (
                    y not in inputs
                    and (p := vals[y].producer) is not None
                    and traits_of(ops[p].primitive).transparent
                ):
                    y = ops[p].operands[0]
                if y in inputs:
                    found.add(y)
                continue
            seen.add(y)
            todo.append(y)
    return frozenset(found)


def _pass(program, scores: int, context: int, top) -> Pass | str:
    """One evaluation of an attention between its dots (`Pass`), or why it is none."""
    ops, values, users = program.ops, program.values, program.users
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
    # between the dots: what the probabilities are made from, and what is made from that
    # alone (residuals the backward reads); not a backward op that reads the recomputation
    made, todo = {s_out}, [C.operands[i]]
    while todo:
        x = todo.pop()
        if x in made or x not in reach:
            continue
        made.add(x)
        todo += [y for y in ops[values[x].producer].operands if isinstance(y, int)]
    grown = True
    while grown:
        grown = False
        for x in list(made):
            for o in users[x]:
                op = ops[o]
                if o == context or op.phase != S.phase or set(op.results) <= made:
                    continue
                if all(y in made for y in op.operands if isinstance(y, int)):
                    made.update(op.results)
                    grown = True
    maxes = [
        ops[o]
        for x in made
        for o in dict.fromkeys(users[x])
        if o != context
        and ops[o].phase == S.phase
        and registry.record(ops[o].primitive).family == "reduce"
        and program.mappings[o].reduction == "max"
    ]
    if len(maxes) != 1 or tuple(maxes[0].params["axes"]) != (key_dim,):
        return "no one softmax over the keys lies between its dots"
    logits = maxes[0].operands[0]
    inner = {values[x].producer for x in made} | {context}
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
        todo += [y for y in ops[o].operands if isinstance(y, int) and y in made]
    chain = sorted(chain, key=top.__getitem__)
    (_, _), (bl, _) = S.params["dimension_numbers"]
    lhs_free = free_dims(S, 0, len(values[S.operands[0]].shape))
    kd = {s_out: len(bl) + (len(lhs_free) if S.operands.index(k) == 1 else 0)}
    sides = {}
    for o in chain:
        op = ops[o]
        dims = {kd[y] for y in op.operands if isinstance(y, int) and y in kd}
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
    for o in inner - set(chain) - {scores, context}:
        op = ops[o]
        family = registry.record(op.primitive).family
        if family not in SOFTMAX_FAMILIES or op.regions:
            return f"a {op.primitive} lies between its softmax and its context (a dropout?)"
        if family == "reduce" and tuple(op.params.get("axes", ())) != (key_dim,):
            return "its softmax reduces over more than its keys"
        if any(isinstance(y, int) and y not in made for y in op.operands):
            return "its softmax reads an array from outside it (a dropout mask?)"
    return Pass(
        scores, context, q, k, v, C.results[0], tuple(chain), tuple(sorted(sides.items())),
        logits, key_dim, i, kf[0], cvc[0], frozenset(inner), frozenset(made),
    )  # fmt: skip


def recomputed(program, attention) -> list[tuple[int, int]]:
    """(scores, context) op pairs that recompute an attention outside the forward pass
    (rematerialisation, in the backward pass or, for the last layers, where the forward
    ends): dots of the same line, parameters and shapes as its scores, whose result reaches
    a dot of its context's line (whose operands may come in another order). ``attention``:
    (scores, context) op pairs."""

    def signature(op):
        shapes = tuple(program.values[v].shape if isinstance(v, int) else () for v in op.operands)
        return op.source, op.primitive, repr(dict(op.params)), shapes

    wanted = {}  # an attention's scores' signature -> its context's line
    for scores, context in attention:
        scores, context = program.ops[scores], program.ops[context]
        if scores.source:  # a line to match on: no guessing by shapes alone
            wanted[signature(scores)] = context.source
    if not wanted:
        return []
    own = {o for pair in attention for o in pair}
    later = [op for op in program.ops if traits_of(op.primitive).contraction and op.id not in own]
    alike, on_line = {}, {}
    for op in later:
        alike.setdefault(signature(op), []).append(op)
        on_line.setdefault(op.source, []).append(op)
    pairs = []
    for sig, line in wanted.items():
        contexts = on_line.get(line, [])
        for op in alike.get(sig, []) if contexts else []:
            reach = downstream(program, op.results[0], phase=None)
            c = next((c for c in contexts if any(x in reach for x in c.operands)), None)
            if c is not None:
                pairs.append((op.id, c.id))
    return pairs
