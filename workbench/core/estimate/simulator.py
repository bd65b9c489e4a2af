"""The simulator: one step's time and memory per device, from the plan, on a hardware spec.

- compute: per op a roofline (``costs.op_cost`` on the local shapes the plan runs it at,
  ``costs.op_time`` on the hardware), times the loop trips around it. Like a compiler, it
  runs elementwise chains as one kernel: a value kept inside a fused kernel (see
  ``FUSIBLE``) is neither written by the op that makes it nor read by the ops that use
  it, and only the op that writes a value to memory launches a kernel; renames and
  reshapes (``FREE``) are bitcasts and cost nothing. Each kernel costs
  ``hardware.op_overhead`` on top of its roofline, and so does each local step of a
  redistribution (a slice or mask, priced like a copy of what it keeps) and each
  transposed copy of a matmul or convolution operand in the wrong order (the copies the
  memory model holds). A compiler fuses such a copy into the elementwise kernel that makes
  the operand, recomputing the cheap values on the way (``recomputed``: on a CPU through
  every later layer of an unrolled step, as XLA's CPU fusion does; on an accelerator up to
  the values a matmul also reads, ``Hardware.fuses_per_reader``), so the copy
  reads every input of that kernel in transposed order: it moves
  those inputs and its own result at ``hardware.copy_bandwidth`` of the bytes it reads
  (a plain copy reads one array: the rate measured at its size; see ``copy_reads``), per
  slice where it leaves leading dimensions in place (a batched transpose), and at the
  memory bandwidth where it moves whole cache lines (``copy_rate``). Plus the first touch
  of the buffers a runtime allocates fresh each step (the temporaries, as one buffer, and
  each output not written over a donated input: ``hardware.fresh_memory_time``);
- communication: per collective of the plan, ``hardware.collective_time`` times its count
  (the gradient all-reduces a runtime combines run as one: see ``buckets``), plus the
  copies the runtime makes around it (``layout_copies``): a gather or scatter
  along a dimension that is not the leading one runs on a transposed copy (input and
  output, at ``hardware.copy_bandwidth`` of the collective's size);
- step time under an overlap policy: "none" (compute + communication), "full"
  (the larger of the two), a fraction of communication hidden behind compute, or
  "prefetch": what an FSDP runtime's scheduler hides, the gathers of values made from the
  step's inputs alone (weights, started ahead of their use) and the reductions of
  gradients (finished behind later work), while every other collective waits on compute
  (``hidden``);
- peak memory per device from liveness over a schedule: every layout a value is held in
  lives from the op that makes it to the last op that reads it (inputs throughout),
  broken down into parameters, gradients, optimizer state, activations and temporaries.
  The schedule is program order, except that, as a memory-aware scheduler does, each
  optimizer update (and rename) runs as soon as what it reads is made (``schedule``), and
  the updates that wait for a combined all-reduce run after it (``combined_reductions``).
  Like a compiler, it keeps elementwise chains inside fused kernels (no buffers) and
  recomputes a fused value in each kernel that reads it, so what it is made from stays
  live until its last reader (an expensive op read by several kernels is computed once,
  into a buffer: ``EXPENSIVE``); it writes a matmul's result straight in the order the
  transpose that reads it wants, lets an elementwise kernel write over an operand it
  reads last, and gives a matmul or convolution a transposed copy of an operand in the
  wrong order. Like a runtime, it combines independent gradient all-reduces into buckets
  of up to ``hardware.all_reduce_combine_bytes`` whose inputs and outputs are live at
  once. Like a training loop, updated parameters and optimizer state overwrite the inputs
  they replace (donation), a value read only to be shrunk (a gradient reduce-scattered
  into ZeRO's shards) is shrunk where it is made, and a gathered copy of a parameter
  counts as a temporary.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from workbench.core.estimate.overlap import made_from_inputs, overlapped
from workbench.core.gcpause import without_gc
from workbench.core.hardware.spec import Hardware, collective_time
from workbench.core.layout.collectives import KINDS, Collective
from workbench.core.layout.mesh import Mesh
from workbench.core.layout.redistribute import as_layout
from workbench.core.layout.sharding import Sharding
from workbench.core.ops.costs import OpCost, op_cost, op_time, tensor_bytes
from workbench.core.ops.mapping import TensorType
from workbench.core.units import format_bytes, format_seconds

CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "temporaries")

#: Bytes per element of the table of pointers a tuple of outputs carries (XLA's output tuple).
TUPLE_POINTER_BYTES = 8

#: Ops a compiler fuses into a loop kernel: a value made by one of them and read only by them
#: (or by a reduction, which fuses its inputs) never gets a buffer of its own.
FUSIBLE = frozenset(
    {
        "abs", "add", "add_any", "and", "broadcast_in_dim", "ceil", "clamp", "convert_element_type",
        "copy", "cos", "div", "eq", "erf", "exp", "exp2", "expm1", "floor", "ge", "gt", "integer_pow",
        "iota", "is_finite", "le", "log", "log1p", "logistic", "lt", "max", "min", "mul", "name", "ne",
        "neg", "not", "or", "pow", "reshape", "round", "rsqrt", "select_n", "sign", "sin", "sqrt",
        "square", "squeeze", "stop_gradient", "sub", "tan", "tanh", "xor",
    }
)  # fmt: skip
FUSING_READERS = FUSIBLE | {"reduce_sum", "reduce_max", "reduce_min", "argmax", "argmin"}
#: Fusible ops a compiler will not compute twice: one read by several kernels gets a buffer.
EXPENSIVE = frozenset(
    {
        "cos", "div", "erf", "exp", "exp2", "expm1", "log", "log1p", "logistic", "pow", "rsqrt",
        "sin", "sqrt", "tan", "tanh",
    }
)  # fmt: skip
COPYING = frozenset({"dot_general", "conv_general_dilated"})
#: Bytes a cache line holds: a copy that moves contiguous runs this long or longer streams.
CACHE_LINE_BYTES = 64
#: The most all-reduces a runtime combines into one (XLA's combiners: 256 operands).
COMBINE_COUNT = 256

#: Ops that compile to no kernel: renames, and reshapes of row-major arrays (bitcasts).
FREE = frozenset({"name", "reshape", "squeeze", "expand_dims", "stop_gradient", "pvary"})


def relaid(kind: str, dim: int | None, src: Sharding, dst: Sharding, mesh: Mesh) -> bool:
    """Whether a ``kind`` collective over ``dim`` runs on a transposed copy: collectives
    move contiguous blocks, so a gather or scatter whose dimension has a non-trivial
    dimension before it (in the local shape) runs on a copy laid out with that dimension
    leading: its input is transposed into that layout and its output back (XLA's layout
    assignment, checked on CPU)."""
    if kind not in ("all-gather", "reduce-scatter") or dim is None:
        return False
    shape = (dst if kind == "all-gather" else src).local_shape(mesh)
    return math.prod(shape[:dim]) > 1


def layout_copies(c: Collective, mesh: Mesh) -> tuple[float, int]:
    """``(bytes, kernels)`` of the transposed copies the runtime makes around collective
    ``c`` (bytes read plus written; see `relaid`): the gathered or scattered array plus
    its 1/n shard, each read and written once."""
    if relaid(c.kind, c.dim, c.src, c.dst, mesh):
        n = math.prod(mesh.axis_size(a) for a in c.axes)
        return 2.0 * c.bytes * (1 + 1 / n), 2
    return 0.0, 0


def wanted_orders(op, ranks) -> tuple[tuple[int, ...], ...] | None:
    """Per operand of a matmul or convolution, the order of its dimensions its kernel reads
    them in (an operand held in another order is read through a transposed copy); None
    for other ops.

    A dot wants batch dims leading, then the left side's free dims and its contracting
    dims last, the right side's contracting dims right after the batch dims; a
    convolution wants NHWC input and HWIO kernel.
    """
    if op.primitive == "dot_general":
        (lc, rc), (lb, rb) = op.params["dimension_numbers"]
        lhs_free = [d for d in range(ranks[0]) if d not in lc and d not in lb]
        rhs_free = [d for d in range(ranks[1]) if d not in rc and d not in rb]
        return (*lb, *lhs_free, *lc), (*rb, *rc, *rhs_free)
    if op.primitive == "conv_general_dilated":
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
    if op.primitive == "dot_general":
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
    if op.primitive != "dot_general":
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
        if made is not None and program.ops[made].primitive in ("broadcast_in_dim", "iota"):
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


@dataclass(frozen=True, slots=True)
class OpEstimate:
    op: int
    cost: OpCost  # per run, on one device (bytes: what touches memory once fused)
    seconds: float  # per run
    count: int  # runs per step
    kernel: bool = True  # whether it launches a kernel (not fused into another, not free)

    @property
    def total_s(self) -> float:
        return self.seconds * self.count


@dataclass(frozen=True, slots=True)
class CollectiveEstimate:
    collective: Collective
    seconds: float  # per run, with the copies around it
    copy_s: float = 0.0  # per run: the part spent in those copies (see ``layout_copies``)

    @property
    def total_s(self) -> float:
        return self.seconds * self.collective.count


@dataclass(frozen=True)
class Memory:
    """Per-device bytes: the peak and what is live at it, by category."""

    peak: int
    at_peak: Mapping[str, int]  # category -> bytes live at the peak
    arguments: int  # the inputs, held throughout
    outputs: int  # the outputs (with the pointer table of their tuple)
    temporaries: int  # the largest live total of everything but inputs and outputs
    capacity: float
    # model state held per device: parameters and optimizer state as stored, gradients in
    # the layout the optimizer reads them (what the ZeRO stages divide)
    states: Mapping[str, int] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return self.peak <= self.capacity

    def __str__(self) -> str:
        parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in self.at_peak.items() if v)
        verdict = "fits" if self.fits else "DOES NOT FIT"
        return (
            f"peak {format_bytes(self.peak)} of {format_bytes(self.capacity)} ({verdict}): {parts}"
        )


@dataclass(frozen=True)
class Estimate:
    """One step on one device, as the simulator sees it."""

    hardware: str
    compute_s: float
    communication_s: float  # every collective, in sequence
    step_s: float  # after overlap
    overlap: str | float
    by_kind: Mapping[str, float]  # collective kind -> seconds
    flops: float  # per device per step
    memory: Memory
    ops: tuple[OpEstimate, ...] = field(repr=False)
    collectives: tuple[CollectiveEstimate, ...] = field(repr=False)
    kernels: int = 0  # kernels launched per device per step (ops after fusion, local steps)
    fresh_memory_s: float = 0.0  # part of compute: first touch of fresh per-step buffers

    def by_tactic(self) -> dict[int | None, float]:
        """Communication seconds per tactic index (None: no tactic behind it)."""
        out: dict[int | None, float] = {}
        for c in self.collectives:
            out[c.collective.tactic] = out.get(c.collective.tactic, 0.0) + c.total_s
        return out

    def __str__(self) -> str:
        kinds = ", ".join(f"{k} {format_seconds(v)}" for k, v in self.by_kind.items() if v)
        return (
            f"step {format_seconds(self.step_s)} on {self.hardware} (compute {format_seconds(self.compute_s)}, "
            f"communication {format_seconds(self.communication_s)}{': ' + kinds if kinds else ''}; "
            f"overlap {self.overlap}); memory {self.memory}"
        )


def _src_key(fetch) -> tuple:
    """The buffer a fetch reads: (value, layout), and the copy when the plan makes several."""
    key = (fetch.value, fetch.src)
    return (*key, fetch.src_copy) if fetch.src_copy else key


def _dst_key(fetch) -> tuple:
    """The buffer a fetch makes (see ``_src_key``)."""
    key = (fetch.value, fetch.dst)
    return (*key, fetch.copy) if fetch.copy else key


def category(program, vid: int) -> str:
    """Which part of training memory a value belongs to, from its role in the program's
    anatomy (parameters, gradients, optimizer state) and where it is used."""
    v = program.values[vid]
    role = program.anatomy().role_of(vid)
    if role == "parameter":
        return "parameters"
    if role == "optimizer_state":
        return "optimizer"
    if role == "gradient":
        return "gradients"
    if v.kind == "input":
        return "activations"  # the batch
    producer = program.ops[v.producer] if v.producer is not None else None
    if producer is None:
        return "temporaries"
    users = [program.ops[u].phase for u in program.users[vid]]
    if producer.phase == "forward" and "backward" in users:
        return "activations"  # saved for the backward pass
    if producer.phase == "backward" and "optimizer" in users:
        return "gradients"
    return "temporaries"


@dataclass(frozen=True)
class _Static:
    """What the simulator needs of a program that no tactic changes, computed once."""

    order: tuple  # ops in program order
    position: dict  # op id -> index in ``order``
    categories: tuple  # per value
    fused: frozenset  # values kept inside fused kernels
    folded: frozenset  # matmul results read only by a transpose: written transposed, once
    unbuffered: frozenset  # fused | folded: values the memory model gives no buffer of their own
    in_place: frozenset  # positions of elementwise kernels
    copies: tuple  # (op id, operand indices read through a transposed copy)
    # per ``per_reader``: (values each fused kernel reading them recomputes,
    # (op id, operand index) of each copy -> what the copy reads); see ``fusion``
    fusions: dict
    copy_kept: dict  # (op id, operand index) -> (leading, trailing) dims left in place
    optimizer_ops: tuple  # op ids in the optimizer phase
    # the optimizer's ops in ``order``: (op id, position, tensor operands, results)
    optimizer_steps: tuple
    priced: tuple  # (op id, values of it that may stay fused) for every op without regions
    fusing: dict  # op id -> those values
    alike: dict  # op id -> a class of ops priced alike (see ``_alike``)
    from_inputs: frozenset  # values made from the step's inputs alone (``made_from_inputs``)

    @classmethod
    def of(cls, program) -> _Static:
        return program.cache.get("estimate.static", lambda: cls._build(program))

    @classmethod
    def _build(cls, program) -> _Static:
        order = tuple(program.walk(schedule(program)))
        outputs = {v for v in program.outputs if isinstance(v, int)}
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
        folded = {
            v
            for op in program.ops
            if op.primitive == "dot_general"
            for v in op.results
            if v not in outputs
            and len(program.users[v]) == 1
            and program.ops[program.users[v][0]].primitive == "transpose"
        }
        fusing = {}
        for op in program.ops:
            tensors = [v for v in op.operands if isinstance(v, int)] + list(op.results)
            fusing[op.id] = tuple(dict.fromkeys(v for v in tensors if v in fused))
        copies, kept = [], {}
        for op in program.ops:
            if op.primitive in COPYING:
                ranks = [len(program.operand_type(v).shape) for v in op.operands]
                if ks := copied_operands(op, ranks):
                    copies.append((op.id, ks))
                    wanted = wanted_orders(op, ranks)
                    kept.update({(op.id, k): kept_in_place(wanted[k]) for k in ks})
        return cls(
            order=order,
            position={op.id: i for i, op in enumerate(order)},
            categories=tuple(category(program, v.id) for v in program.values),
            fused=frozenset(fused),
            folded=frozenset(folded),
            unbuffered=frozenset(fused | folded),
            in_place=frozenset(i for i, op in enumerate(order) if op.primitive in FUSIBLE),
            copies=tuple(copies),
            fusions={},
            copy_kept=kept,
            optimizer_ops=tuple(op.id for op in program.ops if op.phase == "optimizer"),
            optimizer_steps=tuple(
                (
                    op.id,
                    i,
                    tuple(v for v in op.linked_operands if isinstance(v, int)),
                    op.results,
                )
                for i, op in enumerate(order)
                if op.phase == "optimizer"
            ),
            priced=tuple((op.id, fusing[op.id]) for op in program.ops if not op.regions),
            fusing=fusing,
            alike=_alike(program, fusing),
            from_inputs=made_from_inputs(program),
        )

    def fusion(self, program, per_reader: bool) -> tuple[frozenset, dict]:
        """``(recomputed values, what each transposed copy reads)`` for a compiler that
        does or does not recompute sums in every reader (``Hardware.fuses_per_reader``),
        computed the first time a spec of that kind asks."""
        if per_reader not in self.fusions:
            again = recomputed(program, per_reader)
            self.fusions[per_reader] = (
                again,
                {
                    (o_id, k): copy_reads(program, program.ops[o_id].operands[k], again)
                    for o_id, ks in self.copies
                    for k in ks
                },
            )
        return self.fusions[per_reader]


def schedule(program) -> list[int]:
    """The program's top-level ops in the order a memory-aware scheduler runs them: program
    order, except that each optimizer update (and each rename) runs as soon as what it reads
    is made, so a gradient is consumed, and freed, right after it is computed."""
    body = program.body
    at = {oid: i for i, oid in enumerate(body)}
    made: dict[int, int] = {}  # value -> the top-level op that makes it
    for oid in body:
        for op in program.walk([oid]):
            for v in op.linked_results:
                made[v] = oid
    ready: dict[int, int] = {}  # op id -> the position after which it may run
    for oid in body:
        op = program.ops[oid]
        if op.phase == "optimizer" or op.primitive == "name":
            sources = [  # a region op's linked operands include its own regions' outputs
                made[v]
                for v in op.linked_operands
                if isinstance(v, int) and v in made and made[v] != oid
            ]
            ready[oid] = max((ready[s] for s in sources), default=-1)
        else:
            ready[oid] = at[oid]
    return sorted(body, key=lambda oid: (ready[oid], ready[oid] != at[oid], at[oid]))


def _alike(program, fusing: dict) -> dict[int, int]:
    """Op id -> a class of ops that cost the same in the same layouts: ops alike
    (``Program.alike``) whose fusible tensors sit in the same places."""
    classes: dict = {}
    out = {}
    for op, c in zip(program.ops, program.alike):
        # which of its tensors may stay fused, by position (``fused`` flags follow them)
        where = tuple(i for i, v in enumerate((*op.operands, *op.results)) if v in fusing[op.id])
        out[op.id] = classes.setdefault((c, where), len(classes))
    return out


class _Simulator:
    def __init__(self, program, mesh: Mesh, state, plan, hardware: Hardware):
        self.program, self.mesh, self.state, self.plan = program, mesh, state, plan
        self.hw = hardware
        # op costs and times per hardware spec and mesh: a time is only good for the spec it
        # was priced on, and a layout names mesh axes, whose sizes set its local shape
        caches = program.cache.get("estimate.op costs", dict)
        self.cache = caches.setdefault((hardware, mesh), {})
        self.static = _Static.of(program)

    # -- time ------------------------------------------------------------------------------
    def op_estimates(self) -> list[OpEstimate]:
        """Per op, its cost and time on one device. Cached per hardware spec and mesh by
        everything the price depends on (the op, its layouts, which of its tensors stay
        fused)."""
        out = []
        append, cache, plan_ops = out.append, self.cache, self.plan.ops
        # a value the plan redistributes is read from memory: it cannot stay fused
        redistributed = self.plan.redistributed
        for op_id, candidates in self.static.priced:
            o = plan_ops[op_id]
            if o is None:
                continue
            fused = tuple(v not in redistributed for v in candidates) if candidates else ()
            key = (op_id, o.operands, o.results, o.repeats, fused)
            hit = cache.get(key)
            if hit is None:
                alike = ("alike", self.static.alike[op_id], o.operands, o.results, fused)
                priced = cache.get(alike)
                if priced is None:
                    priced = cache[alike] = self.price(op_id, o, fused)
                cost, seconds, kernel = priced
                hit = cache[key] = OpEstimate(op_id, cost, seconds, o.repeats, kernel)
            append(hit)
        return out

    def price(self, op_id: int, o, fused: tuple[bool, ...]) -> tuple[OpCost, float, bool]:
        """One op's cost, seconds per run and whether it launches a kernel; ``fused`` says,
        per candidate in ``_Static.fusing``, whether that tensor stays inside a fused kernel."""
        p, mesh, hw = self.program, self.mesh, self.hw
        op = p.ops[op_id]
        kept = {v for v, f in zip(self.static.fusing[op_id], fused) if f}
        ins = [
            s.local_shape(mesh) if s is not None else None for s in o.operands[: len(op.operands)]
        ]
        outs = [s.local_shape(mesh) for s in o.results[: len(op.results)]]
        in_fused = [isinstance(v, int) and v in kept for v in op.operands]
        out_fused = [v in kept for v in op.results]
        operands = [
            TensorType(shape, p.operand_type(v).dtype) if shape is not None else p.operand_type(v)
            for v, shape in zip(op.operands, ins)
        ]
        results = [TensorType(shape, p.values[v].dtype) for v, shape in zip(op.results, outs)]
        cost = op_cost(op.primitive, op.params, operands, results)
        free = op.primitive in FREE
        # a fused value lives in registers: neither written nor read from memory
        inside = sum(
            tensor_bytes(t) for t, f in zip(operands, in_fused) if f and t is not None
        ) + sum(tensor_bytes(t) for t, f in zip(results, out_fused) if f)
        cost = replace(cost, bytes_accessed=0.0 if free else max(cost.bytes_accessed - inside, 0.0))
        kernel = not free and bool(op.results) and not all(out_fused)
        dtype = p.values[op.results[0]].dtype if op.results else None
        seconds = 0.0 if free else op_time(cost, hw, dtype)
        seconds += hw.op_overhead if kernel else 0.0
        return cost, seconds, kernel

    def operand_copies(self) -> tuple[float, int]:
        """Seconds and kernels per step of the transposed operand copies matmuls and
        convolutions read (the copies the memory model holds, see ``copied_operands``),
        each fused into the kernel that makes its operand (``copy_bytes``)."""
        hw, plan = self.hw, self.plan
        seconds, kernels = 0.0, 0
        for o_id, ks in self.static.copies:
            o = plan.ops[o_id]
            if o is None:
                continue
            for k in ks:
                read, written = self.copy_bytes(o_id, k)
                seconds += o.repeats * (
                    (read + written) / self.copy_rate(o_id, k, read) + hw.op_overhead
                )
                kernels += o.repeats
        return seconds, kernels

    def copy_rate(self, op_id: int, k: int, read: float) -> float:
        """Bytes/s of the transposed copy of operand ``k`` of op ``op_id`` that reads
        ``read`` bytes. The strided reads are what leave the caches: each slice below the
        leading dimensions the copy keeps in place is transposed on its own, at
        ``hardware.copy_bandwidth`` of what it reads of that slice; a copy that keeps
        trailing dimensions moving whole cache lines (``CACHE_LINE_BYTES`` or more) streams
        at the memory bandwidth (XLA's CPU copies of convolution operands from NHWC that
        keep C innermost run 10x faster than those that move it)."""
        o = self.plan.ops[op_id]
        operand = o.operands[k]
        shape = operand.local_shape(self.mesh)
        lead, trail = self.static.copy_kept[(op_id, k)]
        run = math.prod(shape[len(shape) - trail :]) * operand.dtype.itemsize
        if trail and run >= CACHE_LINE_BYTES:
            return self.hw.hbm_bandwidth
        return self.hw.copy_bandwidth(read / max(math.prod(shape[:lead]), 1))

    def copy_bytes(self, op_id: int, k: int) -> tuple[float, float]:
        """``(read, written)`` bytes of the transposed copy of operand ``k`` of op
        ``op_id``: it writes the operand and reads, in transposed order, the inputs of the
        elementwise kernel it is fused into (``copy_reads``, stopping at the values the plan
        redistributes: each is a buffer of its own), or the operand itself where nothing
        fuses into it (made by another kind of op, or itself read through a
        redistribution)."""
        mesh, plan = self.mesh, self.plan
        size = plan.ops[op_id].operands[k].local_nbytes(mesh)
        again, walked = self.static.fusion(self.program, self.hw.fuses_per_reader)
        reads = walked[(op_id, k)]
        operand = self.program.ops[op_id].operands[k]
        redistributed = plan.redistributed
        if reads is None or operand in redistributed:
            return size, size
        if not reads[0].isdisjoint(redistributed):  # the chain stops at those buffers
            cut = reads[0] & redistributed
            walks = self.program.cache.get("estimate.copy reads cut", dict)
            key = (op_id, k, cut, self.hw.fuses_per_reader)
            if key not in walks:
                walks[key] = copy_reads(self.program, operand, again, cut)
            reads = walks[key]
        read = 0.0
        for reader, i in reads[1]:
            layout = plan.ops[reader].operands[i] if plan.ops[reader] is not None else None
            if layout is None:  # an op the plan does not run
                return size, size
            read += layout.local_nbytes(mesh)
        return read, size

    def local_steps(self) -> tuple[float, int]:
        """Seconds and kernels per step of the local redistribution steps (slices, masks):
        each a kernel that copies what it keeps."""
        mesh, hw = self.mesh, self.hw
        seconds, kernels = 0.0, 0
        fetches = [(f, o.repeats) for o in self.plan.ops if o is not None for f in o.fetches]
        fetches += [(f, 1) for f in self.plan.outputs]
        for f, repeats in fetches:
            if f is None:
                continue
            for step in f.steps:
                if not step.is_collective:
                    nbytes = 2 * step.after.local_nbytes(mesh)
                    seconds += repeats * (nbytes / hw.hbm_bandwidth + hw.op_overhead)
                    kernels += repeats
        return seconds, kernels

    def collective_estimates(self) -> list[CollectiveEstimate]:
        """Per collective of the plan, its time with the copies around it. The gradient
        all-reduces a runtime combines (``buckets``, and a loop step's ``step_end``) run
        as one collective over the same axes, up to the runtime's threshold: its time (one
        latency, the bytes of all) is shared among them by bytes. A program output's
        all-reduce (a loss, needed only at the end) joins the last bucket."""
        hw, mesh = self.hw, self.mesh
        combined: dict[tuple, list[int]] = {}  # (bucket, axes, reduction) -> collective indices
        buckets = self.buckets
        bucket_of = {o_id: b for b, members in enumerate(buckets) for _, o_id in members}
        if buckets:
            bucket_of[None] = len(buckets) - 1
        collectives = self.plan.collectives
        seconds = []
        for i, c in enumerate(collectives):
            b = None
            if c.kind == "all-reduce":
                if c.count == 1:
                    b = bucket_of.get(c.op)
                elif (c.op, c.value) in self.step_end:
                    b = ("step", c.op)
            if b is None:
                seconds.append(collective_time(c.kind, c.bytes, c.axes, mesh, hw))
            else:  # priced with its bucket below
                combined.setdefault((b, c.axes, c.reduction), []).append(i)
                seconds.append(0.0)
        limit = hw.all_reduce_combine_bytes
        for (_, axes, _), members in combined.items():
            chunks, size = [[]], 0.0  # a runtime combines up to its threshold
            for i in members:
                if chunks[-1] and (
                    size + collectives[i].bytes > limit or len(chunks[-1]) >= COMBINE_COUNT
                ):
                    chunks.append([])
                    size = 0.0
                chunks[-1].append(i)
                size += collectives[i].bytes
            for chunk in chunks:
                total = sum(collectives[i].bytes for i in chunk)
                t = collective_time("all-reduce", total, axes, mesh, hw)
                for i in chunk:
                    seconds[i] = t * collectives[i].bytes / total
        out = []
        for c, t in zip(collectives, seconds):
            nbytes, kernels = layout_copies(c, mesh)
            copy = nbytes / hw.copy_bandwidth(c.bytes) + kernels * hw.op_overhead
            out.append(CollectiveEstimate(c, t + copy, copy))
        return out

    # -- memory ----------------------------------------------------------------------------
    def memory(self) -> Memory:
        """Sweep program order: each layout a value is held in lives from the op that makes it
        to the last op that reads it (see ``estimate``)."""
        p, mesh, plan, static = self.program, self.mesh, self.plan, self.static
        position, plan_ops = static.position, plan.ops
        # a compiler writes a matmul's result in the order its transpose wants (one buffer);
        # a value the plan redistributes is read from memory: it cannot stay fused
        fused = static.unbuffered
        if plan.redistributed:
            fused = fused - plan.redistributed
        end = len(position)
        # (value, layout) -> [first, last, bytes]; layouts the plan holds carry no tactic pins
        spans: dict[tuple, list] = {}
        shrink_only: dict[tuple, bool] = {}  # natural layouts read only to be shrunk
        made_at: dict[int, int] = {}

        def touch(key, at, *, made=False, shrink=False):
            span = spans.get(key)
            if span is None:
                spans[key] = [at, at, key[1].local_nbytes(mesh)]
            else:
                if at < span[0]:
                    span[0] = at
                if at > span[1]:
                    span[1] = at
            if not shrink:
                shrink_only[key] = made and shrink_only.get(key, True)

        for v in p.inputs:
            key = (v, as_layout(self.state.shardings[v]))
            touch(key, -1)
            touch(key, end)
        for v in p.consts:
            touch((v, p.values[v].type_sharding()), -1)
        copies: list[tuple[int, int]] = []  # (position, bytes) of layout copies
        relaid_made: dict[tuple, int] = {}  # a layout a collective makes on a transposed copy
        eager: list[tuple[tuple, int]] = []  # shrunk layouts, made as soon as their source exists
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
        # a fused value is recomputed by each kernel that reads it: what it is made from
        # (the buffers its producer read) stays live until its last reader
        sources: dict[int, tuple] = {}  # fused value -> (fused operands, buffers read)
        read_last: dict[int, int] = {}  # fused value -> the last position that reads it
        for at, op in enumerate(static.order):
            o = plan_ops[op.id]
            if o is None:
                continue
            reduce_at = reduced_at.get(at)
            if runs_at is not None:
                at = runs_at[at]
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
                if fetch is None:
                    continue
                v, src, dst = fetch.value, _src_key(fetch), _dst_key(fetch)
                if not fetch.steps:
                    # a fused value is held where its reader is not elementwise (a
                    # compiler saves what several kernels read); a folded one never is
                    if v not in static.folded or v not in fused:
                        touch(src, at)
                        if fetch.dst is not fetch.src:
                            touch(dst, at, made=True)
                    continue
                if reduce_at is not None and any(s.kind == "all-reduce" for s in fetch.steps):
                    touch(src, reduce_at)  # reduced with its bucket, then freed
                    touch(dst, reduce_at)
                    touch(dst, at)
                    continue
                for s in fetch.steps:
                    if relaid(s.kind, s.dim, s.before, s.after, mesh):
                        # the whole array is held in both layouts while the shard is
                        # copied in or out: beyond the whole and the shard, one more whole
                        # array less the shard, where the layout is made
                        extra = abs(s.before.local_nbytes(mesh) - s.after.local_nbytes(mesh))
                        relaid_made[dst] = max(relaid_made.get(dst, 0), extra)
                shrinking = fetch.dst.local_nbytes(mesh) < fetch.src.local_nbytes(mesh)
                touch(src, at, shrink=shrinking)
                touch(dst, at)
                if shrinking:
                    eager.append((dst, v))
        for fetch in plan.outputs:
            if fetch is not None:
                touch(_src_key(fetch), end)
                touch(_dst_key(fetch), end)
        # latest readers first: a fused value's last read is its fused operands' last read
        for v in reversed(sources):
            last = read_last.get(v)
            if last is None:
                continue
            inner, read = sources[v]
            for u in inner:
                if read_last.get(u, -2) < last:
                    read_last[u] = last
            for key in read:
                touch(key, last)
        # a layout read only to be shrunk is shrunk where it is made, then freed
        layouts: dict[int, list[tuple]] = {}  # value -> its span keys
        held: set[tuple] = set()  # spans shrunk where they are made: held through it
        if eager:
            for k in spans:
                layouts.setdefault(k[0], []).append(k)
        for key, src_value in eager:
            natural = [k for k in layouts.get(src_value, ()) if shrink_only.get(k) and k != key]
            if natural and src_value in made_at:
                spans[key][0] = min(spans[key][0], made_at[src_value])
                for k in natural:
                    spans[k][1] = spans[k][0]
                    held.add(k)
        copies += [(spans[key][0], nbytes) for key, nbytes in relaid_made.items()]
        return self.sweep(spans, copies, end, in_place, held)

    def hidden(self, c: Collective) -> bool:
        """Whether the "prefetch" policy hides ``c`` behind compute: a gather of a value made
        from the step's inputs alone, or the reduction of a gradient (read by the update,
        or returned by a backward loop's step)."""
        if c.kind == "all-gather":
            return c.value in self.static.from_inputs
        if c.kind not in ("reduce-scatter", "all-reduce") or c.op is None:
            return False
        phase = self.program.ops[c.op].phase
        return phase == "optimizer" or (phase == "backward" and (c.op, c.value) in self.step_end)

    @cached_property
    def step_end(self) -> frozenset[tuple[int, int]]:
        """``(loop op, value)`` for each value a loop's body returns: what the body reduces at
        the end of each step is independent, and a runtime combines it into one all-reduce
        per step, as it combines the update's gradients (``buckets``)."""
        return frozenset(
            (op.id, v)
            for op in self.program.ops
            for region in op.regions
            for v in region.outputs
            if isinstance(v, int)
        )

    @cached_property
    def buckets(self) -> list[list[tuple[int, int]]]:
        """The combined gradient all-reduces: per bucket, ``(position, op id)`` of each
        optimizer op whose operands it reduces (buckets of one op combine nothing and are
        left out).

        Runtimes combine independent all-reduces into one (XLA's all-reduce combiner, the
        gradient buckets of data-parallel frameworks) of up to
        ``hardware.all_reduce_combine_bytes`` and ``COMBINE_COUNT`` operands: a bucket
        closes when full or when an op needs the result of one of its own members.
        """
        limit = self.hw.all_reduce_combine_bytes
        plan_ops, steps = self.plan.ops, self.static.optimizer_steps
        buckets: list[list[tuple[int, int]]] = []
        size = 0.0
        bucket_of: dict[int, int] = {}  # value -> the last bucket it depends on
        for o_id, at, operands, results in steps:
            o = plan_ops[o_id]
            if o is None:
                continue
            after = max([bucket_of.get(v, -1) for v in operands], default=-1)
            reduced = 0
            for f in o.fetches:
                if f is not None and f.steps:
                    reduced += sum(st.bytes for st in f.steps if st.kind == "all-reduce")
            if reduced:
                full = not buckets or size + reduced > limit or len(buckets[-1]) >= COMBINE_COUNT
                if full or after == len(buckets) - 1:  # full, or it needs the open bucket
                    buckets.append([])
                    size = 0.0
                buckets[-1].append((at, o_id))
                size += reduced
                after = len(buckets) - 1
            if after >= 0:
                for v in results:
                    bucket_of[v] = after
        return [b for b in buckets if len(b) > 1]

    def combined_reductions(self) -> tuple[list[int] | None, dict[int, int]]:
        """Where combined all-reduces (``buckets``) move the optimizer: ``(runs_at,
        reduced_at)``, the position each op of ``order`` runs at instead (None: nothing
        moves) and, per position of an op that reads a gradient a combined all-reduce
        reduces, the position that all-reduce runs at.

        The gradients of a bucket are reduced together after the last of them is made, so
        each stays live until then, and the ops that read them, and what reads their
        results, run after it.
        """
        steps = self.static.optimizer_steps
        buckets = [[at for at, _ in b] for b in self.buckets]
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
        p, mesh, plan = self.program, self.mesh, self.plan
        out = dict.fromkeys(("parameters", "gradients", "optimizer"), 0)
        for v in p.inputs:
            cat = self.static.categories[v]
            if cat in out:
                out[cat] += self.state.shardings[v].local_nbytes(mesh)
        read: dict[
            int, int
        ] = {}  # pending gradient -> the fewest bytes an optimizer op reads it in
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


