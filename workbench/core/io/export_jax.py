"""Export a session's shardings as plain JAX: a module that needs no workbench.

It builds the mesh from whatever devices are there (every host's under ``jax.distributed``),
and jits the user's function with the input and output shardings and a sharding
constraint on each intermediate the session tiles. Intermediates are found by their
structural keys (``io.structure``: what computes them, not where their line sits), so the
export survives edits that leave the model's computation as it was: reordered independent
lines, renamed locals, code moved into helpers.
"""

from __future__ import annotations

from workbench.core.errors import InputError, WorkbenchError, given
from workbench.core.io.export import comment, literal
from workbench.core.io.structure import SOURCE, structural_keys
from workbench.core.lowering.constrained import SPATIAL_CONV_FAULTY, spatial_tilings
from workbench.core.ops import calls

_TEMPLATE = '''"""Shardings of {name} on a {mesh_text} mesh, exported by workbench. Needs only JAX.

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

AXES = {axes}
SHAPE = {shape}
{device_ids}

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
CALLS = {calls}
# Convolutions these shardings tile on a spatial (windowed) dimension. On the backends in
# FAULTY_BACKENDS, XLA's SPMD partitioner computes wrong gradients for those (a kernel
# gradient counted once per replica), so partitioned() refuses to run there: keep spatial
# dims whole, or run on another backend.
SPATIAL_CONVS = [
{spatial}
]
FAULTY_BACKENDS = {faulty}

{structure}


def grid(devices):
    """``devices`` in SHAPE: in their order, or where DEVICE_IDS says."""
    devices = np.asarray(devices, dtype=object)
    return devices.reshape(SHAPE) if DEVICE_IDS is None else devices[np.asarray(DEVICE_IDS)]


def make_mesh(devices=None):
    """A mesh of SHAPE over ``devices`` (default: every device of every host)."""
    devices = jax.devices() if devices is None else list(devices)
    if len(devices) != int(np.prod(SHAPE)):
        raise ValueError(f"this strategy needs {{int(np.prod(SHAPE))}} devices ({{dict(zip(AXES, SHAPE))}}); {{len(devices)}} are attached")
    return Mesh(grid(devices), AXES)


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


_EXPLICIT = '''"""Shardings of {name} on a {mesh_text} mesh in JAX's explicit sharding mode,
exported by workbench. Needs only JAX.

    mesh = make_mesh()                  # axes of AxisType.Explicit
    step = partitioned(train_step, mesh)
    out = step(*args)                   # arguments placed with IN_SPECS, run under the mesh

Every value's type carries its sharding: ops that take ``out_sharding=`` (or a created
array's ``sharding``, a ``reshard``'s target) are given the planned one, and any other
result whose type is not the planned one is resharded (``jax.sharding.reshard``).
"""

import contextlib
import hashlib

import jax
import numpy as np
from jax.extend.core import Literal
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXES = {axes}
SHAPE = {shape}
{device_ids}

# one spec per leaf of the arguments and of the outputs, in jax.tree_util order
IN_SPECS = [
{in_specs}
]
OUT_SPECS = [
{out_specs}
]
# structural key of every value the step computes (see structural_keys) -> its spec
SPECS = {{
{constraints}
}}
# primitives whose callee is entered, and the parameter holding it
CALLS = {calls}
# whether the step is written for explicit sharding (traced under the mesh, as it was
# captured) or for the compiler's propagation (traced without one)
TRACE_IN_MESH = {in_mesh}
# parameters that name a result's layout
LAYOUT_PARAMS = ("out_sharding", "sharding", "dst_sharding")

{structure}


def grid(devices):
    """``devices`` in SHAPE: in their order, or where DEVICE_IDS says."""
    devices = np.asarray(devices, dtype=object)
    return devices.reshape(SHAPE) if DEVICE_IDS is None else devices[np.asarray(DEVICE_IDS)]


