"""Export a pipelined step as plain JAX: the step compiled by ``jax.export``, as data.

Sharding constraints cannot say a pipeline schedule (which stage runs which microbatch
when, and the sends between them), so a pipelined session's ``export_jax()`` writes the
pipeline lowering's program itself (`lowering.pipeline`: a ``shard_map`` with
``ppermute``) serialized by ``jax.export`` for the captured shapes and dtypes and this
mesh shape, base64 in the module. The module builds its mesh from the attached devices,
checks the arguments against the captured ones and calls the artifact. The schedule,
stages and microbatches are written out as constants for the reader.
"""

from __future__ import annotations

import base64
import importlib.util

import jax
from jax.sharding import NamedSharding, PartitionSpec

from workbench.core.errors import InputError, WorkbenchError, given
from workbench.core.io.export import _tactic_code, exported_tactics, literal
from workbench.core.io.export_jax import MODES, _spec_code, device_ids_code

#: platforms the artifact is lowered for (jax.export lowers for each, no device needed);
#: when one fails to lower, the artifact holds the exporting platform's only
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")

_TEMPLATE = '''"""The pipelined step of {name} on a {mesh_text} mesh, exported by workbench.

STEP is that step compiled by jax.export for exactly the argument shapes and dtypes in
ARGS, a mesh of SHAPE over AXES and the platforms in PLATFORMS: {pipeline}.
SCHEDULE, PIPELINE, STAGES and WORK say what was compiled; they are for reading, and
changing them changes nothing. Needs JAX (and the flatbuffers package jax.export reads
the artifact with).

    step = partitioned(train_step)        # the pipelined step on all attached devices
    out = step(*args)                     # args shaped as ARGS; out shaped as train_step's

train_step is not run: it gives the outputs' tree, and is checked to compute OUTS. Under
multi-host JAX (jax.distributed.initialize()) the mesh spans every host's devices; pass
global arrays (e.g. jax.make_array_from_process_local_data with IN_SPECS).
"""

import base64

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXES = {axes}
SHAPE = {shape}
{device_ids}
PLATFORMS = {platforms}

# the workbench schedule this step was planned with (workbench.Session(program, mesh, ...))
SCHEDULE = [
{schedule}
]
PIPELINE = {facts}
# per stage (index along PIPELINE["axis"]): the model blocks it runs
STAGES = [
{stages}
]
# per stage: its work in the order it runs (F/B/W: forward/backward/weight pass; the
# microbatch; .c: model chunk c)
WORK = [
{work}
]

# one (path in the arguments, see path_text; shape; dtype) per leaf, in jax.tree_util order
ARGS = [
{args}
]
ARG_TREE = {arg_tree}
# one (name, shape, dtype) per output leaf
OUTS = [
{outs}
]
# one spec per leaf of the arguments and of the outputs: where the step takes and leaves them
IN_SPECS = [
{in_specs}
]
OUT_SPECS = [
{out_specs}
]

# the serialized jax.export.Exported, base64
STEP = (
{step}
)


def make_mesh(devices=None):
    """A mesh of SHAPE over ``devices`` (default: every device of every host)."""
    devices = jax.devices() if devices is None else list(devices)
    if len(devices) != int(np.prod(SHAPE)):
        raise ValueError(f"this pipelined step was compiled for {{int(np.prod(SHAPE))}} devices ({{dict(zip(AXES, SHAPE))}}); {{len(devices)}} are attached. Run it on that many, or export it again from a session on a mesh of these.")
    devices = np.asarray(devices, dtype=object)
    grid = devices.reshape(SHAPE) if DEVICE_IDS is None else devices[np.asarray(DEVICE_IDS)]
    return Mesh(grid, AXES)


def load():
    """The compiled step, a jax.export.Exported."""
    return jax.export.deserialize(bytearray(base64.b64decode(STEP)))


def path_text(path):
    """A leaf's path in the arguments as ARGS writes it: 0/layers/1/w (argument 0, ...)."""
    return "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def check_arguments(args):
    """Raise ValueError naming the first leaf of ``args`` unlike ARGS (and what would work)."""
    leaves = jax.tree_util.tree_flatten_with_path(args)[0]
    for i, ((path, leaf), (want, shape, dtype)) in enumerate(zip(leaves, ARGS)):
        have = (path_text(path), tuple(np.shape(leaf)), str(jax.numpy.result_type(leaf)))
        if have != (want, tuple(shape), dtype):
            raise ValueError(
                f"argument leaf #{{i}} is {{have[0]}}: {{have[2]}}{{list(have[1])}}, but this step was "
                f"compiled for {{want}}: {{dtype}}{{list(shape)}}; pass arguments of the shapes and "
                "dtypes in ARGS (export again from a session captured with these to run them)"
            )
    tree = str(jax.tree_util.tree_structure(args))
    if len(leaves) != len(ARGS) or tree != ARG_TREE:
        raise ValueError(
            f"the arguments hold {{len(leaves)}} leaves in {{tree[:300]}}, but this step was "
            f"compiled for {{len(ARGS)}} in {{ARG_TREE[:300]}}; pass the arguments as ARGS lists them"
        )


def partitioned(fn, mesh=None):
    """The pipelined step on ``mesh`` (default: make_mesh()); ``fn``: the step it was
    exported from, giving the outputs' tree."""
    mesh = make_mesh() if mesh is None else mesh
    platform = mesh.devices.flat[0].platform
    if platform not in PLATFORMS:
        raise ValueError(f"this step was compiled for {{PLATFORMS}}, not for {{platform!r}} devices")
    exported = load()
    jitted = jax.jit(
        exported.call,
        in_shardings=tuple(NamedSharding(mesh, s) for s in IN_SPECS),
        out_shardings=tuple(NamedSharding(mesh, s) for s in OUT_SPECS),
    )
    cache = {{}}

    def call(*args):
        check_arguments(args)
        if "tree" not in cache:
            shapes = jax.eval_shape(fn, *args)
            outs = [(tuple(x.shape), str(x.dtype)) for x in jax.tree_util.tree_leaves(shapes)]
            if outs != [(tuple(s), d) for _, s, d in OUTS]:
                raise ValueError(
                    f"{{getattr(fn, '__name__', fn)}} computes {{len(outs)}} outputs, not the "
                    f"{{len(OUTS)}} in OUTS this step was compiled to: pass the step it was exported from"
                )
            cache["tree"] = jax.tree_util.tree_structure(shapes)
        outs = jitted(*jax.tree_util.tree_leaves(args))
        return jax.tree_util.tree_unflatten(cache["tree"], outs)

    return call
'''


