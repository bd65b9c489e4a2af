"""Elementwise primitives: every operand of full rank shares the result's factors.

Rank-0 operands (scalar literals such as ``2.0`` in ``mul x 2.0``) carry no factors. Each
primitive's row in the tables below gives its FLOPs and transcendentals per element
(XLA:CPU's counts, measured for the functions XLA expands into polynomials) and its CPU
fusion class; ``why`` marks the classes read from XLA:CPU rather than today's tables.
"""

from __future__ import annotations

from dataclasses import replace

import jax.numpy as jnp
import numpy as np

from workbench.core import caches
from workbench.core.ops.costs import OpCost, PerElement, elements, free, io_bytes, moves
from workbench.core.ops.local import as_it_is
from workbench.core.ops.mapping import FactorMapping, MappingBuilder, TensorType
from workbench.core.ops.record import EXPENSIVE, KERNEL, LOOP, RENAME, Traits
from workbench.core.ops.registry import register


def pointwise(operands, results, **kwargs) -> FactorMapping:
    """The shared builder: one factor per result dimension, shared by all full-rank tensors.

    A size-1 operand dimension facing a larger result dimension is broadcast (lax binary
    ops allow that): it carries no factor. Mappings are values: ops of the same shapes (the
    elementwise ops of repeated layers) share one, built once (``_pointwise``).
    """
    return _pointwise(
        tuple(t.shape for t in operands),
        tuple(t.shape for t in results),
        tuple(sorted(kwargs.items())),
    )


@caches.cache("ops.elementwise mappings", maxsize=8192)
def _pointwise(operand_shapes, result_shapes, kwargs) -> FactorMapping:
    operands = [TensorType(s) for s in operand_shapes]
    results = [TensorType(s) for s in result_shapes]
    shape = results[0].shape
    b = MappingBuilder()
    dims = b.dims_for(shape)
    for t in operands:
        if t.rank == len(shape):
            if any(n != m and n != 1 for n, m in zip(t.shape, shape)):
                raise ValueError(
                    f"operand shape {t.shape} does not broadcast to result shape {shape}"
                )
            b.operand([f if n == m else () for f, n, m in zip(dims, t.shape, shape)])
        elif t.rank == 0:
            b.operand(())
        else:
            raise ValueError(f"operand of rank {t.rank} in an op of rank {len(shape)}")
    for t in results:
        b.result(dims if t.rank == len(shape) else ())
    return b.build(**dict(kwargs))


# -- fusion classes decided by what XLA:CPU compiles (tests/core/ops/test_fusion_cpu.py) ----------
_XLA = "not in the simulator's tables before; XLA:CPU "
#: fused into loop kernels, and computed once where a matmul and a loop kernel both read it
DEAR = replace(EXPENSIVE, why=_XLA + "fuses it and computes it once for several readers")
#: fused into loop kernels and recomputed in each reader
CHEAP = replace(LOOP, why=_XLA + "fuses it and recomputes it in each reader")
#: expanded into while loops: several kernels, nothing fuses through them
LOOPS = replace(KERNEL, why=_XLA + "expands it into while loops (several kernels)")
#: kept as the tables had it though XLA:CPU recomputes it per reader (cheap for real types
#: in XLA's IsExpensive): the golden estimates pin it
TABLE_DEAR = replace(EXPENSIVE, why="the tables' class; XLA:CPU recomputes it in each reader")
#: compiled to nothing inside jit
VANISHES = replace(RENAME, why=_XLA + "compiles it to nothing inside jit, like a rename")