def make_mesh(devices=None):
    """A mesh of SHAPE with Explicit axes over ``devices`` (default: every device)."""
    devices = jax.devices() if devices is None else list(devices)
    if len(devices) != int(np.prod(SHAPE)):
        raise ValueError(f"this strategy needs {{int(np.prod(SHAPE))}} devices ({{dict(zip(AXES, SHAPE))}}); {{len(devices)}} are attached")
    return Mesh(grid(devices), AXES, axis_types=(AxisType.Explicit,) * len(AXES))


def _evaluate(jaxpr, consts, args, mesh, keys, seen):
    """Evaluate a jaxpr with each result in its planned sharding (SPECS); ``keys``: an
    iterator over structural_keys; ``seen``: the keys met."""
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
            outs = _evaluate(getattr(sub, "jaxpr", sub), getattr(sub, "consts", ()), values, mesh, keys, seen)
        else:
            result_keys = next(keys)
            specs = [SPECS.get(key) for key in result_keys]
            seen.update(key for key in result_keys if key in SPECS)
            params = dict(eqn.params)
            if len(specs) == 1 and specs[0] is not None:
                for name in LAYOUT_PARAMS:
                    if name in params:
                        params[name] = NamedSharding(mesh.abstract_mesh, specs[0])
            outs = eqn.primitive.bind(*values, **params)
            outs = list(outs) if eqn.primitive.multiple_results else [outs]
            for j, (spec, out) in enumerate(zip(specs, outs)):
                have = getattr(jax.typeof(out), "sharding", None)
                if spec is not None and (have is None or have.spec != spec):
                    outs[j] = jax.sharding.reshard(out, NamedSharding(mesh, spec))
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]


def partitioned(fn, mesh=None):
    """``fn`` run in explicit mode on ``mesh``: arguments placed with IN_SPECS, every value
    in its planned sharding, outputs in OUT_SPECS."""
    mesh = make_mesh() if mesh is None else mesh
    cache = {{}}

    def call(*args):
        leaves, tree = jax.tree_util.tree_flatten(args)
        if tree not in cache:
            shapes = [jax.ShapeDtypeStruct(np.shape(a), a.dtype) for a in leaves]
            with jax.set_mesh(mesh) if TRACE_IN_MESH else contextlib.nullcontext():
                closed = jax.make_jaxpr(fn)(*jax.tree_util.tree_unflatten(tree, shapes))
                out_tree = jax.tree_util.tree_structure(jax.eval_shape(fn, *args))
            keys = structural_keys(closed, CALLS)

            def flat(*xs):
                seen = set()
                outs = _evaluate(closed.jaxpr, closed.consts, xs, mesh, iter(keys), seen)
                if len(seen) != len(SPECS):
                    raise ValueError(
                        f"{{len(SPECS) - len(seen)}} of the {{len(SPECS)}} planned values are not "
                        "computed by this function: these shardings were exported for another step"
                    )
                return outs

            out_shardings = [NamedSharding(mesh, s) for s in OUT_SPECS]
            cache[tree] = (jax.jit(flat, out_shardings=out_shardings), out_tree)
        jitted, out_tree = cache[tree]
        placed = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(leaves, IN_SPECS)]
        with jax.set_mesh(mesh):
            outs = jitted(*placed)
        return jax.tree_util.tree_unflatten(out_tree, outs)

    return call