def export_pipeline(session, pipeline, mode: str = "constrained") -> str:
    """A standalone module running ``session``'s pipelined step (its ``Pipeline``,
    `strategies.pipeline`): the pipeline lowering serialized by ``jax.export`` for the
    captured shapes and dtypes and this mesh shape. ``mode="explicit"`` is refused."""
    if mode not in MODES:
        raise InputError(
            f"export_jax: mode {given(mode)} is not one of {MODES}; pass 'constrained' (for a "
            "pipelined step: the compiled pipeline)."
        )
    if mode == "explicit":
        raise InputError(
            f"export_jax(mode='explicit'): this session pipelines the step ({pipeline.tactic}), "
            "and a pipeline schedule is not a sharding that JAX's explicit mode can carry in "
            "types; export_jax() (mode='constrained') writes the compiled pipeline instead."
        )
    program, state = session.program, session.state
    fn, jmesh = session.lower()
    exported, platforms = _export(program, state, fn, jmesh)
    text = base64.b64encode(exported.serialize()).decode("ascii")
    facts = {
        "axis": pipeline.axis,
        "stages": pipeline.stages,
        "microbatches": pipeline.microbatches,
        "batch": pipeline.batch,
        "schedule": pipeline.schedule.kind,
        "virtual_stages": pipeline.virtual_stages,
    }
    stages = []
    for s in range(pipeline.stages):
        chunks = ["blocks " + ", ".join(map(str, c.blocks)) for c in pipeline.chunks(s)]
        stages.append(f"    {literal(f'stage {s}: ' + '; '.join(chunks))},")
    work = [f"    {literal(' '.join(map(str, row)))}," for row in pipeline.schedule.table]
    in_specs = [f"    {_spec_code(state.shardings[v])}," for v in program.inputs]
    out_specs = [
        f"    {_spec_code(state.shardings[v]) if isinstance(v, int) else 'P()'},"
        for v in program.outputs
    ]
    args = [
        f"    ({literal(path)}, {literal(tuple(x.shape))}, {literal(str(x.dtype))}),"
        for path, x in zip(_paths(program), program.input_values)
    ]
    outs = [
        f"    ({literal(name)}, {literal(tuple(a.shape))}, {literal(str(a.dtype))}),"
        for name, a in zip(program.output_names, exported.out_avals)
    ]
    tree = program.in_tree
    return _TEMPLATE.format(
        name=literal(program.name),
        mesh_text=literal(dict(session.mesh.axes)),
        pipeline=literal(str(pipeline)),
        axes=literal(session.mesh.names),
        shape=literal(session.mesh.sizes),
        device_ids=device_ids_code(session),
        platforms=literal(platforms),
        schedule="\n".join(f"    {literal(_tactic_code(t))}," for t in exported_tactics(session)),
        facts=literal(facts),
        stages="\n".join(stages),
        work="\n".join(work),
        args="\n".join(args),
        arg_tree=literal(str(tree) if tree is not None else ""),
        outs="\n".join(outs),
        in_specs="\n".join(in_specs),
        out_specs="\n".join(out_specs),
        step="\n".join(f"    {literal(text[i : i + 96])}" for i in range(0, len(text), 96)),
    )


def _export(program, state, fn, jmesh):
    """``fn`` (the pipeline lowering, jitted) exported with its inputs' shardings for the
    captured shapes: for every platform of ``PLATFORMS`` that lowers, else the one here."""
    if importlib.util.find_spec("flatbuffers") is None:  # jax.export serializes with it
        raise WorkbenchError(
            "export_jax of a pipelined step serializes it with jax.export, which needs the "
            "flatbuffers package: pip install flatbuffers."
        )
    shardings = [
        NamedSharding(jmesh, PartitionSpec(*state.shardings[v].spec())) for v in program.inputs
    ]
    jitted = jax.jit(fn, in_shardings=shardings)
    avals = [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in program.input_values]
    try:
        return jax.export.export(jitted, platforms=PLATFORMS)(*avals), PLATFORMS
    except Exception:  # a platform without a lowering rule for some op: this one only
        here = (jmesh.devices.flat[0].platform,)
        return jax.export.export(jitted, platforms=here)(*avals), here


def _paths(program) -> list[str]:
    """Each input's path in the arguments as passed, as the module's ``path_text`` writes it."""
    n = len(program.inputs)
    if program.in_tree is None:
        return [str(i) for i in range(n)]
    tree = jax.tree_util.tree_unflatten(program.in_tree, range(n))
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [
        "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in p)
        for p, _ in leaves
    ]
