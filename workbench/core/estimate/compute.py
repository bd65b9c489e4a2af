"""Compute time of one step per device: per op a roofline at the local shapes the plan runs
it at (``costs.op_cost``, ``costs.op_time``) with what stays fused taken out, plus the local
steps of redistributions and the transposed operand copies of matmuls and convolutions,
each kernel paying ``hardware.op_overhead``."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from workbench.core import ops
from workbench.core.dtypes import is_extended
from workbench.core.estimate.fusion import FREE, copy_reads
from workbench.core.estimate.static import PlannedStep
from workbench.core.ops.costs import OpCost, op_cost, tensor_bytes
from workbench.core.ops.mapping import TensorType

#: Bytes a cache line holds: a copy that moves contiguous runs this long or longer streams.
CACHE_LINE_BYTES = 64


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


class Compute(PlannedStep):
    """The compute of one plan: ops, local redistribution steps, transposed operand copies."""

    def __init__(self, program, mesh, state, plan, hardware):
        super().__init__(program, mesh, state, plan, hardware)
        # op costs and times per hardware spec and mesh: a time is only good for the spec it
        # was priced on, and a layout names mesh axes, whose sizes set its local shape
        caches = program.cache.get("estimate.op costs", dict)
        self.cache = caches.setdefault((hardware, mesh), {})

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
        per candidate in ``Static.fusing``, whether that tensor stays inside a fused kernel."""
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
        t = ops.traits(op.primitive)
        seconds = 0.0 if free else op_time(cost, hw, dtype, t.contraction or t.convolution)
        seconds += hw.op_overhead if kernel else 0.0
        return cost, seconds, kernel

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


def op_time(cost: OpCost, hardware, dtype=None, matmul: bool = False) -> float:
    """Roofline seconds: max((flops + transcendentals) / rate, bytes / HBM bandwidth), the
    rate a matmul's (``matmul``: the peak times its measured share, `Hardware.matmul_flops`,
    times what its shape keeps of it on the chip's tiles, ``Hardware.matmul_tiles``) or
    else the dtype's peak.

    One peak per dtype (the matrix unit's): elementwise work really runs on slower
    vector units, but it is almost always memory-bound, so the max rarely changes.
    """
    if is_extended(dtype):  # key arrays: the work is on their uint32 words
        dtype = np.uint32
    rate = hardware.matmul_flops(dtype) if matmul else hardware.peak_flops(dtype)
    if matmul and hardware.matmul_tiles is not None:
        rate *= hardware.matmul_tiles.share(cost.gemm)
    compute = (cost.flops + cost.transcendentals) / rate
    return max(compute, cost.bytes_accessed / hardware.hbm_bandwidth)
