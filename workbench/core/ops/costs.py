"""What one op costs on one device: FLOPs, transcendentals and bytes accessed.

`op_cost(primitive, params, operands, results)` prices one jaxpr equation on
per-device (local) shapes, by the conventions of XLA's ``HloCostAnalysis`` (what
``jax.jit(f).lower(*args).compile().cost_analysis()`` reports, checked on CPU for
one function per primitive family in tests/core/test_costs.py):

- **flops**: one per output element for elementwise arithmetic, comparisons,
  selects, clamps and converts (``convert_element_type`` counts one, like XLA);
  ``integer_pow`` the multiplies of repeated squaring (+1 divide when negative);
  ``select_n`` with more than two cases 2 (cases - 1) (compares and selects).
  ``dot_general``: 2 x output elements x contracting size. ``conv_general_dilated``:
  2 x (C_in / feature groups) x C_out x (batch / batch groups) x the product over
  spatial dims of the kernel taps that land on real (not padding, not dilation-hole)
  input, exactly XLA's ``GetConvolutionFlops``. Reductions: (input - output
  elements) reducer applications, one flop each (argmax/argmin: 9 per application
  for floats, 7 for integers, XLA's count of JAX's comparator). ``reduce_window``:
  (window size - 1) per output element, padding included. ``select_and_scatter_add``:
  window size per source element. ``sort``: n x ceil(log2 n), n the elements of the
  whole first operand (XLA's formula). ``fft``: 8 x prod(log2 fft_lengths) x elements.
- **transcendentals**: one per element for exp, log, tanh, sin, cos, tan, sqrt,
  rsqrt, cbrt, erf, expm1, log1p, pow, atan2 (and logistic, with 3 flops). Functions
  XLA expands into polynomials (acos, erf_inv, lgamma, ...) count the flops and
  transcendentals of their expansion, as measured on XLA:CPU (`ELEMENTWISE`).
- **bytes accessed**: every operand plus every result (literal operands at their
  own, scalar, size), except where XLA knows an op touches less: slice and
  dynamic_slice read only what they write (2 x output, + indices); gather likewise
  (2 x output + indices); dynamic_update_slice and scatter work in place
  (2 x update + indices; scatter 3 x updates + indices).

Where op_cost deliberately differs from XLA (noted in the tests):

- Cumulative ops (cumsum, cumprod, cummax, cummin, cumlogsumexp): JAX lowers them to
  an O(n^2) reduce-window that XLA rewrites per backend (XLA:CPU reports ~17 flops
  per element for long axes); op_cost counts the work-efficient scan, n - 1
  combines per line (cumlogsumexp: 8 flops + 2 transcendentals per combine).
- Random bits (``threefry2x32``, ``random_bits``): XLA counts the body of the
  rolled round loop once; op_cost counts the 20 rounds (~120 flops per pair of
  32-bit words). Their costs sit in their records (``rules/random.py``).
- ``top_k`` is a custom call that XLA:CPU reports as -1; op_cost counts a partial
  sort, n x ceil(log2(k + 1)) per row.
- XLA fuses: inside a fusion only the fusion's inputs and outputs touch memory, so
  the sum of op_cost bytes over a program overestimates a compiled program's
  bytes; flops and transcendentals add up the same. XLA:CPU also rewrites a dot with
  no contracting dimension into a multiply (1 flop per element, not 2) and upcasts
  bfloat16 elementwise ops to float32 (converts counted as flops).

Control flow and calls (``scan``, ``while``, ``cond``, ``jit``, custom calls) cost
nothing themselves: price the ops in their bodies (`jaxpr_cost` does, for a jaxpr).
Collectives under shard_map cost their local part only (``psum``: one flop per
element, like XLA's all-reduce); their communication time is
``hardware.collective_time``. An unknown primitive costs 0 flops and the bytes of
its operands and results.

`op_time(cost, hardware, dtype)` is the roofline: max(compute, memory) where compute
is (flops + transcendentals) / peak FLOP/s of ``dtype`` and memory is bytes / HBM
bandwidth.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from workbench.core.dtypes import is_extended
from workbench.core.dtypes import itemsize as dtype_itemsize
from workbench.core.ops.mapping import TensorType
from workbench.core.ops.registry import RECORDS


@dataclass(frozen=True, slots=True)
class OpCost:
    """Per-device work of one op (or a sum of ops)."""

    flops: float = 0.0
    transcendentals: float = 0.0
    bytes_accessed: float = 0.0

    def __add__(self, other: OpCost) -> OpCost:
        return OpCost(
            self.flops + other.flops,
            self.transcendentals + other.transcendentals,
            self.bytes_accessed + other.bytes_accessed,
        )

    def __mul__(self, k: float) -> OpCost:
        return OpCost(self.flops * k, self.transcendentals * k, self.bytes_accessed * k)

    __rmul__ = __mul__


ZERO = OpCost()


def op_cost(
    primitive: str,
    params,
    operands: Sequence[TensorType],
    results: Sequence[TensorType],
) -> OpCost:
    """The cost of one ``primitive`` on these local operand and result types."""
    params = params or {}
    record = RECORDS.get(primitive)
    if record is not None and record.cost is not None:  # the primitive's own record
        return record.cost(params, list(operands), list(results))
    rule = _RULES.get(primitive)
    if rule is None:
        if primitive in ELEMENTWISE:
            f, t = ELEMENTWISE[primitive]
            n = _elems(results[0]) if results else 0
            return OpCost(f * n, t * n, _io(operands, results))
        return OpCost(0.0, 0.0, _io(operands, results))
    return rule(params, list(operands), list(results))


def op_time(cost: OpCost, hardware, dtype=None) -> float:
    """Roofline seconds: max((flops + transcendentals) / peak(dtype), bytes / HBM bandwidth).

    One peak per dtype (the matrix unit's): elementwise work really runs on slower
    vector units, but it is almost always memory-bound, so the max rarely changes.
    """
    if is_extended(dtype):  # key arrays: the work is on their uint32 words
        dtype = np.uint32
    compute = (cost.flops + cost.transcendentals) / hardware.peak_flops(dtype)
    return max(compute, cost.bytes_accessed / hardware.hbm_bandwidth)


def is_known(primitive: str) -> bool:
    """Whether op_cost has a rule for ``primitive`` (else it uses the unknown default)."""
    record = RECORDS.get(primitive)
    return primitive in _RULES or primitive in ELEMENTWISE or bool(record and record.cost)


# -- sizes ------------------------------------------------------------------------------------------
def _elems(t: TensorType) -> int:
    return math.prod(t.shape)


def itemsize(dtype) -> int:
    """Bytes per element (per key for PRNG key dtypes); 4 when the dtype is unknown (None)."""
    return dtype_itemsize(dtype)


def tensor_bytes(t: TensorType) -> int:
    """Bytes of one tensor (elements x itemsize)."""
    return _elems(t) * itemsize(t.dtype)


_nbytes = tensor_bytes


def _io(operands, results) -> int:
    return sum(_nbytes(t) for t in operands) + sum(_nbytes(t) for t in results)


# -- the rules ------------------------------------------------------------------------------------
Rule = Callable[[dict, list, list], OpCost]
_RULES: dict[str, Rule] = {}


def _rule(*names: str):
    def deco(fn: Rule) -> Rule:
        for n in names:
            _RULES[n] = fn
        return fn

    return deco


# Elementwise primitives: (flops, transcendentals) per output element. Arithmetic is
# (1, 0); XLA's transcendental opcodes are (0, 1); the rest are XLA:CPU's counts of
# the expansion JAX/XLA emit (measured with compile().cost_analysis()).
_ARITH = (
    "abs", "add", "add_any", "and", "ceil", "clamp", "clz", "complex", "conj",
    "convert_element_type", "div", "eq", "floor", "ge", "gt", "imag", "is_finite", "le",
    "lt", "max", "min", "mul", "ne", "neg", "not", "or", "population_count", "real",
    "reduce_precision", "rem", "round", "shift_left", "shift_right_arithmetic",
    "shift_right_logical", "sign", "square", "sub", "xor", "bitcast_convert_type"
)  # fmt: skip
_TRANSCENDENTAL = (
    "atan", "atan2", "cbrt", "cos", "erf", "exp", "expm1", "log", "log1p", "pow", "rsqrt",
    "sin", "sqrt", "tan", "tanh"
)  # fmt: skip
ELEMENTWISE: dict[str, tuple[float, float]] = {
    **{p: (1.0, 0.0) for p in _ARITH},
    **{p: (0.0, 1.0) for p in _TRANSCENDENTAL},
    "logistic": (3.0, 1.0),
    "exp2": (1.0, 1.0),
    "acos": (3.0, 2.0),
    "asin": (5.0, 2.0),
    "acosh": (7.0, 4.0),
    "asinh": (11.0, 3.0),
    "atanh": (6.0, 2.0),
    "cosh": (3.0, 2.0),
    "sinh": (10.0, 3.0),
    "erfc": (60.0, 1.0),
    "erf_inv": (37.0, 2.0),
    "lgamma": (52.0, 4.0),
    "digamma": (73.0, 3.0),
    "bessel_i0e": (83.0, 1.0),
    "bessel_i1e": (83.0, 1.0),
    "igamma": (268.0, 6.0),
    "igammac": (268.0, 6.0),
    "nextafter": (23.0, 0.0),
}


@_rule("integer_pow")
def _integer_pow(params, operands, results):
    # JAX multiplies by repeated squaring, then divides once for a negative exponent.
    y = int(params.get("y", 2))
    k = abs(y)
    muls = 0 if k == 0 else (k.bit_length() - 1) + (bin(k).count("1") - 1)
    flops = (muls + (y < 0)) * _elems(results[0])
    if y == 0:  # a broadcast of ones: only the result is written
        return OpCost(0.0, 0.0, sum(_nbytes(t) for t in results))
    return OpCost(flops, 0.0, _io(operands, results))


@_rule("select_n")
def _select_n(params, operands, results):
    cases = len(operands) - 1
    per = 1 if cases <= 2 else 2 * (cases - 1)  # a chain of compares and selects
    return OpCost(per * _elems(results[0]), 0.0, _io(operands, results))


@_rule("dot_general")
def _dot_general(params, operands, results):
    (lc, _), _ = params["dimension_numbers"]
    k = math.prod(operands[0].shape[d] for d in lc)
    return OpCost(2.0 * _elems(results[0]) * k, 0.0, _io(operands, results))


@_rule("conv_general_dilated")
def _conv(params, operands, results):
    lhs, rhs = operands[0], operands[1]
    out = results[0]
    dn = params["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    nsp = len(lhs_spec) - 2
    strides = params.get("window_strides", (1,) * nsp)
    padding = params.get("padding", ((0, 0),) * nsp)
    lhs_dil = params.get("lhs_dilation") or (1,) * nsp
    rhs_dil = params.get("rhs_dilation") or (1,) * nsp
    valid = 1
    for i in range(nsp):
        valid *= _valid_taps(
            lhs.shape[lhs_spec[2 + i]],
            rhs.shape[rhs_spec[2 + i]],
            out.shape[out_spec[2 + i]],
            strides[i],
            padding[i][0],
            lhs_dil[i],
            rhs_dil[i],
        )
    groups = int(params.get("feature_group_count", 1))
    batch_groups = int(params.get("batch_group_count", 1))
    fma = (
        lhs.shape[lhs_spec[1]]
        // groups
        * out.shape[out_spec[1]]
        * (lhs.shape[lhs_spec[0]] // batch_groups)
        * valid
    )
    return OpCost(2.0 * fma, 0.0, _io(operands, results))


def _valid_taps(n_in, n_k, n_out, stride, pad_lo, lhs_dil, rhs_dil) -> int:
    """(kernel tap, output position) pairs of one spatial dim that read a real input."""
    k = np.arange(n_k)[:, None]
    o = np.arange(n_out)[None, :]
    pos = o * stride - pad_lo + k * rhs_dil  # index into the dilated input
    ok = (pos % lhs_dil == 0) & (pos >= 0) & (pos // lhs_dil < n_in)
    return int(ok.sum())


@_rule(
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or", "reduce_xor"
)
def _reduce(params, operands, results):
    applied = _elems(operands[0]) - _elems(results[0])
    return OpCost(float(applied), 0.0, _io(operands, results))


@_rule("argmax", "argmin")
def _argreduce(params, operands, results):
    applied = _elems(operands[0]) - _elems(results[0])
    per = 9 if jnp.issubdtype(operands[0].dtype or "float32", jnp.inexact) else 7
    return OpCost(float(per * applied), 0.0, _io(operands, results))


def _combines(params, x: TensorType) -> int:
    """n - 1 combines along the scanned axis, per line: a work-efficient scan."""
    n = x.shape[params.get("axis", 0)] if x.shape else 1
    return _elems(x) // max(n, 1) * max(n - 1, 0)


@_rule("cumsum", "cumprod", "cummax", "cummin")
def _cumulative(params, operands, results):
    return OpCost(float(_combines(params, operands[0])), 0.0, _io(operands, results))


@_rule("cumlogsumexp")
def _cumlogsumexp(params, operands, results):
    c = _combines(params, operands[0])  # logaddexp: 8 flops and 2 transcendentals
    return OpCost(8.0 * c, 2.0 * c, _io(operands, results))


@_rule("reduce_window_sum", "reduce_window_max", "reduce_window_min", "reduce_window")
def _reduce_window(params, operands, results):
    window = math.prod(params.get("window_dimensions", (1,)))
    n_out = sum(_elems(r) for r in results)
    return OpCost(float((window - 1) * n_out), 0.0, _io(operands, results))


@_rule("select_and_scatter_add")
def _select_and_scatter_add(params, operands, results):
    # XLA: (window - 1) selects (one compare) + 1 scatter (one add) per source element.
    window = math.prod(params.get("window_dimensions", (1,)))
    return OpCost(float(window * _elems(operands[0])), 0.0, _io(operands, results))


@_rule("select_and_gather_add")
def _select_and_gather_add(params, operands, results):
    # lowered to a reduce-window over (value, tangent) pairs: 3 flops per combine
    window = math.prod(params.get("window_dimensions", (1,)))
    return OpCost(float(3 * (window - 1) * _elems(results[0])), 0.0, _io(operands, results))


@_rule("sort")
def _sort(params, operands, results):
    n = _elems(operands[0])
    return OpCost(float(n * math.ceil(math.log2(n))) if n > 1 else 0.0, 0.0, _io(operands, results))


@_rule("top_k")
def _top_k(params, operands, results):
    k = int(params.get("k", results[0].shape[-1] if results[0].shape else 1))
    return OpCost(
        float(_elems(operands[0]) * max(1, math.ceil(math.log2(k + 1)))),
        0.0,
        _io(operands, results),
    )


@_rule("fft")
def _fft(params, operands, results):
    lengths = params.get("fft_lengths", ())
    logs = math.prod(int(math.log2(n)) for n in lengths) if lengths else 1
    return OpCost(8.0 * logs * _elems(operands[0]), 0.0, _io(operands, results))


# -- data movement ----------------------------------------------------------------------------------
_MOVE = (
    "broadcast_in_dim", "reshape", "transpose", "squeeze", "expand_dims", "rev",
    "concatenate", "pad", "copy", "copy_p", "iota", "optimization_barrier"
)  # fmt: skip
for _p in _MOVE:
    _RULES[_p] = lambda p, o, r: OpCost(0.0, 0.0, _io(o, r))


@_rule("slice", "split")
def _slice(params, operands, results):
    return OpCost(0.0, 0.0, 2 * sum(_nbytes(r) for r in results))


@_rule("dynamic_slice")
def _dynamic_slice(params, operands, results):
    idx = sum(_nbytes(t) for t in operands[1:])
    return OpCost(0.0, 0.0, 2 * _nbytes(results[0]) + idx)


@_rule("dynamic_update_slice")
def _dynamic_update_slice(params, operands, results):
    idx = sum(_nbytes(t) for t in operands[2:])
    return OpCost(0.0, 0.0, 2 * _nbytes(operands[1]) + idx)


@_rule("gather")
def _gather(params, operands, results):
    return OpCost(0.0, 0.0, 2 * _nbytes(results[0]) + _nbytes(operands[1]))


_SCATTER_COMBINE = {
    "scatter": 0,
    "scatter-add": 1,
    "scatter_add": 1,
    "scatter-sub": 1,
    "scatter_sub": 1,
    "scatter-mul": 1,
    "scatter_mul": 1,
    "scatter-min": 1,
    "scatter_min": 1,
    "scatter-max": 1,
    "scatter_max": 1,
}


def _scatter(params, operands, results, combine: int):
    updates = operands[2]
    flops = float(combine * _elems(updates))
    return OpCost(flops, 0.0, 3 * _nbytes(updates) + _nbytes(operands[1]))


for _p, _c in _SCATTER_COMBINE.items():
    _RULES[_p] = lambda p, o, r, _c=_c: _scatter(p, o, r, _c)


# -- random bits: jax.random keeps its costs in its records (rules/random.py) --------------
@_rule("rng_uniform")
def _rng_uniform(params, operands, results):  # XLA: one transcendental per generated element
    return OpCost(0.0, float(sum(_elems(r) for r in results)), _io(operands, results))


# -- free, structural, collectives ------------------------------------------------------------------
_FREE = (
    "scan", "while", "cond", "jit", "pjit", "closed_call", "core_call", "remat", "remat2",
    "checkpoint", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr",
    "custom_lin", "shard_map", "xla_pmap", "run_state", "device_put", "sharding_constraint",
    "mesh_cast", "reshard", "name", "stop_gradient", "pvary"
)  # fmt: skip
for _p in _FREE:
    _RULES[_p] = lambda p, o, r: ZERO


@_rule("psum", "pmax", "pmin", "psum_invariant")
def _all_reduce(params, operands, results):
    return OpCost(float(sum(_elems(r) for r in results)), 0.0, _io(operands, results))


for _p in ("all_gather", "all_to_all", "ppermute", "psum_scatter", "reduce_scatter", "pbroadcast"):
    _RULES[_p] = lambda p, o, r: OpCost(0.0, 0.0, _io(o, r))


# -- whole jaxprs -------------------------------------------------------------------------------------
def jaxpr_cost(jaxpr) -> OpCost:
    """The summed cost of a (closed) jaxpr's equations, on the shapes it was traced with.

    Calls are entered; a ``scan`` body counts ``length`` times; a ``while`` body and
    its condition once (the trip count is unknown); a ``cond`` costs its dearest branch.
    """
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    total = ZERO
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        subs = [v for v in eqn.params.values() if _is_jaxpr(v)]
        branches = eqn.params.get("branches")
        if name == "cond" and branches:
            costs = [jaxpr_cost(b) for b in branches]
            total += max(costs, key=lambda c: (c.flops + c.transcendentals, c.bytes_accessed))
        elif name == "scan":
            total += jaxpr_cost(eqn.params["jaxpr"]) * int(eqn.params["length"])
        elif subs and name in _FREE:
            for s in subs:
                total += jaxpr_cost(s)
        else:
            operands = [TensorType(tuple(v.aval.shape), v.aval.dtype) for v in eqn.invars]
            results = [TensorType(tuple(v.aval.shape), v.aval.dtype) for v in eqn.outvars]
            total += op_cost(name, eqn.params, operands, results)
    return total


def _is_jaxpr(v) -> bool:
    return hasattr(v, "eqns") or hasattr(getattr(v, "jaxpr", None), "eqns")