'''

#: what ``export_jax(mode=...)`` writes
MODES = ("constrained", "explicit")


def device_ids_code(session) -> str:
    """The module's ``DEVICE_IDS`` line: the device (its index in the list ``make_mesh``
    takes) at each mesh position, as the session's placement (a ``Place`` step) lays the
    mesh's axes on the hardware's levels; None (the devices in order) without one."""
    placement = session.state.placement
    ids = None if placement is None else placement.device_ids(session.mesh).tolist()
    where = f"as placed: {placement}" if placement is not None else "None: in the order given"
    return (
        "# the device (its index in the devices make_mesh takes) at each mesh position; "
        f"{comment(where)}\nDEVICE_IDS = {literal(ids)}"
    )


def _spec_code(sharding) -> str:
    parts = []
    for axes in sharding.dims:
        if not axes:
            parts.append("None")
        elif len(axes) == 1:
            parts.append(literal(axes[0]))
        else:
            parts.append(literal(tuple(axes)))
    while parts and parts[-1] == "None":
        parts.pop()
    return f"P({', '.join(parts)})"


def export_jax(session, mode: str = "constrained") -> str:
    """A standalone module applying this session's shardings with plain JAX. ``mode``:
    "constrained" (jit with sharding constraints; where they tile a convolution spatially,
    it refuses to run on a backend XLA gets that wrong on, ``SPATIAL_CONV_FAULTY``) or
    "explicit" (JAX's explicit sharding: a mesh of Explicit axes, every value's planned
    sharding in its type, ``reshard`` where a type is not the planned one)."""
    if mode not in MODES:
        raise InputError(
            f"export_jax: mode {given(mode)} is not one of {MODES}; pass 'constrained' (jit "
            "with sharding constraints) or 'explicit' (JAX's explicit sharding mode)."
        )
    program, state, mesh = session.program, session.state, session.mesh
    in_specs = [
        f"    {_spec_code(state.shardings[v])},  # {literal(program.values[v].name)}"
        for v in program.inputs
    ]
    out_specs = []
    for v, name in zip(program.outputs, program.output_names):
        spec = _spec_code(state.shardings[v]) if isinstance(v, int) else "P()"
        out_specs.append(f"    {spec},  # {literal(name)}")
    constraints = []
    for op_id, keys in zip(program.body, op_keys(program)):
        for v, key in zip(program.ops[op_id].results, keys):
            s = state.shardings[v]
            if s.tiled_axes or mode == "explicit":
                constraints.append(
                    f"    {literal(key)}: {_spec_code(s)},  # {literal(program.values[v].name)}"
                )
    if mode == "explicit":
        return _EXPLICIT.format(
            name=literal(program.name),
            mesh_text=literal(dict(mesh.axes)),
            axes=literal(mesh.names),
            shape=literal(mesh.sizes),
            device_ids=ring_note(state) + device_ids_code(session),
            in_specs="\n".join(in_specs),
            out_specs="\n".join(out_specs),
            constraints="\n".join(constraints),
            calls=literal(calls()),
            in_mesh=literal(written_explicit(program)),
            structure=SOURCE,
        )
    spatial = [f"    {literal(str(t))}," for t in spatial_tilings(program, state)]
    return _TEMPLATE.format(
        name=literal(program.name),
        mesh_text=literal(dict(mesh.axes)),
        axes=literal(mesh.names),
        shape=literal(mesh.sizes),
        device_ids=ring_note(state) + device_ids_code(session),
        in_specs="\n".join(in_specs),
        out_specs="\n".join(out_specs),
        constraints="\n".join(constraints),
        calls=literal(calls()),
        spatial="\n".join(spatial),
        faulty=literal(tuple(sorted(SPATIAL_CONV_FAULTY))),
        structure=SOURCE,
    )


def ring_note(state) -> str:
    """Comment lines saying that a session's ring attention is not in the export ("" when
    it has none): shardings alone leave the keys and values to the compiler, which gathers
    them."""
    if not state.rings:
        return ""
    axes = ", ".join(map(repr, dict.fromkeys(state.rings)))
    return (
        f"# NOTE: ring attention (CP kind='ring' over {comment(axes)}) is not in this export:\n"
        "# these shardings leave the keys and values to XLA, which gathers them inside\n"
        "# attention. The ring runs in workbench's explicit lowering (Session.run).\n"
    )


def written_explicit(program) -> bool:
    """Whether the step was captured in JAX's explicit sharding mode: its arguments' types
    name a mesh with Explicit axes."""
    from workbench.core.io.imports import explicit_spec

    avals = (v.aval for v in program.jaxpr.jaxpr.invars)
    return any(explicit_spec(getattr(a, "sharding", None)) is not None for a in avals)


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
