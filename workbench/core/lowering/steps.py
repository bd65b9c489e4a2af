"""Redistribution steps as JAX collectives, inside ``shard_map``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from workbench.core.dtypes import is_extended
from workbench.core.layout.mesh import Mesh
from workbench.core.layout.redistribute import Step
from workbench.core.lowering import reductions
from workbench.core.ops.local import Zigzag, axis_name, jax_axes, shard_index, zigzag


def run_step(x, step: Step, mesh: Mesh, again: bool = False):
    """One step on a local array; a key array moves as its words (leading dims alike).

    ``again``: the plan makes this layout of the value a second time (gathered once per
    phase). The gather is then written as a stack and a reshape, which computes the same;
    as a second identical all-gather of the same operand, compilers would merge it with the
    first (common subexpressions) and hold that first gather's result across the phases.
    """
    if is_extended(x.dtype):
        impl = jax.random.key_impl(x)
        data = _ordered(jax.random.key_data(x), step, mesh, again)
        return jax.random.wrap_key_data(data, impl=impl)
    return _ordered(x, step, mesh, again)


def _ordered(x, step: Step, mesh: Mesh, again: bool):
    """The step, with a balanced sequence (`Zigzag`) taken from a whole dim in the
    devices' order before a split, and put back in order after a gather."""
    z = zigzag()
    if z is None:
        return _run(x, step, mesh, again)
    for d in range(len(step.before.dims)):
        if z.applies(step.after, d) and not z.applies(step.before, d):
            x = jnp.take(x, z.order(x.shape[d]), axis=d)
    x = _run(x, step, mesh, again)
    for d in range(len(step.before.dims)):
        if z.applies(step.before, d) and not z.applies(step.after, d):
            x = jnp.take(x, np.argsort(z.order(x.shape[d])), axis=d)
    return x


def into_balance(x, dim: int, z: Zigzag):
    """A block of ``dim`` held in order (device ``i``: chunks ``2i``, ``2i + 1``) as the
    balanced order holds it (chunks ``i``, ``2C - 1 - i``): two transfers of half a block."""
    c, name = z.size, axis_name((z.axis,))
    even, odd = jnp.split(x, 2, axis=dim)

    def owner(chunk):
        return chunk if chunk < c else 2 * c - 1 - chunk

    got_even = lax.ppermute(even, name, [(i, owner(2 * i)) for i in range(c)])
    got_odd = lax.ppermute(odd, name, [(i, owner(2 * i + 1)) for i in range(c)])
    first_even = lax.axis_index(name) % 2 == 0  # chunk i is even: it came first
    return jnp.where(
        first_even,
        jnp.concatenate([got_even, got_odd], axis=dim),
        jnp.concatenate([got_odd, got_even], axis=dim),
    )


def out_of_balance(x, dim: int, z: Zigzag):
    """The inverse of `into_balance`: a balanced block of ``dim`` back in order."""
    c, name = z.size, axis_name((z.axis,))
    first, second = jnp.split(x, 2, axis=dim)
    first_even = lax.axis_index(name) % 2 == 0
    even = jnp.where(first_even, first, second)
    odd = jnp.where(first_even, second, first)

    def chunks(i):
        return (i, 2 * c - 1 - i) if i % 2 == 0 else (2 * c - 1 - i, i)

    got_even = lax.ppermute(even, name, [(i, chunks(i)[0] // 2) for i in range(c)])
    got_odd = lax.ppermute(odd, name, [(i, chunks(i)[1] // 2) for i in range(c)])
    return jnp.concatenate([got_even, got_odd], axis=dim)


def _run(x, step: Step, mesh: Mesh, again: bool = False):
    kind, axes = step.kind, step.axes
    if kind == "slice":
        new = step.after.local_shape(mesh)[step.dim]
        return lax.dynamic_slice_in_dim(x, shard_index(axes, mesh) * new, new, axis=step.dim)
    if kind == "mask":
        first = jnp.ones((), bool)
        for axis in axes:
            first = first & (lax.axis_index(axis_name((axis,))) == 0)
        if step.reduction == "sum":
            return jnp.where(first, x, jnp.zeros((), x.dtype))
        return x  # a whole value is already a valid pending max or min
    program = None if again else reductions.chosen(step)  # across levels, synthesising
    if program is not None:
        return reductions.reduce(x, program, reductions.placement(), axes, step.dim or 0)
    if kind == "all-gather":
        if again:
            shape = list(x.shape)
            shape[step.dim] *= int(np.prod([mesh.axis_size(a) for a in axes]))
            return lax.all_gather(x, axis_name(axes), axis=step.dim, tiled=False).reshape(shape)
        return lax.all_gather(x, axis_name(axes), axis=step.dim, tiled=True)
    if kind == "reduce-scatter":
        return lax.psum_scatter(x, axis_name(axes), scatter_dimension=step.dim, tiled=True)
    if kind == "all-reduce":
        reduce = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin}[step.reduction]
        return reduce(x, axis_name(axes))
    if kind == "all-to-all":
        return lax.all_to_all(
            x, axis_name(axes[:1]), split_axis=step.dim, concat_axis=step.dim_from, tiled=True
        )
    if kind == "collective-permute":
        names = jax_axes(mesh_order(axes, mesh))
        return lax.ppermute(x, names, permutation(axes, step.order, mesh))
    raise ValueError(f"unknown redistribution step {kind}")  # pragma: no cover


def mesh_order(axes, mesh: Mesh):
    return [a for a in mesh.names if a in axes]


def permutation(old, new, mesh: Mesh) -> list[tuple[int, int]]:
    """(source, target) pairs over ``axes`` in mesh order: the block a device holds in order
    ``old`` becomes the one it must hold in order ``new``."""
    names = mesh_order(old, mesh)
    sizes = [mesh.axis_size(a) for a in names]
    pairs = []
    for coords in np.ndindex(*sizes):
        c = dict(zip(names, coords))

        def linear(order, c=c):
            k = 0
            for a in order:
                k = k * mesh.axis_size(a) + c[a]
            return k

        block = linear(new)  # the block this device must end up with
        # the device that holds ``block`` in the old order
        src, rest = {}, block
        for a in reversed(old):
            src[a] = rest % mesh.axis_size(a)
            rest //= mesh.axis_size(a)
        pairs.append((linear_in(names, src, mesh), linear_in(names, c, mesh)))
    return pairs


def linear_in(names, coords, mesh: Mesh) -> int:
    k = 0
    for a in names:
        k = k * mesh.axis_size(a) + coords[a]
    return k
