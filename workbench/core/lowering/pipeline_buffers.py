"""The pipeline lowering's buffers: values packed into one flat buffer per dtype (what a
stage sends, keeps between its passes, or accumulates), and the static slots each pool of
kept buffers reuses as a schedule frees them."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from workbench.core.dtypes import is_extended
from workbench.core.errors import InputError

#: The pools of kept buffers: the forward input received, what F keeps for B, the backward
#: input received, what B keeps for W.
POOLS = ("fin", "saved", "bin", "wsaved")


class Pack:
    """Values packed into one flat buffer per dtype (``sizes``: elements per dtype)."""

    def __init__(self, values, layouts, mesh):
        self.values, self.where, self.sizes = tuple(values), {}, {}
        for v in self.values:
            layout = layouts(v)
            if is_extended(layout.dtype):
                raise InputError(
                    f"value {v} {layout} (a PRNG key) would cross pipeline stages; the "
                    "pipeline lowering moves arrays of numbers only: derive keys per stage."
                )
            shape, dt = layout.local_shape(mesh), str(layout.dtype)
            n = 1
            for k in shape:
                n *= k
            self.where[v] = (dt, self.sizes.get(dt, 0), shape, layout.dtype)
            self.sizes[dt] = self.sizes.get(dt, 0) + n

    def pack(self, arrays: dict, into: dict) -> dict:
        out = dict(into)
        for v in self.values:
            dt, off, _, _ = self.where[v]
            out[dt] = lax.dynamic_update_slice(out[dt], jnp.ravel(arrays[v]), (off,))
        return out

    def unpack(self, bufs: dict) -> dict:
        out = {}
        for v in self.values:
            dt, off, shape, _ = self.where[v]
            n = 1
            for k in shape:
                n *= k
            out[v] = lax.slice(bufs[dt], (off,), (off + n,)).reshape(shape)
        return out

    def add(self, arrays: dict, into: dict) -> dict:
        out = dict(into)
        for v, a in arrays.items():
            dt, off, _, _ = self.where[v]
            n = a.size
            cur = lax.slice(out[dt], (off,), (off + n,))
            out[dt] = lax.dynamic_update_slice(out[dt], cur + jnp.ravel(a), (off,))
        return out


def zeros(packs) -> dict:
    sizes, dtypes = {}, {}
    for p in packs:
        for dt, _, _, dtype in p.where.values():
            dtypes[dt] = dtype
        for dt, n in p.sizes.items():
            sizes[dt] = max(sizes.get(dt, 0), n)
    return {dt: jnp.zeros((n,), dtypes[dt]) for dt, n in sizes.items()}


def slots_of(grid, S: int, split: bool, v: int = 1) -> tuple[dict, dict]:
    """Static slot numbers per (pool, virtual stage, microbatch), a device's chunks sharing
    its slots and reusing freed ones; and per pool the most any device uses. ``S``:
    devices along the stage axis; ``v``: chunks per device (virtual stage c*S + s)."""
    V = S * v
    free = {(p, s): [] for p in POOLS for s in range(S)}
    count = {(p, s): 0 for p in POOLS for s in range(S)}
    slot = {}

    def take(p, g, m):
        s = g % S
        if free[p, s]:
            k = free[p, s].pop(0)
        else:
            k, count[p, s] = count[p, s], count[p, s] + 1
        slot[p, g, m] = k

    def give(p, g, m):
        free[p, g % S].append(slot[p, g, m])
        free[p, g % S].sort()

    for tick in grid:
        for s in range(S):
            for pool, g, m in tick.stores[s]:
                take(pool, g, m)
            w = tick.work[s]
            if w is None:
                continue
            m, g = w.microbatch, w.chunk * S + s
            if w.kind == "F":
                if g > 0:
                    give("fin", g, m)
                take("saved", g, m)
            elif w.kind == "B":
                if g < V - 1:
                    give("bin", g, m)
                if split:
                    take("wsaved", g, m)
                else:
                    give("saved", g, m)
            else:
                give("saved", g, m)
                give("wsaved", g, m)
    return slot, {p: max(count[p, s] for s in range(S)) for p in POOLS}
