"""conv_general_dilated: batch, input-feature (contracting) and output-feature factors.

Spatial dimensions need halo exchange to split, so they are blocked, except where the
window is a single element with unit stride, no padding and no dilation. Grouped
convolutions split the feature dimensions into (group, per-group) factors.
"""

from __future__ import annotations

from workbench.core.ops.mapping import MappingBuilder, barrier_mapping
from workbench.core.ops.registry import register


@register("conv_general_dilated")
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