def donations(program, state) -> dict[int, int]:
    """Output value -> index of the input it replaces: an output the anatomy sees fed back as
    an input (a parameter's update, its optimizer state), in the same layout. A training
    loop donates those inputs (``jax.jit(..., donate_argnums=...)``), as the simulator's
    memory assumes."""
    sh = state.shardings
    position = {v: i for i, v in enumerate(program.inputs)}
    out = {}
    for o, v in program.anatomy().feedback.items():
        if sh[v].dims == sh[o].dims:
            out[o] = position[v]
    return out


@without_gc
def estimate(program, mesh: Mesh, state, plan, hardware: Hardware, *, overlap="none") -> Estimate:
    """The simulator's estimate of one step (see module doc)."""
    sim = _Simulator(program, mesh, state, plan, hardware)
    ops = sim.op_estimates()
    collectives = sim.collective_estimates()
    local_s, local_kernels = sim.local_steps()
    copy_s, copy_kernels = sim.operand_copies()
    memory = sim.memory()
    fresh_s = hardware.fresh_memory_time(sim.per_step_buffers(memory))
    compute = sum(o.total_s for o in ops) + local_s + copy_s + fresh_s
    by_kind = dict.fromkeys(KINDS, 0.0)
    for c in collectives:
        by_kind[c.collective.kind] += c.total_s
    communication = sum(by_kind.values())
    hidden = 0.0
    if overlap == "prefetch":
        hidden = sum(c.total_s for c in collectives if sim.hidden(c.collective))
    return Estimate(
        hardware=hardware.name,
        compute_s=compute,
        communication_s=communication,
        step_s=overlapped(compute, communication, overlap, hidden),
        overlap=overlap,
        by_kind=by_kind,
        flops=sum((o.cost.flops + o.cost.transcendentals) * o.count for o in ops),
        kernels=sum(o.count for o in ops if o.kernel) + local_kernels + copy_kernels,
        memory=memory,
        ops=tuple(ops),
        collectives=tuple(collectives),
        fresh_memory_s=fresh_s,
    )
