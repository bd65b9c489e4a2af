"""Layers from structure: projections, attention, MLP, embeddings and repeated blocks.

Read from the forward pass and the dimension classes, never from names:

- a *projection* is a forward ``dot_general`` of an activation with a parameter (seen
  through casts, reshapes, transposes and a loop's per-step slice);
- the *model dimension* is the class the most parameters carry (the residual stream);
- an *up* projection contracts the model dimension into another class, a *down*
  projection contracts other classes back into it; a class some up projection makes and
  some down projection contracts is a block's *hidden* class (Megatron splits it);
- a hidden class that a dot of two activations carries as a batch dimension is
  attention's *heads* (queries and keys meet in one such dot, its result meets the values
  in the next); the others are MLP hidden dimensions;
- attention whose heads no parameter makes is fed by a *fused* projection split after the
  matmul (GPT-2's ``c_attn``): its queries, keys and values are found as activations;
- an *embedding* is a parameter a forward gather looks rows up in (the looked-up
  dimension is its vocabulary); an up projection into a class no down projection
  contracts is an *output head* (the vocabulary of the logits);
- *repeated blocks*: parameters of the same shape and kind that recur once per layer,
  numbered by where the forward pass first reads them; parameters a loop slices per step
  are one block repeated by the loop;
- *experts*, their router and dispatch/combine (``experts``): the router is no output head
  and the matmuls that route tokens are no attention.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from workbench.core.anatomy.experts import find_experts
from workbench.core.ops import traits as traits_of


@dataclass(frozen=True, slots=True)
class Projection:
    """A forward matmul of an activation with a parameter."""

    op: int
    param: int
    operand: int  # the value the dot reads (the parameter, or a cast or slice of it)
    kind: str  # "up", "down" or "other"
    contracted: frozenset[int]  # classes it contracts
    free: tuple[int, ...]  # classes it makes (the parameter side), in operand dim order


@dataclass(frozen=True, slots=True)
class Attention:
    """One attention: its heads class, the dots of scores and context, and the projections
    (or, when fused, the activations) that give queries, keys and values."""

    heads: int
    scores: int  # op id
    context: int  # op id
    queries: tuple[int, ...]  # parameters (or activations when ``fused``)
    keys: tuple[int, ...]
    values: tuple[int, ...]
    output: tuple[int, ...]  # down-projection parameters
    fused: bool
    fused_from: tuple[int, ...] = ()  # the fused projections' parameters


@dataclass(eq=False)
class Layers:
    model_class: int | None
    projections: list[Projection]
    hidden: dict[int, str]  # class -> "heads" or "mlp"
    attention: list[Attention]
    embeddings: list[tuple[int, int]]  # (table, vocabulary dim)
    heads_out: list[tuple[int, int]]  # (output-head parameter, vocabulary dim)
    blocks: list[tuple[int, ...]]  # parameters of each repeated block, in order
    stacked: tuple[int, ...]  # parameters a loop slices per step (one block, repeated)
    repeats: int  # how many times the block repeats (layers)
    slots: dict[int, int] = field(default_factory=dict)  # parameter -> its place in a block
    origin: dict[int, int] = field(default_factory=dict)  # value -> the parameter it is
    experts: tuple = ()  # mixture-of-experts layers (``experts.Experts``)

    @property
    def count(self) -> int:
        """How many repeated blocks: a loop's trips over the stacked block, else the blocks."""
        return self.repeats if self.stacked else len(self.blocks)

    def split_dim(self, anatomy, param: int) -> int | None:
        """The dimension Megatron splits: the hidden (heads first) class an up projection of
        ``param`` makes, as a dim of ``param``."""
        dims = anatomy.classes.dims_of(param, len(anatomy.program.values[param].shape))
        for proj in self.projections:
            if proj.param != param or proj.kind != "up":
                continue
            hidden = [c for c in proj.free if c in self.hidden]
            hidden.sort(key=lambda c: self.hidden[c] != "heads")
            for c in hidden:
                if c in dims:
                    return dims.index(c)
        return None


def origins(program, params) -> dict[int, int]:
    """Value -> the parameter it is, through transparent ops and loops' inputs."""
    origin = {p: p for p in params}
    for op in program.ops:
        transparent = traits_of(op.primitive).transparent
        if transparent and op.operands and isinstance(op.operands[0], int):
            p = origin.get(op.operands[0])
            if p is not None:
                for r in op.results:
                    origin[r] = p
        for region, outer in zip(op.regions, region_operands(op)):
            for inner, o in zip(region.inputs, outer):
                if isinstance(o, int) and o in origin:
                    origin[inner] = origin[o]
    return origin


def carried_inputs(op, region_inputs: int) -> range:
    """Positions of a region's inputs that its loop carries from step to step (scan: after
    the constants; while: the last ones, see ``region_operands``); none for a branch."""
    control = traits_of(op.primitive).control
    if control is None:
        return range(0)
    return control.carried(op.params, op.operands, region_inputs)


