"""Constrained lowering: the program at global shapes under ``jax.jit``, with input and output
shardings and a ``with_sharding_constraint`` on every value the state tiles. XLA places
the collectives. Pending sums cannot be written as constraints; XLA decides those.

Guarded: on a backend in ``SPATIAL_CONV_FAULTY`` a convolution tiled on a spatial dimension
is refused (XLA computes wrong gradients for it; see `guard_backend`)."""

from __future__ import annotations

from dataclasses import dataclass

import jax
from jax.sharding import NamedSharding

from workbench.core.errors import InputError, WorkbenchError
from workbench.core.ir.program import Lit
from workbench.core.layout.mesh import Mesh
from workbench.core.layout.sharding import Sharding
from workbench.core.lowering.explicit import in_mesh, jax_mesh, spec
from workbench.core.lowering.interpret import Interpreter
from workbench.core.ops import traits
from workbench.core.ops.local import bind, local_params


class _Global(Interpreter):
    """At global shapes on our mesh: layouts named in params (explicit sharding's
    ``out_sharding=``, the types of created arrays) are the user's mesh's, so they go;
    the lowering places every value itself."""

    def bind(self, op, args):
        if traits(op.primitive).constraint:  # the plan's own constraints stand for it
            return list(args)
        return bind(op, args, local_params(op))


class _Constrained(_Global):
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
    if state.rings:
        raise InputError(
            f"the schedule runs attention as a ring on {state.rings[-1]!r} (CP kind='ring'), "
            "which only the explicit lowering performs; kind='constrained' would gather the "
            "keys and values instead. Use the explicit lowering."
        )
    guard_backend(program, state, devices)
    jmesh = jax_mesh(mesh, devices, state.placement)
    interp = _Constrained(program, state, jmesh, probes)
    in_shardings = tuple(NamedSharding(jmesh, spec(state.shardings[v])) for v in program.inputs)
    out_shardings = tuple(
        NamedSharding(jmesh, spec(output_layout(state, v))) if isinstance(v, int) else None
        for v in (*program.outputs, *probes)
    )

    def fn(*flat):
        return tuple(interp(*flat))

    return jax.jit(
        in_mesh(fn, jmesh),
        in_shardings=in_shardings,
        out_shardings=out_shardings,
        donate_argnums=tuple(donate),
    ), jmesh


def lower_propagated(program, mesh: Mesh, state, devices=None, donate=(), probes=()):
    """XLA's own propagation from the input shardings alone (for comparison with ours);
    ``donate`` and ``probes`` as for `lower_constrained`."""
    jmesh = jax_mesh(mesh, devices, state.placement)
    interp = _Global(program, probes)
    in_shardings = tuple(NamedSharding(jmesh, spec(state.shardings[v])) for v in program.inputs)

    def fn(*flat):
        return tuple(interp(*flat))

    return jax.jit(
        in_mesh(fn, jmesh), in_shardings=in_shardings, donate_argnums=tuple(donate)
    ), jmesh


#: Backends whose SPMD partitioner computes wrong gradients for a convolution tiled on a
#: spatial dimension (a kernel gradient summed once per replica, an input gradient off);
#: tests/core/lowering/test_backend_guard.py reproduces it in plain JAX and fails the day
#: XLA is fixed. GPU and TPU are not known to be affected (unchecked).
SPATIAL_CONV_FAULTY = frozenset({"cpu"})


@dataclass(frozen=True)
class SpatialTiling:
    """A convolution's operand or result tiled on a dimension the op's mapping blocks."""

    op: str
    value: str
    dim: int
    axes: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.op}: {self.value!r} dim {self.dim} tiled on {', '.join(self.axes)}"


def spatial_tilings(program, state) -> list[SpatialTiling]:
    """Convolutions (by their record's traits) whose operand or result the state tiles on
    a dimension made only of blocked factors of the op's mapping: a windowed spatial dim."""
    found = []
    for op in program.walk():
        if not traits(op.primitive).convolution:
            continue
        m = program.mapping(op)
        values = (*op.linked_operands, *op.linked_results)
        for v, dims in zip(values, (*m.operands, *m.results)):
            if isinstance(v, Lit):
                continue
            tiled = state.shardings[v].dims
            for d, factors in enumerate(dims):
                if factors and tiled[d] and all(f in m.blocked for f in factors):
                    name = program.values[v].name
                    found.append(SpatialTiling(op.name, name, d, tuple(tiled[d])))
    return found


def backend_of(devices=None) -> str:
    """The platform ``devices`` run on (default: JAX's default backend)."""
    devices = [] if devices is None else list(devices)
    return devices[0].platform if devices else jax.default_backend()


def guard_backend(program, state, devices=None) -> None:
    """Refuse the constrained lowering where the attached backend computes it wrongly."""
    backend = backend_of(devices)
    if backend not in SPATIAL_CONV_FAULTY:
        return
    found = spatial_tilings(program, state)
    if found:
        listed = "; ".join(map(str, found[:4])) + (
            f" (+{len(found) - 4} more)" if found[4:] else ""
        )
        raise WorkbenchError(
            f"the constrained lowering would tile a convolution on a spatial dimension ({listed}), "
            f"and XLA's {backend} backend computes wrong gradients for that (a kernel gradient "
            "counted once per replica). Use the explicit lowering (lowering='explicit', "
            "session.lower('explicit')), which gathers spatial dims itself, or keep spatial dims "
            "whole (tile batch or feature dims instead)."
        )
