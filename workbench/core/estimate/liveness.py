"""Peak memory per device from liveness over a schedule: every layout a value is held in is
a buffer from the op that makes it to the last op that reads it (inputs throughout); the
sweep over those lifetimes gives the peak and what is live at it (see README.md)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cached_property

import numpy as np

from workbench.core.estimate import rings
from workbench.core.estimate.communication import Communication, relaid
from workbench.core.estimate.memory import CATEGORIES, TUPLE_POINTER_BYTES, Memory, donations
from workbench.core.estimate.static import PlannedStep
from workbench.core.layout.redistribute import as_layout


def _src_key(fetch) -> tuple:
    """The buffer a fetch reads: (value, layout), and the copy when the plan makes several."""
    key = (fetch.value, fetch.src)
    return (*key, fetch.src_copy) if fetch.src_copy else key


def _dst_key(fetch) -> tuple:
    """The buffer a fetch makes (see ``_src_key``)."""
    key = (fetch.value, fetch.dst)
    return (*key, fetch.copy) if fetch.copy else key


class _Lifetimes:
    """The buffers of one plan, collected op by op: ``spans`` maps (value, layout) to
    [first position, last position, bytes]; layouts the plan holds carry no tactic pins."""

    def __init__(self, mesh):
        self.mesh = mesh
        self.spans: dict[tuple, list] = {}
        self.shrink_only: dict[tuple, bool] = {}  # natural layouts read only to be shrunk
        self.made_at: dict[int, int] = {}
        self.sources: dict[int, tuple] = {}  # fused value -> (fused operands, buffers read)
        self.read_last: dict[int, int] = {}  # fused value -> the last position that reads it
        self.relaid: dict[tuple, int] = {}  # a layout a collective makes on a transposed copy
        self.eager: list[tuple[tuple, int]] = []  # shrunk layouts, made once their source is
        self.scratch: list[tuple[int, int]] = []  # (position, bytes) a ring attention works in

    def touch(self, key, at, *, made=False, shrink=False):
        span = self.spans.get(key)
        if span is None:
            self.spans[key] = [at, at, key[1].local_nbytes(self.mesh)]
        else:
            if at < span[0]:
                span[0] = at
            if at > span[1]:
                span[1] = at
        if not shrink:
            self.shrink_only[key] = made and self.shrink_only.get(key, True)

    def read_fused(self):
        """A fused value is recomputed by each kernel that reads it: what it is made from
        (the buffers its producer read) stays live until its last reader. Latest readers
        first: a fused value's last read is its fused operands' last read."""
        read_last, touch = self.read_last, self.touch
        for v in reversed(self.sources):
            last = read_last.get(v)
            if last is None:
                continue
            inner, read = self.sources[v]
            for u in inner:
                if read_last.get(u, -2) < last:
                    read_last[u] = last
            for key in read:
                touch(key, last)

    def shrink_where_made(self) -> set[tuple]:
        """A layout read only to be shrunk is shrunk where it is made, then freed; returns
        the spans so shrunk (held through the op that shrinks them)."""
        spans = self.spans
        layouts: dict[int, list[tuple]] = {}  # value -> its span keys
        held: set[tuple] = set()
        if self.eager:
            for k in spans:
                layouts.setdefault(k[0], []).append(k)
        for key, src_value in self.eager:
            natural = [
                k for k in layouts.get(src_value, ()) if self.shrink_only.get(k) and k != key
            ]
            if natural and src_value in self.made_at:
                spans[key][0] = min(spans[key][0], self.made_at[src_value])
                for k in natural:
                    spans[k][1] = spans[k][0]
                    held.add(k)
        return held


class Liveness(PlannedStep):
    """The memory of one plan: buffers' lifetimes over the schedule, their peak, the model
    state held. ``communication`` gives the combined all-reduces (its ``buckets``)."""

    def __init__(self, program, mesh, state, plan, hardware, communication=None, inside=()):
        super().__init__(program, mesh, state, plan, hardware)
        if communication is None:
            communication = Communication(program, mesh, state, plan, hardware)
        self.communication = communication
        self.inside = frozenset(inside)  # values kept in fused attention kernels (``fused``)

    def memory(self) -> Memory:
        """Sweep program order: each layout a value is held in lives from the op that makes it
        to the last op that reads it (see README.md)."""
        p, mesh, plan, static = self.program, self.mesh, self.plan, self.static
        position, plan_ops = static.position, plan.ops
        end = len(position)
        life = _Lifetimes(mesh)
        for v in p.inputs:
            key = (v, as_layout(self.state.shardings[v]))
            life.touch(key, -1)
            life.touch(key, end)
        for v in p.consts:
            life.touch((v, p.values[v].type_sharding()), -1)
        copies: list[tuple[int, int]] = []  # (position, bytes) of layout copies
        for o_id, ks in static.copies:
            if plan_ops[o_id] is not None:
                copies += [
                    (position[o_id], plan_ops[o_id].operands[k].local_nbytes(mesh)) for k in ks
                ]
        # combined all-reduces: the ops waiting for one run after it (see ``combined_reductions``)
        runs_at, reduced_at = self.combined_reductions()
        in_place = static.in_place
        if runs_at is not None:
            copies = [(runs_at[at], nbytes) for at, nbytes in copies]
            # a combined all-reduce holds every input and output of its bucket at once
            in_place = {runs_at[at] for at in in_place} - set(reduced_at.values())
        self._walk(life, runs_at, reduced_at)
        for fetch in plan.outputs:
            if fetch is not None:
                life.touch(_src_key(fetch), end)
                life.touch(_dst_key(fetch), end)
        life.read_fused()
        held = life.shrink_where_made()
        copies += [(life.spans[key][0], nbytes) for key, nbytes in life.relaid.items()]
        copies += life.scratch
        return self.sweep(life.spans, copies, end, in_place, held)

    def _walk(self, life: _Lifetimes, runs_at, reduced_at: dict) -> None:
        """Touch every buffer each op of the schedule makes or reads, at the position it runs."""
        static, plan = self.static, self.plan
        # a compiler writes a matmul's result in the order its transpose wants (one buffer);
        # a value the plan redistributes is read from memory: it cannot stay fused
        fused = static.unbuffered | self.inside
        if plan.redistributed:
            fused = fused - plan.redistributed
        plan_ops, touch = plan.ops, life.touch
        sources, read_last, made_at = life.sources, life.read_last, life.made_at
        for at, op in enumerate(static.order):
            o = plan_ops[op.id]
            if o is None:
                continue
            reduce_at = reduced_at.get(at)
            if runs_at is not None:
                at = runs_at[at]
            if op.id in plan.skipped:  # a ring attention's: only the ring's own buffers
                ring = plan.rings.get(op.id)
                if ring is not None:
                    self._ring(life, ring, at, fused)
                continue
            inner, read = [], []
            for v, fetch in zip(op.linked_operands, o.fetches):
                if fetch is None:
                    continue
                if v in fused:
                    inner.append(v)
                    if read_last.get(v, -2) < at:
                        read_last[v] = at
                else:
                    read.append(_dst_key(fetch) if fetch.steps else _src_key(fetch))
            for v in op.results:
                if v in fused:
                    sources[v] = (inner, read)
            for v, layout in zip(op.linked_results, o.results):
                made_at[v] = at
                if v not in fused:
                    touch((v, layout), at, made=True)
            for fetch in o.fetches:
                if fetch is not None:
                    self._fetch(life, fetch, at, reduce_at, fused)

    def _ring(self, life: _Lifetimes, ring, at: int, fused) -> None:
        """A ring attention's pass at ``at``: what it reads and makes, its working buffers,
        and the output and log-sum-exp the forward keeps for the backward."""
        for fetch in ring.fetches:
            if fetch is not None:
                self._fetch(life, fetch, at, None, fused)
        for v, layout in ring.makes:
            life.made_at[v] = at
            life.touch((v, layout), at, made=True)
        r = ring.region.forward
        life.scratch.append((at, rings.working(ring, self.mesh, self.state)))
        life.touch((r.logits, rings.kept(ring, self.mesh, self.state)), at)  # log-sum-exp
        if ring.kind != "forward":  # the forward's output, kept for the backward
            out = self.plan.rings.get(r.context)
            if out is not None:
                life.touch((r.out, out.makes[0][1]), at)

    def _fetch(self, life: _Lifetimes, fetch, at: int, reduce_at, fused) -> None:
        """Touch the buffers one fetch reads and makes at position ``at`` (``reduce_at``: where
        its op's combined all-reduce runs, if it waits for one)."""
        mesh, touch = self.mesh, life.touch
        v, src, dst = fetch.value, _src_key(fetch), _dst_key(fetch)
        if not fetch.steps:
            # a fused value is held where its reader is not elementwise (a
            # compiler saves what several kernels read); a folded one never is, nor one a
            # fused attention kernel keeps on chip
            if v not in self.inside and (v not in self.static.folded or v not in fused):
                touch(src, at)
                if fetch.dst is not fetch.src:
                    touch(dst, at, made=True)
            return
        if reduce_at is not None and any(s.kind == "all-reduce" for s in fetch.steps):
            touch(src, reduce_at)  # reduced with its bucket, then freed
            touch(dst, reduce_at)
            touch(dst, at)
            return
        for s in fetch.steps:
            if relaid(s.kind, s.dim, s.before, s.after, mesh):
                # the whole array is held in both layouts while the shard is
                # copied in or out: beyond the whole and the shard, one more whole
                # array less the shard, where the layout is made
                extra = abs(s.before.local_nbytes(mesh) - s.after.local_nbytes(mesh))
                life.relaid[dst] = max(life.relaid.get(dst, 0), extra)
        shrinking = fetch.dst.local_nbytes(mesh) < fetch.src.local_nbytes(mesh)
        touch(src, at, shrink=shrinking)
        touch(dst, at)
        if shrinking:
            life.eager.append((dst, v))

    def combined_reductions(self) -> tuple[list[int] | None, dict[int, int]]:
        """Where combined all-reduces (``Communication.buckets``) move the optimizer:
        ``(runs_at, reduced_at)``, the position each op of ``order`` runs at instead (None:
        nothing moves) and, per position of an op that reads a gradient a combined all-reduce
        reduces, the position that all-reduce runs at.

        The gradients of a bucket are reduced together after the last of them is made, so
        each stays live until then, and the ops that read them, and what reads their
        results, run after it.
        """
        steps = self.static.optimizer_steps
        buckets = [[at for at, _ in b] for b in self.communication.buckets]
        if not buckets:
            return None, {}
        delay: dict[int, int] = {}  # position -> the position it must follow
        for bucket in buckets:
            last = max(bucket)
            delay.update((at, last) for at in bucket)
        # what reads a delayed result runs after it
        made: dict[int, int] = {}
        for _, at, operands, results in steps:
            ready = max([made.get(v, -1) for v in operands], default=-1) if made else -1
            after = max(delay.get(at, at), ready)
            if after != at:
                delay[at] = after
                for v in results:
                    made[v] = after
        end = len(self.static.order)
        follows = np.arange(end)
        follows[list(delay)] = list(delay.values())
        runs_at = np.empty(end, dtype=np.int64)
        runs_at[np.lexsort((np.arange(end), follows))] = np.arange(end)
        runs_at = runs_at.tolist()
        reduced_at = {}
        for bucket in buckets:
            first = min(runs_at[at] for at in bucket)
            reduced_at.update((at, first) for at in bucket)
        return runs_at, reduced_at

    def sweep(
        self, spans: dict, copies: list, end: int, in_place: frozenset, held: set = frozenset()
    ) -> Memory:
        """Peak, its breakdown and the peak of temporaries over the buffers' lifetimes."""
        p, mesh, plan, static = self.program, self.mesh, self.plan, self.static
        inputs = set(p.inputs)
        returned = {_dst_key(f) for f in plan.outputs if f is not None}
        donated = self.donated
        shardings, categories = self.state.shardings, static.categories
        temporaries_at = CATEGORIES.index("temporaries")
        index = {c: i for i, c in enumerate(CATEGORIES)}
        # a buffer lives over positions [start, stop); at one position frees come before
        # allocations, so the live total peaks at the end of some position
        start, stop, size, cat, temp = [], [], [], [], []
        for key, (first, last, nbytes) in spans.items():
            v = key[0]
            is_input, is_returned = v in inputs, key in returned
            if is_returned and v in donated:
                continue  # written over the input it replaces
            big = not is_input and nbytes > shardings[v].local_nbytes(mesh)
            start.append(first)
            # read last by an elementwise kernel: its result may reuse this buffer in place
            # (not one shrunk where it is made: the collective reading it is no such kernel)
            stop.append(last if last in in_place and key not in held else last + 1)
            size.append(nbytes)
            cat.append(temporaries_at if big else index[categories[v]])
            temp.append(not is_input and not is_returned)
        for at, nbytes in copies:
            start.append(at)
            stop.append(at + 1)
            size.append(nbytes)
            cat.append(temporaries_at)
            temp.append(True)
        start = np.asarray(start, dtype=np.int64) + 1  # positions from -1 to end + 1
        stop = np.asarray(stop, dtype=np.int64) + 1
        size = np.asarray(size, dtype=np.float64)  # exact: byte counts stay below 2**53
        cat, temp = np.asarray(cat, dtype=np.int64), np.asarray(temp, dtype=bool)
        n = end + 3

        def live(mask=None):
            s, e, w = (start, stop, size) if mask is None else (start[mask], stop[mask], size[mask])
            return np.cumsum(np.bincount(s, w, n) - np.bincount(e, w, n))

        total = live()
        at = int(np.argmax(total))
        peak = max(int(total[at]), 0)
        at_peak = dict.fromkeys(CATEGORIES, 0)
        if peak:
            holding = (start <= at) & (stop > at)
            by_cat = np.bincount(cat[holding], size[holding], len(CATEGORIES))
            at_peak = {c: int(b) for c, b in zip(CATEGORIES, by_cat)}
        temporaries = max(int(live(temp).max(initial=0)), 0) if temp.any() else 0
        arguments = sum(shardings[v].local_nbytes(mesh) for v in p.inputs)
        outputs = sum(f.dst.local_nbytes(mesh) for f in plan.outputs if f is not None)
        if len(p.outputs) > 1:
            outputs += TUPLE_POINTER_BYTES * len(p.outputs)
        return Memory(
            peak, at_peak, arguments, outputs, temporaries, self.hw.memory_bytes, self.states()
        )

    def states(self) -> dict[str, int]:
        """Model state held per device: parameters and optimizer state as stored, gradients
        in the fewest bytes an optimizer op reads them in (or as held, fully reduced)."""
        p, mesh, plan = self.program, self.mesh, self.plan
        out = dict.fromkeys(("parameters", "gradients", "optimizer"), 0)
        for v in p.inputs:
            cat = self.static.categories[v]
            if cat in out:
                out[cat] += self.state.shardings[v].local_nbytes(mesh)
        read: dict[int, int] = {}  # pending gradient -> the fewest bytes an optimizer op reads
        categories = self.static.categories
        for o_id in self.static.optimizer_ops:
            op, o = p.ops[o_id], plan.ops[o_id]
            if o is None:
                continue
            for v, need in zip(op.operands, o.operands):
                if isinstance(v, int) and need is not None and categories[v] == "gradients":
                    read[v] = min(read.get(v, need.local_nbytes(mesh)), need.local_nbytes(mesh))
        for v in read:  # a gradient the state holds fully reduced is held in that layout
            own = self.state.shardings[v]
            if not own.partial:
                read[v] = own.local_nbytes(mesh)
        out["gradients"] = sum(read.values())
        return out

    def per_step_buffers(self, memory: Memory) -> Iterator[int]:
        """Bytes of each buffer a runtime allocates every step: the temporaries (one
        buffer, as XLA lays them out) and each output not written over a donated input.
        Lazy: a spec whose runtime reuses its memory never asks."""
        yield memory.temporaries
        for f in self.plan.outputs:
            if f is not None and f.value not in self.donated:
                yield f.dst.local_nbytes(self.mesh)

    @cached_property
    def donated(self) -> set[int]:
        """Outputs written over a donated input (see ``donations``): no extra memory."""
        return set(donations(self.program, self.state))
