"""Capture: trace a JAX function into a ``Program`` with stable, readable value names.

Names:
- inputs by argument name and pytree path: ``params/layers/0/attn/wq``;
- outputs by pytree path under ``out``: ``out/loss``, ``out/params/layers/0/attn/wq``;
- values tagged with ``workbench.tag`` by their scope and tag: ``layer0/attn_out``;
- other intermediates by scope, primitive and a per-scope count: ``layer0/mlp/dot_general.1``;
  ops of the backward pass are prefixed ``bwd/``;
- values inside a loop body under the loop op's name: ``transformer/scan.0/blk/mlp/tanh.0``,
  and its inputs by role and the outer value they stand for: ``scan.0/x[params/layers/wq]``.

Dead code is dropped first, as XLA drops it (``_without_dead_code``).
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import jax
import numpy as np
from jax.extend import core as jex

from workbench.core.dtypes import as_dtype
from workbench.core.errors import CaptureError
from workbench.core.ir.phases import dataflow_phases
from workbench.core.ir.program import Lit, Op, Operand, Program, Region, Value
from workbench.core.ir.source_lines import code_lines, package_dirs
from workbench.core.ops import traits as traits_of


def _path_text(path) -> str:
    parts = []
    for key in path:
        for attr in ("key", "idx", "name"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


def _split_name_stack(name_stack) -> tuple[tuple[str, ...], bool]:
    """Scope components and whether a ``transpose`` (the backward pass) wraps them."""
    scopes, backward = [], False
    for entry in getattr(name_stack, "stack", ()):
        kind = type(entry).__name__
        if kind == "Transform":
            backward |= entry.name == "transpose"
        elif entry.name:
            scopes.extend(p for p in entry.name.split("/") if p)
    return tuple(scopes), backward


def _is_concrete(leaf) -> bool:
    return isinstance(leaf, np.ndarray | np.generic | jax.Array | int | float | bool | complex)


class _Builder:
    """Walks a jaxpr and its sub-jaxprs, creating values and ops in program order."""

    def __init__(self):
        self.values: list[dict] = []
        self.ops: list[Op | None] = []
        self.consts: dict[int, np.ndarray] = {}
        self.counters: dict[tuple[str, str], int] = defaultdict(int)
        self.taken: set[str] = set()
        self.scalars: dict[int, np.ndarray] = {}  # rank-0 values known at capture time
        self.packages = package_dirs()
        self.lines: dict = {}  # traceback -> (user line, library line)

    # -- names -----------------------------------------------------------------------------
    def unique(self, name: str) -> str:
        if name not in self.taken:
            self.taken.add(name)
            return name
        k = 1
        while f"{name}.{k}" in self.taken:
            k += 1
        self.taken.add(f"{name}.{k}")
        return f"{name}.{k}"

    def new_value(self, name, aval, kind, producer=None, region_of=None) -> int:
        vid = len(self.values)
        self.values.append(
            dict(
                id=vid,
                name=self.unique(name),
                shape=tuple(int(d) for d in aval.shape),
                dtype=as_dtype(aval.dtype),
                kind=kind,
                producer=producer,
                region_of=region_of,
            )
        )
        return vid

    def op_name(self, prefix: str, primitive: str) -> str:
        k = self.counters[(prefix, primitive)]
        self.counters[(prefix, primitive)] = k + 1
        short = "tag" if traits_of(primitive).tag else primitive
        return f"{prefix}/{short}.{k}" if prefix else f"{short}.{k}"

    # -- walking ---------------------------------------------------------------------------
    def read(self, env: dict, atom) -> Operand:
        if isinstance(atom, jex.Literal):
            aval = atom.aval
            return Lit(atom.val, tuple(aval.shape), as_dtype(aval.dtype))
        return env[atom]

    def bind_consts(self, closed, env, prefix, region_of):
        jaxpr = getattr(closed, "jaxpr", closed)
        for var, val in zip(jaxpr.constvars, getattr(closed, "consts", ())):
            vid = self.new_value(
                f"{prefix}/const" if prefix else "const", var.aval, "const", region_of=region_of
            )
            self.consts[vid] = np.asarray(val)
            env[var] = vid
        return jaxpr

    def emit(self, jaxpr, env, ctx) -> list[int]:
        """Emit the equations of ``jaxpr`` under context ``ctx``; returns the op ids in order."""
        order: list[int] = []
        for eqn in jaxpr.eqns:
            prim = eqn.primitive.name
            scopes, backward = _split_name_stack(eqn.source_info.name_stack)
            sub = dict(ctx, scope=ctx["scope"] + scopes, backward=ctx["backward"] or backward)
            operands = tuple(self.read(env, v) for v in eqn.invars)
            call = traits_of(prim).call
            if call is not None and call.param in eqn.params:
                callee = eqn.params[call.param]
                scope = eqn.params.get(call.scope) if call.scope else None
                if scope not in (None, "<lambda>"):
                    sub["scope"] = sub["scope"] + (str(scope),)
                sub["lines"] = self.code_lines(eqn.source_info.traceback, ctx)
                inner_env: dict = {}
                inner = self.bind_consts(callee, inner_env, self.prefix(sub), ctx["region_of"])
                for var, operand in zip(inner.invars, operands):
                    inner_env[var] = operand
                order += self.emit(inner, inner_env, sub)
                for var, atom in zip(eqn.outvars, inner.outvars):
                    env[var] = self.read(inner_env, atom)
                continue
            order.append(self.emit_op(eqn, prim, operands, env, sub))
        return order

    def prefix(self, ctx) -> str:
        parts = [ctx["base"]] if ctx["base"] else []
        if ctx["backward"] and not ctx["base"]:
            parts.append("bwd")
        parts.extend(ctx["scope"])
        return "/".join(parts)

    def emit_op(self, eqn, prim, operands, env, ctx) -> int:
        oid = len(self.ops)
        self.ops.append(None)
        prefix = self.prefix(ctx)
        name = self.op_name(prefix, prim)
        phase = "backward" if ctx["backward"] else "forward"  # the update: see ``phases``
        results = []
        traits = traits_of(prim)
        for k, var in enumerate(eqn.outvars):
            if traits.tag:
                tag = str(eqn.params.get(traits.tag, "tag"))
                vname = f"{self.prefix(dict(ctx, backward=False))}/{tag}".lstrip("/")
            else:
                vname = name if len(eqn.outvars) == 1 else f"{name}:{k}"
            vid = self.new_value(
                vname, var.aval, "intermediate", producer=oid, region_of=ctx["region_of"]
            )
            results.append(vid)
            if not isinstance(var, jex.DropVar):
                env[var] = vid
        if traits.cast and isinstance(operands[0], Lit) and not operands[0].shape:
            self.scalars[results[0]] = np.asarray(operands[0].value).astype(
                self.values[results[0]]["dtype"]
            )
        source, library = self.code_lines(eqn.source_info.traceback, ctx)
        ctx = dict(ctx, lines=(source, library))  # a region's body traced where the op was
        regions = self.emit_regions(eqn, traits.control, oid, name, operands, ctx)
        self.ops[oid] = Op(
            id=oid,
            name=name,
            primitive=prim,
            params=dict(eqn.params),
            operands=operands,
            results=tuple(results),
            scope=ctx["scope"],
            phase=phase,
            regions=regions,
            parent=ctx["region_of"],
            source=source,
            library=library,
            jax_primitive=eqn.primitive,
        )
        return oid

    def code_lines(self, traceback, ctx) -> tuple[str, str]:
        """The user's line and the library's that made an equation (``source_lines``).
        JAX traces a function under ``jit`` (and a loop's body) with the frames inside it
        only: an equation with no user frame there takes the line of the call around it."""
        lines = self.lines.get(traceback)
        if lines is None:
            lines = self.lines[traceback] = code_lines(traceback, self.packages)
        if lines[0] or not ctx["lines"][0]:
            return lines
        return ctx["lines"][0], lines[1] or ctx["lines"][1]

    # -- regions (scan, while, cond) ---------------------------------------------------------
    def emit_regions(self, eqn, control, oid, name, operands, ctx) -> tuple[Region, ...]:
        """The regions of a loop or branch (``control``: the op's control-flow trait)."""
        if control is None:
            return ()
        return tuple(
            self.region(rname, closed, oid, name, roles, outer, ctx)
            for rname, closed, roles, outer in control.regions(eqn.params, operands)
        )

    def region(self, rname, closed, oid, op_name, roles, outer_operands, ctx) -> Region:
        base = f"{op_name}/{rname}" if rname != "body" else op_name
        sub = dict(scope=(), backward=ctx["backward"], base=base, region_of=oid, lines=ctx["lines"])
        env: dict = {}
        jaxpr = self.bind_consts(closed, env, base, oid)
        inputs = []
        for i, (var, role, outer) in enumerate(zip(jaxpr.invars, roles, outer_operands)):
            label = (
                f"{role}[{self.values[outer]['name']}]" if isinstance(outer, int) else f"{role}{i}"
            )
            vid = self.new_value(
                f"{base}/{label}", var.aval, "region_input", producer=oid, region_of=oid
            )
            env[var] = vid
            inputs.append(vid)
        op_ids = self.emit(jaxpr, env, sub)
        outputs = tuple(self.read(env, v) for v in jaxpr.outvars)
        return Region(rname, tuple(inputs), outputs, tuple(op_ids))


def bind_arguments(fn: Callable, args, kwargs) -> tuple[list[str], list]:
    """Argument names and values, by ``fn``'s signature where it has a plain one."""
    try:
        sig = inspect.signature(fn)
        bound = sig.bind(*args, **kwargs)
        kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        if any(sig.parameters[name].kind in kinds for name in bound.arguments):
            raise TypeError
        return list(bound.arguments), list(bound.arguments.values())
    except (TypeError, ValueError):
        return [f"arg{i}" for i in range(len(args))] + list(kwargs), list(args) + list(
            kwargs.values()
        )


#: Where the function's own result goes when arguments were updated in place.
RESULT = "result"


def updated_in_place(arg_names, tree_args, flat, arg_trees, result) -> dict:
    """The arguments whose leaves the call replaced and did not return, by name: a step
    that updates objects in place (``nnx.Optimizer.update``, an ``nnx.jit`` step on
    ``nnx.Module``s) returns nothing for them, so capture makes them outputs.
    ``arg_trees``: the arguments' treedefs; ``result``: what the call returned."""
    returned = {id(leaf) for leaf in jax.tree_util.tree_leaves(result)}
    updated, start = {}, 0
    for name, arg, tree in zip(arg_names, tree_args, arg_trees):
        before = flat[start : start + tree.num_leaves]
        start += tree.num_leaves
        now = jax.tree_util.tree_leaves(arg)
        changed = len(now) != len(before) or any(a is not b for a, b in zip(now, before))
        if changed and not all(id(leaf) in returned for leaf in now):
            updated[name if name != RESULT else f"{name}_arg"] = arg
    return updated


def capture(fn: Callable, *args, **kwargs) -> Program:
    """Trace ``fn(*args, **kwargs)`` into a Program.

    Arguments may be arrays or ``jax.ShapeDtypeStruct``s (plan a model without its
    memory), or pytrees of objects a step updates in place (``flax.nnx`` modules and
    optimizers): those become outputs too, ``out/<argument>/...``, and the function's
    result is ``out/result``. Pass non-array arguments with ``functools.partial``.
    """
    if not callable(fn):
        raise CaptureError(f"capture needs a function; got {type(fn).__name__} {fn!r}.")
    arg_names, arg_values = bind_arguments(fn, args, kwargs)

    leaves_with_paths, in_tree = jax.tree_util.tree_flatten_with_path(tuple(arg_values))
    leaves = [leaf for _, leaf in leaves_with_paths]
    input_names = []
    for path, _ in leaves_with_paths:
        top = arg_names[path[0].idx]
        rest = _path_text(path[1:])
        input_names.append(f"{top}/{rest}" if rest else top)

    def flat_fn(*flat):
        tree_args = jax.tree_util.tree_unflatten(in_tree, flat)
        out = fn(**dict(zip(arg_names, tree_args))) if kwargs else fn(*tree_args)
        updated = updated_in_place(arg_names, tree_args, flat, in_tree.children(), out)
        return {RESULT: out, **updated} if updated else out

    try:
        closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*leaves)
    except Exception as err:  # anything JAX raises while tracing the user's function
        name = getattr(fn, "__name__", repr(fn))
        raise CaptureError(
            f"JAX could not trace {name}({', '.join(arg_names)}): {type(err).__name__}: {err}\n"
            "Arguments must be arrays or jax.ShapeDtypeStruct pytrees; bind static arguments "
            "(sizes, flags, modules) with functools.partial, and make sure the function runs "
            "under jax.jit."
        ) from err

    closed = _without_dead_code(closed)
    out_paths, out_tree = jax.tree_util.tree_flatten_with_path(out_shape)
    output_names = tuple(("out/" + _path_text(p)).rstrip("/") for p, _ in out_paths)

    b = _Builder()
    env: dict = {}
    jaxpr = closed.jaxpr
    inputs = []
    for var, name in zip(jaxpr.invars, input_names):
        vid = b.new_value(name, var.aval, "input")
        env[var] = vid
        inputs.append(vid)
    for var, val in zip(jaxpr.constvars, closed.consts):
        vid = b.new_value("const", var.aval, "const")
        b.consts[vid] = np.asarray(val)
        env[var] = vid
    body = b.emit(
        jaxpr, env, dict(scope=(), backward=False, base="", region_of=None, lines=("", ""))
    )
    outputs = tuple(b.read(env, v) for v in jaxpr.outvars)

    renamed = set()
    for vid, oname in zip(outputs, output_names):
        if isinstance(vid, int) and vid not in renamed:
            rec = b.values[vid]
            op = b.ops[rec["producer"]] if rec["producer"] is not None else None
            if rec["kind"] == "intermediate" and op is not None and not traits_of(op.primitive).tag:
                b.taken.discard(rec["name"])
                rec["name"] = b.unique(oname)
                renamed.add(vid)

    concrete = all(_is_concrete(leaf) for leaf in leaves)
    return Program(
        values=tuple(Value(**rec) for rec in b.values),
        ops=_with_phases(b.ops, body, b.values),
        body=tuple(body),
        inputs=tuple(inputs),
        outputs=outputs,
        output_names=output_names,
        consts=b.consts,
        scalars=b.scalars,
        in_tree=in_tree,
        out_tree=out_tree,
        jaxpr=closed,
        example_args=tuple(leaves) if concrete else None,
        fn=fn,
        name=getattr(fn, "__name__", "program"),
    )


def _without_dead_code(closed):
    """``closed`` without the equations nothing it returns depends on, as XLA compiles it.
    JAX's loop autodiff leaves some: the backward scan of a step can carry a constant no
    iteration reads (a score-sized zero broadcast), which would otherwise be planned, held
    and priced. Inputs are all kept; effects are kept."""
    try:
        from jax._src.interpreters.partial_eval import dce_jaxpr
    except ImportError:  # a JAX without it: the program keeps its dead code
        return closed
    jaxpr, _ = dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars), instantiate=True)
    return closed.replace(jaxpr=jaxpr)


