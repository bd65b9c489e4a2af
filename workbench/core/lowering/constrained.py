"""Constrained lowering: the program at global shapes under ``jax.jit``, with input and output
shardings and a ``with_sharding_constraint`` on every value the state tiles. XLA places
the collectives. Pending sums cannot be written as constraints; XLA decides those."""

from __future__ import annotations

import jax
from jax.sharding import NamedSharding

from workbench.core.layout.mesh import Mesh
from workbench.core.layout.sharding import Sharding
from workbench.core.lowering.explicit import jax_mesh, spec
from workbench.core.lowering.interpret import Interpreter


class _Constrained(Interpreter):
    def __init__(self, program, state, jmesh, extra=()):
        super().__init__(program, extra)
        self.state, self.jmesh = state, jmesh

    def define(self, env, op, v, array, slot):
        s = self.state.shardings[v]
        if s.tiled_axes:
            array = jax.lax.with_sharding_constraint(array, NamedSharding(self.jmesh, spec(s)))
        env[v] = array


def output_layout(state, v) -> Sharding | None:
    if not isinstance(v, int):
        return None
    s = state.shardings[v]
    return Sharding(s.shape, s.dtype, s.dims)


def lower_constrained(program, mesh: Mesh, state, devices=None, donate=(), probes=()):
    """A jitted function of the program's flat inputs, with the state's shardings as
    constraints; ``donate``: indices of inputs whose buffers it may reuse; ``probes``: value
    ids also returned, after the outputs."""
    jmesh = jax_mesh(mesh, devices)
    interp = _Constrained(program, state, jmesh, probes)
    in_shardings = tuple(NamedSharding(jmesh, spec(state.shardings[v])) for v in program.inputs)
    out_shardings = tuple(
        NamedSharding(jmesh, spec(output_layout(state, v))) if isinstance(v, int) else None
        for v in (*program.outputs, *probes)
    )

    def fn(*flat):
        return tuple(interp(*flat))

    return jax.jit(
        fn, in_shardings=in_shardings, out_shardings=out_shardings, donate_argnums=tuple(donate)
    ), jmesh


def lower_propagated(program, mesh: Mesh, state, devices=None, donate=(), probes=()):
    """XLA's own propagation from the input shardings alone (for comparison with ours);
    ``donate`` and ``probes`` as for `lower_constrained`."""
    jmesh = jax_mesh(mesh, devices)
    interp = Interpreter(program, probes)
    in_shardings = tuple(NamedSharding(jmesh, spec(state.shardings[v])) for v in program.inputs)

    def fn(*flat):
        return tuple(interp(*flat))

    return jax.jit(fn, in_shardings=in_shardings, donate_argnums=tuple(donate)), jmesh