# name: (flops, transcendentals) per element, CPU fusion. Arithmetic is (1, 0), XLA's
# transcendental opcodes (0, 1); the rest are XLA:CPU's counts of their expansion (the
# total-order comparisons ``*_to`` of sorting and searchsorted: 9, a compare of bit patterns).
UNARY_TABLE = {
    "abs": (1, 0, LOOP), "acos": (3, 2, DEAR), "acosh": (7, 4, DEAR), "asin": (5, 2, DEAR),
    "asinh": (11, 3, DEAR), "atan": (0, 1, DEAR), "atanh": (6, 2, DEAR),
    "bessel_i0e": (83, 1, DEAR), "bessel_i1e": (83, 1, DEAR), "cbrt": (0, 1, DEAR),
    "ceil": (1, 0, LOOP), "clz": (1, 0, CHEAP), "cos": (0, 1, TABLE_DEAR), "cosh": (3, 2, DEAR),
    "digamma": (73, 3, DEAR), "erf": (0, 1, EXPENSIVE), "erf_inv": (37, 2, DEAR),
    "erfc": (60, 1, DEAR), "exp": (0, 1, EXPENSIVE), "exp2": (1, 1, EXPENSIVE),
    "expm1": (0, 1, EXPENSIVE), "floor": (1, 0, LOOP), "is_finite": (1, 0, LOOP),
    "lgamma": (52, 4, DEAR), "log": (0, 1, EXPENSIVE), "log1p": (0, 1, EXPENSIVE),
    "logistic": (3, 1, EXPENSIVE), "not": (1, 0, LOOP), "population_count": (1, 0, CHEAP),
    "round": (1, 0, LOOP), "rsqrt": (0, 1, EXPENSIVE), "sign": (1, 0, LOOP),
    "sin": (0, 1, TABLE_DEAR), "sinh": (10, 3, DEAR), "sqrt": (0, 1, EXPENSIVE),
    "square": (1, 0, LOOP), "tan": (0, 1, TABLE_DEAR), "tanh": (0, 1, EXPENSIVE),
}  # fmt: skip
BINARY_TABLE = {
    "and": (1, 0, LOOP), "atan2": (0, 1, DEAR), "clamp": (1, 0, LOOP), "complex": (1, 0, CHEAP),
    "eq": (1, 0, LOOP), "eq_to": (9, 0, CHEAP), "ge": (1, 0, LOOP), "gt": (1, 0, LOOP),
    "igamma": (268, 6, LOOPS), "igammac": (268, 6, LOOPS), "le": (1, 0, LOOP),
    "le_to": (9, 0, CHEAP), "lt": (1, 0, LOOP), "lt_to": (9, 0, CHEAP), "max": (1, 0, LOOP),
    "min": (1, 0, LOOP), "ne": (1, 0, LOOP), "nextafter": (23, 0, CHEAP), "or": (1, 0, LOOP),
    "pow": (0, 1, EXPENSIVE), "rem": (1, 0, DEAR), "shift_left": (1, 0, CHEAP),
    "shift_right_arithmetic": (1, 0, CHEAP), "shift_right_logical": (1, 0, CHEAP),
    "xor": (1, 0, LOOP),
}  # fmt: skip
LINEAR_UNARY_TABLE = {
    "neg": (1, 0, LOOP), "real": (1, 0, CHEAP), "imag": (1, 0, CHEAP), "conj": (1, 0, CHEAP),
}  # fmt: skip
UNARY = (*UNARY_TABLE, "integer_pow")
BINARY = tuple(BINARY_TABLE)
LINEAR_UNARY = (*LINEAR_UNARY_TABLE, "reduce_precision")
IDENTITY = ("copy", "copy_p", "name", "stop_gradient")


def _pointwise_rule(params, operands, results):
    return pointwise(operands, results)


def _linear_unary_rule(params, operands, results):
    return pointwise(operands, results, linear=((0,),))


for _table, _rule in ((UNARY_TABLE, _pointwise_rule), (BINARY_TABLE, _pointwise_rule),
                      (LINEAR_UNARY_TABLE, _linear_unary_rule)):  # fmt: skip
    for _name, (_flops, _trans, _fusion) in _table.items():
        register(_name, cost=PerElement(float(_flops), float(_trans)), fusion=_fusion)(_rule)

register(
    "reduce_precision",
    cost=PerElement(1.0),
    fusion=CHEAP,
    traits=Traits(transparent=True, rounding=True),
)(_linear_unary_rule)


def _integer_pow_cost(params, operands, results):
    # JAX multiplies by repeated squaring, then divides once for a negative exponent.
    y = int(params.get("y", 2))
    k = abs(y)
    muls = 0 if k == 0 else (k.bit_length() - 1) + (bin(k).count("1") - 1)
    flops = (muls + (y < 0)) * elements(results[0])
    if y == 0:  # a broadcast of ones: only the result is written
        return OpCost(0.0, 0.0, io_bytes((), results))
    return OpCost(flops, 0.0, io_bytes(operands, results))


register("integer_pow", cost=_integer_pow_cost, fusion=LOOP)(_pointwise_rule)


