"""``partition(fn, mesh, schedule)``: a jitted, partitioned function, like ``partir.jit``."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import jax
from jax.sharding import NamedSharding

from workbench.core.errors import InputError, given
from workbench.core.ir.capture import bind_arguments, capture
from workbench.core.layout.mesh import Mesh, as_mesh
from workbench.core.lowering.explicit import spec
from workbench.core.propagate.tactics import Tactic, TacticInputError
from workbench.core.session import LOWERINGS, Session


def partition(
    fn: Callable, mesh: Mesh | dict, schedule: Iterable, *, lowering: str = "explicit", devices=None
):
    """``fn`` partitioned by ``schedule`` over ``mesh`` on the attached devices.

    The first call with a new argument structure captures ``fn``, applies the schedule and
    lowers it (explicitly by default: every collective placed by the workbench); later calls
    run the compiled program. ``partitioned.session(*args)`` gives the session behind it.
    """
    if not callable(fn):
        raise InputError(
            f"partition takes the function to partition first; got {given(fn)}. Write "
            "partition(step_fn, mesh, schedule)."
        )
    mesh = as_mesh(mesh)
    if isinstance(schedule, Tactic | str) or not isinstance(schedule, Iterable):
        raise TacticInputError(
            f"partition's schedule is a list of tactics; got {given(schedule)}. Write e.g. "
            "partition(fn, mesh, [BP('batch')])."
        )
    schedule = list(schedule)
    if lowering not in LOWERINGS:
        raise InputError(f"unknown lowering={given(lowering)}; use one of {list(LOWERINGS)}.")
    for tactic in schedule:  # each one checked now, not at the first call
        if not isinstance(tactic, Tactic):
            raise TacticInputError(
                f"partition's schedule holds {given(tactic)}, which is not a tactic; give "
                "tactics such as BP('batch') or Tile(selector, dim, axis)."
            )
    cache: dict = {}

    def prepare(args, kwargs):
        _, values = bind_arguments(fn, args, kwargs)
        leaves, tree = jax.tree_util.tree_flatten(values)
        key = (tree, tuple((jax.numpy.shape(x), jax.numpy.result_type(x)) for x in leaves))
        if key not in cache:
            session = Session(capture(fn, *args, **kwargs), mesh, schedule)
            jitted, jmesh = session.lower(lowering, devices)
            shardings = [
                NamedSharding(jmesh, spec(session.state.shardings[v]))
                for v in session.program.inputs
            ]
            cache[key] = (session, jitted, shardings)
        return cache[key], leaves

    def partitioned(*args, **kwargs):
        (session, jitted, shardings), leaves = prepare(args, kwargs)
        placed = [jax.device_put(x, s) for x, s in zip(leaves, shardings)]
        outputs = jitted(*placed)
        return jax.tree_util.tree_unflatten(session.program.out_tree, list(outputs))

    partitioned.session = lambda *args, **kwargs: prepare(args, kwargs)[0][0]
    partitioned.__wrapped__ = fn
    partitioned.__name__ = getattr(fn, "__name__", "partitioned")
    return partitioned
