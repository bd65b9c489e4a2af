"""Pipeline parallelism: ``PP`` runs the step's repeated blocks as stages over one mesh axis.

``PP(axis, microbatches=M, schedule=...)`` tiles nothing: it cuts the step into as many
stages as ``axis`` has devices (`anatomy.stages.stage_cuts`: the repeated blocks balanced
by FLOPs, what precedes the first block on the first stage, the head and loss on the last),
splits the batch into M microbatches and orders each stage's work by a schedule table
(`plan.schedule`). With ``virtual_stages=v`` ("interleaved") the step is cut into S*v
virtual stages and stage s runs chunks c = 0..v-1, virtual stage c*S + s. The other axes keep their SPMD layouts; the stage axis carries no tile
(`reserves_axis`: a later tactic on it is refused). `pipeline_of(program, mesh, state)`
reads the pipeline a state's schedule holds, resolved and checked, for the simulator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral

from workbench.core.anatomy.stages import Stage, StageCuts, stage_cuts
from workbench.core.errors import InputError, TacticError, closest_names, given
from workbench.core.plan.schedule import SCHEDULES, Schedule, schedule
from workbench.core.propagate.tactics import Tactic, TacticInputError, _check_axis, check_axis_name
from workbench.core.strategies.named import register

#: Microbatches per stage a pipeline runs when not told: the bubble share (S-1)/(M+S-1)
#: stays under a fifth at M = 4S.
MICROBATCHES_PER_STAGE = 4


@dataclass(frozen=True, slots=True)
class Pipeline:
    """A state's pipeline, resolved: its stage axis, stage cuts, microbatches and schedule
    table; ``batch``: the batch the microbatches split."""

    tactic: PP
    axis: str
    stages: int
    microbatches: int
    batch: int
    schedule: Schedule
    cuts: StageCuts

    @property
    def virtual_stages(self) -> int:
        """Model chunks per stage (``cuts`` holds ``stages * virtual_stages`` stages)."""
        return self.schedule.virtual_stages

    def chunks(self, stage: int) -> tuple[Stage, ...]:
        """The virtual stages (cuts) stage ``stage`` runs, chunk 0 first."""
        S = self.stages
        return tuple(self.cuts.stages[c * S + stage] for c in range(self.virtual_stages))

    def __str__(self) -> str:
        def span(s: Stage) -> str:
            return f"{s.blocks[0]}-{s.blocks[-1]}" if len(s.blocks) > 1 else f"{s.blocks[0]}"

        blocks = " | ".join("+".join(span(c) for c in self.chunks(s)) for s in range(self.stages))
        v = self.virtual_stages
        return (
            f"pipeline over {self.axis!r}: {self.stages} stages (blocks {blocks}), "
            f"{self.microbatches} microbatches of {self.batch // self.microbatches}, "
            + (f"{v} chunks per stage, " if v > 1 else "")
            + f"{self.schedule.kind} schedule"
        )


@register()
@dataclass(frozen=True, slots=True)
class PP(Tactic):
    """Pipeline parallelism over ``axis``: one stage per device along it, the batch split
    into ``microbatches`` (default: the smallest divisor of each device's share of the batch
    >= 4 x stages, else that share), run
    in the order ``schedule`` gives ("gpipe", "1f1b", "zero-bubble", or "interleaved" with
    ``virtual_stages`` >= 2 model chunks per stage; see `plan.schedule`). ``stages``: the
    block indices where stages (virtual stages: S*v - 1 of them) 1, 2, ... start (default:
    balanced by FLOPs). Tiles nothing; the other axes keep their layouts."""

    axis: str
    microbatches: int | None = None
    schedule: str = "1f1b"
    stages: Sequence[int] | None = None
    virtual_stages: int = 1

    reserves_axis = True  # no other tactic may tile on a pipeline's stage axis

    def __post_init__(self):
        check_axis_name(self)
        m = self.microbatches
        if m is not None and (isinstance(m, bool) or not isinstance(m, Integral) or m < 1):
            raise TacticInputError(
                f"{self}: microbatches must be a whole number >= 1 (or None: 4 per stage); "
                f"got {given(m)}."
            )
        if not isinstance(self.schedule, str) or self.schedule not in SCHEDULES:
            hint = closest_names(str(self.schedule), SCHEDULES)
            raise TacticInputError(
                f"{self}: schedule={given(self.schedule)} is not a pipeline schedule"
                + (f"; did you mean {hint[0]!r}?" if hint else ".")
                + f" Use one of {list(SCHEDULES)}."
            )
        v = self.virtual_stages
        if isinstance(v, bool) or not isinstance(v, Integral) or v < 1:
            raise TacticInputError(
                f"{self}: virtual_stages must be a whole number >= 1; got {given(v)}."
            )
        if self.stages is not None:
            cuts = self.stages
            if (
                isinstance(cuts, str | bytes)
                or not isinstance(cuts, Sequence)
                or any(isinstance(k, bool) or not isinstance(k, Integral) for k in cuts)
            ):
                cuts = None
            if cuts is None:
                raise TacticInputError(
                    f"{self}: stages must be the block indices where stages 1, 2, ... start, "
                    f"e.g. stages=[2, 4, 6] for 4 stages of 8 blocks; got {given(self.stages)}."
                )
            object.__setattr__(self, "stages", tuple(int(k) for k in cuts))

    def __str__(self) -> str:
        text = f"PP({self.axis!r}"
        if self.microbatches is not None:
            text += f", microbatches={self.microbatches!r}"
        if self.schedule != "1f1b":
            text += f", schedule={self.schedule!r}"
        if self.stages is not None:
            text += (
                f", stages={list(self.stages) if isinstance(self.stages, tuple) else self.stages!r}"
            )
        if self.virtual_stages != 1:
            text += f", virtual_stages={self.virtual_stages!r}"
        return text + ")"

    def expand(self, program, mesh, state):
        _check_axis(self, mesh)
        if state.pipeline is not None:
            raise TacticError(
                f"{self}: the schedule pipelines the step already ({state.pipeline}); a step "
                "has one pipeline. Undo that step to pipeline it differently."
            )
        if state.rings:
            raise TacticError(
                f"{self}: the schedule runs attention as a ring on {state.rings[-1]!r} "
                "(CP kind='ring'), which a pipelined step does not run yet; pipeline a step "
                "whose context parallelism gathers the keys and values (CP(axis))."
            )
        tiled = [program.values[v].name for v, s in state.shardings.items() if s.uses(self.axis)]
        if tiled:
            shown = ", ".join(tiled[:3]) + (f" and {len(tiled) - 3} more" if len(tiled) > 3 else "")
            raise TacticError(
                f"{self}: axis {self.axis!r} already tiles {shown}; a pipeline's stage axis "
                "carries no tile. Pipeline over an axis no tactic used yet (apply PP first), "
                "or undo the steps that tile on it."
            )
        self.resolve(program, mesh.axis_size(self.axis), held_batch(program, mesh, state)[0])
        return []

    def check(self, program, mesh, state) -> None:
        """A ``TacticError`` unless each device's share of the batch splits into this
        pipeline's microbatches (a data axis tiling the batch leaves it fewer examples)."""
        if self.microbatches is None:  # as many as each device's share allows
            return
        held, axes = held_batch(program, mesh, state)
        if held % self.microbatches:
            raise TacticError(
                f"{self}: each device holds {held} of the batch's examples (tiled over "
                f"{list(axes)}), which do not split into {self.microbatches} microbatches; "
                f"pipeline with fewer microbatches (a divisor of {held}), or split the data "
                "on another dim (BP(axis, dim=1))."
            )

    def resolve(self, program, stages: int, held: int | None = None) -> Pipeline:
        """This pipeline on ``program`` with ``stages`` stages, checked (a ``TacticError``
        saying why it cannot be cut or scheduled); ``held``: the examples each device holds
        (default microbatches divide it). Cached in ``program.cache``."""
        cache = program.cache.get("strategies.pipeline", dict)
        key = (self, stages, held if self.microbatches is None else None)
        if key not in cache:
            cache[key] = self._resolve(program, stages, key[2])
        return cache[key]

    def _resolve(self, program, stages: int, held: int | None) -> Pipeline:
        if stages < 2:
            raise TacticError(
                f"{self}: axis {self.axis!r} has {stages} device, so the pipeline would have "
                "one stage; pipeline over an axis of 2 or more devices."
            )
        v = self.virtual_stages
        try:
            batch = batch_size(program)
            every = stages if self.schedule == "interleaved" else 1  # M a multiple of S
            m = self.microbatches or default_microbatches(held or batch, stages, every)
            check_microbatches(program, m)
            table = schedule(self.schedule, stages, m, v)
            check_chunks(program, stages, v)
            cuts = stage_cuts(program, stages * v, layers=self.stages)
        except InputError as err:
            raise TacticError(f"{self}: {err}") from err
        return Pipeline(self, self.axis, stages, m, batch, table, cuts)