def _with_phases(ops: list[Op], body: list[int], values: list[dict]) -> tuple[Op, ...]:
    """Ops with their phase from dataflow (see ``phases``); region ops share their loop's."""
    position = {o: i for i, o in enumerate(body)}
    reads: list[list[int]] = [[] for _ in body]
    readers: list[list[int]] = [[] for _ in body]
    for i, o in enumerate(body):
        for v in ops[o].operands:
            producer = values[v]["producer"] if isinstance(v, int) else None
            if producer in position:
                reads[i].append(position[producer])
                readers[position[producer]].append(i)
    top = dataflow_phases(len(body), reads, readers, [ops[o].phase == "backward" for o in body])
    phase = {o: top[i] for i, o in enumerate(body)}
    for i, o in enumerate(body):  # a tag is the identity: it belongs where its operand is made
        if traits_of(ops[o].primitive).tag and reads[i]:
            phase[o] = phase[body[reads[i][0]]]
    out = []
    for op in ops:  # a region op comes before the ops of its regions
        p = phase.get(op.id) or ("backward" if op.phase == "backward" else phase[op.parent])
        phase[op.id] = p
        out.append(op if p == op.phase else replace(op, phase=p))
    return tuple(out)


def tag(x: Any, name: str) -> Any:
    """Name an intermediate (or every leaf of a pytree, as ``name/<path>``) for selectors.

    The identity everywhere: under jit, grad and vmap it is ``checkpoint_name``.
    """
    from jax.ad_checkpoint import checkpoint_name

    leaves, tree = jax.tree_util.tree_flatten_with_path(x)
    if len(leaves) == 1 and not leaves[0][0]:
        return checkpoint_name(x, name)
    named = [checkpoint_name(leaf, f"{name}/{_path_text(path)}") for path, leaf in leaves]
    return jax.tree_util.tree_unflatten(tree, named)
