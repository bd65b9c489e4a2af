"""Pipeline schedules as tables: per stage, the ordered work items (pass, microbatch, chunk).

`schedule(kind, stages, microbatches, virtual_stages=1)` builds one of `SCHEDULES`:

- "gpipe": every forward, then every backward (Huang et al. 2019).
- "1f1b": stage i runs min(M, S-1-i) forwards, then one forward and one backward in turn,
  then the backwards left (PipeDream-flush, Narayanan et al. 2021).
- "interleaved": v model chunks per stage, Megatron-LM's order (Narayanan et al. 2021):
  forwards in groups of S microbatches per chunk, warmup 2(S-1-i) + (v-1)S, M a multiple of S.
- "zero-bubble": ZB-H1 (Qi et al. 2023): the backward split into the input gradient "B" and
  the weight gradient "W"; stage i runs S-i forwards, i times B then F, then B, W, F in turn,
  so W fills what 1F1B leaves idle and no stage holds more than S microbatches.

Chunk c of stage s is virtual stage c*S + s: it feeds chunk c of stage s+1, and the last
stage's chunk c feeds stage 0's chunk c+1. The same table drives the simulator
(`timeline.simulate`) and the lowering.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.errors import InputError, LimitError, closest_names, given

#: The passes: forward, backward (input gradient; the whole backward unless split), weight gradient.
PASSES = ("F", "B", "W")
#: The named schedules `schedule` builds.
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zero-bubble")
#: The most work items a table may hold.
MAX_ITEMS = 1_000_000


@dataclass(frozen=True, slots=True)
class Work:
    """One item of a stage's order: `kind` ("F", "B" or "W") of `microbatch` on model `chunk`."""

    kind: str
    microbatch: int
    chunk: int = 0

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


@dataclass(frozen=True, slots=True)
class Schedule:
    """A pipeline schedule: `table[s]` is stage s's work in the order it runs.

    Checked on construction: every (pass, microbatch, chunk) exactly once per stage, "W"
    items exactly when `split_backward`, and on each stage F before B before W of the same
    microbatch and chunk. Orders across stages are checked by simulating (`timeline.simulate`).
    """

    kind: str
    stages: int
    microbatches: int
    virtual_stages: int
    split_backward: bool
    table: tuple[tuple[Work, ...], ...]

    def __post_init__(self):
        _check_sizes(self.stages, self.microbatches, self.virtual_stages)
        if len(self.table) != self.stages:
            raise InputError(
                f"a {self.kind!r} schedule of {self.stages} stages was given a table of "
                f"{len(self.table)} rows; give one row (that stage's ordered work) per stage"
            )
        passes = PASSES if self.split_backward else PASSES[:2]
        want = {
            Work(k, m, c)
            for k in passes
            for m in range(self.microbatches)
            for c in range(self.virtual_stages)
        }
        for s, row in enumerate(self.table):
            _check_row(self, s, row, want)

    def virtual(self, stage: int, chunk: int) -> int:
        """The position of `chunk` of `stage` in the model: chunk * stages + stage."""
        return chunk * self.stages + stage

    def place(self, virtual: int) -> tuple[int, int]:
        """(stage, chunk) that runs virtual stage `virtual`."""
        return virtual % self.stages, virtual // self.stages

    def transfers(self) -> dict[tuple[int, int, str], int]:
        """Point-to-point sends in one step, per (from stage, to stage, "activation" or
        "gradient"): each microbatch's activation at every virtual-stage boundary that
        crosses stages, and its gradient back. Interleaving sends v times what 1F1B sends on
        each link s -> s+1, and (v-1) times it on the wrap from stage S-1 to stage 0."""
        out: dict[tuple[int, int, str], int] = {}
        for g in range(self.stages * self.virtual_stages - 1):
            a, b = g % self.stages, (g + 1) % self.stages
            if a != b:
                for key in ((a, b, "activation"), (b, a, "gradient")):
                    out[key] = out.get(key, 0) + self.microbatches
        return out

    def __str__(self) -> str:
        head = f"{self.kind} schedule: S={self.stages} M={self.microbatches}"
        head += f" v={self.virtual_stages}" if self.virtual_stages > 1 else ""
        rows = (f"  stage {s}: " + " ".join(map(str, row)) for s, row in enumerate(self.table))
        return "\n".join([head, *rows])