def pipeline_moves(program, mesh, axis: str) -> list[PP]:
    """The pipelines a search tries on ``axis``: 1F1B and zero-bubble at 2, 4 and 8
    microbatches per stage (those dividing the batch); none where ``axis`` has one device
    or the step has fewer repeated blocks than it has devices."""
    stages = mesh.axis_size(axis)
    blocks = program.anatomy().layers.count
    if stages < 2 or blocks < stages:
        return []
    try:
        batch = batch_size(program)
    except InputError:
        return []
    counts = [k * stages for k in (2, 4, 8) if batch % (k * stages) == 0]
    return [PP(axis, microbatches=m, schedule=k) for m in counts for k in ("1f1b", "zero-bubble")]


def default_microbatches(batch: int, stages: int, every: int = 1) -> int:
    """The smallest divisor of ``batch`` that is at least 4 per stage, else the batch; with
    ``every``, a multiple of it (the largest dividing the batch when none reaches 4 per
    stage; ``every`` itself when none does, which the schedule then refuses)."""
    want = MICROBATCHES_PER_STAGE * stages
    fits = [k for k in range(every, batch + 1, every) if batch % k == 0]
    return next((k for k in fits if k >= want), fits[-1] if fits else every)


def check_chunks(program, stages: int, virtual_stages: int) -> None:
    """An ``InputError`` unless the step has a repeated block for each of the ``stages *
    virtual_stages`` virtual stages (a model chunk holds at least one block)."""
    blocks = program.anatomy().layers.count
    if virtual_stages > 1 and 2 <= blocks < stages * virtual_stages:
        ways = [f"virtual_stages <= {blocks // stages}"] * (blocks // stages >= 2)
        ways += [f"{blocks // 2} stages of 2 chunks"] * (blocks >= 4)
        ways += ["one chunk per stage (virtual_stages=1, schedule '1f1b')"]
        raise InputError(
            f"{stages} stages x {virtual_stages} model chunks need {stages * virtual_stages} "
            f"repeated blocks (one per virtual stage), but {program.name!r} has {blocks}; "
            f"give {' or '.join(ways)}"
        )


def batch_size(program) -> int:
    """The batch size: the batch dimension of the program's data inputs (one size)."""
    sizes = {program.values[v].shape[d] for v, d in program.anatomy().data if d is not None}
    if len(sizes) != 1:
        raise InputError(
            f"{program.name!r} has data inputs with batch sizes {sorted(sizes) or 'none'}; a "
            "pipeline splits one batch dimension into microbatches. program.anatomy().report() "
            "shows what the workbench sees; correct it with wb.Role if it is wrong"
        )
    return sizes.pop()


def check_microbatches(program, microbatches: int) -> None:
    """An ``InputError`` unless ``microbatches`` divides the batch of ``program``."""
    batch = batch_size(program)
    if batch % microbatches:
        fits = [m for m in range(1, batch + 1) if batch % m == 0]
        raise InputError(
            f"microbatches={microbatches} does not divide the batch of {batch} "
            f"({program.name!r}'s data inputs); give one of {fits}"
        )


def pipeline_of(program, mesh, state) -> Pipeline | None:
    """The pipeline ``state``'s schedule holds (None: it holds no ``PP``), resolved."""
    pp = state.pipeline
    if pp is None:
        return None
    return pp.resolve(program, mesh.axis_size(pp.axis), held_batch(program, mesh, state)[0])


def held_batch(program, mesh, state) -> tuple[int, tuple[str, ...]]:
    """The examples of the batch each device holds, and the axes tiling the batch."""
    held, axes = batch_size(program), ()
    for v, d in program.anatomy().data:
        if d is not None and state.shardings[v].local_shape(mesh)[d] < held:
            held, axes = state.shardings[v].local_shape(mesh)[d], state.shardings[v].dims[d]
    return held, axes
