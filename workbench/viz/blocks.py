"""Which box each op is drawn in when the graph folds by the anatomy's blocks and phases.

Names and scopes play no part: a model without a single ``named_scope`` folds the same.
From the anatomy's repeated blocks (``anatomy.layers.blocks``: the parameters of each
layer), every top-level op gets a *layer*, by dataflow in one pass over the program:

- a forward op belongs to the deepest layer whose parameters reach it (the largest
  layer among its operands'), ``pre`` if none does (embeddings, masks); an op that
  mixes the last layer's output with a parameter of no layer starts ``post`` (the
  final norm's scale, the output head), and what it feeds stays there;
- a backward op belongs to the largest layer among the forward values it reads
  (residuals, weights); one that reads only cotangents to the largest of theirs; one
  that reads neither (the loss's seed) to ``post``;
- an update belongs to the largest layer among what it reads (a weight and its
  gradient), ``pre`` if none (a step counter).

The boxes nest: a phase folds into one box; an open phase shows ``pre``, the repeated
block folded into one box that says its count (``layers 0–79 ×80``), and ``post``; an
open repeated block shows one box per layer; an open box draws its ops one by one.
Keys name what is open: ``"backward"``, ``"forward/layers"``, ``"forward/layer3"``,
``"forward/pre"``. A layer opened while its repeated block is folded is drawn op by op
beside the folded rest (``layers 1–79 ×79``): one block seen in full, with its count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from itertools import pairwise

from workbench.core.gcpause import without_gc
from workbench.core.ir.program import Program
from workbench.viz.collapse import PHASES, Group, Nodes, _root_and_regions

PRE, POST = -1, 10**9  # layer labels before the first block and after the last


@without_gc
def op_layers(program: Program) -> dict[int, int]:
    """Top-level op id -> its layer (``PRE``, 0.., ``POST``); see the module docstring."""
    anatomy = program.anatomy()
    blocks = anatomy.layers.blocks
    ops = [program.ops[o] for o in program.body]
    reads = {op.id: [v for v in op.operands if isinstance(v, int)] for op in ops}
    weight: dict[int, int] = {}  # value -> its block, for a block's parameters and their casts
    for k, params in enumerate(blocks):
        weight.update(dict.fromkeys(params, k))
    free = {p for p in anatomy.parameters if p not in weight}  # parameters of no block
    forward = [op for op in ops if op.phase == "forward"]
    core: dict[int, int] = {}  # value -> the block of the op making it, if it read a weight
    ahead: dict[int, int] = {}  # value -> the deepest block among its ancestors
    tail: set[int] = set()  # values past the last block: they mix its output with a free one
    last = len(blocks) - 1
    layer: dict[int, int] = {}
    for op in forward:
        rs = reads[op.id]
        ws = {weight[v] for v in rs if v in weight}
        if rs and all(v in weight for v in rs) and len(ws) == 1:
            weight.update(dict.fromkeys(op.results, ws.pop()))  # a cast of a weight
            layer[op.id] = weight[op.results[0]]
            continue
        if rs and all(v in free for v in rs):
            free.update(op.results)
        a = max((ahead[v] for v in rs if v in ahead), default=PRE)
        if any(v in tail for v in rs) or (a == last >= 0 and any(v in free for v in rs)):
            tail.update(op.results)
        if ws:
            layer[op.id] = max(ws)
            core.update(dict.fromkeys(op.results, max(ws)))
        elif any(v in core for v in rs):
            layer[op.id] = max(core[v] for v in rs if v in core)
        elif a == PRE and any(v in free for v in rs):
            layer[op.id] = PRE
        ahead.update(dict.fromkeys(op.results, max(a, *ws) if ws else a))
    # the rest: the first block their results reach (``POST`` past the last, ``PRE`` if none)
    decided = set(layer)
    below: dict[int, int] = {}  # value -> the first block that reads what it feeds
    users_of = program.users
    for op in reversed(forward):
        k = layer.get(op.id)
        anchor = k == PRE  # read a parameter of no block before any block: it holds its inputs
        d = min((below[r] for r in op.results if r in below), default=None)
        if k is None:
            a = max((ahead[v] for v in reads[op.id] if v in ahead), default=PRE)
            if d is not None:
                k = d
            elif any(r in tail for r in op.results):
                k = POST
            elif a > PRE:
                k = a
            else:  # a constant: with what reads it
                users = [layer[u] for r in op.results for u in users_of[r] if u in layer]
                k = min(users, default=PRE)
            layer[op.id] = k
        first = k if anchor or any(v in weight for v in reads[op.id]) else d
        for v in reads[op.id]:
            if first is not None:
                below[v] = min(below.get(v, first), first)
    made = {v: layer[op.id] for op in forward for v in op.results}
    for op in forward:  # reaching no block (read by the backward pass only): with what it reads
        if layer[op.id] == PRE and op.id not in decided:
            layer[op.id] = max((made[v] for v in reads[op.id] if v in made), default=PRE)
            made.update(dict.fromkeys(op.results, layer[op.id]))
    label = {v: layer[op.id] for op in forward for v in op.results}
    label.update(weight)
    cotangent: dict[int, int] = {}
    for op in ops:
        rs = reads[op.id]
        if op.phase == "forward":
            continue
        if op.phase == "backward":
            known = [label[v] for v in rs if v in label]
            cot = [cotangent[v] for v in rs if v in cotangent]
            k = max(known) if known else max(cot, default=POST)
            cotangent.update(dict.fromkeys(op.results, k))
        else:
            k = max((label.get(v, cotangent.get(v, PRE)) for v in rs), default=PRE)
            label.update(dict.fromkeys(op.results, k))
        layer[op.id] = k
    return layer


def repeats(program: Program) -> int:
    """How many layers the repeated block stands for (a loop's trip count if it is one)."""
    layers = program.anatomy().layers
    return len(layers.blocks) if len(layers.blocks) > 1 else max(layers.repeats, 1)


def layer_text(k: int) -> str:
    return {PRE: "pre", POST: "post"}.get(k, f"layer{k}")


def _range_text(ks: list[int], n_blocks: int, total: int) -> str:
    """``layers 0–79 ×80``; ``layers ×80`` for one block a loop repeats; ``layer 3``."""
    if n_blocks <= 1:
        return f"layers ×{total}" if total > 1 else "layer"
    if len(ks) == 1:
        return f"layer {ks[0]}"
    return f"layers {ks[0]}–{ks[-1]} ×{len(ks)}"


def assign_blocks(
    program: Program,
    *,
    phases: Iterable[str] = PHASES,
    expand: Iterable[str] = ("forward",),
    layers: dict[int, int] | None = None,
) -> Nodes:
    """Which node every op is drawn as, folded by phase and block and opened at ``expand``
    (keys as in the module docstring). Groups carry their key in ``Group.key``. ``layers``:
    ``op_layers(program)`` if the caller keeps it (it costs a pass over the program)."""
    phases = tuple(phases)
    open_ = set(expand)
    root, region_index, order = _root_and_regions(program)
    layer = op_layers(program) if layers is None else layers
    n_blocks = len(program.anatomy().layers.blocks)
    total = repeats(program)
    groups: dict[str, Group] = {}
    node_of: list[str | None] = [None] * len(program.ops)
    cluster_of: dict[int, tuple[str, str]] = {}

    def group(key: str, phase: str, title: tuple[str, ...]) -> Group:
        if key not in groups:
            groups[key] = Group(f"g{len(groups)}", phase, title, key=key)
        return groups[key]

    for oid in program.body:
        op = program.ops[oid]
        if op.phase not in phases:
            continue
        ph = op.phase
        if ph not in open_:
            g = group(ph, ph, (ph,))
        else:
            k = layer[oid] if n_blocks else PRE
            sub = f"{ph}/{layer_text(k)}"
            title = {PRE: "before the layers", POST: "after the layers"}.get(k, f"layer {k}")
            if not n_blocks:
                title = ph
            if sub in open_:
                node_of[oid] = f"op{oid}"
                cluster_of[oid] = (sub, title)
                continue
            if k in (PRE, POST) or f"{ph}/layers" in open_:
                g = group(sub, ph, (title,))
            else:
                g = group(f"{ph}/layers", ph, ("layers",))
        g.roots.append(oid)
        node_of[oid] = g.node
    # the folded repeated block says which layers it holds and how many
    for key, g in groups.items():
        if key.endswith("/layers"):
            ks = sorted({layer[r] for r in g.roots})
            g.scope = (_range_text(ks, n_blocks, total),)
    drawn = []
    for op in order:
        r = root[op.id]
        node = node_of[r]
        if node is None:
            continue
        if node == f"op{r}":
            node_of[op.id] = f"op{op.id}"
            drawn.append(op.id)
        else:
            node_of[op.id] = node
    by_node = {g.node: g for g in groups.values()}
    for op in order:
        node = node_of[op.id]
        if node in by_node:
            by_node[node].ops.append(op.id)
    return Nodes(None, node_of, drawn, by_node, root, region_index, cluster_of)


def block_keys(program: Program, phases: Iterable[str] = PHASES) -> dict[str, str]:
    """Every key that opens something, with what it opens (for a menu or a test)."""
    keys = {}
    n_blocks = len(program.anatomy().layers.blocks)
    for ph in phases:
        keys[ph] = f"the {ph} phase"
        keys[f"{ph}/pre"] = f"{ph}: before the layers"
        if n_blocks:
            keys[f"{ph}/layers"] = f"{ph}: one box per layer"
            keys[f"{ph}/post"] = f"{ph}: after the layers"
            keys.update({f"{ph}/layer{k}": f"{ph}: layer {k}" for k in range(n_blocks)})
    return keys


def default_expand(program: Program) -> tuple[str, ...]:
    """What opens first: the forward phase, with its first layer drawn op by op beside the
    folded rest (or, with no repeated blocks, the forward ops one by one)."""
    if program.anatomy().layers.blocks:
        return ("forward", "forward/layer0")
    return ("forward", "forward/pre")


ROLE_TITLES = {
    "parameter": "parameters",
    "optimizer_state": "optimizer state",
    "gradient": "gradients",
    "data": "data",
    "key": "random keys",
}


def io_groups(program: Program, nodes: Nodes, items: list[int], kind: str, budget: int) -> list:
    """The title of the node each input (``kind="in"``, value ids) or output (``"out"``,
    output indices) is drawn in when folding by blocks: None for one drawn by itself (an
    op reading or making it is drawn one by one), else its role's group (``parameters``,
    ``optimizer state``, ``data``; an output by the role it is returned in), split by layer
    (``layer 3 parameters``) where a box of that layer alone reads or makes it. The anatomy
    decides, never a name; a group of one is drawn by itself, and past ``budget`` nodes the
    layers (then the values drawn by themselves) join their role's group."""
    anatomy = program.anatomy()
    owner: dict[int, int] = {}  # value -> the parameter it belongs to
    for p in anatomy.parameters:
        owner[p] = p
        owner.update((v, p) for v in (*anatomy.state.get(p, ()), *anatomy.updates.get(p, ())))
        for found in (anatomy.new_params, anatomy.gradients):
            if p in found:
                owner[found[p]] = p
    block = {p: k for k, params in enumerate(anatomy.layers.blocks) for p in params}
    key_of = {g.node: g.key for g in nodes.groups.values()}
    alone, layered, coarse = [], [], []
    for item in items:
        v = item if kind == "in" else program.outputs[item]
        if kind == "in":
            touching = program.users[v]
        else:
            producer = program.values[v].producer
            touching = () if producer is None else (producer,)
        role = anatomy.role_of(v)
        title = ROLE_TITLES.get(role, "other inputs" if kind == "in" else "other outputs")
        k = block.get(owner.get(v))
        mine = f"/layer{k}"
        alone.append(any(nodes.is_drawn(o) for o in touching))
        own = k is not None and any(
            key_of.get(nodes.node_of[o], "").endswith(mine) for o in touching
        )
        layered.append(f"layer {k} {title}" if own else title)
        coarse.append(title)
    for split, by_itself in ((True, True), (False, True), (False, False)):
        titles = [
            None if by_itself and a else lay if split else c
            for a, lay, c in zip(alone, layered, coarse)
        ]
        size = Counter(titles)
        titles = [None if size[t] == 1 else t for t in titles]
        if len(set(titles) - {None}) + titles.count(None) <= budget:
            break
    return titles


def reading_order(program: Program, nodes: Nodes) -> list[tuple[str, str]]:
    """Pairs of nodes to join with invisible edges so the folded program reads top to
    bottom: each open phase's boxes in order (before the layers, the layers, after them);
    each folded phase a rank below the previous phase's first node (the edges that would
    place it are left out, see ``graph.py``), and the last phase also below the first
    phase's last box: the backward box beside the layers, the optimizer's below them."""
    by_key = {g.key: g.node for g in nodes.groups.values() if g.key}
    first: dict[str, str] = {}
    for o in nodes.drawn:
        first.setdefault(program.ops[nodes.root[o]].phase, f"op{o}")
    pairs, previous, last = [], None, None
    for ph in PHASES:
        if ph in by_key:
            chain = [by_key[ph]]
            if previous is not None:
                pairs.append((previous, by_key[ph]))
            if ph == PHASES[-1] and last is not None:
                pairs.append((last, by_key[ph]))
        else:
            ks = sorted(int(k[len(ph) + 6 :]) for k in by_key if k[len(ph) + 6 :].isdigit())
            keys = (f"{ph}/pre", f"{ph}/layers", *(f"{ph}/layer{k}" for k in ks), f"{ph}/post")
            chain = [by_key[k] for k in keys if k in by_key]
            pairs += pairwise(chain)
        previous = chain[0] if chain else first.get(ph, previous)
        if ph == PHASES[0] and chain:
            last = chain[-1]
    return pairs
