"""An interpreter of captured programs, shared by every lowering.

It evaluates ops in program order by re-binding their primitives, and rebuilds loops
and branches with ``lax.scan``, ``lax.while_loop`` and ``lax.switch`` around regions it
interprets recursively. Subclasses decide how operands are read and ops are bound: at
global shapes (the reference and the constrained lowering) or per device (explicit).
"""

from __future__ import annotations

import numpy as np

from workbench.core.ir.program import Lit, Op
from workbench.core.ops import traits as traits_of


def literal(lit: Lit):
    return np.asarray(lit.value, dtype=lit.dtype)


class Interpreter:
    """Evaluates a Program; ``env`` maps value ids to arrays (tracers while tracing)."""

    def __init__(self, program, extra=()):
        self.program = program
        self.extra = tuple(extra)  # value ids whose arrays ``__call__`` returns after the outputs

    # -- hooks ---------------------------------------------------------------------------
    def read(self, env: dict, v, op: Op | None, slot: int):
        """The array for operand ``slot`` of ``op`` (op None: a program output)."""
        return literal(v) if isinstance(v, Lit) else env[v]

    def bind(self, op: Op, args: list) -> list:
        if traits_of(op.primitive).constraint:  # a layout, not a computation: the
            return list(args)  # lowerings place the plan's own (which imports it)
        params = dict(op.params)
        out = op.jax_primitive.bind(*args, **params)
        return list(out) if op.jax_primitive.multiple_results else [out]

    def define(self, env: dict, op: Op | None, v: int, array, slot: int) -> None:
        """Record result (or region input) ``slot`` of ``op``."""
        env[v] = array

    def region_output(self, env: dict, op: Op, v, slot: int):
        """Region output ``slot`` (counted over all the op's regions), read at the end of its body."""
        return self.read(env, v, op, slot)

    # -- walking -------------------------------------------------------------------------
    def run(self, env: dict, op_ids) -> None:
        for o in op_ids:
            op = self.program.ops[o]
            args = [self.read(env, v, op, t) for t, v in enumerate(op.operands)]
            outs = self.region(env, op, args) if op.regions else self.bind(op, args)
            for j, (v, array) in enumerate(zip(op.results, outs)):
                self.define(env, op, v, array, j)

    def _body(self, env: dict, op: Op, k: int, values, out_start: int, in_start: int) -> list:
        region = op.regions[k]
        inner = dict(env)
        for i, (v, array) in enumerate(zip(region.inputs, values)):
            self.define(inner, op, v, array, in_start + i)
        self.run(inner, region.ops)
        return [
            self.region_output(inner, op, v, out_start + i) for i, v in enumerate(region.outputs)
        ]

    def region(self, env: dict, op: Op, args: list) -> list:
        """A loop or branch, by JAX's control flow around its interpreted regions."""
        control = traits_of(op.primitive).control
        if control is None:  # pragma: no cover
            raise NotImplementedError(f"no interpreter for region op {op.primitive}")

        def body(k, values, out_start, in_start):
            return self._body(env, op, k, values, out_start, in_start)

        return control.run(op.params, args, len(op.operands), len(op.results), body)

    def outputs(self, env: dict) -> list:
        return [self.read(env, v, None, i) for i, v in enumerate(self.program.outputs)]

    def start(self, flat_args) -> dict:
        p = self.program
        env = {v: a for v, a in zip(p.inputs, flat_args)}
        for v, array in p.consts.items():
            env[v] = array
        return env

    def __call__(self, *flat_args):
        env = self.start(flat_args)
        self.run(env, self.program.body)
        return self.outputs(env) + self.extras(env)

    def extras(self, env: dict) -> list:
        """The arrays of ``extra``, read at the end of the program."""
        return [env[v] for v in self.extra]
