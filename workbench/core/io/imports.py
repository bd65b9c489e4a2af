"""Read the shardings a user already has into a schedule of tactics.

Sources, in the order their tactics enter the schedule (earlier decides first):

- the shardings in the types of a step written in JAX's explicit sharding mode: every
  argument's and value's type on the mesh's ``Explicit`` axes, which holds what each
  ``reshard`` (``auto_axes`` and ``explicit_axes`` lower to it) and each ``out_sharding=``
  asks for; one step, as the types are decided together (an earlier source's propagation
  would pre-empt a ``reshard`` that moves an axis). The types are the program's sharding
  (JAX computes exactly them), so each typed value is also held whole (``Atomic``) on every
  ``Explicit`` axis its type leaves whole; ``Auto`` axes stay free, the compiler's to place;
- ``in_shardings``: a pytree like the arguments (a prefix of it also works: one spec for a
  whole argument) of ``PartitionSpec``s, ``NamedSharding``s or None; or, when the step is a
  ``jax.jit`` function, the ``in_shardings`` it was jitted with;
- ``logical_axes`` and ``rules``: Flax's logical axis names per argument leaf (as
  ``nnx.get_partition_spec`` or ``flax.linen.get_partition_spec`` give them) and the rules
  that map them onto mesh axes;
- the ``with_sharding_constraint`` calls inside the step;
- ``out_shardings``, like ``in_shardings`` for the outputs.

Each source becomes one ``Imported`` step: its tiles apply in one go and it is undone,
explained (``why``) and exported as the tiles it holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable

import jax
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from workbench.core import ops
from workbench.core.errors import InputError, TacticError, WorkbenchError, given
from workbench.core.io.specs import logical_leaves, spec_entry
from workbench.core.ir.selectors import exact
from workbench.core.ops.elementwise import constraint_target
from workbench.core.propagate.propagation import op_index
from workbench.core.propagate.tactics import Atomic, Tactic, Tile

#: ``(selector, dim, axis)`` per tile
Triples = tuple[tuple[str, int, str], ...]
#: ``(selectors, axis)`` per mesh axis: the values held whole on it
Holds = tuple[tuple[tuple[str, ...], str], ...]


def _holds(source: str, whole) -> Holds | None:
    """``whole`` checked and frozen (None when it holds nothing)."""
    if whole is not None and not isinstance(whole, list | tuple):
        raise TacticError(
            f"Imported({source!r}): whole is a list of (selectors, axis) pairs, e.g. "
            f"[(['h'], 'model')], or None; got {given(whole)}."
        )
    out = []
    for h in whole or ():
        ok = isinstance(h, list | tuple) and len(h) == 2 and isinstance(h[1], str)
        names = h[0] if ok else None
        if not (
            isinstance(names, list | tuple) and names and all(isinstance(n, str) for n in names)
        ):
            raise TacticError(
                f"Imported({source!r}): each entry of whole is (selectors, axis), e.g. "
                f"(['h', 'params/w'], 'model'); got {given(h)}."
            )
        out.append((tuple(names), h[1]))
    return tuple(out) or None


@dataclasses.dataclass(frozen=True, slots=True)
class Imported(Tactic):
    """The tiles a plan the user already has makes, from ``source`` (e.g. "in_shardings"):
    ``tiles`` holds ``(selector, dim, axis)`` triples, ``whole`` per mesh axis the values
    held whole on it (``Atomic``: what a type leaves whole on an ``Explicit`` axis). They are
    the user's decisions all at once: every tile and hold is seeded, then propagation runs
    (``one_pass``), so no tile's propagation pre-empts another's."""

    source: str
    tiles: Triples
    whole: Holds | None = None
    one_pass = True

    def __post_init__(self):
        triples = tuple(tuple(t) for t in self.tiles)
        for t in triples:
            if not (
                len(t) == 3
                and isinstance(t[0], str)
                and isinstance(t[1], int)
                and not isinstance(t[1], bool)
                and isinstance(t[2], str)
            ):
                raise TacticError(
                    f"Imported({self.source!r}): each tile is (selector, dim, axis), e.g. "
                    f"('params/w', 0, 'data'); got {t!r}."
                )
        object.__setattr__(self, "tiles", triples)
        object.__setattr__(self, "whole", _holds(self.source, self.whole))

    def __str__(self) -> str:
        held = sum(len(names) for names, _ in self.whole or ())
        return f"Imported({self.source!r}, {len(self.tiles)} tiles" + (
            f", {held} held whole)" if held else ")"
        )

    @property
    def axis(self) -> str:
        """The mesh axes its tiles and holds use, comma-separated."""
        axes = [axis for _, _, axis in self.tiles] + [axis for _, axis in self.whole or ()]
        return ",".join(dict.fromkeys(axes))

    def expand(self, program, mesh, state):
        tiles = [Tile(selector, dim, axis) for selector, dim, axis in self.tiles]
        return tiles + [Atomic(names, axis) for names, axis in self.whole or ()]


def _as_spec(sharding) -> PartitionSpec | None:
    if sharding is None or isinstance(sharding, PartitionSpec):
        return sharding
    if isinstance(sharding, NamedSharding):
        return sharding.spec
    return None  # jit's UNSPECIFIED, or a sharding that is not a mesh's: left to propagation


def _is_leaf(x) -> bool:
    return x is None or isinstance(x, PartitionSpec | NamedSharding)


def tiles_for(names, specs, mesh) -> Triples:
    """A ``(selector, dim, axis)`` per dim and axis the specs place, major axis first."""
    out = []
    for name, spec in zip(names, specs):
        if spec is None or name is None:  # left to propagation, or a literal output
            continue
        for dim, entry in enumerate(spec):
            for axis in (entry,) if isinstance(entry, str) else (entry or ()):
                if axis not in mesh.names:
                    raise WorkbenchError(
                        f"{name}: its sharding names mesh axis {axis!r}, which {mesh} does not "
                        "have; pass the mesh the shardings were written for."
                    )
                out.append((exact(name), dim, axis))
    return tuple(out)


def flat_specs(tree, arguments, what: str) -> list:
    """One spec (or None) per leaf of ``arguments`` from a full tree or a prefix of it."""
    if isinstance(tree, PartitionSpec | NamedSharding):
        return [_as_spec(tree)] * sum(t.num_leaves for t in arguments)
    if isinstance(tree, str | bytes | int | float):
        raise InputError(
            f"{what}={given(tree)} is not a sharding; pass one per argument (a PartitionSpec "
            "tree shaped like it, a NamedSharding, or None), e.g. (P(), P('batch'))."
        )
    parts = tuple(tree) if isinstance(tree, list | tuple) else (tree,)
    if len(parts) != len(arguments):
        raise InputError(
            f"{what} has {len(parts)} entries but the step takes {len(arguments)} arguments; "
            "pass one per argument (a PartitionSpec tree shaped like it, or None)."
        )
    out = []
    for part, arg in zip(parts, arguments):
        leaves = jax.tree_util.tree_leaves(part, is_leaf=_is_leaf)
        if isinstance(part, PartitionSpec | NamedSharding) or part is None:
            out += [_as_spec(part)] * arg.num_leaves
        elif len(leaves) == arg.num_leaves:
            out += [_as_spec(leaf) for leaf in leaves]
        else:
            raise WorkbenchError(
                f"{what}: an argument with {arg.num_leaves} arrays got a tree with {len(leaves)} "
                "specs; pass a tree shaped like the argument, or one spec for all of it."
            )
    return out


def checked_logical_axes(logical_axes, arguments) -> tuple:
    """``logical_axes`` as one entry per argument (a tree of logical-name tuples, or None)."""
    if not isinstance(logical_axes, list | tuple) or len(logical_axes) != len(arguments):
        raise InputError(
            f"logical_axes={given(logical_axes)} is not one entry per argument of the step "
            f"({len(arguments)}); pass a tuple with, per argument, its tree of logical names "
            "(as nnx.get_partition_spec or flax.linen.get_partition_spec give them) or None."
        )
    return tuple(logical_axes)


def checked_rules(rules) -> list:
    """``rules`` as (logical name, mesh axis or axes or None) pairs."""
    example = "e.g. rules=[('batch', 'data'), ('mlp', 'model'), ('embed', None)]"
    if isinstance(rules, str | bytes) or not isinstance(rules, Iterable):
        raise InputError(
            f"rules={given(rules)} is not a list of (logical name, mesh axes) pairs; {example}."
        )
    out = []
    for rule in rules:
        ok = isinstance(rule, list | tuple) and len(rule) == 2 and isinstance(rule[0], str)
        axes = rule[1] if ok else None
        ok = ok and (
            axes is None
            or isinstance(axes, str)
            or (isinstance(axes, list | tuple) and all(isinstance(a, str) for a in axes))
        )
        if not ok:
            raise InputError(
                f"rules holds {given(rule)}, not a (logical name, mesh axis or axes or None) pair; {example}."
            )
        out.append(tuple(rule))
    return out


def logical_specs(logical_axes, rules, arguments) -> list:
    """Flax's logical names mapped through ``rules``: each name takes the first rule's mesh
    axis not already used by the same array (as ``flax.linen.logical_to_mesh_axes``)."""
    rules = [(name, axes) for name, axes in rules]
    out = []
    for part, arg in zip(logical_axes, arguments):
        if part is None:
            out += [None] * arg.num_leaves
            continue
        leaves = logical_leaves(part, arg)
        for names in leaves:
            used, entries = set(), []
            for name in names or ():
                pick = None
                for rule_name, axes in rules:
                    cand = (axes,) if isinstance(axes, str) else tuple(axes or ())
                    if rule_name == name and not used & set(cand):
                        pick = cand
                        break
                used |= set(pick or ())
                entries.append(spec_entry(pick or ()))
            out.append(PartitionSpec(*entries) if names is not None else None)
    return out


def jit_shardings(step, program) -> tuple[list, list] | None:
    """The in and out shardings a ``jax.jit`` function was made with, read off the captured
    program's jit equation (None if ``step`` is not one)."""
    if not hasattr(step, "lower"):
        return None
    eqns = program.jaxpr.jaxpr.eqns
    if len(eqns) != 1 or "in_shardings" not in eqns[0].params:  # not one jitted call
        return None
    params = eqns[0].params
    return (
        [_as_spec(s) for s in params.get("in_shardings", ())],
        [_as_spec(s) for s in params.get("out_shardings", ())],
    )


