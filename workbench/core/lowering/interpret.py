"""An interpreter of captured programs, shared by every lowering.

It evaluates ops in program order by re-binding their primitives, and rebuilds loops
and branches with ``lax.scan``, ``lax.while_loop`` and ``lax.switch`` around regions it
interprets recursively. Subclasses decide how operands are read and ops are bound: at
global shapes (the reference and the constrained lowering) or per device (explicit).
"""

from __future__ import annotations

import numpy as np
from jax import lax

from workbench.core.ir.program import Lit, Op


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
        if op.primitive == "sharding_constraint":  # a layout, not a computation: the
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
        p = op.params
        n_in, n_res = len(op.operands), len(op.results)
        if op.primitive == "scan":
            nc, nk = p["num_consts"], p["num_carry"]
            consts, init, xs = args[:nc], args[nc : nc + nk], args[nc + nk :]

            def body(carry, x):
                outs = self._body(env, op, 0, [*consts, *carry, *x], n_in, n_res)
                return outs[:nk], outs[nk:]

            carry, ys = lax.scan(
                body,
                list(init),
                list(xs),
                length=p["length"],
                reverse=p["reverse"],
                unroll=p["unroll"],
            )
            return [*carry, *ys]
        if op.primitive == "while":
            cn, bn = p["cond_nconsts"], p["body_nconsts"]
            cconsts, bconsts, init = args[:cn], args[cn : cn + bn], args[cn + bn :]
            k = len(init)

            def cond_fn(carry):
                return self._body(env, op, 0, [*cconsts, *carry], n_in, n_res)[0]

            def body_fn(carry):
                return self._body(env, op, 1, [*bconsts, *carry], n_in + 1, n_res + cn + k)

            return list(lax.while_loop(cond_fn, body_fn, list(init)))
        if op.primitive == "cond":
            index, ops = args[0], args[1:]
            m, r = len(ops), len(op.results)

            def branch(i):
                return lambda *xs: self._body(env, op, i, list(xs), n_in + i * r, n_res + i * m)

            return list(lax.switch(index, [branch(i) for i in range(len(op.regions))], *ops))
        raise NotImplementedError(
            f"no interpreter for region op {op.primitive}"
        )  # pragma: no cover

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
