"""What-if questions over clusters and shapes: a sweep of simulated steps.

`sweep` prices one model over a grid: chip kinds (hardware presets), chip counts, mesh
shapes (a model axis inside a node, pipeline stages and their microbatches, the rest data
parallel), ZeRO-3 or not, and the model's own shape arguments (a batch, a sequence length:
whatever the model function takes), recapturing only where the shapes change and planning
each mesh once for every chip kind. `Sweep` answers from the points: the smallest cluster
on which the step fits (`smallest_fitting`), the best MFU per chip count (`best_mfu`), what
a step costs when one shape argument doubles (`scaled`), and the plans no other beats in
both step time and chip-seconds (`pareto`). A point that cannot be planned (a batch that
does not split over the data axis) says why instead of an estimate.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from workbench.core.errors import InputError, WorkbenchError, given
from workbench.core.hardware.names import resolve
from workbench.core.ir.capture import capture
from workbench.core.ir.program import Program
from workbench.core.layout.mesh import Mesh
from workbench.core.session import Session
from workbench.core.strategies.data import BP
from workbench.core.strategies.pipeline import PP
from workbench.core.strategies.tensor import MP
from workbench.core.strategies.zero import Z3

#: Points a sweep prices at most (about 0.1 s each on a scanned 70B step).
MAX_POINTS = 5000


@dataclass(frozen=True, slots=True)
class Point:
    """One priced configuration (times in seconds, memory in bytes per device)."""

    hardware: str
    chips: int
    mesh: tuple[tuple[str, int], ...]
    shapes: tuple[tuple[str, object], ...]  # the model's shape arguments
    plan: str  # the tactics, as text
    step_s: float = float("nan")
    mfu: float = 0.0
    peak: float = 0.0
    fits: bool = False
    error: str = ""  # why it could not be priced ("" when it was)

    @property
    def chip_seconds(self) -> float:
        """What a step costs: chips times its time."""
        return self.chips * self.step_s

    @property
    def priced(self) -> bool:
        return not self.error


@dataclass(frozen=True)
class Sweep:
    """Priced points and the answers read from them (see the module docstring)."""

    points: tuple[Point, ...]
    seconds: float = 0.0  # wall time of the sweep

    def fitting(self) -> list[Point]:
        return [p for p in self.points if p.priced and p.fits]

    def smallest_fitting(self, **where) -> Point | None:
        """The fewest chips on which the step fits (the fastest of those), among the points
        matching ``where`` (e.g. ``hardware="H100 SXM"``)."""
        pts = [p for p in self.fitting() if _matches(p, where)]
        return min(pts, key=lambda p: (p.chips, p.step_s), default=None)

    def best_mfu(self, **where) -> dict[tuple[str, int], Point]:
        """Per (chip kind, chip count), the fitting point with the highest MFU."""
        out: dict[tuple[str, int], Point] = {}
        for p in self.fitting():
            if _matches(p, where):
                key = (p.hardware, p.chips)
                if key not in out or p.mfu > out[key].mfu:
                    out[key] = p
        return dict(sorted(out.items()))

    def scaled(self, name: str, factor: float = 2) -> list[tuple[Point, Point, float]]:
        """(a point, the same configuration with shape ``name`` times ``factor``, the step
        time's ratio), for every priced pair the grid holds."""
        by_key = {_key(p, name): p for p in self.points if p.priced}
        out = []
        for p in self.points:
            value = dict(p.shapes).get(name)
            if not p.priced or value is None:
                continue
            q = by_key.get(_key(p, name, value * factor))
            if q is not None:
                out.append((p, q, q.step_s / p.step_s))
        return out

    def scaling(self, name: str, factor: float = 2) -> tuple[float, float, float, int] | None:
        """The step time's ratio when shape ``name`` is ``factor`` times larger, over every
        pair `scaled` finds: (median, least, most, pairs); None with no pair."""
        ratios = sorted(r for _, _, r in self.scaled(name, factor))
        if not ratios:
            return None
        return ratios[len(ratios) // 2], ratios[0], ratios[-1], len(ratios)

    def pareto(self) -> list[Point]:
        """Fitting points no other point of the same shapes beats in both step time and
        chip-seconds (the cost of a step), fastest first."""
        out = []
        for _, group in itertools.groupby(
            sorted(self.fitting(), key=lambda p: p.shapes), key=lambda p: p.shapes
        ):
            pts = sorted(group, key=lambda p: (p.step_s, p.chip_seconds))
            best = float("inf")
            for p in pts:
                if p.chip_seconds < best:
                    out.append(p)
                    best = p.chip_seconds
        return sorted(out, key=lambda p: p.step_s)

    def rows(self, points: Iterable[Point] | None = None) -> list[dict]:
        """Plain rows (JSON-ready) of ``points`` (default: all)."""
        return [
            {
                "hardware": p.hardware,
                "chips": p.chips,
                "mesh": dict(p.mesh),
                **dict(p.shapes),
                "plan": p.plan,
                "step_s": p.step_s,
                "mfu": p.mfu,
                "peak_bytes": p.peak,
                "fits": p.fits,
                "chip_seconds": p.chip_seconds,
                "error": p.error,
            }
            for p in (self.points if points is None else points)
        ]


def _matches(p: Point, where: Mapping) -> bool:
    fields = {"hardware": p.hardware, "chips": p.chips, **dict(p.shapes)}
    return all(fields.get(k) == v for k, v in where.items())


def _key(p: Point, name: str, value=None):
    shapes = dict(p.shapes)
    if value is not None:
        shapes[name] = value
    return (p.hardware, p.chips, p.mesh, p.plan, tuple(sorted(shapes.items())))


def meshes(chips: int, per_node: int, stages: Iterable[int] = (1,)) -> list[dict[str, int]]:
    """Mesh shapes for ``chips``: a model axis of 1, 2, 4 ... up to a node's chips, pipeline
    stages of ``stages`` (1: none), the rest data parallel; axes of size 1 left out."""
    out = []
    for s in stages:
        m = 1
        while m <= per_node:
            if chips % (m * s) == 0:
                shape = {"stage": s, "data": chips // (m * s), "model": m}
                out.append({k: v for k, v in shape.items() if v > 1} or {"data": 1})
            m *= 2
    return out


def plans(mesh: dict[str, int], microbatches: Iterable[int] = (4,)) -> list[list]:
    """The plans a sweep prices on ``mesh``: data parallelism with the model axis's tensor
    parallelism, with and without ZeRO-3 over the data axis, pipelined over the stages
    (each number of ``microbatches``) where the mesh has them."""
    base = [BP("data")] if "data" in mesh else []
    base += [MP("model")] if "model" in mesh else []
    heads = [[PP("stage", microbatches=m)] for m in microbatches] if "stage" in mesh else [[]]
    zero = [[], [Z3("data")]] if "data" in mesh else [[]]
    return [h + base + z for h in heads for z in zero]


def sweep(
    model: Callable[..., tuple] | Program,
    *,
    hardware: Iterable,
    chips: Iterable[int],
    shapes: Mapping[str, Iterable] | None = None,
    stages: Iterable[int] = (1,),
    microbatches: Iterable[int] = (4,),
    progress: Callable[[int, int], None] | None = None,
) -> Sweep:
    """Price ``model`` over the grid (see the module docstring). ``model``: a function of
    the ``shapes`` arguments returning ``(step_fn, *example_args)`` (abstract arguments,
    ``jax.ShapeDtypeStruct``, cost nothing), or a captured `Program` (no ``shapes``);
    ``hardware``: presets or `Hardware`; ``progress(done, total)`` after each point."""
    kinds = [resolve(h) for h in _listed(hardware, "hardware")]
    counts = [_count(c) for c in _listed(chips, "chips")]
    grid_shapes = {k: list(v) for k, v in (shapes or {}).items()}
    if isinstance(model, Program) and grid_shapes:
        raise InputError(
            "sweep got a captured Program and shapes to vary; a Program has its shapes. "
            "Pass a function of the shapes returning (step_fn, *args) instead."
        )
    if not isinstance(model, Program) and not callable(model):
        raise InputError(
            f"sweep's model is a function of the shapes returning (step_fn, *args), or a "
            f"captured Program; got {given(model)}."
        )
    combos = [dict(zip(grid_shapes, vs)) for vs in itertools.product(*grid_shapes.values())]
    stages, microbatches = list(stages), list(microbatches)
    jobs = []
    for combo in combos:
        for n in counts:
            for kind in kinds:
                per_node = kind.devices_per_node or 1
                for shape in meshes(n, per_node, stages):
                    jobs += [(combo, n, kind, shape, t) for t in plans(shape, microbatches)]
    if len(jobs) > MAX_POINTS:
        raise InputError(
            f"the grid has {len(jobs)} points; a sweep prices at most {MAX_POINTS}. Give "
            "fewer chip counts, chip kinds, shapes, stages or microbatches."
        )
    start, points, programs, sessions = time.perf_counter(), [], {}, {}
    for i, (combo, n, kind, shape, tactics) in enumerate(jobs):
        points.append(_price(model, combo, n, kind, shape, tactics, programs, sessions))
        if progress is not None:
            progress(i + 1, len(jobs))
    return Sweep(tuple(points), time.perf_counter() - start)


def _price(model, combo, n, kind, shape, tactics, programs, sessions) -> Point:
    plan = ", ".join(str(t) for t in tactics) or "(replicated)"
    point = Point(kind.name, n, tuple(shape.items()), tuple(combo.items()), plan)
    try:
        key = tuple(combo.items())
        if key not in programs:
            programs[key] = model if isinstance(model, Program) else capture(*model(**combo))
        program = programs[key]
        skey = (key, tuple(shape.items()), plan)
        if skey not in sessions:
            sessions[skey] = Session(program, Mesh(shape), tactics)
        e = sessions[skey].estimate(kind)
    except WorkbenchError as err:
        return replace(point, error=str(err).splitlines()[0])
    mfu = e.breakdown.mfu if e.breakdown is not None else 0.0
    return replace(point, step_s=e.step_s, mfu=mfu, peak=e.memory.peak, fits=e.memory.fits)


def counts(text: str, what: str) -> list[int]:
    """``"8, 16,32"`` -> ``[8, 16, 32]`` (chip counts, stages, microbatches as a person
    types them); anything else is an `InputError` saying so."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise InputError(
            f"{what}: give positive whole numbers joined by commas, e.g. 8,16,32; "
            f"got {given(text)}."
        )
    return [int(p) for p in parts]


def _listed(x, what: str) -> list:
    items = [x] if isinstance(x, str | int) or not isinstance(x, Iterable) else list(x)
    if not items:
        raise InputError(f"sweep needs at least one {what}; got none.")
    return items


def _count(c) -> int:
    if isinstance(c, bool) or not isinstance(c, int) or c < 1:
        raise InputError(f"a chip count is a positive integer; got {given(c)}.")
    return c
