"""Properties of rules and propagation, on random inputs and random tactic sequences."""

import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import workbench as wb
from tests.core.zoo import ZOO, program
from workbench.core.ops import RULES
from workbench.core.ops.shape import reshape_factors
from workbench.core.propagate.propagation import Propagator

MESH = wb.Mesh({"batch": 2, "model": 4})

#: Primitives the zoo produces that deliberately have no rule (none today).
DELIBERATELY_UNSUPPORTED: frozenset[str] = frozenset()


def test_every_primitive_the_zoo_produces_has_a_rule():
    produced = set().union(*(program(name).primitives for name in ZOO))
    missing = produced - set(RULES) - DELIBERATELY_UNSUPPORTED
    assert not missing, f"primitives without a sharding rule: {sorted(missing)}"
    families = {
        "dot_general",
        "conv_general_dilated",
        "gather",
        "scatter-add",
        "scan",
        "reshape",
        "transpose",
    }
    assert (
        families | {"reduce_max", "reduce_sum", "iota", "concatenate", "split", "select_n"}
        <= produced
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ZOO:
            p = program(name)
            barriers = [op.name for op, m in zip(p.ops, p.mappings) if m.barrier]
            assert not barriers, f"{name}: ops that fell back to a barrier: {barriers[:5]}"


def test_factor_sizes_multiply_to_dimension_sizes_on_every_zoo_op():
    for name in ZOO:
        p = program(name)
        for op, m in zip(p.ops, p.mappings):
            operands = [p.operand_type(v) for v in op.linked_operands]
            results = [p.operand_type(v) for v in op.linked_results]
            m.check(operands, results)  # raises on any mismatch


@given(st.lists(st.integers(1, 6), min_size=1, max_size=4), st.data())
def test_reshape_factors_multiply_to_both_shapes(dims, data):
    in_shape = tuple(dims)
    total = math.prod(in_shape)
    # a random regrouping of the same elements
    out_shape, rest = [], total
    while rest > 1:
        divisors = [d for d in range(2, rest + 1) if rest % d == 0]
        d = data.draw(st.sampled_from(divisors))
        out_shape.append(d)
        rest //= d
    out_shape = tuple(out_shape) or (1,)
    sizes, ins, outs, blocked = reshape_factors(in_shape, out_shape)
    for shape, per_dim in ((in_shape, ins), (out_shape, outs)):
        assert tuple(math.prod(sizes[f] for f in fs) for fs in per_dim) == shape
    shared = {f for fs in ins for f in fs} & {f for fs in outs for f in fs}
    assert not (shared & blocked)


def check_consistent(s: wb.Session) -> None:
    """Structural invariants of a state, and that propagation is at a fixed point."""
    state, p = s.state, s.program
    for v in p.values:
        sh = state.shardings[v.id]
        axes = [a for dim in sh.dims for a in dim] + [a for a, _ in sh.partial]
        assert len(axes) == len(set(axes)), (v.name, sh)
        for d, dim_axes in enumerate(sh.dims):
            assert v.shape[d] % math.prod(MESH.axis_size(a) for a in dim_axes) == 0, (v.name, sh)
        assert not (set(sh.replicated) & set(axes)), (v.name, sh)
        for axis in axes:
            prov = state.provenance[(v.id, axis)]
            assert prov.dim == sh.dim_of(axis) and prov.reduction == sh.reduction_of(axis)
    again = Propagator(p, MESH, state, tactic=len(state.schedule), schedule=state.schedule)
    for axis in MESH.names:
        assert again.run(axis, range(len(p.values))) == 0, f"not a fixed point on {axis}"


@st.composite
def tactics(draw, p):
    values = [v for v in p.values if v.kind == "input" or draw(st.integers(0, 9)) == 0]
    v = draw(st.sampled_from([v for v in values if v.shape]))
    axis = draw(st.sampled_from(MESH.names))
    kind = draw(st.sampled_from(["tile", "tile", "tile", "replicate", "atomic"]))
    if kind == "tile":
        return wb.Tile(v.name, draw(st.integers(-len(v.shape), len(v.shape))), axis)
    return (wb.Replicate if kind == "replicate" else wb.Atomic)(v.name, axis)


@pytest.mark.slow  # 60 examples, seconds: in the full suite
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(ZOO), st.data())
def test_random_tactic_sequences_never_leave_an_inconsistent_state(name, data):
    s = wb.Session(program(name), MESH)
    for _ in range(data.draw(st.integers(1, 5))):
        tactic = data.draw(tactics(s.program))
        before = (s.state, s.history)
        try:
            s.apply(tactic)
        except wb.WorkbenchError:
            assert (s.state, s.history) == before
            continue
        check_consistent(s)
        # applying the same tactic again changes no sharding
        if isinstance(tactic, wb.Tile):
            shardings = dict(s.state.shardings)
            s.apply(tactic)
            assert dict(s.state.shardings) == shardings
            s.undo()


def test_an_identical_schedule_gives_an_identical_state():
    schedule = [wb.Tile("batch/*", 0, "batch"), wb.Tile("params/**/mlp/w_in", -1, "model")]
    a, b = (wb.Session(program("lm"), MESH, schedule) for _ in range(2))
    assert dict(a.state.shardings) == dict(b.state.shardings)
    assert [(p.value, p.axis, p.step) for p in a.state.order] == [
        (p.value, p.axis, p.step) for p in b.state.order
    ]
    assert np.all([a.state.provenance[k] == b.state.provenance[k] for k in a.state.provenance])
