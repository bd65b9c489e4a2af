"""What fuses with what: the primitive tables of the simulator and the fusion decisions.

Like a compiler, the simulator runs elementwise chains as one kernel: a value kept inside a
fused kernel is neither written by the op that makes it nor read by the ops that use it;
renames and reshapes are bitcasts; a matmul or convolution reads an operand held in the
wrong order through a transposed copy, which the compiler fuses into the kernel that makes
the operand. Every test of an op's primitive the simulator makes is here (see README.md).
"""

from __future__ import annotations

import math

from workbench.core import ops
from workbench.core.ops.costs import tensor_bytes

#: The fusion classes of every primitive, from its record in ``ops`` (XLA:CPU's, for every
#: preset until the records carry GPU and TPU classes):
#: - FUSIBLE: fused into a loop kernel; a value made by one and read only by such ops (or
#:   by a reduction, which fuses its inputs: FUSING_READERS) never gets a buffer of its own;
#: - EXPENSIVE: fusible, but not computed twice: one read by several kernels gets a buffer;
#: - COPYING: a matmul or convolution, reading operands held in another order through copies;
#: - FREE: no kernel at all (renames, reshapes of row-major arrays).
_SETS = ops.fusion_sets("cpu")
FUSIBLE, FUSING_READERS, EXPENSIVE = _SETS.fusible, _SETS.fusing_readers, _SETS.expensive
COPYING, FREE = _SETS.copying, _SETS.free


def is_rename(op) -> bool:
    """Whether ``op`` only renames its operand (a scheduler runs it as soon as it may)."""
    return ops.traits(op.primitive).tag is not None


def fused_values(program, outputs: set) -> set[int]:
    """Values kept inside fused kernels: made by a ``FUSIBLE`` op, not returned, read only by
    ops that fuse their inputs (``FUSING_READERS``), and not an ``EXPENSIVE`` one read twice."""
    fused = set()
    for v in program.values:
        producer = program.ops[v.producer] if v.producer is not None else None
        if producer is None or producer.primitive not in FUSIBLE or v.id in outputs:
            continue
        users = program.users[v.id]
        if producer.primitive in EXPENSIVE and len(users) > 1:
            continue
        if all(program.ops[u].primitive in FUSING_READERS for u in users):
            fused.add(v.id)
    return fused


def folded_values(program, outputs: set) -> set[int]:
    """Matmul results read only by a transpose: a compiler writes them transposed, once."""
    return {
        v
        for op in program.ops
        if ops.traits(op.primitive).contraction
        for v in op.results
        if v not in outputs
        and len(program.users[v]) == 1
        and ops.traits(program.ops[program.users[v][0]].primitive).permutes
    }


def transposed_copies(program) -> tuple[list, dict]:
    """``(copies, kept)``: ``(op id, operand indices)`` of each matmul or convolution that
    reads operands through a transposed copy (``copied_operands``), and per ``(op id,
    operand index)`` the ``(leading, trailing)`` dims the copy leaves in place."""
    copies, kept = [], {}
    for op in program.ops:
        if op.primitive in COPYING:
            ranks = [len(program.operand_type(v).shape) for v in op.operands]
            if ks := copied_operands(op, ranks):
                copies.append((op.id, ks))
                wanted = wanted_orders(op, ranks)
                kept.update({(op.id, k): kept_in_place(wanted[k]) for k in ks})
    return copies, kept


def wanted_orders(op, ranks) -> tuple[tuple[int, ...], ...] | None:
    """Per operand of a matmul or convolution, the order of its dimensions its kernel reads
    them in (an operand held in another order is read through a transposed copy); None
    for other ops.

    A dot wants batch dims leading, then the left side's free dims and its contracting
    dims last, the right side's contracting dims right after the batch dims; a
    convolution wants NHWC input and HWIO kernel.
    """
    traits = ops.traits(op.primitive)
    if traits.contraction:
        (lc, rc), (lb, rb) = op.params["dimension_numbers"]
        lhs_free = [d for d in range(ranks[0]) if d not in lc and d not in lb]
        rhs_free = [d for d in range(ranks[1]) if d not in rc and d not in rb]
        return (*lb, *lhs_free, *lc), (*rb, *rc, *rhs_free)
    if traits.convolution:
        dn = op.params["dimension_numbers"]
        lhs, rhs = tuple(dn.lhs_spec), tuple(dn.rhs_spec)
        return (lhs[0], *lhs[2:], lhs[1]), (*rhs[2:], rhs[1], rhs[0])
    return None


def copied_operands(op, ranks) -> tuple[int, ...]:
    """Operands a matmul or convolution kernel reads through a transposed copy: those not
    held in ``wanted_orders``. A 2-D matmul takes either operand transposed for free
    (GEMM flags)."""
    wanted = wanted_orders(op, ranks)
    if wanted is None:
        return ()
    if ops.traits(op.primitive).contraction:
        (_, _), (lb, _) = op.params["dimension_numbers"]
        if not lb and max(ranks) <= 2:
            return ()
    return tuple(k for k, order in enumerate(wanted) if tuple(order) != tuple(range(ranks[k])))


def kept_in_place(order: tuple[int, ...]) -> tuple[int, int]:
    """``(leading, trailing)``: how many leading and trailing dimensions a copy into
    ``order`` leaves in place. It transposes each slice below the leading ones on its
    own (a batched transpose) and moves runs of the trailing ones whole."""
    n = len(order)
    lead = 0
    while lead < n and order[lead] == lead:
        lead += 1
    trail = 0
    while trail < n - lead and order[n - 1 - trail] == n - 1 - trail:
        trail += 1
    return lead, trail


