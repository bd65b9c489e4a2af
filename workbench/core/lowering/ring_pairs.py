"""A balanced ring attention per device (``CP(kind="ring", balance=True)``), by pairs of
chunks.

Balanced (``plan/zigzag.py``), each device holds two chunks of the queries and each block
of keys two chunks, so every step is four pairs of chunks. A pair whose logits its mask
keeps at or below ``HIDDEN`` for any score the queries and keys can make (the chain run
on scores of plus and minus a bound on them: ``|q.k| <= |q| |k|``) is skipped: under a
causal mask about half of every step's pairs, on every device alike. Skipping is exact
where each query row's largest logit stands ``MARGIN`` above that, so what it skips
rounds to zero; where a row's does not (a padding mask hiding a whole row), the devices
of the ring agree to run the attention again with every pair, as `ring.forward` and
`ring.backward` do. The chain is taken to be monotone in the scores (a scale, a bias, a
select, a soft cap).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from workbench.core.lowering import ring as dense
from workbench.core.lowering.ring import F32, _Blocks

#: Logits at or below this are a mask's (``-1e9``, ``-inf``, the lowest float plus a score).
HIDDEN = -1e4
#: How far above ``HIDDEN`` each row's largest logit must stand for what is skipped to
#: round to zero in its softmax (``exp(-200)`` is below the least float32).
MARGIN = 200.0


class _Pairs(_Blocks):
    """A region's products on pairs of chunks of a balanced ring."""

    def __init__(self, program, ring, mesh, arrays):
        super().__init__(program, ring, mesh, arrays)
        self.rows = {  # value -> its dim split on the ring's axis (the queries' rows)
            v: next((d for d, axes in enumerate(lay.dims) if ring.axis in axes), None)
            for v, lay in (*ring.reads, *ring.makes)
        }
        # the output's rows: as the forward makes it, as its cotangent arrives backward
        self.out_dim = self.rows.get(ring.region.cotangent, self.rows.get(ring.evaluated.out))

    def half(self, x, a: int, dim: int | None):
        """Chunk ``a`` (0 or 1) of the two ``x`` holds along ``dim``."""
        if dim is None:
            return x
        n = x.shape[dim] // 2
        return lax.slice_in_dim(x, a * n, (a + 1) * n, axis=dim)

    def pair_sides(self, s: int, a: int, b: int) -> dict:
        """The masks and biases cut to query chunk ``a`` and key chunk ``b`` of step ``s``."""
        cut = self.sides(s, chunks=(self.held(s)[b],))
        return {x: self.half(arr, a, self.rows.get(x)) for x, arr in cut.items()}

    def bound(self, q, k):
        """A bound on every score of the ring's queries and keys: the largest norms of a
        query and of a key (over the contracted dims; the keys' over the whole ring)."""
        scores = self.program.ops[self.r.scores]
        contracted, _ = scores.params["dimension_numbers"]
        i = scores.operands.index(self.r.queries)  # the queries come first or second
        qc, kc = contracted[i], contracted[1 - i]
        q_norm = jnp.sqrt(jnp.max(jnp.sum(jnp.square(q.astype(F32)), axis=tuple(qc))))
        k_norm = jnp.sqrt(jnp.max(jnp.sum(jnp.square(k.astype(F32)), axis=tuple(kc))))
        return q_norm * lax.pmax(k_norm, self.name) * 1.01 + 1.0

    def hidden(self, q, k, sides, bound):
        """Whether the mask keeps every logit of a pair at or below ``HIDDEN`` (the chain
        on scores of ``bound`` and of ``-bound``)."""
        shape = jax.eval_shape(self.scores, q, k)
        top = [
            jnp.max(self.chain(jnp.full(shape.shape, x, shape.dtype), sides))
            for x in (bound, -bound)
        ]
        return jnp.maximum(*top) <= HIDDEN

    def agree(self, tops):
        """Whether a row of any device on the ring has its largest logit too near
        ``HIDDEN`` for skipping to be exact (``tops``: each chunk's largest logits)."""
        low = jnp.any(jnp.stack([jnp.any(m <= HIDDEN + MARGIN) for m in tops]))
        return lax.pmax(low.astype(jnp.int32), self.name) > 0


def _rows_dim(full, part) -> int:
    return next(d for d, (x, y) in enumerate(zip(full, part, strict=True)) if x != y)


