"""Export a session's shardings as plain JAX: a module that needs no workbench.

It builds the mesh from whatever devices are there (every host's under ``jax.distributed``),
and jits the user's function with the input and output shardings and a sharding
constraint on each intermediate the session tiles. Intermediates are found by their
structural keys (``io.structure``: what computes them, not where their line sits), so the
export survives edits that leave the model's computation as it was: reordered independent
lines, renamed locals, code moved into helpers.
"""

from __future__ import annotations

from workbench.core.errors import WorkbenchError
from workbench.core.io.structure import SOURCE, structural_keys
from workbench.core.lowering.constrained import SPATIAL_CONV_FAULTY, spatial_tilings
from workbench.core.ops import calls

_TEMPLATE = '''"""Shardings of {name!r} on a {mesh_text} mesh, exported by workbench. Needs only JAX.

    step = partitioned(train_step)        # jit with these shardings on all attached devices
    out = step(*args)

Under multi-host JAX (jax.distributed.initialize()), the mesh spans every host's devices;
pass global arrays (e.g. from jax.make_array_from_process_local_data).
"""

import hashlib

import jax
import numpy as np
from jax.extend.core import Literal
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXES = {axes!r}
SHAPE = {shape!r}

# one spec per leaf of the arguments and of the outputs, in jax.tree_util order
IN_SPECS = [
{in_specs}
]
OUT_SPECS = [
{out_specs}
]
# structural key of an intermediate (see structural_keys) -> spec
CONSTRAINTS = {{
{constraints}
}}
# primitives whose callee is entered, and the parameter holding it
CALLS = {calls!r}
# Convolutions these shardings tile on a spatial (windowed) dimension. On the backends in
# FAULTY_BACKENDS, XLA's SPMD partitioner computes wrong gradients for those (a kernel
# gradient counted once per replica), so partitioned() refuses to run there: keep spatial
# dims whole, or run on another backend.
SPATIAL_CONVS = [
{spatial}
]
FAULTY_BACKENDS = {faulty!r}

{structure}


def make_mesh(devices=None):
    """A mesh of SHAPE over ``devices`` (default: every device of every host)."""
    devices = jax.devices() if devices is None else list(devices)
    if len(devices) != int(np.prod(SHAPE)):
        raise ValueError(f"this strategy needs {{int(np.prod(SHAPE))}} devices ({{dict(zip(AXES, SHAPE))}}); {{len(devices)}} are attached")
    return Mesh(np.asarray(devices, dtype=object).reshape(SHAPE), AXES)


def _evaluate(jaxpr, consts, args, mesh, keys):
    """Evaluate a jaxpr, constraining results as CONSTRAINTS says. ``keys``: an iterator over
    structural_keys, one entry per equation evaluated (calls are entered; a loop or a branch
    is one equation, bound whole)."""
    env = {{}}

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        values = [read(v) for v in eqn.invars]
        param = CALLS.get(eqn.primitive.name)
        if param is not None and param in eqn.params:
            sub = eqn.params[param]
            outs = _evaluate(getattr(sub, "jaxpr", sub), getattr(sub, "consts", ()), values, mesh, keys)
        else:
            result_keys = next(keys)
            outs = eqn.primitive.bind(*values, **eqn.params)
            outs = list(outs) if eqn.primitive.multiple_results else [outs]
            for j, (key, out) in enumerate(zip(result_keys, outs)):
                spec = CONSTRAINTS.get(key)
                if spec is not None:
                    outs[j] = jax.lax.with_sharding_constraint(out, NamedSharding(mesh, spec))
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]


def partitioned(fn, mesh=None):
    """``fn`` jitted with these shardings: inputs, outputs and intermediates."""
    mesh = make_mesh() if mesh is None else mesh
    platform = mesh.devices.flat[0].platform
    if SPATIAL_CONVS and platform in FAULTY_BACKENDS:
        raise RuntimeError(
            f"these shardings tile convolutions on a spatial dimension ({{SPATIAL_CONVS}}), and "
            f"XLA's {{platform}} backend computes wrong gradients for that. Keep spatial dims "
            "whole (drop those specs), or run on a backend not in FAULTY_BACKENDS."
        )
    cache = {{}}

    def call(*args):
        leaves, tree = jax.tree_util.tree_flatten(args)
        if tree not in cache:
            closed = jax.make_jaxpr(fn)(*args)
            out_tree = jax.tree_util.tree_structure(jax.eval_shape(fn, *args))

            keys = structural_keys(closed, CALLS)

            def flat(*xs):
                return _evaluate(closed.jaxpr, closed.consts, xs, mesh, iter(keys))

            cache[tree] = (
                jax.jit(
                    flat,
                    in_shardings=[NamedSharding(mesh, s) for s in IN_SPECS],
                    out_shardings=[NamedSharding(mesh, s) for s in OUT_SPECS],
                ),
                out_tree,
            )
        jitted, out_tree = cache[tree]
        return jax.tree_util.tree_unflatten(out_tree, jitted(*leaves))

    return call
'''


def _spec_code(sharding) -> str:
    parts = []
    for axes in sharding.dims:
        if not axes:
            parts.append("None")
        elif len(axes) == 1:
            parts.append(repr(axes[0]))
        else:
            parts.append(repr(tuple(axes)))
    while parts and parts[-1] == "None":
        parts.pop()
    return f"P({', '.join(parts)})"


def export_jax(session) -> str:
    """A standalone module applying this session's shardings with plain JAX; where they tile
    a convolution spatially, it says so and refuses to run on a backend XLA gets that wrong
    on (``lowering.constrained.SPATIAL_CONV_FAULTY``)."""
    program, state, mesh = session.program, session.state, session.mesh
    in_specs = [
        f"    {_spec_code(state.shardings[v])},  # {program.values[v].name!r}"
        for v in program.inputs
    ]
    out_specs = []
    for v, name in zip(program.outputs, program.output_names):
        spec = _spec_code(state.shardings[v]) if isinstance(v, int) else "P()"
        out_specs.append(f"    {spec},  # {name!r}")
    constraints = []
    for op_id, keys in zip(program.body, op_keys(program)):
        for v, key in zip(program.ops[op_id].results, keys):
            s = state.shardings[v]
            if s.tiled_axes:
                constraints.append(f"    {key!r}: {_spec_code(s)},  # {program.values[v].name!r}")
    spatial = [f"    {str(t)!r}," for t in spatial_tilings(program, state)]
    return _TEMPLATE.format(
        name=program.name,
        mesh_text=str(dict(mesh.axes)),
        axes=mesh.names,
        shape=mesh.sizes,
        in_specs="\n".join(in_specs),
        out_specs="\n".join(out_specs),
        constraints="\n".join(constraints),
        calls=calls(),
        spatial="\n".join(spatial),
        faulty=tuple(sorted(SPATIAL_CONV_FAULTY)),
        structure=SOURCE,
    )


def op_keys(program) -> list[tuple[str, ...]]:
    """The structural keys of each top-level op's results, in ``program.body`` order (cached
    on the program)."""
    return program.cache.get("io.structural keys", lambda: _op_keys(program))


def _op_keys(program) -> list[tuple[str, ...]]:
    keys = structural_keys(program.jaxpr, calls())
    ops = [program.ops[o] for o in program.body]
    if len(keys) != len(ops) or any(len(k) != len(op.results) for k, op in zip(keys, ops)):
        raise WorkbenchError(
            f"{program.name}: its jaxpr has {len(keys)} top-level equations but the program "
            f"{len(ops)} top-level ops; structural keys need capture's walk of the jaxpr."
        )
    return keys