# a user's ``with_sharding_constraint``, and JAX's explicit ``reshard`` (which ``auto_axes``
# and ``explicit_axes`` lower to): the identity on values. Per device each is the identity:
# the plan already holds its target (``io.imports`` reads it into the schedule), and its
# mesh is global
@register(
    "sharding_constraint",
    "reshard",
    cost=free,
    fusion=VANISHES,
    local=as_it_is,
    traits=Traits(transparent=True, constraint=True),
)
@register("copy", cost=moves, fusion=LOOP, traits=Traits(transparent=True))
@register("copy_p", cost=moves, fusion=CHEAP, traits=Traits(transparent=True))
@register("name", cost=free, fusion=RENAME, traits=Traits(transparent=True, tag="name"))
@register("stop_gradient", cost=free, fusion=RENAME)
def _identity_rule(params, operands, results):
    return pointwise(operands, results, linear=((0,),), structural=True)


#: per constraint primitive: the source ``io.imports`` names it by, and the param holding
#: its target sharding
CONSTRAINTS = {
    "sharding_constraint": ("with_sharding_constraint", "sharding"),
    "reshard": ("reshard", "dst_sharding"),
}


def constraint_target(op) -> tuple[str, object] | None:
    """``(source, sharding)`` of a constraint op (its record's ``constraint`` trait): the
    user's call it comes from and the sharding it asks for; None for any other op."""
    found = CONSTRAINTS.get(op.primitive)
    return None if found is None else (found[0], op.params.get(found[1]))


@register(
    "convert_element_type",
    cost=PerElement(1.0),
    fusion=LOOP,
    traits=Traits(transparent=True, cast=True),
)
def _convert_rule(params, operands, results):
    # float -> float keeps sums and order; a cast to an integer rounds, so it is not linear
    floats = is_float(operands[0].dtype) and is_float(results[0].dtype)
    return pointwise(operands, results, linear=((0,),) if floats else (), structural=floats)


@register(
    "bitcast_convert_type",
    cost=PerElement(1.0),
    fusion=replace(CHEAP, why=_XLA + "fuses it into loop kernels (a same-width bitcast-convert)"),
    traits=Traits(bitwise=True),
)
def _bitcast_rule(params, operands, results):
    """Same width: elementwise. To a narrower type a trailing dim appears (wider: it goes);
    it is blocked."""
    (x,), (out,) = operands, results
    if x.rank == out.rank:
        return pointwise(operands, results)
    b = MappingBuilder()
    lead = b.dims_for(min(x, out, key=lambda t: t.rank).shape)
    extra = [
        (b.factor(n, blocked=True),) for n in max(x, out, key=lambda t: t.rank).shape[len(lead) :]
    ]
    b.operand(lead if x.rank < out.rank else [*lead, *extra])
    b.result(lead if out.rank < x.rank else [*lead, *extra])
    return b.build()


@register("add", "sub", cost=PerElement(1.0), fusion=LOOP)
@register("add_any", cost=PerElement(1.0), fusion=LOOP, traits=Traits(accumulates=True))
def _add_rule(params, operands, results):
    return pointwise(operands, results, linear=((0, 1),))


@register("mul", cost=PerElement(1.0), fusion=LOOP)
def _mul_rule(params, operands, results):
    return pointwise(operands, results, linear=((0,), (1,)))


@register("div", cost=PerElement(1.0), fusion=EXPENSIVE)
def _div_rule(params, operands, results):
    return pointwise(operands, results, linear=((0,),))


def _select_n_cost(params, operands, results):
    cases = len(operands) - 1
    per = 1 if cases <= 2 else 2 * (cases - 1)  # a chain of compares and selects
    return OpCost(per * elements(results[0]), 0.0, io_bytes(operands, results))


@register("select_n", cost=_select_n_cost, fusion=LOOP)
def _select_n_rule(params, operands, results):
    # select_n(pred, *cases): linear in the cases together, never in the predicate
    return pointwise(operands, results, linear=(tuple(range(1, len(operands))),))


@register(
    "optimization_barrier",
    cost=moves,
    fusion=replace(VANISHES, why=_XLA + "expands its opt-barrier away: nothing is left inside jit"),
)
@register("device_put", cost=free, fusion=VANISHES)
def _identity_per_operand_rule(params, operands, results):
    """Operand i and result i share their factors."""
    b = MappingBuilder()
    per = [b.dims_for(t.shape) for t in operands]
    for dims in per:
        b.operand(dims)
    for dims in per[: len(results)]:
        b.result(dims)
    return b.build(
        structural=True,
        linear=tuple((i,) for i in range(len(operands))) if len(operands) == 1 else (),
    )


def is_float(dtype) -> bool:
    """True for floating and complex dtypes, bfloat16 and the float8s included."""
    return jnp.issubdtype(dtype, jnp.inexact)


def is_zero_literal(t: TensorType) -> bool:
    return t.literal is not None and t.rank == 0 and float(np.asarray(t.literal)) == 0.0
