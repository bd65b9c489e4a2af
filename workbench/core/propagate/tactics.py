"""Tactics: one user decision about one mesh axis, and the engine step that applies it.

``Tile(selector, dim, axis)`` tiles a dimension of the selected values over an axis;
``Replicate(selector, axis)`` keeps them whole on it; ``Atomic(selector, axis)`` freezes
them on it, so propagation never crosses them (a later ``Tile`` may still tile them: an
explicit decision, which then does not spread). Composite tactics (named strategies,
search) expand into these. Applying a tactic validates everything before it writes
anything, so a failed tactic leaves no trace.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral

from workbench.core.errors import (
    InputError,
    LeftWhole,
    TacticError,
    WorkbenchError,
    closest_names,
    given,
)
from workbench.core.gcpause import without_gc
from workbench.core.ir.selectors import Selector, check_selector, select
from workbench.core.layout.mesh import Mesh
from workbench.core.layout.state import Note, Provenance, State
from workbench.core.propagate.explain import note_text, nothing_tiled
from workbench.core.propagate.propagation import Propagator


class TacticInputError(TacticError, InputError):
    """A tactic built with an argument it cannot use (a wrong type, an unknown keyword), or
    something that is not a tactic where one is needed."""


def _text(tactic) -> str:
    try:
        return str(tactic)
    except Exception:  # a field too wrong for the tactic's own text
        return type(tactic).__name__


def _freeze(selector: Selector, tactic=None, field: str = "selector") -> Selector:
    """A checked selector; lists become tuples so tactics stay hashable."""
    where = f"{_text(tactic)}: {field}" if tactic is not None else field
    return check_selector(selector, where)


def check_axis_name(tactic, axis=None, field: str = "axis") -> None:
    """At construction: ``axis`` (default: the tactic's) names a mesh axis, a non-empty
    identifier such as 'batch'; whether the mesh has it is checked when applied."""
    axis = tactic.axis if axis is None and field == "axis" else axis
    if isinstance(axis, str) and axis.isidentifier():
        return
    why = "is empty" if axis == "" else "is not a mesh axis name"
    raise TacticInputError(
        f"{_text(tactic)}: {field} {given(axis)} {why}; name a mesh axis as a string, such "
        "as 'batch' or 'model' (session.mesh.names lists them)."
    )


def check_dim(tactic, field: str, optional: bool = False) -> None:
    """At construction: field ``field`` is a dimension index (an int, negative from the end;
    numpy ints become ints), or None when ``optional``."""
    dim = getattr(tactic, field)
    if dim is None and optional:
        return
    if isinstance(dim, Integral) and not isinstance(dim, bool):
        object.__setattr__(tactic, field, int(dim))
        return
    whole = isinstance(dim, float) and dim.is_integer()
    hint = f" (write {int(dim)})" if whole else ""
    raise TacticInputError(
        f"{_text(tactic)}: {field} must be an integer dimension index{hint} (0 the first, "
        f"-1 the last{', or None' if optional else ''}); got {given(dim)}."
    )


def check_flag(tactic, field: str = "strict") -> None:
    """At construction: field ``field`` is True or False."""
    if not isinstance(getattr(tactic, field), bool):
        raise TacticInputError(
            f"{_text(tactic)}: {field} must be True or False; got {given(getattr(tactic, field))}."
        )


def check_optional_selector(tactic, field: str) -> None:
    """At construction: field ``field`` is None or a selector (lists become tuples)."""
    if getattr(tactic, field) is not None:
        object.__setattr__(tactic, field, _freeze(getattr(tactic, field), tactic, field))


def _signature(cls: type) -> str:
    """``BP(axis, inputs=None, dim=None, strict=False)``: how a tactic is called."""
    params = inspect.signature(cls).parameters.values()
    shown = [p.name if p.default is p.empty else f"{p.name}={p.default!r}" for p in params]
    return f"{cls.__name__}({', '.join(shown)})"


def checked_init(cls: type) -> type:
    """Class decorator: a call with unknown or missing arguments raises ``TacticInputError``
    showing the signature (the dataclass's own ``__init__`` raises a bare TypeError)."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except TypeError as err:
            try:
                inspect.signature(cls).bind(*args, **kwargs)
            except TypeError:
                shown = ", ".join(
                    [*map(given, args), *(f"{k}={given(v)}" for k, v in kwargs.items())]
                )
                why = str(err).replace(f"{cls.__qualname__}.__init__()", "").strip()
                why = re.sub(  # the counts without ``self``
                    r"takes (\d+) positional arguments? but (\d+)",
                    lambda m: f"takes {int(m[1]) - 1} positional arguments but {int(m[2]) - 1}",
                    why,
                )
                raise TacticInputError(
                    f"{cls.__name__}({shown}): {why}; write {_signature(cls)}."
                ) from None
            raise

    cls.__init__ = __init__
    return cls


def _selector_text(selector: Selector) -> str:
    return repr(list(selector)) if isinstance(selector, tuple) else repr(selector)


class Tactic:
    """Base of all tactics. A composite overrides ``expand``; a primitive overrides ``seed``."""

    axis: str

    def expand(self, program, mesh: Mesh, state: State) -> Sequence[Tactic]:
        """The primitive tactics this one stands for, given the state it applies to."""
        return [self]

    def seed(self, prop: Propagator, mesh: Mesh) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


def _check_axis(tactic, mesh: Mesh) -> None:
    """When applied: the tactic's axis is one of the mesh's."""
    if not isinstance(tactic.axis, str) or tactic.axis not in mesh:
        hint = closest_names(str(tactic.axis), mesh.names)
        raise TacticError(
            f"{tactic}: axis {given(tactic.axis)} is not in {mesh}"
            + (f"; did you mean {hint[0]!r}?" if hint else "")
            + f" Use one of its axes {list(mesh.names)}, or a mesh that has it."
        )


def _not_a_tactic(tactic) -> TacticInputError:
    """The error for applying something that is not a tactic, saying what to write instead."""
    example = "Tile(selector, dim, axis), Replicate(selector, axis), BP('batch')"
    if isinstance(tactic, type) and issubclass(tactic, Tactic):
        why = f"{tactic.__name__} is a tactic class, not a tactic; make one: {tactic.__name__}(<axis>, ...)"
    elif isinstance(tactic, str):
        why = f"a string is not a tactic; write the tactic itself, e.g. {tactic.strip() or 'BP'}('batch')"
    elif isinstance(tactic, list | tuple) and any(isinstance(t, Tactic) for t in tactic):
        why = (
            "apply takes one tactic; apply several one by one (for t in tactics: "
            "session.apply(t)), or give them as the schedule: Session(program, mesh, tactics)"
        )
    else:
        why = "that is not a tactic"
    return TacticInputError(f"expected a tactic such as {example}; got {given(tactic)}: {why}.")


def _decided_by(prop: Propagator, vid: int, axis: str) -> str:
    p = prop.prov.get((vid, axis))
    if p is None:
        return ""
    schedule = prop.schedule
    what = str(schedule[p.tactic]) if p.tactic < len(schedule) else "this tactic"
    return f" by tactic #{p.tactic} {what}"


@checked_init
@dataclass(frozen=True, slots=True)
class Tile(Tactic):
    """Tile dimension ``dim`` of every value ``selector`` matches over mesh axis ``axis``."""

    selector: Selector
    dim: int
    axis: str

    def __post_init__(self):
        object.__setattr__(self, "selector", _freeze(self.selector, self))
        check_dim(self, "dim")
        check_axis_name(self)

    def __str__(self) -> str:
        return f"Tile({_selector_text(self.selector)}, dim={self.dim}, axis={self.axis!r})"

    def seed(self, prop: Propagator, mesh: Mesh) -> None:
        _check_axis(self, mesh)
        if isinstance(self.dim, bool) or not isinstance(self.dim, int):
            raise TacticError(
                f"{self}: dim must be an integer; got {type(self.dim).__name__} {self.dim!r}."
            )
        program, size = prop.program, mesh.axis_size(self.axis)
        todo = []
        for vid in select(program, self.selector):
            v, s = program.values[vid], prop.sh[vid]
            if not -len(v.shape) <= self.dim < len(v.shape):
                raise TacticError(
                    f"{self}: {v.name} has rank {len(v.shape)} (shape {v.shape}), so dim "
                    f"{self.dim} is out of range; use a dim in [{-len(v.shape)}, {len(v.shape) - 1}]"
                    if v.shape
                    else f"{self}: {v.name} is a scalar and has no dim to tile; select arrays only."
                )
            d = self.dim % len(v.shape)
            if s.dim_of(self.axis) == d:
                continue  # already exactly so
            if s.uses(self.axis):
                where = (
                    f"dim {s.dim_of(self.axis)}"
                    if s.dim_of(self.axis) is not None
                    else "a pending reduction"
                )
                raise TacticError(
                    f"{self}: {v.name} already uses axis {self.axis!r} ({where}"
                    f"{_decided_by(prop, vid, self.axis)}); a mesh axis appears at most once per value "
                    "and a later tactic never overrides an earlier one. Tile over another axis, "
                    "or undo the earlier tactic."
                )
            if self.axis in s.replicated:
                raise TacticError(
                    f"{self}: {v.name} was made replicated on axis {self.axis!r} by an earlier tactic; "
                    "undo that tactic or tile over another axis."
                )
            already = s.shards(d, mesh)
            if v.shape[d] % (already * size):
                have = f" already cut in {already} pieces," if already > 1 else ""
                raise TacticError(
                    f"{self}: dim {d} of {v.name} has size {v.shape[d]},{have} which mesh axis "
                    f"{self.axis!r} (size {size}) does not divide; pick a dim whose size "
                    f"{already * size} divides, or pad it."
                )
            todo.append((vid, d))
        for vid, d in todo:
            prop.tile(vid, d, self.axis)


@checked_init
@dataclass(frozen=True, slots=True)
class Replicate(Tactic):
    """Keep every value ``selector`` matches whole on ``axis``: propagation will not tile it."""

    selector: Selector
    axis: str

    def __post_init__(self):
        object.__setattr__(self, "selector", _freeze(self.selector, self))
        check_axis_name(self)

    def __str__(self) -> str:
        return f"Replicate({_selector_text(self.selector)}, axis={self.axis!r})"

    def seed(self, prop: Propagator, mesh: Mesh) -> None:
        _check_axis(self, mesh)
        todo = []
        for vid in select(prop.program, self.selector):
            s = prop.sh[vid]
            if s.uses(self.axis):
                raise TacticError(
                    f"{self}: {prop.program.values[vid].name} is already {s} "
                    f"on axis {self.axis!r}{_decided_by(prop, vid, self.axis)}; a later tactic never "
                    "overrides an earlier one. Undo that tactic first, or replicate on another axis."
                )
            if self.axis not in s.replicated:
                todo.append(vid)
        for vid in todo:
            prop.pin(vid, self.axis, atomic=False)


@checked_init
@dataclass(frozen=True, slots=True)
class Atomic(Tactic):
    """Freeze every value ``selector`` matches on ``axis``: propagation never crosses it there."""

    selector: Selector
    axis: str

    def __post_init__(self):
        object.__setattr__(self, "selector", _freeze(self.selector, self))
        check_axis_name(self)

    def __str__(self) -> str:
        return f"Atomic({_selector_text(self.selector)}, axis={self.axis!r})"

    def seed(self, prop: Propagator, mesh: Mesh) -> None:
        _check_axis(self, mesh)
        todo = [
            vid
            for vid in select(prop.program, self.selector)
            if self.axis not in prop.sh[vid].atomic
        ]
        for vid in todo:
            prop.pin(vid, self.axis, atomic=True)


PRIMITIVE_TACTICS = (Tile, Replicate, Atomic)


@dataclass(frozen=True, slots=True)
class Fence(Tactic):
    """Ops that never spread one of their factors on ``axis`` (``State.fences``): a part a
    composite builds from the program's structure (EP keeps the experts dim off the routing
    side), never written by hand, as it names op ids and factors."""

    axis: str
    held: tuple[tuple[int, int], ...]  # (op id, factor)
    what: str = ""  # what the ops are, for explanations

    def __str__(self) -> str:
        return f"Fence({self.what or f'{len(self.held)} ops'}, axis={self.axis!r})"

    def seed(self, prop: Propagator, mesh: Mesh) -> None:
        _check_axis(self, mesh)
        for o, f in self.held:
            prop.fence(o, self.axis, f)


SEEDED = (*PRIMITIVE_TACTICS, Fence)


@dataclass(frozen=True, slots=True)
class Target:
    """A value a composite tactic targets on its axis; ``reason`` why none of its parts
    tiles it ("" when one does), ``size`` the dim's size the axis does not divide and
    ``what`` the dim's role. ``value`` None: a selector of it selected nothing."""

    value: int | None
    reason: str = ""
    size: int | None = None
    what: str = ""


class Expansion(list):
    """A composite's parts, with the values it targets (``targets``): those left whole on
    its axis once it is applied become the step's notes. Adding keeps the targets."""

    def __init__(self, parts=(), targets=()):
        super().__init__(parts)
        self.targets = list(targets)

    def __add__(self, other):
        return Expansion([*self, *other], [*self.targets, *getattr(other, "targets", ())])

    def __radd__(self, other):
        return Expansion([*other, *self], [*getattr(other, "targets", ()), *self.targets])


@without_gc
def apply_tactic(
    program, mesh: Mesh, state: State, tactic: Tactic, *, strict: bool = False
) -> State:
    """The state after ``tactic``: its seeds, then propagation to a fixed point on every axis.

    Each value a composite targets that stays whole on its axis is noted (``State.notes``);
    a strategy that tiles nothing raises ``NothingTiled``, and with ``strict`` (or the
    tactic's own ``strict``) any note raises ``LeftWhole``. A tactic that ``moves_nothing``
    (``Place``) is checked by its ``expand`` and joins the schedule, the rest as it was.
    Pure: ``state`` is never modified, so on error the caller still holds it unchanged.
    """
    if not isinstance(tactic, Tactic):
        raise _not_a_tactic(tactic)
    schedule = (*state.schedule, tactic)
    if getattr(tactic, "moves_nothing", False):  # a fact about the run (``Place``): checked,
        tactic.expand(program, mesh, state)  # then kept in the schedule, every sharding as it was
        return dataclasses.replace(state, schedule=schedule, changed=frozenset(), events=())
    prop = Propagator(program, mesh, state, tactic=len(state.schedule), schedule=schedule)
    expanded: list[tuple[Tactic, list[Target]]] = []  # each composite, and what it targets

    def free(t: Tactic) -> None:
        if prop.pipeline is not None and t.axis == prop.pipeline.axis:
            raise TacticError(
                f"{t}: axis {t.axis!r} is the stages' axis of {prop.pipeline}, which "
                "carries no tile; tile on another axis of the mesh."
            )

    def run(t: Tactic, now: State | None = None) -> None:
        if isinstance(t, SEEDED):
            free(t)
            if t is not tactic:
                prop.begin_part(t)
            t.seed(prop, mesh)
            prop.settle(t.axis)
        else:
            subs = t.expand(program, mesh, prop.state() if now is None else now)
            if getattr(t, "reserves_axis", False):  # the pipeline, checked by its expand
                prop.pipeline = t
            if getattr(t, "ring", None) is not None:  # ring attention on its axis
                prop.rings = (*prop.rings, t.ring)
                if getattr(t, "balance", False):
                    prop.balanced = (*prop.balanced, t.ring)
            expanded.append((t, getattr(subs, "targets", [])))
            for sub in subs:
                run(sub)

    if isinstance(tactic, SEEDED):
        run(tactic)
        return _pipelined(program, mesh, prop.state())
    try:
        if getattr(tactic, "one_pass", False):  # every seed placed, then one propagation
            subs = list(tactic.expand(program, mesh, state))
            for sub in subs:
                free(sub)
                prop.begin_part(sub)
                sub.seed(prop, mesh)
            prop.settle(subs[0].axis if subs else None)  # every axis, to a fixed point
        else:
            run(tactic, state)  # the state itself: a search keeps its decisions per state
        _note(program, mesh, prop, expanded, strict or getattr(tactic, "strict", False))
        return _pipelined(program, mesh, prop.state())
    except WorkbenchError as err:  # say which tactic the user wrote, then what it ran into
        if str(err).startswith(str(tactic)):
            raise
        raise _within(tactic, err) from err


def _pipelined(program, mesh: Mesh, state: State) -> State:
    """``state``, once its pipeline (if any) says it can still split the batch each device
    holds into its microbatches (a ``TacticError`` from ``pipeline.check`` otherwise)."""
    if state.pipeline is not None:
        state.pipeline.check(program, mesh, state)
    return state


def _note(program, mesh: Mesh, prop: Propagator, expanded, strict: bool) -> None:
    """Note each targeted value left whole on its composite's axis; raise when a composite
    that targets values tiled none (``NothingTiled``), or on any note when ``strict``."""
    new = []
    for t, targets in expanded:
        seen: set = set()
        mine = []
        for target in targets:
            v = target.value
            if v in seen or (v is not None and prop.sh[v].uses(t.axis)):
                continue
            seen.add(v)
            reason = target.reason or "no part of the tactic tiled it, nor did propagation"
            mine.append(Note(v, t.axis, prop.tactic, reason, target.size, target.what))
        if mine and not any(isinstance(e, Provenance) and e.axis == t.axis for e in prop.events):
            raise nothing_tiled(program, mesh, t, mine)
        new += mine
    if strict and new:
        shown = [note_text(program, n) for n in new[:5]]
        more = f"\n  ... and {len(new) - 5} more" if len(new) > 5 else ""
        raise LeftWhole(
            f"{prop.schedule[-1]} left {len(new)} value(s) it targets whole (strict):\n  "
            + "\n  ".join(shown)
            + more
            + "\nFix what each note says, or apply it without strict to accept them."
        )
    prop.notes += new


def _within(tactic: Tactic, err: WorkbenchError) -> WorkbenchError:
    message = str(err)
    try:
        return type(err)(f"{tactic} failed: {message}")
    except TypeError:  # an error type with its own constructor
        return TacticError(f"{tactic} failed: {message}")
