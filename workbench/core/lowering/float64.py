"""The program evaluated in float64: the reference a run's verdict measures errors against.

Every floating value is computed in float64 (complex in complex128), whatever dtype the
program asks for: inputs, literals and constants are widened, dtype parameters
(``convert_element_type``'s, ``dot_general``'s preferred type, ``iota``'s) are rewritten,
and ``reduce_precision`` is skipped. Ops that read bits rather than numbers
(``bitcast_convert_type``, the random primitives) run at the program's own dtypes and
their results are widened. The partitioned and the unpartitioned runs are then each judged
by their distance to this reference (``workbench.core.lowering.verdict``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr, jaxpr_as_fun

from workbench.core.dtypes import is_extended
from workbench.core.ir.program import Lit, Op
from workbench.core.lowering.interpret import Interpreter, literal
from workbench.core.ops import traits as traits_of


def wide(dtype):
    """The dtype a float64 evaluation holds ``dtype`` in."""
    if dtype is None or is_extended(dtype):
        return dtype
    dt = np.dtype(dtype)
    if jnp.issubdtype(dt, jnp.complexfloating):
        return np.dtype(np.complex128)
    if jnp.issubdtype(dt, jnp.floating):
        return np.dtype(np.float64)
    return dt


def widen(x):
    """``x`` converted to its wide dtype (unchanged if it has one already)."""
    dtype = getattr(x, "dtype", None)
    target = wide(dtype)
    return x if target is None or target == dtype else jnp.asarray(x, target)


def _wide_jaxpr(closed: ClosedJaxpr) -> ClosedJaxpr:
    """``closed`` traced again on wide inputs (a scatter's or a reduction's combiner)."""
    avals = [jax.ShapeDtypeStruct(a.shape, wide(a.dtype)) for a in closed.in_avals]
    return jax.make_jaxpr(jaxpr_as_fun(closed))(*avals)


def _wide_param(value):
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return wide(value)
    if isinstance(value, ClosedJaxpr):
        return _wide_jaxpr(value)
    if isinstance(value, Jaxpr) and not value.constvars:
        return _wide_jaxpr(ClosedJaxpr(value, [])).jaxpr
    return value


class Float64(Interpreter):
    """Evaluates a Program with every floating value in float64; ``extra``: value ids whose
    arrays are returned after the outputs."""

    def read(self, env, v, op, slot):
        return widen(literal(v)) if isinstance(v, Lit) else env[v]

    def bind(self, op: Op, args: list) -> list:
        traits = traits_of(op.primitive)
        if traits.rounding or traits.constraint:  # only rounds or places: the identity in float64
            return list(args)
        if not traits.bitwise:  # one that means its operands' bits runs at their dtypes, below
            try:
                params = {k: _wide_param(p) for k, p in op.params.items()}
                outs = op.jax_primitive.bind(*args, **params)
                return self._fit(op, list(outs) if op.jax_primitive.multiple_results else [outs])
            except (TypeError, ValueError):
                pass  # an op that insists on its dtypes: bind it at them
        own = [
            jnp.asarray(a, self.program.operand_type(v).dtype)
            if not is_extended(getattr(a, "dtype", None))
            else a
            for a, v in zip(args, op.operands)
        ]
        outs = op.jax_primitive.bind(*own, **op.params)
        return self._fit(op, list(outs) if op.jax_primitive.multiple_results else [outs])

    def _fit(self, op: Op, outs: list) -> list:
        """Results at their wide dtypes (floats widened, everything else as the program has it)."""
        fitted = []
        for v, out in zip(op.results, outs):
            dtype = self.program.values[v].dtype
            target = wide(dtype)
            if not is_extended(dtype) and out.dtype != target:
                out = jnp.asarray(out, target)
            fitted.append(out)
        return fitted

    def start(self, flat_args) -> dict:
        env = super().start([widen(a) for a in flat_args])
        for v in self.program.consts:
            env[v] = widen(env[v])
        return env


def reference64(program, flat_args, extra=()) -> list:
    """The program's outputs (then the arrays of ``extra`` value ids) computed in float64 on
    one device."""
    with jax.enable_x64(True):
        fn = jax.jit(Float64(program, extra))
        return [np.asarray(o) if not is_extended(o.dtype) else o for o in fn(*flat_args)]
