"""Elementwise primitives: every operand of full rank shares the result's factors.

Rank-0 operands (scalar literals such as ``2.0`` in ``mul x 2.0``) carry no factors.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from workbench.core import caches
from workbench.core.ops.mapping import FactorMapping, MappingBuilder, TensorType
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


UNARY = (
    "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "bessel_i0e", "bessel_i1e",
    "cbrt", "ceil", "clz", "cos", "cosh", "digamma", "erf", "erf_inv", "erfc", "exp", "exp2",
    "expm1", "floor", "integer_pow", "is_finite", "lgamma", "log", "log1p", "logistic", "not",
    "population_count", "round", "rsqrt", "sign", "sin", "sinh", "sqrt", "square", "tan", "tanh",
)  # fmt: skip
BINARY = (
    "and", "atan2", "clamp", "complex", "eq", "ge", "gt", "igamma", "igammac", "le", "lt",
    "max", "min", "ne", "nextafter", "or", "pow", "rem", "shift_left", "shift_right_arithmetic",
    "shift_right_logical", "xor",
)  # fmt: skip
LINEAR_UNARY = ("neg", "real", "imag", "conj", "reduce_precision")
IDENTITY = ("copy", "copy_p", "name", "stop_gradient")


@register(*UNARY, *BINARY)
def _pointwise_rule(params, operands, results):
    return pointwise(operands, results)


@register(*LINEAR_UNARY)
def _linear_unary_rule(params, operands, results):
    return pointwise(operands, results, linear=((0,),))


@register(*IDENTITY)
def _identity_rule(params, operands, results):
    return pointwise(operands, results, linear=((0,),), structural=True)


def _as_it_is(op, args, ins, outs, mesh):
    """Per device, a user's sharding constraint is the identity: the plan already holds it
    (``io.imports`` reads it into the schedule) and its mesh is global."""
    return list(args)


@register("sharding_constraint", local=_as_it_is)
def _sharding_constraint_rule(params, operands, results):
    return pointwise(operands, results, linear=((0,),), structural=True)


@register("convert_element_type")
def _convert_rule(params, operands, results):
    # float -> float keeps sums and order; a cast to an integer rounds, so it is not linear
    floats = is_float(operands[0].dtype) and is_float(results[0].dtype)
    return pointwise(operands, results, linear=((0,),) if floats else (), structural=floats)


@register("bitcast_convert_type")
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


@register("add", "sub", "add_any")
def _add_rule(params, operands, results):
    return pointwise(operands, results, linear=((0, 1),))


@register("mul")
def _mul_rule(params, operands, results):
    return pointwise(operands, results, linear=((0,), (1,)))


@register("div")
def _div_rule(params, operands, results):
    return pointwise(operands, results, linear=((0,),))


@register("select_n")
def _select_n_rule(params, operands, results):
    # select_n(pred, *cases): linear in the cases together, never in the predicate
    return pointwise(operands, results, linear=(tuple(range(1, len(operands))),))


@register("optimization_barrier", "device_put")
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
