"""Pipeline parallelism: ``PP`` runs the step's repeated blocks as stages over one mesh axis.

``PP(axis, microbatches=M, schedule=...)`` tiles nothing: it cuts the step into as many
stages as ``axis`` has devices (`anatomy.stages.stage_cuts`: the repeated blocks balanced
by FLOPs, what precedes the first block on the first stage, the head and loss on the last),
splits the batch into M microbatches and orders each stage's work by a schedule table
(`plan.schedule`). The other axes keep their SPMD layouts; the stage axis carries no tile
(`reserves_axis`: a later tactic on it is refused). `pipeline_of(program, mesh, state)`
reads the pipeline a state's schedule holds, resolved and checked, for the simulator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral

from workbench.core.anatomy.stages import StageCuts, stage_cuts
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

    def __str__(self) -> str:
        blocks = " | ".join(
            f"{s.blocks[0]}-{s.blocks[-1]}" if len(s.blocks) > 1 else f"{s.blocks[0]}"
            for s in self.cuts.stages
        )
        return (
            f"pipeline over {self.axis!r}: {self.stages} stages (blocks {blocks}), "
            f"{self.microbatches} microbatches of {self.batch // self.microbatches}, "
            f"{self.schedule.kind} schedule"
        )


@register()
@dataclass(frozen=True, slots=True)
class PP(Tactic):
    """Pipeline parallelism over ``axis``: one stage per device along it, the batch split
    into ``microbatches`` (default: the smallest divisor of the batch >= 4 x stages), run
    in the order ``schedule`` gives ("gpipe", "1f1b", "zero-bubble"; see `plan.schedule`).
    ``stages``: the block indices where stages 1, 2, ... start (default: balanced by
    FLOPs). Tiles nothing; the other axes keep their layouts."""

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
        earlier = [t for t in state.schedule if isinstance(t, PP)]
        if earlier:
            raise TacticError(
                f"{self}: the schedule pipelines the step already ({earlier[0]}); a step has "
                "one pipeline. Undo that step to pipeline it differently."
            )
        tiled = [program.values[v].name for v, s in state.shardings.items() if s.uses(self.axis)]
        if tiled:
            shown = ", ".join(tiled[:3]) + (f" and {len(tiled) - 3} more" if len(tiled) > 3 else "")
            raise TacticError(
                f"{self}: axis {self.axis!r} already tiles {shown}; a pipeline's stage axis "
                "carries no tile. Pipeline over an axis no tactic used yet (apply PP first), "
                "or undo the steps that tile on it."
            )
        self.resolve(program, mesh.axis_size(self.axis))
        return []

    def resolve(self, program, stages: int) -> Pipeline:
        """This pipeline on ``program`` with ``stages`` stages, checked (a ``TacticError``
        saying why it cannot be cut or scheduled); cached in ``program.cache``."""
        cache = program.cache.get("strategies.pipeline", dict)
        key = (self, stages)
        if key not in cache:
            cache[key] = self._resolve(program, stages)
        return cache[key]

    def _resolve(self, program, stages: int) -> Pipeline:
        if stages < 2:
            raise TacticError(
                f"{self}: axis {self.axis!r} has {stages} device, so the pipeline would have "
                "one stage; pipeline over an axis of 2 or more devices."
            )
        if self.virtual_stages != 1:
            raise TacticError(
                f"{self}: model chunks per stage (virtual_stages={self.virtual_stages}) are "
                "scheduled (plan.schedule) but not yet priced or run; give virtual_stages=1."
            )
        try:
            batch = batch_size(program)
            m = self.microbatches or default_microbatches(batch, stages)
            if batch % m:
                fits = [k for k in range(1, batch + 1) if batch % k == 0]
                raise InputError(
                    f"microbatches={m} does not divide the batch of {batch}; give one of {fits}"
                )
            table = schedule(self.schedule, stages, m, self.virtual_stages)
            cuts = stage_cuts(program, stages, layers=self.stages)
        except InputError as err:
            raise TacticError(f"{self}: {err}") from err
        return Pipeline(self, self.axis, stages, m, batch, table, cuts)


def default_microbatches(batch: int, stages: int) -> int:
    """The smallest divisor of ``batch`` that is at least 4 per stage, else the batch."""
    want = MICROBATCHES_PER_STAGE * stages
    return next((k for k in range(want, batch + 1) if batch % k == 0), batch)


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


def pipeline_of(program, mesh, state) -> Pipeline | None:
    """The pipeline ``state``'s schedule holds (None: it holds no ``PP``), resolved."""
    pp = next((t for t in state.schedule if isinstance(t, PP)), None)
    return None if pp is None else pp.resolve(program, mesh.axis_size(pp.axis))
