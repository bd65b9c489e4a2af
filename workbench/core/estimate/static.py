"""What the simulator knows of a program before any plan: the schedule, the categories of its
values, what fuses, classes of ops priced alike (`Static`, computed once per program); and
`PlannedStep`, one plan of it on a mesh and a hardware spec, which each part of the
simulator (compute, communication, liveness) reads."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.estimate.fusion import (
    FUSIBLE,
    copy_reads,
    folded_values,
    fused_values,
    is_rename,
    recomputed,
    transposed_copies,
)
from workbench.core.estimate.memory import category
from workbench.core.estimate.overlap import made_from_inputs
from workbench.core.hardware.spec import Hardware
from workbench.core.layout.mesh import Mesh


@dataclass(frozen=True)
class Static:
    """What the simulator needs of a program that no tactic changes, computed once."""

    order: tuple  # ops in program order
    position: dict  # op id -> index in ``order``
    categories: tuple  # per value
    fused: frozenset  # values kept inside fused kernels
    folded: frozenset  # matmul results read only by a transpose: written transposed, once
    unbuffered: frozenset  # fused | folded: values the memory model gives no buffer of their own
    in_place: frozenset  # positions of elementwise kernels
    copies: tuple  # (op id, operand indices read through a transposed copy)
    # per ``per_reader``: (values each fused kernel reading them recomputes,
    # (op id, operand index) of each copy -> what the copy reads); see ``fusion``
    fusions: dict
    copy_kept: dict  # (op id, operand index) -> (leading, trailing) dims left in place
    optimizer_ops: tuple  # op ids in the optimizer phase
    # the optimizer's ops in ``order``: (op id, position, tensor operands, results)
    optimizer_steps: tuple
    priced: tuple  # (op id, values of it that may stay fused) for every op without regions
    fusing: dict  # op id -> those values
    alike: dict  # op id -> a class of ops priced alike (see ``_alike``)
    from_inputs: frozenset  # values made from the step's inputs alone (``made_from_inputs``)

    @classmethod
    def of(cls, program) -> Static:
        return program.cache.get("estimate.static", lambda: cls._build(program))

    @classmethod
    def _build(cls, program) -> Static:
        order = tuple(program.walk(schedule(program)))
        outputs = {v for v in program.outputs if isinstance(v, int)}
        fused = fused_values(program, outputs)
        folded = folded_values(program, outputs)
        fusing = {}
        for op in program.ops:
            tensors = [v for v in op.operands if isinstance(v, int)] + list(op.results)
            fusing[op.id] = tuple(dict.fromkeys(v for v in tensors if v in fused))
        copies, kept = transposed_copies(program)
        return cls(
            order=order,
            position={op.id: i for i, op in enumerate(order)},
            categories=tuple(category(program, v.id) for v in program.values),
            fused=frozenset(fused),
            folded=frozenset(folded),
            unbuffered=frozenset(fused | folded),
            in_place=frozenset(i for i, op in enumerate(order) if op.primitive in FUSIBLE),
            copies=tuple(copies),
            fusions={},
            copy_kept=kept,
            optimizer_ops=tuple(op.id for op in program.ops if op.phase == "optimizer"),
            optimizer_steps=tuple(
                (
                    op.id,
                    i,
                    tuple(v for v in op.linked_operands if isinstance(v, int)),
                    op.results,
                )
                for i, op in enumerate(order)
                if op.phase == "optimizer"
            ),
            priced=tuple((op.id, fusing[op.id]) for op in program.ops if not op.regions),
            fusing=fusing,
            alike=_alike(program, fusing),
            from_inputs=made_from_inputs(program),
        )

    def fusion(self, program, per_reader: bool) -> tuple[frozenset, dict]:
        """``(recomputed values, what each transposed copy reads)`` for a compiler that
        does or does not recompute sums in every reader (``Hardware.fuses_per_reader``),
        computed the first time a spec of that kind asks."""
        if per_reader not in self.fusions:
            again = recomputed(program, per_reader)
            self.fusions[per_reader] = (
                again,
                {
                    (o_id, k): copy_reads(program, program.ops[o_id].operands[k], again)
                    for o_id, ks in self.copies
                    for k in ks
                },
            )
        return self.fusions[per_reader]


def schedule(program) -> list[int]:
    """The program's top-level ops in the order a memory-aware scheduler runs them: program
    order, except that each optimizer update (and each rename) runs as soon as what it reads
    is made, so a gradient is consumed, and freed, right after it is computed."""
    body = program.body
    at = {oid: i for i, oid in enumerate(body)}
    made: dict[int, int] = {}  # value -> the top-level op that makes it
    for oid in body:
        for op in program.walk([oid]):
            for v in op.linked_results:
                made[v] = oid
    ready: dict[int, int] = {}  # op id -> the position after which it may run
    for oid in body:
        op = program.ops[oid]
        if op.phase == "optimizer" or is_rename(op):
            sources = [  # a region op's linked operands include its own regions' outputs
                made[v]
                for v in op.linked_operands
                if isinstance(v, int) and v in made and made[v] != oid
            ]
            ready[oid] = max((ready[s] for s in sources), default=-1)
        else:
            ready[oid] = at[oid]
    return sorted(body, key=lambda oid: (ready[oid], ready[oid] != at[oid], at[oid]))


def _alike(program, fusing: dict) -> dict[int, int]:
    """Op id -> a class of ops that cost the same in the same layouts: ops alike
    (``Program.alike``) whose fusible tensors sit in the same places."""
    classes: dict = {}
    out = {}
    for op, c in zip(program.ops, program.alike):
        # which of its tensors may stay fused, by position (``fused`` flags follow them)
        where = tuple(i for i, v in enumerate((*op.operands, *op.results)) if v in fusing[op.id])
        out[op.id] = classes.setdefault((c, where), len(classes))
    return out


class PlannedStep:
    """One plan of a program on a mesh, a state and a hardware spec, with the program's
    `Static` facts: what each part of the simulator reads."""

    def __init__(self, program, mesh: Mesh, state, plan, hardware: Hardware):
        self.program, self.mesh, self.state, self.plan = program, mesh, state, plan
        self.hw = hardware
        self.static = Static.of(program)