def _readers(program, v: int) -> list[tuple]:
    """``(op, operand index)`` of each read of value ``v``, looking through renames and
    bitcasts (``FREE``)."""
    readers, stack = [], [v]
    while stack:
        u = stack.pop()
        for r in dict.fromkeys(program.users[u]):
            op = program.ops[r]
            if op.primitive in FREE:
                stack.extend(op.results)
            else:
                readers.extend((op, k) for k, w in enumerate(op.operands) if w == u)
    return readers


def _fuses_its_input(program, op, k: int) -> bool:
    """Whether ``op`` reads operand ``k`` through an elementwise loop a compiler can fuse
    what makes the operand into: an elementwise op, or a matmul's operand that is copied
    into order (``copied_operands``) or collapsed to a matrix first (two or more free or
    contracting dimensions: XLA reshapes it, and a reshape fuses like an elementwise op)."""
    if op.primitive in FUSIBLE:
        return True
    if not ops.traits(op.primitive).contraction:
        return False
    ranks = [len(program.operand_type(u).shape) for u in op.operands]
    if k in copied_operands(op, ranks):
        return True
    (lc, rc), (lb, rb) = op.params["dimension_numbers"]
    contracting, batch = (lc, rc)[k], (lb, rb)[k]
    free = ranks[k] - len(contracting) - len(batch)
    return free > 1 or len(contracting) > 1


def _full_inputs(program, op) -> int:
    """How many of ``op``'s operands are arrays of its own rank read element for element:
    not literals, scalars or broadcasts (through bitcasts), which a fused kernel reads from
    registers or the caches."""
    values = program.values
    rank = max((len(values[r].shape) for r in op.results), default=0)
    full = 0
    for u in op.operands:
        if not isinstance(u, int):
            continue
        shape = values[u].shape
        made = values[u].producer
        while made is not None and program.ops[made].primitive in FREE:
            first = program.ops[made].operands[0]
            made = values[first].producer if isinstance(first, int) else None
        if made is not None and ops.traits(program.ops[made].primitive).broadcasts:
            continue
        if math.prod(shape) > 1 and len(shape) >= rank:
            full += 1
    return full


def recomputed(program, per_reader: bool = True) -> frozenset:
    """The values a compiler recomputes inside each fused kernel that reads them, rather
    than reading them from a buffer, even where it also writes one for readers that do not
    fuse (XLA's instruction fusion duplicates producers): bitcasts (``FREE``), and
    elementwise values (``FUSIBLE``) except

    - an expensive one (``EXPENSIVE``) read by several ops: computed once;
    - one made from more bytes than it holds by an op with two or more full-size inputs
      (``_full_inputs``; a sum of two arrays), where some reader cannot fuse it
      (``_fuses_its_input``: a collective, a matmul reading it as it is, a reduction:
      XLA's CPU row reductions are library kernels that fuse nothing): recomputing it in
      the other readers would read its inputs again on top of the buffer;
    - without ``per_reader`` (a compiler that fuses a value into all of its readers or
      none, as XLA's GPU priority fusion does), one read by several ops of which one cannot
      fuse it (a matmul): it is written once and every reader reads it. The residual
      stream's gradient is then written once per layer, as it is in a scan.

    Checked on the LM on CPU: the copy feeding a layer's weight gradient recomputes the
    residual stream's gradient through every later layer's layer-norm backward, reading
    each layer's residual sum (read by its layer norm's row reduction) and the row
    statistics from their buffers."""
    out = set()
    for value in program.values:
        made = value.producer
        if made is None:
            continue
        op = program.ops[made]
        if op.primitive in FREE:
            out.add(value.id)
            continue
        if op.primitive not in FUSIBLE:
            continue
        readers = None  # (op, operand index) of each read, walked once when a rule needs it
        if op.primitive in EXPENSIVE or not per_reader:
            readers = _readers(program, value.id)
            kinds = {r.id: r.primitive for r, _ in readers}
            if op.primitive in EXPENSIVE and len(kinds) > 1:
                continue
            if not per_reader and len(kinds) > 1 and not FUSING_READERS.issuperset(kinds.values()):
                continue
        if _full_inputs(program, op) > 1:
            inputs = sum(
                tensor_bytes(program.values[u].type)
                for u in dict.fromkeys(op.operands)
                if isinstance(u, int)
            )
            if inputs > sum(tensor_bytes(program.values[r].type) for r in op.results):
                if readers is None:
                    readers = _readers(program, value.id)
                if not all(_fuses_its_input(program, r, k) for r, k in readers):
                    continue
        out.add(value.id)
    return frozenset(out)


def copy_reads(
    program, v: int, recomputed: frozenset, buffered=frozenset()
) -> tuple[frozenset, tuple] | None:
    """What a transposed copy of value ``v`` reads once a compiler fuses it into the
    elementwise kernel that makes ``v``: ``(values recomputed on the way, ((op id, operand
    index), ...) of the reads from memory)``, walking back from ``v`` through the values
    the kernel recomputes (``recomputed``) other than ``buffered`` ones (a value a plan
    redistributes is read from its own buffer); None where ``v`` is not one of them (made
    by another kind of op, or written once for all its readers: the copy reads ``v``).
    XLA emits the copy as a loop over the transposed result that evaluates the whole
    chain, so each input is read in transposed order (checked on CPU: the LM's copy for a
    layer's weight gradient reads up to 73 arrays)."""
    if v not in recomputed:
        return None
    path, reads, stack, seen = set(), [], [program.values[v].producer], {v}
    while stack:
        op = program.ops[stack.pop()]
        for i, u in enumerate(op.operands):
            if not isinstance(u, int) or u in seen:
                continue
            seen.add(u)
            if u in recomputed and u not in buffered:
                path.add(u)
                stack.append(program.values[u].producer)
            else:
                reads.append((op.id, i))
    return frozenset(path), tuple(reads)
