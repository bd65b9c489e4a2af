"""Ring attention per device, inside ``shard_map`` (Liu et al. 2023; the blockwise softmax
of FlashAttention, Dao et al. 2022).

Each device holds its queries and one block of the keys and values. Over ``C`` steps it
computes its queries' logits against the block it holds (the captured scores dot and the
elementwise chain to the logits, a mask or bias sliced to the block's keys), folds them
into a running max, sum and output (an online softmax), and passes the block on with
``ppermute``. The backward pass replays the blocks from the saved log-sum-exp: ``dQ``
accumulates on the device, ``dK`` and ``dV`` travel with their block and take one last
hop home. Every product is the captured dot with its own dimension numbers, so any
layout of the queries, keys and values works; the rows' statistics reach the output's
layout through the context dot itself (`_to_out`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from workbench.core.ir.program import Lit
from workbench.core.lowering.interpret import literal
from workbench.core.ops.local import axis_name, bind, local_params, shard_index, zigzag

F32 = jnp.float32


class _Blocks:
    """One region's products on blocks, with the ring's bookkeeping."""

    def __init__(self, program, ring, mesh, arrays):
        self.program, self.ring, self.r = program, ring, ring.evaluated
        self.arrays = arrays
        self.c = ring.size
        self.index = shard_index((ring.axis,), mesh)
        self.name = axis_name((ring.axis,))
        self.block = arrays[self.r.keys].shape[self.r.keys_seq]
        z = zigzag()  # a balanced sequence: each block is two chunks (``plan/zigzag.py``)
        self.z = z if z is not None and z.axis == ring.axis else None

    def turn(self, x, again: bool = False):
        """``x`` passed to the next device on the ring. ``again``: the backward pass's
        blocks, passed around once more as ring attention's backward does; sent with a
        leading unit dim, or a compiler would merge them with the forward's transfers (the
        same operands) and hold every block from the forward pass to the backward."""
        pairs = [(j, (j + 1) % self.c) for j in range(self.c)]
        if again:
            return lax.ppermute(x[None], self.name, pairs)[0]
        return lax.ppermute(x, self.name, pairs)

    def held(self, s: int) -> tuple:
        """The chunks of the sequence in the block of keys held at step ``s``: the block's
        index, or balanced (`Zigzag`) its two chunks."""
        j = (self.index - s) % self.c
        return (j,) if self.z is None else self.z.chunks(j)

    def sides(self, s: int, chunks=None) -> dict:
        """The masks and biases cut to the keys of the block held at step ``s`` (or of
        ``chunks`` of it, `held`)."""
        held = self.held(s) if chunks is None else chunks
        n = self.block // len(self.held(s))
        cut = {}
        for x, d in self.r.sides:
            a = self.arrays[x]
            if d is not None:
                parts = [lax.dynamic_slice_in_dim(a, g * n, n, d) for g in held]
                a = parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=d)
            cut[x] = a
        return cut

    def scores(self, q, k):
        """The captured scores dot on one block of keys."""
        s, r = self.program.ops[self.r.scores], self.r
        env = {r.queries: q, r.keys: k}
        return bind(s, [env[x] for x in s.operands], local_params(s))[0]

    def logits(self, q, k, sides):
        """The captured scores dot and chain on one block of keys, in float32."""
        return self.chain(self.scores(q, k), sides)

    def chain(self, scores, sides):
        """The captured chain from the scores to the logits, in float32."""
        ops, r = self.program.ops, self.r
        env = {**sides, ops[r.scores].results[0]: scores}
        for o in r.chain:
            op = ops[o]
            args = [literal(x) if isinstance(x, Lit) else env[x] for x in op.operands]
            env[op.results[0]] = bind(op, args, local_params(op))[0]
        return env[r.logits].astype(F32)

    def context(self, v, p):
        """The captured context dot of a block's values and probabilities, in float32."""
        c = self.program.ops[self.r.context]
        args = [p if t == self.r.probs else v.astype(F32) for t in range(2)]
        dims = c.params["dimension_numbers"]
        return lax.dot_general(*args, dims, preferred_element_type=F32)

    def to_out(self, stat):
        """Row statistics (the logits' shape without the keys) broadcast into the output's
        layout: the context dot of ones (one key) with them (one key)."""
        p = jnp.expand_dims(stat, self.r.key_dim)
        v = self.arrays[self.r.values]
        shape = list(v.shape)
        shape[self.r.values_seq] = 1
        return self.context(jnp.ones(shape, F32), p)

    def to_stat(self, out, like):
        """The transpose of `to_out`: sums over the output's value dims, per row."""
        return jax.vjp(self.to_out, like)[1](out)[0]