def schedule(kind: str, stages: int, microbatches: int, virtual_stages: int = 1) -> Schedule:
    """The table of the named schedule `kind` (one of `SCHEDULES`) for `stages` stages,
    `microbatches` microbatches and `virtual_stages` model chunks per stage."""
    if kind not in SCHEDULES:
        near = closest_names(str(kind), SCHEDULES)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise InputError(
            f"pipeline schedule {given(kind)} is not one the workbench knows{hint}; "
            f"pick one of {', '.join(map(repr, SCHEDULES))}"
        )
    _check_sizes(stages, microbatches, virtual_stages)
    S, M, v = stages, microbatches, virtual_stages
    if kind == "interleaved":
        if v < 2:
            raise InputError(
                f"the interleaved schedule needs virtual_stages >= 2 (model chunks per stage), "
                f"got {given(v)}; give 2 or more, or use '1f1b' for one chunk per stage"
            )
        if M % S:
            lo, hi = M // S * S, (M // S + 1) * S
            raise InputError(
                f"the interleaved schedule runs microbatches in groups of the {S} stages, so "
                f"their number must be a multiple of {S}, got {M}; use "
                + (f"{lo} or {hi}" if lo else f"{hi}")
                + " microbatches, or the '1f1b' schedule"
            )
    elif v != 1:
        raise InputError(
            f"the {kind!r} schedule runs one model chunk per stage, got virtual_stages="
            f"{given(v)}; give virtual_stages=1, or use 'interleaved' for several chunks"
        )
    build = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "interleaved": _interleaved}
    if kind == "zero-bubble":
        table = tuple(_zb_h1(S, M, s) for s in range(S))
    else:
        table = tuple(build[kind](S, M, v, s) for s in range(S))
    return Schedule(kind, S, M, v, kind == "zero-bubble", table)


def _check_sizes(stages, microbatches, virtual_stages) -> None:
    for name, value in (
        ("stages", stages),
        ("microbatches", microbatches),
        ("virtual_stages", virtual_stages),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(
                f"a pipeline schedule's {name} must be a whole number >= 1, got {given(value)}"
            )
    items = 3 * stages * microbatches * virtual_stages
    if items > MAX_ITEMS:
        raise LimitError(
            f"a pipeline schedule of {stages} stages x {microbatches} microbatches x "
            f"{virtual_stages} chunks has up to {items} work items, over the {MAX_ITEMS} the "
            "workbench simulates; use fewer microbatches (the bubble share is already "
            "small at a few times the stage count)"
        )


def _check_row(sched: Schedule, s: int, row, want: set[Work]) -> None:
    where = f"stage {s} of a {sched.kind!r} schedule"
    seen: dict[Work, int] = {}
    for i, w in enumerate(row):
        if not isinstance(w, Work) or w not in want:
            raise InputError(
                f"{where} holds {given(w)}, which is not a work item of this schedule; give "
                f"Work(kind, microbatch, chunk) with kind in {sorted({x.kind for x in want})}, "
                f"microbatch < {sched.microbatches} and chunk < {sched.virtual_stages}"
            )
        if w in seen:
            raise InputError(f"{where} runs {w} twice (items {seen[w]} and {i}); run it once")
        seen[w] = i
    missing = sorted(
        want - seen.keys(), key=lambda w: (w.microbatch, w.chunk, PASSES.index(w.kind))
    )
    if missing:
        shown = ", ".join(map(str, missing[:6])) + (", ..." if len(missing) > 6 else "")
        raise InputError(f"{where} never runs {shown}; every stage runs every pass once")
    for w, i in seen.items():
        before = {"B": "F", "W": "B"}.get(w.kind)
        if before and seen[Work(before, w.microbatch, w.chunk)] > i:
            raise InputError(
                f"{where} runs {w} (item {i}) before {Work(before, w.microbatch, w.chunk)}, "
                f"which it needs; put {before} of a microbatch before its {w.kind}"
            )


def _gpipe(S: int, M: int, v: int, s: int) -> tuple[Work, ...]:
    return tuple(Work("F", m) for m in range(M)) + tuple(Work("B", m) for m in range(M))


def _one_f_one_b(S: int, M: int, v: int, s: int) -> tuple[Work, ...]:
    warm = min(M, S - 1 - s)
    row = [Work("F", m) for m in range(warm)]
    for k in range(M - warm):
        row += [Work("F", warm + k), Work("B", k)]
    return tuple(row + [Work("B", m) for m in range(M - warm, M)])


def _interleaved(S: int, M: int, v: int, s: int) -> tuple[Work, ...]:
    total = M * v

    def item(k: int, kind: str) -> Work:
        group, within = divmod(k, S * v)
        chunk = within // S
        return Work(kind, group * S + k % S, chunk if kind == "F" else v - 1 - chunk)

    warm = min(total, 2 * (S - 1 - s) + (v - 1) * S)
    row = [item(k, "F") for k in range(warm)]
    for k in range(total - warm):
        row += [item(warm + k, "F"), item(k, "B")]
    return tuple(row + [item(k, "B") for k in range(total - warm, total)])


def _zb_h1(S: int, M: int, s: int) -> tuple[Work, ...]:
    done = {"F": 0, "B": 0, "W": 0}
    row: list[Work] = []

    def emit(kind: str) -> bool:
        # a pass runs once the stage has run the pass before it for that microbatch
        ahead = {"F": M, "B": done["F"], "W": done["B"]}[kind]
        if done[kind] >= ahead:
            return False
        row.append(Work(kind, done[kind]))
        done[kind] += 1
        return True

    for _ in range(min(M, S - s)):
        emit("F")
    for _ in range(s):
        emit("B")
        emit("F")
    while len(row) < 3 * M:
        for kind in ("B", "W", "F"):
            emit(kind)
    return tuple(row)