def constraint_tiles(program, mesh, source: str = "with_sharding_constraint") -> Triples:
    """Tiles for the constraint calls of ``source`` inside the step (see ``ops``'s
    ``constraint_target``)."""
    names, specs = [], []
    for op in program.walk():
        if not ops.traits(op.primitive).constraint:
            continue
        target = constraint_target(op)
        spec = _as_spec(target[1]) if target is not None and target[0] == source else None
        if spec is not None:
            names.append(program.values[op.results[0]].name)
            specs.append(spec)
    return tiles_for(names, specs, mesh)


def _explicit_axes(sharding) -> tuple[str, ...]:
    """The ``Explicit`` axes of a type's mesh, in mesh order (none if it is no mesh's)."""
    mesh = getattr(sharding, "mesh", None)
    if not isinstance(sharding, NamedSharding) or mesh is None:
        return ()
    return tuple(a for a, t in zip(mesh.axis_names, mesh.axis_types) if t == AxisType.Explicit)


def explicit_spec(sharding) -> tuple | None:
    """What a sharding in a type decides: per dim, its axes that are ``Explicit`` on its
    mesh (``Auto`` axes are the compiler's to place); None where it decides nothing."""
    explicit = _explicit_axes(sharding)
    if not explicit:
        return None
    return tuple(
        tuple(a for a in ((e,) if isinstance(e, str) else (e or ())) if a in explicit)
        for e in sharding.spec
    )


