"""Each value's rounding scale, measured beside the float64 reference.

A value computed in float32 carries rounding error, and how much depends on how it was
made, not on its size: a sum whose terms cancel (a gradient that is zero by symmetry) is
tiny, yet its error is of the size of its terms; an optimizer that divides by a gradient's
size (Adam) or takes its sign (Lion) turns a near-zero gradient's error into a full step.

``Rounding`` evaluates the program in float64 (as ``float64.Float64`` does) and, in its
*perturbed* runs, moves each op's floating results as rounding in the program's own dtypes
may: by up to ``eps`` (that of the result's dtype) times the result's size, and for a sum
(an op whose rule has contracting factors summed over: matmuls, convolutions, reductions)
times the sum of its terms' magnitudes (the op on the operands' magnitudes). Data movement
(structural ops) rounds nothing. The moves are pseudo-random, different per op, element and
run; the errors then travel through the rest of the program as real errors do, through
cancellations, normalisations, jumps and the optimizer. An element's rounding scale is the
largest distance of ``RUNS`` perturbed runs from the clean one (stochastic arithmetic,
as in CESTAC); the verdict (``verdict``) allows a partitioned result a few such scales.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from workbench.core import progress
from workbench.core.dtypes import epsilon, inexact, is_extended
from workbench.core.ir.program import Op
from workbench.core.lowering.float64 import Float64

RUNS = 2  # perturbed runs measured against the clean one
VARIANTS = 2  # random fields per operand shape, taken in turn by the sums


def _is_sum(mapping) -> bool:
    """An op whose rounding is simulated: a sum over contracting factors."""
    return (
        bool(mapping.contracting)
        and mapping.reduction == "sum"
        and not (mapping.structural or mapping.barrier)
    )


def fields(program, seed: int) -> dict:
    """Per operand shape of a sum, ``VARIANTS`` fields of pseudo-random numbers in [-1, 1)."""
    rng = np.random.default_rng(seed)
    shapes = {
        program.operand_type(v).shape
        for op in program.walk()
        if _is_sum(program.mapping(op))
        for v in op.operands
        if inexact(program.operand_type(v).dtype)
    }
    return {  # float32: plenty for a fraction of an epsilon, and half the memory
        str(s): rng.random((VARIANTS, *s), dtype=np.float32) * 2 - 1 for s in sorted(shapes)
    }


class Rounding(Float64):
    """The float64 evaluation; given ``amount`` 1 and random ``fields`` (inputs), each sum's
    terms are moved as rounding in the program's dtypes may move them."""

    def __init__(self, program, extra=()):
        super().__init__(program, extra)
        self.fields = self.amount = None

    def bind(self, op: Op, args: list) -> list:
        eps = max(epsilon(self.program.values[v].dtype) for v in op.results)
        if eps and _is_sum(
            self.program.mapping(op)
        ):  # each term rounds: the operands move for them (terms that cancel still leave an error)
            args = [
                a
                * (
                    1.0
                    + self.amount
                    * eps
                    * self.fields[str(jnp.shape(a))][(op.id + t) % VARIANTS].astype(jnp.float64)
                )
                if inexact(getattr(a, "dtype", None)) and str(jnp.shape(a)) in self.fields
                else a
                for t, a in enumerate(args)
            ]
        return super().bind(op, args)

    def __call__(self, fields, amount, *flat_args):
        self.fields, self.amount = fields, amount
        return super().__call__(*flat_args)


def reference_with_scales(program, flat_args, extra=()) -> tuple[list, list]:
    """The program's outputs (then ``extra`` value ids) in float64, and each one's rounding
    scale (None for integers, booleans and keys), on one device."""
    with jax.enable_x64(True):
        fn = jax.jit(Rounding(program, extra))
        drawn = [jax.device_put(fields(program, run)) for run in range(RUNS)]
        progress.stage("float64 reference")
        clean = fn(drawn[0], 0.0, *flat_args)  # moved by nothing
        xs = [np.asarray(o) if not is_extended(o.dtype) else o for o in clean]
        scales = [None if is_extended(x.dtype) or x.dtype.kind not in "fc" else 0.0 for x in xs]
        for k, field in enumerate(drawn):
            progress.stage(f"rounding scales {k + 1}/{RUNS}")
            moved = fn(field, 1.0, *flat_args)
            scales = [
                None if s is None else np.maximum(s, _distance(np.asarray(m), x))
                for s, m, x in zip(scales, moved, xs)
            ]
    return xs, [None if s is None else np.broadcast_to(s, np.shape(x)) for s, x in zip(scales, xs)]


def _distance(moved: np.ndarray, clean: np.ndarray) -> np.ndarray:
    """|moved - clean|, with equal non-numbers at distance 0 and a number that became a
    non-number (or back) at an unbounded one."""
    same = (moved == clean) | (np.isnan(moved) & np.isnan(clean))
    d = np.abs(moved - clean)
    return np.where(same, 0.0, np.where(np.isnan(d), np.inf, d))
