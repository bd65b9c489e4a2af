"""Loops and branches: one mapping ties each region's inputs and outputs to the outside.

Operands are the outer operands then every region's outputs; results are the outer
results then every region's inputs (see ``registry``). Each loop-carried value has one
set of factors shared by its initial value, the body's input and output, and the final
value, so a carry reaches a fixed point like any other value. The iteration dimension
of scanned inputs and outputs is blocked. Pending reductions do not cross region edges:
a scan's per-step output is reduced in the step that makes it (as XLA does), not stacked
pending and reduced once after the loop. Each primitive's ``Control`` (its trait) says how
its regions stand for its operands, how often its body runs, and evaluates it with JAX's
control flow; the loops and branches cost nothing themselves (their bodies are priced).
"""

from __future__ import annotations

from jax import lax

from workbench.core.ops.costs import free
from workbench.core.ops.mapping import MappingBuilder
from workbench.core.ops.record import KERNEL, Control, Traits
from workbench.core.ops.registry import register

#: Region ops are not kernels: the simulator prices the ops of their bodies.
_REGIONS = KERNEL


def _arity(closed) -> tuple[int, int]:
    jaxpr = getattr(closed, "jaxpr", closed)
    return len(jaxpr.invars), len(jaxpr.outvars)


class _Slots:
    """Per-tensor dims for the extended operand and result lists, filled in any order."""

    def __init__(self, n_operands, n_results):
        self.operands: list = [None] * n_operands
        self.results: list = [None] * n_results

    def build(self, b: MappingBuilder, **kwargs):
        for dims in self.operands:
            b.operand(dims)
        for dims in self.results:
            b.result(dims)
        return b.build(**kwargs)


class _Scan(Control):
    __slots__ = ()
    kind = "loop"

    def region_operands(self, params, operands, n_regions):
        return [tuple(operands)]

    def regions(self, params, operands):
        nc, nk = params["num_consts"], params["num_carry"]
        roles = ("const",) * nc + ("carry",) * nk + ("x",) * (len(operands) - nc - nk)
        return (("body", params["jaxpr"], roles, tuple(operands)),)

    def carried(self, params, operands, region_inputs):
        nc = params["num_consts"]
        return range(nc, nc + params["num_carry"])

    def trips(self, params):
        return int(params["length"])

    def stacked(self, params, result):
        return result >= params["num_carry"]

    def jaxprs(self, params):
        return (params["jaxpr"],)

    def run(self, params, args, n_in, n_res, body):
        nc, nk = params["num_consts"], params["num_carry"]
        consts, init, xs = args[:nc], args[nc : nc + nk], args[nc + nk :]

        def step(carry, x):
            outs = body(0, [*consts, *carry, *x], n_in, n_res)
            return outs[:nk], outs[nk:]

        carry, ys = lax.scan(
            step,
            list(init),
            list(xs),
            length=params["length"],
            reverse=params["reverse"],
            unroll=params["unroll"],
        )
        return [*carry, *ys]


class _While(Control):
    __slots__ = ()
    kind = "loop"

    def region_operands(self, params, operands, n_regions):
        cn, bn = params["cond_nconsts"], params["body_nconsts"]
        carry = tuple(operands[cn + bn :])
        return [tuple(operands[:cn]) + carry, tuple(operands[cn : cn + bn]) + carry]

    def regions(self, params, operands):
        cn, bn = params["cond_nconsts"], params["body_nconsts"]
        cond_ops, body_ops = self.region_operands(params, operands, 2)
        k = len(operands) - cn - bn
        return (
            ("cond", params["cond_jaxpr"], ("const",) * cn + ("carry",) * k, cond_ops),
            ("body", params["body_jaxpr"], ("const",) * bn + ("carry",) * k, body_ops),
        )

    def carried(self, params, operands, region_inputs):
        k = len(operands) - params["cond_nconsts"] - params["body_nconsts"]
        return range(region_inputs - k, region_inputs)

    def jaxprs(self, params):
        return (params["cond_jaxpr"], params["body_jaxpr"])

    def run(self, params, args, n_in, n_res, body):
        cn, bn = params["cond_nconsts"], params["body_nconsts"]
        cconsts, bconsts, init = args[:cn], args[cn : cn + bn], args[cn + bn :]
        k = len(init)

        def cond_fn(carry):
            return body(0, [*cconsts, *carry], n_in, n_res)[0]

        def body_fn(carry):
            return body(1, [*bconsts, *carry], n_in + 1, n_res + cn + k)

        return list(lax.while_loop(cond_fn, body_fn, list(init)))


