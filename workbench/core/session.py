"""A session: a program, a mesh and the schedule applied so far, as a history of states."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from numbers import Integral

from workbench.core.errors import HistoryError, InputError, closest_names, given
from workbench.core.ir.program import Program
from workbench.core.layout.mesh import Mesh, as_mesh, same_axes
from workbench.core.layout.sharding import Sharding
from workbench.core.layout.state import State
from workbench.core.lowering.arguments import LOWERINGS
from workbench.core.propagate.explain import (
    ConflictReport,
    Diff,
    Event,
    Why,
    diff,
    events,
    report,
    why,
)
from workbench.core.propagate.explain import notes as step_notes
from workbench.core.propagate.tactics import Tactic, TacticInputError, apply_tactic


class StepError(HistoryError, InputError):
    """A step that is not one of the history's: not an integer, negative, or past its end."""


class Session:
    """A mutable handle over immutable states: ``apply`` adds one, ``undo``/``redo`` move along.

    ``apply`` is all-or-nothing: on error it raises a ``WorkbenchError`` and the session is
    exactly as before. A tactic that leaves a value it targets whole says so in its step's
    notes (``notes``); with ``strict`` such a note is an error (``LeftWhole``) instead.
    """

    def __init__(
        self,
        program: Program,
        mesh: Mesh | dict,
        schedule: Iterable[Tactic] = (),
        *,
        strict: bool = False,
    ):
        if not isinstance(program, Program):
            raise InputError(
                f"Session needs a Program, as workbench.capture(fn, *args) makes one; got "
                f"{given(program)}. Write Session(workbench.capture(fn, *args), mesh)."
            )
        if isinstance(schedule, Tactic | str) or not isinstance(schedule, Iterable):
            raise TacticInputError(
                f"a schedule is a list of tactics; got {given(schedule)}. Write e.g. "
                "Session(program, mesh, [BP('batch')]), or apply one: session.apply(tactic)."
            )
        if not isinstance(strict, bool):
            raise InputError(f"strict must be True or False; got {given(strict)}.")
        self.program = program
        self.mesh = as_mesh(mesh)  # a Mesh, {axis: size}, (name, size) pairs or a jax Mesh
        self.strict = strict
        self._states: list[State] = [State.initial(program)]
        self._cursor = 0
        for tactic in schedule:
            self.apply(tactic)

    # -- the history ----------------------------------------------------------------------
    @property
    def state(self) -> State:
        return self._states[self._cursor]

    @property
    def step(self) -> int:
        """How many tactics are applied now (0 = nothing)."""
        return self._cursor

    @property
    def history(self) -> tuple[Tactic, ...]:
        """The schedule applied so far, in order."""
        return self.state.schedule

    @property
    def redo_stack(self) -> tuple[Tactic, ...]:
        return self._states[-1].schedule[self._cursor :]

    def apply(self, tactic: Tactic) -> Session:
        new = apply_tactic(self.program, self.mesh, self.state, tactic, strict=self.strict)
        dropped = self._states[self._cursor + 1 :]
        del self._states[self._cursor + 1 :]
        self._states.append(new)
        self._cursor += 1
        self._forget(dropped)
        return self

    def _forget(self, states) -> None:
        """Drop what the plan, event and estimate caches hold for states no longer in the
        history."""
        for name in ("_plans", "_events", "_estimates"):
            cache = self.__dict__.get(name, {})
            for state in states:
                cache.pop(state, None)

    def undo(self) -> Session:
        if self._cursor == 0:
            raise HistoryError(
                "nothing to undo: no tactic is applied (step 0). Apply one first "
                "(session.apply(tactic)), or redo() one that was undone."
            )
        self._cursor -= 1
        return self

    def redo(self) -> Session:
        if self._cursor + 1 >= len(self._states):
            raise HistoryError(
                f"nothing to redo: no undone tactic follows step {self._cursor}, the last. "
                "undo() first, or apply a new tactic (session.apply(tactic))."
            )
        self._cursor += 1
        return self

    def reset(self) -> Session:
        """Back to no tactics; redo replays the schedule."""
        self._cursor = 0
        return self

    def jump(self, step: int) -> Session:
        """Go to any step of the history (0 = nothing applied)."""
        self._cursor = self._step(step)
        return self

    def state_at(self, step: int) -> State:
        return self._states[self._step(step)]

    def _step(self, step, what: str = "step") -> int:
        """``step`` as an index of the history (numpy ints too), or ``StepError``: a step
        is a whole number from 0 (nothing applied) to the last; negative ones are refused."""
        last = len(self._states) - 1
        number = isinstance(step, Integral) and not isinstance(step, bool)
        if number and 0 <= step <= last:
            return int(step)
        if not number:
            why = "is not a step number"
        elif step < 0:
            why = "is negative: steps count from 0 (nothing applied), not from the end"
        else:
            why = "is past the end of the history"
        raise StepError(
            f"{what} {given(step)} {why}; give a step from 0 to {last} "
            f"(the session is at step {self._cursor})."
        )

    def _value(self, name, what: str):
        """The value named ``name``, or a clear error (``UnknownValueError`` with close names)."""
        if not isinstance(name, str):
            first = self.program.values[0].name if self.program.values else "..."
            raise InputError(
                f"{what} takes a value's name (a str) such as {first!r}; got {given(name)}. "
                "session.program.names() lists them."
            )
        return self.program.value(name)

    # -- queries --------------------------------------------------------------------------
    def sharding(self, name: str) -> Sharding:
        return self.state.shardings[self._value(name, "sharding").id]

    def shardings(self, selector=None) -> dict[str, Sharding]:
        """Name -> sharding, for every value or those ``selector`` matches."""
        from workbench.core.ir.selectors import select

        ids = (
            range(len(self.program.values)) if selector is None else select(self.program, selector)
        )
        return {self.program.values[i].name: self.state.shardings[i] for i in ids}

    def why(self, name: str) -> Why:
        return why(self.program, self.state, self._value(name, "why").id)

    def events(self, step: int | None = None) -> tuple[Event, ...]:
        """How the tactic of ``step`` (default: the current step) propagated, event by event:
        every axis it put on a value (from which value, over which op), pin and conflict."""
        state = self.state if step is None else self._states[self._step(step)]
        cache = self.__dict__.setdefault("_events", {})
        if state not in cache:
            cache[state] = events(self.program, state)
        return cache[state]

    def notes(self, step: int | None = None) -> tuple[str, ...]:
        """What the tactic of ``step`` (default: the current step) could not do: each value
        it targets that it left whole on its axis, and why."""
        step = self._cursor if step is None else self._step(step)
        if step == 0:
            return ()
        return step_notes(self.program, self.state_at(step), step - 1)

    @property
    def conflicts(self) -> list[ConflictReport]:
        return [report(self.program, self.state, c) for c in self.state.conflicts]

    @property
    def changed(self) -> list[str]:
        """Names of the values the last applied tactic changed."""
        return [self.program.values[v].name for v in sorted(self.state.changed)]

    def diff(self, before: int | None = None, after: int | None = None) -> Diff:
        """What changed between two steps (default: the step before this one, and this one)."""
        after = self._cursor if after is None else self._step(after, "after")
        before = max(after - 1, 0) if before is None else self._step(before, "before")
        return diff(self.program, (before, self.state_at(before)), (after, self.state_at(after)))

    # -- the partitioned program ------------------------------------------------------------
    def plan(self, step: int | None = None):
        """The execution plan of the state at ``step`` (default: the current one), cached
        per state."""
        from workbench.core.plan.plan import build_plan

        state = self.state if step is None else self._states[self._step(step)]
        cache = self.__dict__.setdefault("_plans", {})
        if state not in cache:
            cache[state] = build_plan(self.program, self.mesh, state)
        return cache[state]

    def collectives(self):
        """Every collective the partitioned program performs: kind, value, axes, bytes and why
        (a list that displays as a summary: counts and bytes by kind and axes, the largest)."""
        from workbench.core.plan.collective_list import Collectives
        from workbench.core.plan.sends import pipeline_sends

        pipe = self._pipeline()  # a pipeline's sends join the plan's collectives
        sends = pipeline_sends(
            self.program, self.mesh, self.state, pipe, pipe and self._piped() - 1
        )
        return Collectives([*self.plan().collectives, *sends], self.program, self.history)

    def estimate(self, hardware=None, *, overlap="none", step=None, expert_load=None):
        """The simulator's estimate of one step per device on ``hardware`` (default: the host CPU
        preset) at ``step`` (default: the current one), its MoE layers under ``expert_load``
        (None: balanced; see ``estimate/experts.py``). Cached per state, spec, overlap, load."""
        from workbench.core import hardware as presets
        from workbench.core.estimate import check_overlap, estimate, expert_loads, with_load
        from workbench.core.estimate.placements import placed_for
        from workbench.core.estimate.step import joined, placed_twin, repriced

        state = self.state if step is None else self._states[self._step(step)]
        hardware = presets.resolve(hardware)  # None: the CPU preset; a preset's name; a spec
        check_overlap(overlap)
        load = expert_loads(self.program, expert_load)  # checked before any work
        cache = self.__dict__.setdefault("_estimates", {}).setdefault(state, {})
        if (hardware, overlap) not in cache:
            priced, note = placed_for(self.mesh, state.placement, hardware)  # a Place step's
            args = (self.program, self.mesh, state, self.plan(step), priced)
            twin = placed_twin(cache, priced, overlap)  # the same but for its placement
            e = estimate(*args, overlap=overlap) if twin is None else repriced(twin, *args)
            cache[hardware, overlap] = dataclasses.replace(e, note=joined(note, e.note))
        return with_load(cache, (hardware, overlap), load, self, state, step)

    def place(self, placement) -> Session:
        """Fix where the mesh's axes lie on the hardware's levels, as a step of the history
        (a ``Place``; undo takes it back): a `Placement`, or a `Ranked` of ``placements``.
        ``estimate`` prices under it on hardware of its levels (and says where it cannot);
        ``lower`` and ``run`` lay the devices out by it."""
        from workbench.core.strategies.placing import Place

        return self.apply(Place.of(placement))  # an InputError for anything else

    def placements(self, hardware=None, *, overlap="none", limit: int | None = None):
        """Where the mesh's axes may lie on ``hardware``'s levels (which devices form each
        axis's groups), ranked by the simulated step of the current plan, fastest first: a
        list of `Ranked` (placement, estimate), at most ``limit`` priced."""
        from workbench.core.estimate.placements import rank

        return rank(self.mesh, hardware, lambda hw: self.estimate(hw, overlap=overlap), limit)

    def lower(self, kind: str = "explicit", devices=None, donate=(), probes=(), hardware=None):
        """``(jitted fn of the flat inputs, jax Mesh)`` for ``kind`` "explicit", "constrained" or
        "propagated" (XLA propagating from the input shardings alone); ``donate``: indices of
        inputs whose buffers the step may reuse (``jax.jit``'s ``donate_argnums``); ``probes``:
        top-level value ids the function also returns, after the outputs; ``hardware``
        (explicit only): sums over groups spanning its levels run as the programs the
        simulator prices them as, over the mesh split by level (``lowering/reductions.py``)."""
        from workbench.core.lowering import constrained, explicit
        from workbench.core.plan.plan import build_plan

        if kind not in LOWERINGS:
            hint = closest_names(kind, LOWERINGS) if isinstance(kind, str) else []
            raise InputError(
                f"unknown lowering kind={given(kind)}"
                + (f"; did you mean {hint[0]!r}?" if hint else ".")
                + f" Use one of {list(LOWERINGS)}."
            )
        pipeline = self._pipeline()
        if hardware is not None and (kind != "explicit" or pipeline is not None):
            where = f"kind={kind!r}" + (" on a pipelined step" if pipeline else "")
            raise InputError(f"lower(hardware=...) synthesises reductions in the explicit "
                             f"lowering of an unpipelined step, not {where}; leave hardware out.")  # fmt: skip
        if pipeline is not None:
            return self._lower_pipeline(pipeline, kind, devices, probes)
        if kind == "explicit":
            plan = build_plan(self.program, self.mesh, self.state, probes) if probes else None
            return explicit.lower_explicit(
                self.program, self.mesh, self.state, plan or self.plan(), devices, donate, probes,
                hardware,
            )  # fmt: skip
        if kind == "constrained":
            return constrained.lower_constrained(
                self.program, self.mesh, self.state, devices, donate, probes
            )
        if kind == "propagated":
            return constrained.lower_propagated(
                self.program, self.mesh, self.state, devices, donate, probes
            )
        raise AssertionError(kind)  # pragma: no cover - checked above

    def run(
        self,
        *,
        lowering: str = "explicit",
        args=None,
        repeats: int = 5,
        devices=None,
        training_loop: bool = True,
        hardware=None,
    ):
        """Run on the attached devices; outputs checked against the unpartitioned program,
        timed (as a training loop runs the step unless ``training_loop=False``; with
        ``hardware``, reductions across its levels synthesised: `lower`; see
        `workbench.core.lowering.run.run`)."""
        from workbench.core.lowering.run import run

        return run(
            self,
            lowering=lowering,
            args=args,
            repeats=repeats,
            devices=devices,
            training_loop=training_loop,
            hardware=hardware,
        )

    # -- import and export ------------------------------------------------------------------
    @classmethod
    def from_jax(
        cls,
        step,
        *args,
        mesh,
        in_shardings=None,
        out_shardings=None,
        logical_axes=None,
        rules=None,
    ) -> Session:
        """A session of ``step(*args)`` starting from the plan the user already has: jit's
        ``in_shardings``/``out_shardings`` (given here, or those ``step`` was jitted with), Flax
        ``logical_axes`` with their ``rules``, and the ``with_sharding_constraint`` calls in
        the step; each source one ``Imported`` step of the schedule (see ``io.imports``).
        ``mesh``: a ``jax.sharding.Mesh``, a ``Mesh`` or ``{axis: size}``."""
        from workbench.core.io.imports import import_plan

        mesh = as_mesh(mesh)  # a jax Mesh too
        program, schedule = import_plan(
            step,
            args,
            mesh=mesh,
            in_shardings=in_shardings,
            out_shardings=out_shardings,
            logical_axes=logical_axes,
            rules=rules,
        )
        return cls(program, mesh, schedule)

    def specs(self, *, mesh=None, outputs: bool = False):
        """PartitionSpec pytrees mirroring each argument as passed (``outputs``: the outputs'
        pytree), for ``jax.jit(in_shardings=...)``; NamedShardings with a jax ``mesh``."""
        from workbench.core.io.specs import specs

        if not isinstance(outputs, bool):
            raise InputError(f"outputs must be True or False; got {given(outputs)}.")
        if mesh is not None:
            same_axes(mesh, self.mesh, "specs(mesh=...)")
        return specs(self, mesh=mesh, outputs=outputs)

    def logical_rules(self, axes=None):
        """The plan as Flax logical axis rules, over the model's own logical names (``axes``:
        per argument, its logical names tree or None) or the anatomy's (see ``io.specs``)."""
        from workbench.core.io.specs import logical_rules

        tree = self.program.in_tree
        arguments = tree.children() if tree is not None else ()
        if axes is not None and (not isinstance(axes, list | tuple) or len(axes) != len(arguments)):
            raise InputError(
                f"logical_rules takes one entry per argument of the step ({len(arguments)} of "
                f"them): a tree of its logical axis names, or None; got {given(axes)}. Write "
                f"e.g. logical_rules([nnx.get_partition_spec(state), None]), or leave it out."
            )
        return logical_rules(self, axes)

    def export_code(self) -> str:
        """Python that rebuilds this session's schedule (``build(program)`` in the text)."""
        from workbench.core.io.export import export_code

        return export_code(self)

    def export_jax(self, mode: str = "constrained") -> str:
        """A standalone module of plain JAX applying these shardings (no workbench needed);
        ``mode="explicit"``: in JAX's explicit sharding mode; a pipelined step: compiled."""
        from workbench.core.io.export_jax import export_jax
        from workbench.core.io.export_pipeline import export_pipeline

        pipeline = self._pipeline()
        return export_jax(self, mode) if pipeline is None else export_pipeline(self, pipeline, mode)

    def _pipeline(self):
        from workbench.core.strategies.pipeline import pipeline_of

        return pipeline_of(self.program, self.mesh, self.state)

    def _piped(self) -> int:
        """The step that pipelines (the first whose state holds the pipeline)."""
        return next(i for i in range(1, self._cursor + 1) if self._states[i].pipeline)

    def _lower_pipeline(self, pipeline, kind: str, devices, probes):
        """The pipeline lowering (`lowering.pipeline`): explicit, the other axes laid out as
        the state says, and no probes."""
        from workbench.core.lowering.pipeline import lower_pipeline

        step = self._piped()
        if kind != "explicit":
            raise InputError(
                f"lowering={kind!r}: a pipelined step (step {step}, {pipeline.tactic}) lowers "
                "explicitly only, its sends placed by the workbench; use lowering='explicit'."
            )
        if probes:
            raise InputError("a pipelined step's lowering returns no intermediate values")
        p = pipeline
        lowered = lower_pipeline(
            self.program, self.mesh, p.axis, p.cuts, p.schedule, devices, self.state
        )
        return lowered.fn, lowered.mesh

    def save(self, path):
        """Write the schedule as a JSON strategy file (data only)."""
        from workbench.core.io.export import save

        return save(self, path)

    @classmethod
    def load(cls, program: Program, path) -> Session:
        """A session of ``program`` with the mesh and schedule a strategy file holds."""
        from workbench.core.io.export import read

        mesh, tactics = read(path)
        return cls(program, mesh, tactics)

    def __repr__(self) -> str:
        from workbench.core import display as d

        head = f"Session({self.program.name!r}, {self.mesh}, step {self._cursor}/{len(self._states) - 1})"
        body = []
        for i, t in enumerate(self.history):
            body.append(d.clip(f"#{i} {t}"))
            said = step_notes(self.program, self.state, i)
            if said:
                body.append(f"    left whole: {d.clip(said[0], 240)}")
            if len(said) > 1:
                body.append(f"    ... and {len(said) - 1} more left whole (session.notes({i + 1}))")
        if self.state.conflicts:
            body.append(f"{len(self.state.conflicts)} conflicts (session.conflicts)")
        return d.lines(head, body, hint="session.history, session.notes(step)")

    def _repr_html_(self) -> str:
        from workbench.core import display as d

        notes = [step_notes(self.program, self.state, i) for i in range(len(self.history))]
        steps = d.table(
            ("#", "tactic", "left whole"),
            ((i, t, len(n) or "") for i, (t, n) in enumerate(zip(self.history, notes))),
        )
        parts = [
            d.facts(
                [
                    ("program", self.program.summary()),
                    ("mesh", self.mesh),
                    ("step", f"{self._cursor} of {len(self._states) - 1}"),
                    ("conflicts", len(self.state.conflicts)),
                ]
            ),
            steps,
        ]
        said = [(f"#{i}", n) for i, ns in enumerate(notes) for n in ns]
        if said:
            parts.append(d.details(f"{len(said)} left whole", d.table(("tactic", "note"), said)))
        if self.state.conflicts:
            rows = [(c.op, c.axis, c.reason, c.found_by) for c in self.conflicts]
            parts.append(
                d.details(
                    f"{len(rows)} conflicts", d.table(("op", "axis", "why", "found by"), rows)
                )
            )
        return d.panel(f"Session {self.program.name!r}", *parts)
