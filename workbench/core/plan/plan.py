"""The execution plan: how every op runs on each device, and what moves between them.

Walking the program in order, each op gets its layouts (``op_layout.plan_op``); its operands
are fetched into them from the cheapest layout already materialised (a value reduced once
serves every later use), and every fetch is a redistribution whose collectives make up the
plan's collective list. The explicit lowering performs exactly this plan and the simulator
prices it.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

from workbench.core import ops
from workbench.core.gcpause import without_gc
from workbench.core.ir.source_lines import where
from workbench.core.layout.collectives import Collective
from workbench.core.layout.mesh import Mesh
from workbench.core.layout.redistribute import Step, as_layout, cost_bytes, peak_bytes, redistribute
from workbench.core.layout.sharding import Sharding
from workbench.core.layout.state import State
from workbench.core.plan import rings, zigzag
from workbench.core.plan.op_layout import laid_out, plan_op
from workbench.core.plan.records import Fetch, OpPlan, Plan
from workbench.core.propagate.propagation import op_index

__all__ = ["Fetch", "OpPlan", "Plan", "Planner", "build_plan", "code_of", "collective_why"]


class Planner:
    """Walks the program in order, choosing layouts and fetches exactly as the lowering runs."""

    def __init__(self, program, mesh: Mesh, state: State):
        self.program, self.mesh, self.state = program, mesh, state
        self.index = op_index(program)
        self.scopes: list[list[int]] = []  # per open scope, the values given layouts in it
        # value -> layout (no tactic pins) -> (scope depth, the fetch that reads it as it is,
        # the phase that gathered it or None)
        self.versions: dict[int, dict[Sharding, tuple[int, Fetch, str | None]]] = {}
        self.copies: dict[tuple[int, Sharding], int] = {}  # (value, layout) -> copies made
        self.ops: list[OpPlan | None] = [None] * len(program.ops)
        self.collectives: list[Collective] = []
        self.redistributed: set[int] = set()
        self.repeat = 1
        self.rings, self.skipped, self.notes = rings.rings(program, mesh, state, self.index)

    def add(self, v: int, layout: Sharding, gathered_in: str | None = None) -> int:
        """Make ``layout`` of ``v`` available; returns its copy number."""
        layout = as_layout(layout)
        key = (v, layout)
        copy = self.copies[key] = self.copies.get(key, -1) + 1
        self.versions.setdefault(v, {})[layout] = (
            len(self.scopes),
            Fetch(v, layout, layout, (), copy, copy),
            gathered_in,
        )
        self.scopes[-1].append(v)
        return copy

    def open_scope(self) -> None:
        self.scopes.append([])

    def close_scope(self) -> None:
        depth = len(self.scopes)
        for v in set(self.scopes.pop()):
            kept = {k: entry for k, entry in self.versions[v].items() if entry[0] < depth}
            if kept:
                self.versions[v] = kept
            else:
                del self.versions[v]

    def fetch(self, v, dst: Sharding | None, consumer: int | None) -> Fetch | None:
        """Bring ``v`` into ``dst`` for ``consumer`` from the cheapest layout available to it.

        A layout gathered in one phase (forward, backward, update) serves that phase only:
        the next gathers it again rather than hold it in between, as FSDP and Megatron's
        sequence parallelism do (and as a loop does: each pass over the layers gathers its
        own). So the gathered weights of a layer are not all live at the turn of the step.
        A value gathered into the layout the state decided for it (made split, kept whole)
        is that value: it serves every phase.
        """
        if dst is None or not isinstance(v, int):
            return None
        versions = self.versions.get(v)
        if not versions:
            raise AssertionError(f"value {self.program.values[v].name} used before it is defined")
        phase = None if consumer is None else self.program.ops[consumer].phase
        dst = as_layout(dst)
        hit = versions.get(dst)
        if hit is not None and (hit[2] is None or phase is None or hit[2] == phase):
            return hit[1]
        best = None
        for s, (_, held, gathered_in) in versions.items():
            if gathered_in is not None and phase is not None and gathered_in != phase:
                continue
            steps = redistribute(s, dst, self.mesh)
            cost = (cost_bytes(steps), peak_bytes(steps, s, self.mesh), len(steps))
            if best is None or cost < best[0]:
                best = (cost, s, steps, held.copy)
        _, src, steps, src_copy = best
        gathers = any(st.kind == "all-gather" for st in steps)
        own = dst == as_layout(self.state.shardings[v])  # the state's layout serves every phase
        copy = self.add(v, dst, phase if gathers and not own else None)
        if steps:
            self.redistributed.add(v)
        self.record(v, steps, consumer)
        return Fetch(v, src, dst, steps, copy, src_copy)

    def record(self, v: int, steps, consumer: int | None) -> None:
        source = library = ""
        if any(step.is_collective for step in steps):
            source, library = code_of(self.program, v, consumer)
        for i, step in enumerate(steps):
            if step.is_collective:
                tactic = self.tactic_for(v, step.axes, consumer)
                self.collectives.append(
                    Collective(
                        kind=step.kind,
                        value=v,
                        axes=step.axes,
                        bytes=step.bytes,
                        op=consumer,
                        tactic=tactic,
                        src=step.before,
                        dst=step.after,
                        dim=step.dim,
                        dim_from=step.dim_from,
                        reduction=step.reduction,
                        why=collective_why(self.program, step, v, consumer, (source, library)),
                        count=self.repeat,
                        step=i,
                        source=source,
                        library=library,
                    )
                )

    def tactic_for(self, v: int, axes, consumer: int | None) -> int | None:
        prov = self.state.provenance
        for axis in axes:
            if (v, axis) in prov:
                return prov[(v, axis)].tactic
        if consumer is not None:
            for r in self.program.ops[consumer].results:
                for axis in axes:
                    if (r, axis) in prov:
                        return prov[(r, axis)].tactic
        return None

    def run(self, probes=()) -> Plan:
        p = self.program
        self.open_scope()
        for v in p.inputs:
            self.add(v, self.state.shardings[v])
        for v in p.consts:
            if p.values[v].region_of is None:
                self.add(v, p.values[v].type_sharding())
        self.walk(p.body)
        outputs = tuple(
            self.fetch(v, laid_out(self.state.shardings[v], self.state.shardings[v].dims), None)
            if isinstance(v, int)
            else None
            for v in p.outputs
        )
        probed = tuple(
            self.fetch(v, laid_out(self.state.shardings[v], self.state.shardings[v].dims), None)
            for v in probes
        )
        plan = Plan(
            tuple(self.ops),
            outputs,
            tuple(self.collectives),
            frozenset(self.redistributed),
            probed,
            MappingProxyType(self.rings),
            self.skipped,
            self.notes,
        )
        z, why = zigzag.balance(p, self.mesh, self.state, plan)
        if z is None:
            return plan if why is None else dataclasses.replace(plan, notes=(*plan.notes, why))
        moves = zigzag.transfers(p, self.mesh, self.state, plan, z)
        moves += zigzag.agreements(p, plan, z)
        rerun = tuple(
            dataclasses.replace(
                c, why=f"{c.why}; only where a row sees no key, when the ring runs every pair again"
            )
            for ring in plan.rings.values()
            for c in rings.transfers(p, self.mesh, ring, 1, None)
        )
        return dataclasses.replace(
            plan, zigzag=z, collectives=(*plan.collectives, *moves), fallback=rerun
        )

    def ring(self, ring) -> None:
        """One pass of a ring attention: its reads fetched, its transfers listed, what it
        makes added in its layouts."""
        reads = tuple(self.fetch(v, lay, ring.at) for v, lay in ring.reads)
        self.rings[ring.at] = dataclasses.replace(ring, fetches=reads)
        tactic = self.tactic_for(ring.evaluated.keys, (ring.axis,), ring.evaluated.scores)
        self.collectives += rings.transfers(self.program, self.mesh, ring, self.repeat, tactic)
        for v, lay in ring.makes:
            self.add(v, lay)

    def walk(self, op_ids) -> None:
        p = self.program
        for o in op_ids:
            op = p.ops[o]
            ix = self.index[o]
            fa, contracted, passed, operands, results = plan_op(p, self.mesh, self.state, op, ix)
            if o in self.skipped:  # laid out for the simulator's compute; a ring runs it
                ring = self.rings.get(o)
                if ring is not None:
                    self.ring(ring)
                fetches = (None,) * len(op.operands)
                self.ops[o] = OpPlan(
                    o, fa, contracted, passed, operands, results, fetches, self.repeat
                )
                continue
            n_outer = len(op.operands)
            fetches = [self.fetch(v, operands[t], o) for t, v in enumerate(op.operands)]
            n_res = len(op.results)
            region_in = n_res
            region_out = n_outer
            control = ops.traits(op.primitive).control
            for region in op.regions:
                saved = self.repeat
                self.repeat *= control.trips(op.params)
                self.open_scope()
                for k, v in enumerate(region.inputs):
                    self.add(v, results[region_in + k])
                for v in p.consts:
                    if p.values[v].region_of == o:
                        self.add(v, p.values[v].type_sharding())
                self.walk(region.ops)
                for k, v in enumerate(region.outputs):
                    fetches.append(self.fetch(v, operands[region_out + k], o))
                self.close_scope()
                self.repeat = saved
                region_in += len(region.inputs)
                region_out += len(region.outputs)
            for j, v in enumerate(op.results):
                self.add(v, results[j])
            self.ops[o] = OpPlan(
                o, fa, contracted, passed, operands, results, tuple(fetches), self.repeat
            )


@without_gc
def build_plan(program, mesh: Mesh, state: State, probes=()) -> Plan:
    """The execution plan of ``state`` (see module doc). ``probes``: top-level values the
    program also returns, after its outputs, in their decided layouts with pending
    reductions done (a run's verdict reads them to find where two runs part)."""
    return Planner(program, mesh, state).run(tuple(probes))


def code_of(program, v: int, consumer: int | None) -> tuple[str, str]:
    """The user's line and the library's that a fetch of ``v`` for ``consumer`` comes from:
    the consumer's, else (a program output, an op with no line) those of the op that made
    ``v`` (a loop's region input: the loop's)."""
    ops = program.ops
    if consumer is not None and ops[consumer].source:
        return ops[consumer].source, ops[consumer].library
    producer = program.values[v].producer
    if producer is not None:
        return ops[producer].source, ops[producer].library
    return "", ""


def collective_why(
    program, step: Step, v: int, consumer: int | None, code: tuple[str, str] = ("", "")
) -> str:
    """One sentence saying why a collective is there; ``code``: the user's line and the
    library's it comes from (``code_of``), named at its end."""
    text = _why(program, step, v, consumer)
    at = where(*code)
    return f"{text} (at {at})" if at else text


def _why(program, step: Step, v: int, consumer: int | None) -> str:
    name = program.values[v].name
    who = program.ops[consumer].name if consumer is not None else "the program's output"
    axes = ",".join(step.axes)
    if step.kind == "all-reduce":
        return f"{name} is a pending {step.reduction} over {axes}; {who} needs it whole"
    if step.kind == "reduce-scatter":
        return (
            f"{name} is a pending sum over {axes}; {who} needs it tiled on dim {step.dim}, "
            "so it is reduced and scattered at once"
        )
    if step.kind == "all-gather":
        return f"{name} is tiled on dim {step.dim} over {axes}; {who} needs that dim whole"
    if step.kind == "all-to-all":
        return (
            f"{who} needs {name} split on dim {step.dim} over {axes} instead of dim {step.dim_from}"
        )
    return f"{who} needs the axes of dim {step.dim} of {name} in the order {','.join(step.order or ())}"