class _Cond(Control):
    __slots__ = ()
    kind = "branch"

    def region_operands(self, params, operands, n_regions):
        return [tuple(operands[1:])] * n_regions

    def regions(self, params, operands):
        ins = tuple(operands[1:])
        return tuple(
            (f"branch{i}", br, ("in",) * len(ins), ins) for i, br in enumerate(params["branches"])
        )

    def jaxprs(self, params):
        return tuple(params.get("branches") or ())

    def run(self, params, args, n_in, n_res, body):
        index, ins = args[0], args[1:]
        m, r = len(ins), n_res

        def branch(i):
            return lambda *xs: body(i, list(xs), n_in + i * r, n_res + i * m)

        return list(lax.switch(index, [branch(i) for i in range(len(params["branches"]))], *ins))


@register("scan", cost=free, fusion=_REGIONS, traits=Traits(control=_Scan()))
def _scan_rule(params, operands, results):
    # operands: consts (nc), carries (nk), xs (nx) + body outputs: carries (nk), ys (ny)
    # results:  carries (nk), ys (ny) + body inputs: consts (nc), carries (nk), xs (nx)
    nc, nk = params["num_consts"], params["num_carry"]
    n_in, n_out = _arity(params["jaxpr"])
    nx, ny = n_in - nc - nk, n_out - nk
    b = MappingBuilder()
    s = _Slots(len(operands), len(results))
    body_out, body_in = n_in, n_out
    for i in range(nc):
        s.operands[i] = s.results[body_in + i] = b.dims_for(operands[i].shape)
    for i in range(nk):
        dims = b.dims_for(operands[nc + i].shape)
        s.operands[nc + i] = s.results[i] = s.results[body_in + nc + i] = s.operands[
            body_out + i
        ] = dims
    for i in range(nx):
        outer = operands[nc + nk + i]
        inner = b.dims_for(outer.shape[1:])
        s.operands[nc + nk + i] = [(b.factor(outer.shape[0], blocked=True),), *inner]
        s.results[body_in + nc + nk + i] = inner
    for i in range(ny):
        outer = results[nk + i]
        inner = b.dims_for(outer.shape[1:])
        s.results[nk + i] = [(b.factor(outer.shape[0], blocked=True),), *inner]
        s.operands[body_out + nk + i] = inner
    return s.build(b)


@register("while", cost=free, fusion=_REGIONS, traits=Traits(control=_While()))
def _while_rule(params, operands, results):
    # operands: cond consts (cn), body consts (bn), init (k) + cond output (pred) + body outputs (k)
    # results:  outs (k) + cond inputs (cn consts, k carries) + body inputs (bn consts, k carries)
    cn, bn = params["cond_nconsts"], params["body_nconsts"]
    k = _arity(params["body_jaxpr"])[1]
    b = MappingBuilder()
    s = _Slots(len(operands), len(results))
    cond_in, body_in = k, k + cn + k
    for i in range(cn):
        s.operands[i] = s.results[cond_in + i] = b.dims_for(operands[i].shape)
    for i in range(bn):
        s.operands[cn + i] = s.results[body_in + i] = b.dims_for(operands[cn + i].shape)
    pred = cn + bn + k
    s.operands[pred] = b.dims_for(operands[pred].shape, blocked=True)
    for i in range(k):
        dims = b.dims_for(operands[cn + bn + i].shape)
        s.operands[cn + bn + i] = s.results[i] = dims
        s.results[cond_in + cn + i] = s.results[body_in + bn + i] = s.operands[pred + 1 + i] = dims
    return s.build(b)


@register("cond", cost=free, fusion=_REGIONS, traits=Traits(control=_Cond()))
def _cond_rule(params, operands, results):
    # operands: index, ins (m) + each branch's outputs (r); results: outs (r) + each branch's inputs (m)
    branches = params["branches"]
    m, r = _arity(branches[0])
    b = MappingBuilder()
    s = _Slots(len(operands), len(results))
    s.operands[0] = b.dims_for(operands[0].shape, blocked=True)
    for i in range(m):
        dims = b.dims_for(operands[1 + i].shape)
        s.operands[1 + i] = dims
        for br in range(len(branches)):
            s.results[r + br * m + i] = dims
    for j in range(r):
        dims = b.dims_for(results[j].shape)
        s.results[j] = dims
        for br in range(len(branches)):
            s.operands[1 + m + br * r + j] = dims
    return s.build(b)
