"""``partition(fn, mesh, schedule)``: a jitted, partitioned function, like ``partir.jit``."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import jax
from jax.sharding import NamedSharding

from workbench.core.ir.capture import bind_arguments, capture
from workbench.core.layout.mesh import Mesh
from workbench.core.lowering.explicit import spec
from workbench.core.session import Session


def partition(
    fn: Callable, mesh: Mesh | dict, schedule: Iterable, *, lowering: str = "explicit", devices=None
):
    """``fn`` partitioned by ``schedule`` over ``mesh`` on the attached devices.

    The first call with a new argument structure captures ``fn``, applies the schedule and
    lowers it (explicitly by default: every collective placed by the workbench); later calls
    run the compiled program. ``partitioned.session(*args)`` gives the session behind it.
    """
    mesh = mesh if isinstance(mesh, Mesh) else Mesh(mesh)
    schedule = list(schedule)
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