def region_operands(op) -> list[tuple]:
    """Per region of ``op``, the outer operands its inputs stand for."""
    control = traits_of(op.primitive).control
    if control is None:
        return [()] * len(op.regions)
    return control.region_operands(op.params, op.operands, len(op.regions))


def find_layers(anatomy) -> Layers:
    program, classes = anatomy.program, anatomy.classes
    values, ops = program.values, program.ops
    origin = origins(program, anatomy.parameters)
    # the model dimension: the class the most parameters carry
    carried = Counter(
        c for p in anatomy.parameters for c in set(classes.dims_of(p, len(values[p].shape)))
    )
    model = carried.most_common(1)[0][0] if carried else None
    projections, act_dots, gathers = [], [], []
    first_use: dict[int, int] = {}
    for op in ops:
        if op.phase != "forward":
            continue
        for v in op.operands:
            if isinstance(v, int) and v in origin:
                first_use.setdefault(origin[v], op.id)
        traits = traits_of(op.primitive)
        if traits.lookup and isinstance(op.operands[0], int) and op.operands[0] in origin:
            gathers.append(op)
        if not traits.contraction:
            continue
        (lc, rc), (lb, rb) = op.params["dimension_numbers"]
        sides = [(0, lc, lb), (1, rc, rb)]
        from_param = [
            isinstance(op.operands[s], int) and op.operands[s] in origin for s, _, _ in sides
        ]
        if not any(from_param):
            act_dots.append(op)
            continue
        if all(from_param):
            continue
        s, contract, batch = sides[from_param.index(True)]
        operand = op.operands[s]
        dims = classes.dims_of(operand, len(values[operand].shape))
        contracted = frozenset(dims[d] for d in contract)
        free = tuple(c for d, c in enumerate(dims) if d not in contract and d not in batch)
        kind = "other"
        if model in contracted and any(c != model for c in free):
            kind = "up"
        elif model is not None and model in free and model not in contracted:
            kind = "down"
        projections.append(Projection(op.id, origin[operand], operand, kind, contracted, free))
    experts = find_experts(anatomy, origin, projections, model)
    routing = {o for e in experts for o in (*e.dispatch, *e.combine, *e.routing)}
    act_dots = [op for op in act_dots if op.id not in routing]  # not attention
    routers = {e.router for e in experts}
    made = {c for p in projections if p.kind == "up" for c in p.free if c != model}
    contracted_down = {c for p in projections if p.kind == "down" for c in p.contracted}
    act_batch = set()
    for op in act_dots:
        (_, _), (lb, _) = op.params["dimension_numbers"]
        a = op.operands[0]
        if isinstance(a, int):
            act_batch |= {classes.of(a, d) for d in lb}
    act_batch -= {anatomy.batch_class, anatomy.sequence_class}
    hidden = {c: ("heads" if c in act_batch else "mlp") for c in made & contracted_down}
    attention = _attention(program, anatomy, act_dots, projections, act_batch, hidden)
    for a in attention:
        hidden.setdefault(a.heads, "heads")
    embeddings = []
    for op in gathers:
        table = origin[op.operands[0]]
        dn = op.params["dimension_numbers"]
        tdims = classes.dims_of(op.operands[0], len(values[op.operands[0]].shape))
        pdims = classes.dims_of(table, len(values[table].shape))
        shape = values[op.operands[0]].shape
        looked_up = [  # indexed dims a slice takes less of than the whole (one row: a token)
            d for d in dn.start_index_map if op.params["slice_sizes"][d] < shape[d]
        ]
        for d in looked_up:
            if tdims[d] in pdims and (table, pdims.index(tdims[d])) not in embeddings:
                embeddings.append((table, pdims.index(tdims[d])))
    heads_out = []
    fused_from = {p for a in attention for p in a.fused_from}
    for proj in projections:
        if proj.param in fused_from or proj.param in routers:
            continue
        if proj.kind == "up" and not any(c in hidden for c in proj.free):
            pdims = classes.dims_of(proj.param, len(values[proj.param].shape))
            vocab = [c for c in proj.free if c != model and c in pdims]
            if vocab and (proj.param, pdims.index(vocab[0])) not in heads_out:
                heads_out.append((proj.param, pdims.index(vocab[0])))
    blocks, stacked, repeats, slots = _blocks(program, anatomy, origin, first_use, projections)
    return Layers(
        model,
        projections,
        hidden,
        attention,
        embeddings,
        heads_out,
        blocks,
        stacked,
        repeats,
        slots,
        origin,
        experts,
    )