def whole_axes(sharding) -> tuple[str, ...]:
    """The ``Explicit`` axes a type holds its value whole on: those no dim uses and no
    pending (``unreduced``) sum names."""
    spec = explicit_spec(sharding)
    if spec is None:
        return ()
    used = {a for axes in spec for a in axes} | set(getattr(sharding.spec, "unreduced", ()))
    return tuple(a for a in _explicit_axes(sharding) if a not in used)


def typed_values(program) -> list[tuple[int, object]]:
    """``(value id, aval)`` of the inputs and of every top-level op's results (calls
    entered, as capture enters them), read off the captured jaxpr."""
    closed = program.jaxpr
    out = list(zip(program.inputs, (v.aval for v in closed.jaxpr.invars)))
    body = iter(program.body)

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            call = ops.traits(eqn.primitive.name).call
            if call is not None and call.param in eqn.params:
                sub = eqn.params[call.param]
                walk(getattr(sub, "jaxpr", sub))
                continue
            oid = next(body, None)
            op = None if oid is None else program.ops[oid]
            if op is None or op.primitive != eqn.primitive.name:
                raise WorkbenchError(
                    f"{program.name}: its jaxpr's equation {eqn.primitive.name} does not line up "
                    "with the program's ops; the types can be read only from the jaxpr capture "
                    "walked (capture the step again)."
                )
            out.extend(zip(op.results, (v.aval for v in eqn.outvars)))

    walk(closed.jaxpr)
    return out


def summed_axes(program, v, typed) -> set[str]:
    """The axes ``v``'s producer contracts: those an operand's type puts on a dim the op
    sums over. JAX reduces that sum inside the op; the plan holds it pending until the
    first use fetches it whole, the same all-reduce at the same place."""
    o = program.values[v].producer
    if o is None or program.ops[o].regions:
        return set()
    ix = op_index(program)[o]
    contracting = ix.mapping.contracting
    out = set()
    for t in range(ix.n_in):
        spec = explicit_spec(typed.get(ix.tensors[t]))
        for d, axes in enumerate(spec or ()):
            if contracting & set(ix.dims[t][d]):
                out.update(axes)
    return out