def forward(program, ring, mesh, arrays):
    """(output, (its rows' maxima, their sums)) of the attention over the ring; ``arrays``:
    the ring's reads."""
    b, r = _Blocks(program, ring, mesh, arrays), ring.evaluated
    q, k, v = arrays[r.queries], arrays[r.keys], arrays[r.values]
    m = l_ = acc = None  # running max, sum and output, from the first block on
    for s in range(b.c):
        logits = b.logits(q, k, b.sides(s))
        top = jnp.max(logits, axis=r.key_dim)
        m_new = top if m is None else jnp.maximum(m, top)
        safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        p = jnp.exp(logits - jnp.expand_dims(safe, r.key_dim))
        rows, part = jnp.sum(p, axis=r.key_dim), b.context(v, p)
        if m is None:
            l_, acc = rows, part
        else:  # the earlier blocks rescaled to the new max
            alpha = jnp.exp(m - safe)
            l_, acc = l_ * alpha + rows, acc * b.to_out(alpha) + part
        m = m_new
        if s < b.c - 1:
            k, v = b.turn(k), b.turn(v)
    safe = jnp.where(jnp.isfinite(m), m, 0.0)
    out = acc / b.to_out(l_)
    return out.astype(program.values[r.out].dtype), (safe, l_)


def replayed(out, stats):
    """The forward's output where a rematerialised step recomputes it: the same values, as
    a value of its own (plus zero times one of its rows' maxima, which no compiler folds
    for floats), or the recomputation's ops would be merged with the forward's and their
    results held from one pass to the other, as remat is there to avoid."""
    some = jax.tree.leaves(stats)[0].reshape(-1)[0]
    return out + jnp.zeros((), out.dtype) * some.astype(out.dtype)


def backward(program, ring, mesh, arrays, out, stats):
    """The cotangents of the queries, keys and values (each device's own block);
    ``stats``: the forward's rows' maxima and sums (kept apart: a log-sum-exp near a mask's
    -1e9 would round the sum away)."""
    b, r, region = _Blocks(program, ring, mesh, arrays), ring.evaluated, ring.region
    q, k, v = arrays[r.queries], arrays[r.keys], arrays[r.values]
    m, total = stats
    dout = arrays[region.cotangent].astype(F32)
    delta = b.to_stat(dout * out.astype(F32), m)
    dq = jnp.zeros(q.shape, F32)
    dk, dv = jnp.zeros(k.shape, F32), jnp.zeros(v.shape, F32)
    for s in range(b.c):
        sides = b.sides(s)
        logits, pull = jax.vjp(lambda qq, kk, sides=sides: b.logits(qq, kk, sides), q, k)
        p = jnp.exp(logits - jnp.expand_dims(m, r.key_dim)) / jnp.expand_dims(total, r.key_dim)
        dv_s, dp = jax.vjp(b.context, v.astype(F32), p)[1](dout)
        dq_s, dk_s = pull(p * (dp - jnp.expand_dims(delta, r.key_dim)))
        dq, dk, dv = dq + dq_s.astype(F32), dk + dk_s.astype(F32), dv + dv_s
        if s < b.c - 1:
            k, v = b.turn(k, again=True), b.turn(v, again=True)
        dk, dv = b.turn(dk), b.turn(dv)
    dtypes = [program.values[g].dtype for g in region.grads]
    return [x.astype(dt) for x, dt in zip((dq, dk, dv), dtypes)]