def downstream(program, start: int, limit: int = 64, phase: str | None = "forward") -> set[int]:
    """Values reached from ``start`` through ops of ``phase`` (any phase for None; bounded),
    dots excluded."""
    seen, frontier = {start}, [start]
    while frontier and len(seen) < limit:
        v = frontier.pop()
        for u in program.users[v]:
            op = program.ops[u]
            if phase not in (None, op.phase) or traits_of(op.primitive).contraction:
                continue
            for r in op.results:
                if r not in seen:
                    seen.add(r)
                    frontier.append(r)
    return seen


def _feeders(program, value, made_by, by_op, limit: int = 32) -> list[Projection]:
    """Up projections whose result reaches ``value`` through forward ops other than dots."""
    found, seen, frontier = [], {value}, [value]
    while frontier and len(seen) < limit:
        v = frontier.pop()
        found += [by_op[o] for o in made_by.get(v, ()) if by_op[o].kind == "up"]
        producer = program.values[v].producer
        if producer is None or v in made_by:
            continue
        op = program.ops[producer]
        if op.phase != "forward" or traits_of(op.primitive).contraction or op.regions:
            continue
        for u in op.operands:
            if isinstance(u, int) and u not in seen:
                seen.add(u)
                frontier.append(u)
    return found


def _attention(program, anatomy, act_dots, projections, act_batch, hidden) -> list[Attention]:
    """Pairs of activation dots sharing a heads class: scores, then context (scores' result
    reaches one of its operands through the softmax; the other is the values)."""
    classes = anatomy.classes
    by_op = {p.op: p for p in projections}
    made_by: dict[int, list[int]] = {}  # value a projection makes -> projection op
    for p in projections:
        for r in program.ops[p.op].results:
            made_by.setdefault(r, []).append(p.op)
    out = []
    used = set()
    for s in act_dots:
        (_, _), (lb, _) = s.params["dimension_numbers"]
        heads = [
            classes.of(s.operands[0], d) for d in lb if classes.of(s.operands[0], d) in act_batch
        ]
        if not heads or s.id in used:
            continue
        reach = downstream(program, s.results[0])
        context = next(
            (c for c in act_dots if c.id not in used and c.id != s.id
             and any(x in reach for x in c.operands)), None
        )  # fmt: skip
        if context is None:
            continue
        used |= {s.id, context.id}
        values = next(x for x in context.operands if x not in reach)
        h = heads[0]

        found = [_feeders(program, x, made_by, by_op) for x in
                 (s.operands[0], s.operands[1], values)]  # fmt: skip
        q, k, v = (tuple(dict.fromkeys(p.param for p in f)) for f in found)
        fused = not any(h in p.free for f in found for p in f)
        if fused:
            q, k, v = (s.operands[0],), (s.operands[1],), (values,)
        output = tuple(
            dict.fromkeys(p.param for p in projections if p.kind == "down" and h in p.contracted)
        )
        fused_from = tuple(dict.fromkeys(p.param for f in found for p in f)) if fused else ()
        out.append(Attention(h, s.id, context.id, q, k, v, output, fused, fused_from))
    return out


def _blocks(program, anatomy, origin, first_use, projections):
    """Repeated blocks: see the module docstring."""
    values = program.values
    kind = {p.param: p.kind for p in projections}
    stacked = tuple(
        p
        for p in anatomy.parameters
        if any(
            values[v].kind == "region_input" and len(values[v].shape) == len(values[p].shape) - 1
            for v, o in origin.items()
            if o == p
        )
    )
    repeats_stacked = values[stacked[0]].shape[0] if stacked else 0
    if stacked:
        return [stacked], stacked, repeats_stacked, {p: i for i, p in enumerate(stacked)}
    ordered = sorted((p for p in anatomy.parameters if p in first_use),
                     key=lambda p: first_use[p])  # fmt: skip
    sig = {p: (values[p].shape, str(values[p].dtype), kind.get(p, "")) for p in ordered}
    counts = Counter(sig.values())
    repeated = Counter(c for c in counts.values() if c > 1)
    if not repeated:
        return [], (), 0, {}
    k = max(repeated, key=lambda c: (repeated[c], c))
    exact = [s for s, c in counts.items() if c == k]
    occurrence: dict[tuple, int] = Counter()
    ends = [0] * k
    for p in ordered:
        s = sig[p]
        if s in exact:
            ends[occurrence[s]] = max(ends[occurrence[s]], first_use[p])
            occurrence[s] += 1
    period = (ends[-1] - ends[0]) / max(k - 1, 1)
    starts = [ends[0] - period, *ends[:-1]]
    blocks: list[list[int]] = [[] for _ in range(k)]
    for p in ordered:
        if counts[sig[p]] < k:
            continue  # fewer than one a layer: not part of the repeated block
        for i in range(k):
            if starts[i] < first_use[p] <= ends[i]:
                blocks[i].append(p)
                break
    slots = {}
    for b in blocks:
        for j, p in enumerate(b):
            slots[p] = j
    if stacked:
        slots.update({p: i for i, p in enumerate(stacked)})
    return [tuple(b) for b in blocks], stacked, (repeats_stacked or k), slots