def type_plan(program, mesh) -> tuple[Triples, Holds]:
    """The tiles the types carry (JAX's explicit sharding mode), and per ``Explicit`` axis
    the values their types hold whole on it."""
    names, specs, holds = [], [], {}
    typed = {v: getattr(aval, "sharding", None) for v, aval in typed_values(program)}
    for v, sharding in typed.items():
        spec = explicit_spec(sharding)
        if spec is None:
            continue
        name = program.values[v].name
        if any(spec):
            names.append(name)
            specs.append(spec)
        summed = summed_axes(program, v, typed)
        for axis in whole_axes(sharding):
            if axis in summed:
                continue
            if axis not in mesh.names:
                raise WorkbenchError(
                    f"{name}: its type is on a mesh with Explicit axis {axis!r}, which {mesh} "
                    "does not have; pass the mesh the step was written for."
                )
            holds.setdefault(axis, []).append(exact(name))
    held = tuple((tuple(dict.fromkeys(n)), a) for a, n in holds.items())
    return tiles_for(names, specs, mesh), held


def without_types(program):
    """``program`` free of the user's mesh once its types are read (the schedule holds
    them): params naming layouts on it dropped (``out_sharding=``, created arrays' types;
    what every lowering drops) and the example arrays as host copies. Its runs, the
    unpartitioned ones included, then place every value on the mesh they run on."""
    from workbench.core.ir.program import DerivedCache
    from workbench.core.lowering.run import host_copy
    from workbench.core.ops.local import local_params

    ops_ = tuple(dataclasses.replace(op, params=local_params(op)) for op in program.ops)
    example = program.example_args
    return dataclasses.replace(
        program,
        ops=ops_,
        example_args=None if example is None else tuple(host_copy(a) for a in example),
        cache=DerivedCache(),
    )


def explicit_context(args):
    """The mesh to trace ``args`` under: none is needed where a context mesh is set or no
    argument is placed on a mesh of ``Explicit`` axes; else that mesh (a step written for
    explicit sharding names its axes in ``P(...)``, which JAX resolves on the context mesh)."""
    if not jax.sharding.get_abstract_mesh().empty:
        return contextlib.nullcontext()
    for leaf in jax.tree_util.tree_leaves(args):
        sharding = getattr(leaf, "sharding", None)
        mesh = getattr(sharding, "mesh", None)
        if (
            isinstance(sharding, NamedSharding)
            and isinstance(mesh, jax.sharding.Mesh)
            and AxisType.Explicit in mesh.axis_types
        ):
            return jax.set_mesh(mesh)
    return contextlib.nullcontext()


def import_plan(
    step,
    args,
    *,
    mesh,
    in_shardings=None,
    out_shardings=None,
    logical_axes=None,
    rules=None,
):
    """``(program, schedule)``: the step captured, and its plan as ``Imported`` steps."""
    from workbench.core.ir.capture import capture

    with explicit_context(args):
        program = capture(step, *args)
    arguments = program.in_tree.children()
    inputs = [program.values[v].name for v in program.inputs]
    outputs = [program.values[v].name if isinstance(v, int) else None for v in program.outputs]
    types, held = type_plan(program, mesh)
    if types or held:
        program = without_types(program)
    schedule = [Imported("sharding types", types, held)]
    jitted = (
        jit_shardings(step, program) if in_shardings is None and out_shardings is None else None
    )
    if jitted is not None:
        ins, outs = jitted
        schedule.append(Imported("jit in_shardings", tiles_for(inputs, ins, mesh)))
        out_tiles = tiles_for(outputs, outs, mesh)
    else:
        if in_shardings is not None:
            specs = flat_specs(in_shardings, arguments, "in_shardings")
            schedule.append(Imported("in_shardings", tiles_for(inputs, specs, mesh)))
        out_tiles = ()
        if out_shardings is not None:
            specs = flat_specs(
                out_shardings, program.out_tree.children() or [program.out_tree], "out_shardings"
            )
            out_tiles = tiles_for(outputs, specs, mesh)
    if logical_axes is not None:
        if rules is None:
            raise WorkbenchError(
                "logical_axes needs the rules that map them onto mesh axes, e.g. "
                "rules=[('batch', 'data'), ('mlp', 'model'), ('embed', None)]."
            )
        specs = logical_specs(
            checked_logical_axes(logical_axes, arguments), checked_rules(rules), arguments
        )
        schedule.append(Imported("logical axis rules", tiles_for(inputs, specs, mesh)))
    schedule.append(Imported("with_sharding_constraint", constraint_tiles(program, mesh)))
    schedule.append(Imported("out_shardings", out_tiles))
    return program, [t for t in schedule if t.tiles or t.whole]
