"""Checks for chapter 7, automatic search (notebooks/course_07_*.ipynb)."""

from __future__ import annotations

import workbench as wb
from workbench.core.units import format_bytes, format_seconds

from .common import as_list, data_inputs, ok, require, session, unanswered


def _autos(s) -> list:
    autos = [t for t in s.history if isinstance(t, wb.Auto)]
    require(autos, "put a wb.Auto(...) in your schedule: the search should find the layout.")
    return autos


def _session(answer) -> wb.Session:
    unanswered(answer, "a wb.Session(...) whose schedule holds a wb.Auto(...)")
    require(
        isinstance(answer, wb.Session),
        f"expected a wb.Session(program, mesh, [...]); got {type(answer).__name__}.",
    )
    return answer


def auto_fits(answer, limit: float, hardware, baseline) -> None:
    """Exercise 7.1: the baseline schedule does not fit under ``limit``; the reader's session,
    which asks the search to respect the limit, does."""
    s = _session(answer)
    autos = _autos(s)
    require(
        all(a.memory_limit is not None and a.memory_limit <= limit for a in autos),
        "the search prices step time only unless it is told the budget per device: which of "
        "wb.Auto's arguments says how many bytes a device may hold?",
    )
    program, mesh = s.program, s.mesh
    base = session(program, mesh, as_list(baseline)).estimate(hardware).memory.peak
    require(base > limit, "the baseline already fits under the limit; nothing to search for.")
    peak = s.estimate(hardware).memory.peak
    require(
        peak <= limit,
        f"the search's strategy peaks at {format_bytes(peak)}, over the limit "
        f"{format_bytes(limit)}. Give it more evaluations or more time (budget=, seconds=).",
    )
    ok(
        f"the baseline peaks at {format_bytes(base)}, over the {format_bytes(limit)} limit; "
        f"the search's strategy peaks at {format_bytes(peak)}"
    )


def auto_composes(answer, hardware, data_axis: str = "batch", model_axis: str = "model") -> None:
    """Exercises 7.2 and 7.3: BP by hand on ``data_axis``, the search deciding ``model_axis``
    only: every data input keeps its batch split, the search tiles over ``model_axis`` alone,
    and the step is no slower than BP alone."""
    s = _session(answer)
    tactics = list(s.history)
    require(
        any(isinstance(t, wb.BP) and t.axis == data_axis for t in tactics),
        f"split the batch yourself: which named strategy splits the data over {data_axis!r}?",
    )
    autos = _autos(s)
    require(
        all(a.axes == (model_axis,) for a in autos),
        f"your search decides {sorted({x for a in autos for x in a.axes})}; the batch is "
        f"decided by hand, so the search should only be given {model_axis!r}.",
    )
    program, mesh = s.program, s.mesh
    for name, dim in data_inputs(program):
        got = s.sharding(name).dim_of(data_axis)
        require(
            dim is None or got == dim,
            f"the data input {name} is {s.sharding(name)}: its batch (dim {dim}) is no longer "
            f"split over {data_axis!r}. Did the BP come first?",
        )
    i = tactics.index(autos[0])
    decided = autos[0].decisions(program, mesh, s.state_at(i))
    require(
        all(isinstance(t, wb.Tile) and t.axis == model_axis for t in decided),
        f"the search decided {decided}; it should only tile over {model_axis!r}.",
    )
    bp = wb.Session(program, mesh, [wb.BP(data_axis)]).estimate(hardware).step_s
    mine = s.estimate(hardware).step_s
    require(
        mine <= bp,
        f"{format_seconds(mine)} per step, slower than BP alone ({format_seconds(bp)}): give "
        "the search more evaluations, or check what else your schedule holds.",
    )
    ok(
        f"BP kept on {data_axis!r}; the search made {len(decided)} tiling decisions over "
        f"{model_axis!r}; {format_seconds(mine)} per step against {format_seconds(bp)} for BP alone"
    )
