"""Block interiors: the ops of attention and MLP blocks, forward and backward, from dataflow.

Sequence parallelism keeps the residual stream split on the sequence, a block's input
whole (gathered where it is made) and reduce-scatters what a block returns; it needs to
know which ops are *inside* a block. From the anatomy's projections alone:

- forward: the ops on a path from a block's input (what an up projection reads) to its
  down projection's result, both projections included;
- backward: the ops that read a forward interior value or a block's weight, and the ops
  all of whose activations come from the backward interior (so the cotangent of a block's
  input, summed over its projections, is inside; the layer norm before it is not).
"""

from __future__ import annotations

from workbench.core.anatomy.layers import region_operands
from workbench.core.ops import traits as traits_of


def block_interior(anatomy) -> frozenset[int]:
    """Op ids inside attention and MLP blocks (see the module docstring)."""
    program, layers = anatomy.program, anatomy.layers
    values, ops = program.values, program.ops
    ups = [
        p for p in layers.projections if p.kind == "up" and any(c in layers.hidden for c in p.free)
    ]
    downs = [
        p
        for p in layers.projections
        if p.kind == "down" and any(c in layers.hidden for c in p.contracted)
    ]
    weights = {p.param for p in (*ups, *downs)}
    entries = {v for p in ups for v in ops[p.op].operands if isinstance(v, int) and v != p.operand}
    # a weight, or a cast or a loop's slice of one (the layers' origins)
    derived = {v for v, p in layers.origin.items() if p in weights}
    up_weights = {p.param for p in ups}
    up_derived = {v for v in derived if layers.origin[v] in up_weights}
    # forward: ancestors of the down projections, stopping at block inputs and weights
    inside: set[int] = set()
    frontier = [p.op for p in downs]
    while frontier:
        o = frontier.pop()
        if o in inside or ops[o].phase != "forward":
            continue
        inside.add(o)
        for v in ops[o].operands:
            if isinstance(v, int) and v not in entries and v not in derived:
                producer = values[v].producer
                if producer is not None and values[v].kind == "intermediate":
                    frontier.append(producer)
    residuals = {r for o in inside for r in ops[o].results}
    # what the interior computes only for its own backward pass (a tanh's derivative), and
    # constants only the interior reads (a causal mask)
    constant = set()
    for op in ops:
        if op.phase != "forward" or op.regions or op.id in inside:
            continue
        made = [v for v in op.operands if isinstance(v, int) and values[v].kind != "const"]
        if all(v in constant for v in made):
            constant.update(op.results)
        elif all(v in residuals or v in constant for v in made) and any(
            v in residuals for v in made
        ):
            inside.add(op.id)
            residuals.update(op.results)
    for op in reversed(ops):
        if op.phase == "forward" and op.id not in inside and set(op.results) <= constant:
            users = [u for r in op.results for u in program.users[r]]
            if users and all(u in inside for u in users):
                inside.add(op.id)
    for op in ops:  # a loop's stacked residuals and block inputs are those too
        if op.phase == "forward" and op.regions:
            for region in op.regions:
                for inner, outer in zip(region.outputs, op.results):
                    for marks in (residuals, entries):
                        if inner in marks:
                            marks.add(outer)
    # backward: see the module docstring
    exits: set[int] = set()  # the cotangent of a block's input: where the block ends
    flowing: set[int] = set()  # other cotangents inside the block

    def visit(op_ids) -> None:
        for o in op_ids:
            op = ops[o]
            if op.phase != "backward":
                continue
            if op.regions:
                for region, outer in zip(op.regions, region_operands(op)):
                    for inner, v in zip(region.inputs, outer):
                        for marks in (residuals, derived, up_derived, flowing, exits, entries,
                                      constant):  # fmt: skip
                            if v in marks:
                                marks.add(inner)
                    visit(region.ops)
                    for inner, result in zip(region.outputs, op.results):
                        for marks in (flowing, exits):
                            if inner in marks:
                                marks.add(result)
                continue
            reads = [v for v in op.operands if isinstance(v, int) and values[v].kind != "const"]
            made = [
                v
                for v in reads
                if v not in derived and v not in constant and values[v].kind != "input"
            ]
            if any(v in residuals or v in derived for v in reads):
                inside.add(o)
                leaves = traits_of(op.primitive).contraction and any(v in up_derived for v in reads)
                (exits if leaves else flowing).update(op.results)
            elif (
                made
                and any(v in flowing for v in made)
                and all(v in flowing or v in entries or v in residuals for v in made)
            ):
                inside.add(o)
                if not weight_gradient(op):  # a weight's gradient leaves for the update
                    flowing.update(op.results)
            elif traits_of(op.primitive).accumulates and made and all(v in exits for v in made):
                inside.add(o)
                exits.update(op.results)

    def weight_gradient(op) -> bool:
        return traits_of(op.primitive).contraction and not any(
            anatomy.batch_class in anatomy.classes.dims_of(r, len(values[r].shape))
            for r in op.results
        )

    visit(program.body)
    return frozenset(inside)


def crossing(program, inside: frozenset[int]) -> list[int]:
    """Activations made on one side of ``inside`` and read on the other."""
    values = program.values
    out = set()
    for op in program.ops:
        for v in op.operands:
            made = isinstance(v, int) and values[v].kind == "intermediate"
            if made and (op.id in inside) != (values[v].producer in inside):
                out.add(v)
    return sorted(out)


def residual_stream(anatomy, inside: frozenset[int]) -> list[int]:
    """The forward values a block's result is added to outside the blocks (the residual
    sums), less those a block reads itself: a block's input is not the stream's to split."""
    program = anatomy.program
    ops = program.ops
    returned = {r for o in inside if ops[o].phase == "forward" for r in ops[o].results}
    read = set(crossing(program, inside))
    return [
        r
        for op in ops
        if op.phase == "forward" and op.id not in inside and not op.regions
        and any(v in returned for v in op.operands if isinstance(v, int))
        for r in op.results
        if r not in read
    ]  # fmt: skip
