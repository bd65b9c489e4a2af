"""Which blocks of an attention its mask hides, read from the program without running it.

A causal or sliding-window mask is built from counts along the sequence (iotas), compared
and selected elementwise, or read from a constant. `hidden_blocks` evaluates the mask and
the chain to the logits on zero scores at a few positions of each chunk of the sequence
(its first, middle and last), with numpy broadcasting standing in for the dims the mask
does not vary along, and says which pairs of chunks (query chunk, key chunk) it hides at
every position sampled. Exact for masks whose hidden part of a block is convex (causal,
sliding windows), a sample otherwise; None where the mask reads the program's inputs (a
padding mask) or an op it cannot evaluate so. The simulator prices a balanced ring's
skipped blocks by it (``estimate/rings.py``); the ring itself decides on the device.
"""

from __future__ import annotations

import math

import numpy as np

from workbench.core import ops
from workbench.core.ops.local import bind, local_params

#: Logits at or below this are a mask's (as the balanced ring decides, ``ring_pairs.py``).
HIDDEN = -1e4
_SMALL = 1 << 16  # elements a dim the mask does not sample may hold whole


def hidden_blocks(program, p, rows: int, n: int) -> np.ndarray | None:
    """``[n, n]`` booleans: whether the mask of pass ``p`` hides every logit of query chunk
    ``i`` against key chunk ``j`` (``rows``: the logits' dim of the queries; the sequence cut
    into ``n`` chunks). None where the mask cannot be read so."""
    key = ("anatomy.masks", p.context, rows, n)
    return program.cache.get(key, lambda: _hidden(program, p, rows, n))


def _hidden(program, p, rows: int, n: int):
    logits_shape = program.values[p.logits].shape
    length = logits_shape[p.key_dim]
    if logits_shape[rows] != length or length % n:
        return None
    h = length // n
    samples = np.unique(
        np.concatenate([[g * h, g * h + h // 2, g * h + h - 1] for g in range(n)])
    ).astype(np.int64)
    ev = _Evaluator(program, length, samples)
    scores = program.ops[p.scores].results[0]
    ev.known[scores] = np.zeros(
        (1,) * len(program.values[scores].shape), program.values[scores].dtype
    )
    try:
        for o in p.chain:
            ev.op(program.ops[o])
        logits = ev.value(p.logits)
    except _Unreadable:
        return None
    logits = np.asarray(logits, np.float32)
    others = tuple(d for d in range(logits.ndim) if d not in (rows, p.key_dim))
    worst = np.max(logits, axis=others) if others else logits
    if rows > p.key_dim:
        worst = worst.T
    worst = np.broadcast_to(worst, (len(samples), len(samples)))
    chunk = samples // h
    out = np.ones((n, n), bool)
    for i in range(n):
        for j in range(n):
            out[i, j] = bool(np.all(worst[np.ix_(chunk == i, chunk == j)] <= HIDDEN))
    return out


class _Unreadable(Exception):
    """The mask reads something the evaluation cannot (an input, an unknown op)."""


class _Evaluator:
    """Values of a mask's cone, each an array of its value's rank whose sequence dims hold
    the sampled positions and whose other dims are whole or broadcast (size 1)."""

    def __init__(self, program, length: int, samples: np.ndarray):
        self.program, self.length, self.samples = program, length, samples
        self.known: dict[int, np.ndarray] = {}

    def value(self, v):
        if not isinstance(v, int):  # a literal
            return np.asarray(v.value, dtype=v.dtype)
        if v in self.known:
            return self.known[v]
        p = self.program
        if v in p.consts:
            a = np.asarray(p.consts[v])
            for d, size in enumerate(a.shape):
                if size == self.length:
                    a = np.take(a, self.samples, axis=d)
            if a.size > _SMALL:
                raise _Unreadable
            self.known[v] = a
            return a
        producer = p.values[v].producer
        if producer is None:  # an input of the program: data the mask depends on
            raise _Unreadable
        self.op(p.ops[producer])
        return self.known[v]

    def op(self, op) -> None:
        args = [self.value(x) for x in op.operands]
        self.known[op.results[0]] = self._eval(op, args)

    def _eval(self, op, args):
        """One op of the cone, told apart by what its record and params say it does."""
        params, record = op.params, ops.record(op.primitive)
        if not op.operands and "dimension" in params and "shape" in params:  # a count
            shape, d = params["shape"], params["dimension"]
            count = self.samples if shape[d] == self.length else np.arange(shape[d])
            if len(count) > _SMALL:
                raise _Unreadable
            at = [1] * len(shape)
            at[d] = len(count)
            return count.reshape(at).astype(params["dtype"])
        if record is not None and record.family == "elementwise":
            same = np.broadcast_arrays(*args)
            if math.prod(same[0].shape) > _SMALL:
                raise _Unreadable
            return np.asarray(bind(op, list(same), local_params(op))[0])
        if len(args) != 1 or record is None:
            raise _Unreadable
        (x,) = args
        if record.traits.broadcasts and "broadcast_dimensions" in params:
            at = [1] * len(params["shape"])
            for src, dst in enumerate(params["broadcast_dimensions"]):
                at[dst] = x.shape[src]
            return x.reshape(at)
        if record.traits.permutes:
            return np.transpose(x, params["permutation"])
        if record.traits.transparent:  # a reshape, if it only adds or drops unit dims
            return _reshaped(x, self.program.values[op.operands[0]].shape, op, self.program)
        raise _Unreadable


def _reshaped(x, before, op, program):
    """A reshape that only adds or drops dims of size 1."""
    after = program.values[op.results[0]].shape
    kept = [d for d, s in enumerate(before) if s != 1]
    if [before[d] for d in kept] != [s for s in after if s != 1]:
        raise _Unreadable
    at = [1] * len(after)
    places = [d for d, s in enumerate(after) if s != 1]
    for src, dst in zip(kept, places, strict=True):
        at[dst] = x.shape[src]
    return x.reshape(at)
