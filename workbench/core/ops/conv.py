"""conv_general_dilated: batch, input-feature (contracting) and output-feature factors.

Spatial dimensions need halo exchange to split, so they are blocked, except where the
window is a single element with unit stride, no padding and no dilation. Grouped
convolutions split the feature dimensions into (group, per-group) factors, and on local
shards count their local groups. The cost is XLA's ``GetConvolutionFlops``: 2 x (C_in /
groups) x C_out x (batch / batch groups) x the kernel taps that land on real input.
"""

from __future__ import annotations

import numpy as np

from workbench.core.ops.costs import OpCost, io_bytes
from workbench.core.ops.local import bind, local_params
from workbench.core.ops.mapping import MappingBuilder, barrier_mapping
from workbench.core.ops.record import COPYING, Traits
from workbench.core.ops.registry import register


def _conv_cost(params, operands, results):
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
    return OpCost(2.0 * fma, 0.0, io_bytes(operands, results))


def _valid_taps(n_in, n_k, n_out, stride, pad_lo, lhs_dil, rhs_dil) -> int:
    """(kernel tap, output position) pairs of one spatial dim that read a real input."""
    k = np.arange(n_k)[:, None]
    o = np.arange(n_out)[None, :]
    pos = o * stride - pad_lo + k * rhs_dil  # index into the dilated input
    ok = (pos % lhs_dil == 0) & (pos >= 0) & (pos // lhs_dil < n_in)
    return int(ok.sum())


def _conv_local(op, args, ins, outs, mesh):
    """A grouped convolution counts the groups of its local shards."""
    params = local_params(op)
    if params.get("feature_group_count", 1) > 1:
        dn = params["dimension_numbers"]
        lhs, rhs = (i.local_shape(mesh) for i in ins[:2])
        params["feature_group_count"] = lhs[dn.lhs_spec[1]] // rhs[dn.rhs_spec[1]]
    return bind(op, args, params)


@register(
    "conv_general_dilated",
    cost=_conv_cost,
    fusion=COPYING,
    local=_conv_local,
    traits=Traits(convolution=True),
)
def _conv_rule(params, operands, results):
    lhs, rhs = operands
    (out,) = results
    dn = params["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    groups = int(params.get("feature_group_count", 1))
    if int(params.get("batch_group_count", 1)) != 1:
        return barrier_mapping(operands, results)
    b = MappingBuilder()
    ld: list = [None] * lhs.rank
    rd: list = [None] * rhs.rank
    od: list = [None] * out.rank
    n = b.factor(lhs.shape[lhs_spec[0]])
    ld[lhs_spec[0]] = od[out_spec[0]] = (n,)
    c_in = rhs.shape[rhs_spec[1]]  # input features per group
    c_out = rhs.shape[rhs_spec[0]]
    k = b.factor(c_in)
    rd[rhs_spec[1]] = (k,)
    if groups == 1:
        ld[lhs_spec[1]] = (k,)
        o = b.factor(c_out)
        rd[rhs_spec[0]] = od[out_spec[1]] = (o,)
    else:
        g = b.factor(groups)
        o = b.factor(c_out // groups)
        ld[lhs_spec[1]] = (g, k)
        rd[rhs_spec[0]] = od[out_spec[1]] = (g, o)
    pointwise_window = all(s == 1 for s in params["window_strides"]) and all(
        tuple(p) == (0, 0) for p in params["padding"]
    )
    for i in range(len(lhs_spec) - 2):
        ls, rs, os_ = lhs_spec[2 + i], rhs_spec[2 + i], out_spec[2 + i]
        dil_ok = params["lhs_dilation"][i] == 1 and params["rhs_dilation"][i] == 1
        if pointwise_window and dil_ok and rhs.shape[rs] == 1:
            f = b.factor(lhs.shape[ls])
            ld[ls] = od[os_] = (f,)
            rd[rs] = ()
        else:
            ld[ls] = (b.factor(lhs.shape[ls], blocked=True),)
            rd[rs] = (b.factor(rhs.shape[rs], blocked=True),)
            od[os_] = (b.factor(out.shape[os_], blocked=True),)
    b.operand(ld)
    b.operand(rd)
    b.result(od)
    return b.build(linear=((0,), (1,)))
