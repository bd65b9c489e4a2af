"""How a training step's update is laid out: the chains of ops that update each parameter,
and which outputs the step returns in an argument's place (a training loop feeds them
back). Read from structure: the optimizer phase's elementwise ops and the pytrees."""

from __future__ import annotations

from workbench.core.anatomy.dims import UnionFind


def update_chains(program) -> UnionFind:
    """Values joined by the optimizer's elementwise ops and by loops' and branches' carries
    (same shape, rank >= 1): each parameter's update chain."""
    uf = UnionFind(len(program.values))
    for op, m in zip(program.ops, program.mappings):
        if op.phase != "optimizer":
            continue
        if op.regions:  # a branch or loop of the update: its inputs and outputs line up
            for region in op.regions:
                _join_same_shape(program, uf, op.operands[-len(region.inputs) :], region.inputs)
                _join_same_shape(program, uf, region.outputs, op.results[: len(region.outputs)])
            continue
        tensors = [
            (t, d)
            for t, d in zip((*op.linked_operands, *op.linked_results), (*m.operands, *m.results))
            if isinstance(t, int) and program.values[t].shape
        ]
        if len(tensors) < 2 or m.contracting or len({d for _, d in tensors}) != 1:
            continue
        for t, _ in tensors[1:]:
            uf.union(tensors[0][0], t)
    return uf


def _join_same_shape(program, uf, a, b) -> None:
    for x, y in zip(a, b):
        if isinstance(x, int) and isinstance(y, int):
            vx, vy = program.values[x], program.values[y]
            if vx.shape and vx.shape == vy.shape:
                uf.union(x, y)


def tree_pairs(program) -> dict[int, int]:
    """Output -> input, where the step returns a pytree shaped exactly like an argument (same
    structure, shapes and dtypes): a training loop feeds those outputs back in their place."""
    if program.in_tree is None or program.out_tree is None:
        return {}
    values = program.values

    def pieces(tree, leaves):
        out, start = [], 0
        children = tree.children() if tree.num_nodes > 1 else [tree]
        for child in children:
            n = child.num_leaves
            out.append((child, leaves[start : start + n]))
            start += n
        return out

    ins = pieces(program.in_tree, list(program.inputs))  # one piece per argument
    outs = pieces(program.out_tree, list(program.outputs))

    def kinds(leaves):
        return [(values[v].shape, values[v].dtype) if isinstance(v, int) else None for v in leaves]

    out: dict[int, int] = {}
    used: set[int] = set()
    for otree, oleaves in outs:
        for k, (itree, ileaves) in enumerate(ins):
            if k in used or otree != itree or kinds(oleaves) != kinds(ileaves):
                continue
            used.add(k)
            for o, i in zip(oleaves, ileaves):
                if isinstance(o, int) and o not in out:
                    out[o] = i
            break
    return out