def forward(program, ring, mesh, arrays):
    """(output, (each query chunk's rows' maxima and sums, whether the dense ring ran))."""
    b, r = _Pairs(program, ring, mesh, arrays), ring.evaluated
    q, k, v = arrays[r.queries], arrays[r.keys], arrays[r.values]
    qd = b.rows[r.queries]
    qs = [b.half(q, a, qd) for a in range(2)]

    def start(a):
        logits = jax.eval_shape(b.logits, qs[a], b.half(k, 0, r.keys_seq), b.pair_sides(0, a, 0))
        rows = [n for d, n in enumerate(logits.shape) if d != r.key_dim]
        p = jnp.zeros(logits.shape, F32)
        acc = jax.eval_shape(b.context, b.half(v, 0, r.values_seq), p)
        return jnp.full(rows, -jnp.inf, F32), jnp.zeros(rows, F32), jnp.zeros(acc.shape, F32)

    def fold(state, qq, kk, vv, sides):  # one pair into the online softmax
        m, l_, acc = state
        logits = b.logits(qq, kk, sides)
        m_new = jnp.maximum(m, jnp.max(logits, axis=r.key_dim))
        safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        p = jnp.exp(logits - jnp.expand_dims(safe, r.key_dim))
        alpha = jnp.exp(m - safe)
        part = b.context(vv, p)
        return m_new, l_ * alpha + jnp.sum(p, axis=r.key_dim), acc * b.to_out(alpha) + part

    states = [start(a) for a in range(2)]
    bound = b.bound(q, k)
    for s in range(b.c):
        ks = [b.half(k, i, r.keys_seq) for i in range(2)]
        vs = [b.half(v, i, r.values_seq) for i in range(2)]
        for a in range(2):
            for kb in range(2):
                sides = b.pair_sides(s, a, kb)
                skip = b.hidden(qs[a], ks[kb], sides, bound)
                states[a] = lax.cond(
                    skip, lambda st, *_: st, fold, states[a], qs[a], ks[kb], vs[kb], sides
                )
        if s < b.c - 1:
            k, v = b.turn(k), b.turn(v)
    outs, stats = [], []
    for m, l_, acc in states:
        outs.append(acc / b.to_out(l_))
        stats.append((jnp.where(jnp.isfinite(m), m, 0.0), l_))
    out = jnp.concatenate(outs, axis=b.out_dim)
    stuck = b.agree([m for m, _, _ in states])
    dtype = program.values[r.out].dtype

    def again(_):  # a row no computed pair shows: every pair, as the dense ring runs them
        o, whole = dense.forward(program, ring, mesh, arrays)
        d = _rows_dim(whole[0].shape, stats[0][0].shape)
        halves = [jnp.split(x, 2, axis=d) for x in whole]
        return o.astype(F32), [(halves[0][a], halves[1][a]) for a in range(2)]

    o, stats = lax.cond(stuck, again, lambda _: (out, stats), None)
    return o.astype(dtype), (stats, stuck)


def backward(program, ring, mesh, arrays, out, saved):
    """The cotangents of the queries, keys and values (each device's own chunks)."""
    stats, stuck = saved
    b, r, region = _Pairs(program, ring, mesh, arrays), ring.evaluated, ring.region
    q, k, v = arrays[r.queries], arrays[r.keys], arrays[r.values]
    dout = arrays[region.cotangent].astype(F32)
    qd, od = b.rows[r.queries], b.out_dim

    def pairs(_):
        qs = [b.half(q, a, qd) for a in range(2)]
        bound = b.bound(q, k)
        douts = [b.half(dout, a, od) for a in range(2)]
        outs = [b.half(out.astype(F32), a, od) for a in range(2)]
        deltas = [b.to_stat(douts[a] * outs[a], stats[a][0]) for a in range(2)]
        dq = [jnp.zeros(x.shape, F32) for x in qs]
        kk, vv = k, v
        dk, dv = jnp.zeros(k.shape, F32), jnp.zeros(v.shape, F32)
        for s in range(b.c):
            ks = [b.half(kk, i, r.keys_seq) for i in range(2)]
            vs = [b.half(vv, i, r.values_seq) for i in range(2)]
            dks = [b.half(dk, i, r.keys_seq) for i in range(2)]
            dvs = [b.half(dv, i, r.values_seq) for i in range(2)]
            for a in range(2):
                for kb in range(2):
                    sides = b.pair_sides(s, a, kb)

                    def step(acc, qq, kx, vx, sides, a=a):
                        dq_a, dk_b, dv_b = acc
                        logits, pull = jax.vjp(lambda x, y: b.logits(x, y, sides), qq, kx)
                        m, total = (jnp.expand_dims(x, r.key_dim) for x in stats[a])
                        p = jnp.exp(logits - m) / total
                        dv_s, dp = jax.vjp(b.context, vx.astype(F32), p)[1](douts[a])
                        dq_s, dk_s = pull(p * (dp - jnp.expand_dims(deltas[a], r.key_dim)))
                        return dq_a + dq_s.astype(F32), dk_b + dk_s.astype(F32), dv_b + dv_s

                    skip = b.hidden(qs[a], ks[kb], sides, bound)
                    dq[a], dks[kb], dvs[kb] = lax.cond(
                        skip,
                        lambda acc, *_: acc,
                        step,
                        (dq[a], dks[kb], dvs[kb]),
                        qs[a],
                        ks[kb],
                        vs[kb],
                        sides,
                    )
            dk = jnp.concatenate(dks, axis=r.keys_seq)
            dv = jnp.concatenate(dvs, axis=r.values_seq)
            if s < b.c - 1:
                kk, vv = b.turn(kk, again=True), b.turn(vv, again=True)
            dk, dv = b.turn(dk), b.turn(dv)
        return jnp.concatenate(dq, axis=qd), dk, dv

    def again(_):
        d = _rows_dim_of(stats[0][0], q, b)
        whole = tuple(jnp.concatenate([stats[0][i], stats[1][i]], axis=d) for i in range(2))
        got = dense.backward(program, ring, mesh, arrays, out, whole)
        return tuple(x.astype(F32) for x in got)

    grads = lax.cond(stuck, again, pairs, None)
    dtypes = [program.values[g].dtype for g in region.grads]
    return [x.astype(dt) for x, dt in zip(grads, dtypes)]


def _rows_dim_of(stat, q, b) -> int:
    """The dim of a chunk's row statistics that holds its query rows."""
    whole = jax.eval_shape(b.logits, q, b.arrays[b.r.keys], b.sides(0)).shape
    rows = [n for d, n in enumerate(whole) if d != b.r.key_dim]
    return _rows_dim(rows, stat.shape)
