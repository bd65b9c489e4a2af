"""The estimate under a user-given expert load: capacity forms' compute at E x C slots per
group and their dropped token choices against hand counts, the dropless form's grouped
matmuls scaled to the busiest device, the dispatch buffers in the peak, the checks."""

from __future__ import annotations

import dataclasses
import math

import pytest

import workbench as wb
from tests.models import maxtext_capacity_moe as maxtext
from workbench.core.errors import InputError, TacticError
from workbench.core.estimate import estimate
from workbench.core.estimate.compute import op_time
from workbench.core.estimate.experts import busiest, layer_facts, loaded, shares
from workbench.core.estimate.liveness import Liveness
from workbench.core.estimate.step import Estimate
from workbench.models import build, lm

E, K, G, T, D, F = 4, 2, 4, 16, 32, 64
C = math.ceil(K * T * 1.25 / E)  # 10


def _program(dispatch, **kw):
    config = lm.Config(n_experts=E, top_k=K, dispatch=dispatch, batch=G, seq_len=T, **kw)
    ex = build("lm", config, abstract=True)
    return wb.capture(ex.fn, *ex.args)


@pytest.fixture(scope="module")
def einsum():
    return _program("einsum")


@pytest.fixture(scope="module")
def ragged():
    return _program("ragged")


@pytest.fixture(scope="module")
def wide():
    """A dropless MoE whose grouped matmuls are compute-bound on the H100 preset (8,192
    rows of 1,024 x 2,048 in bfloat16): there the busiest device's time is the balanced
    time times its load."""
    config = lm.Config(
        n_experts=E, top_k=K, dispatch="ragged", batch=8, seq_len=512, d_model=1024,
        d_ff=2048, dtype="bfloat16",
    )  # fmt: skip
    ex = build("lm", config, abstract=True)
    return wb.capture(ex.fn, *ex.args)


def _expert_matmuls(program):
    """Forward matmuls reading an expert weight, per layer."""
    a = program.anatomy()
    out = []
    for layer in a.experts:
        params = {p for p, _ in layer.experts}
        out.append(
            [
                op.id
                for op in program.ops
                if op.phase == "forward"
                and any(a.layers.origin.get(v) in params for v in op.operands if isinstance(v, int))
            ]
        )
    return out


def test_capacity_forms_run_E_times_C_slots_per_group_whatever_the_load(einsum):
    s = wb.Session(einsum, wb.Mesh({"x": 1}))
    e = s.estimate()
    ops = {o.op: o for o in e.ops}
    for w_in, w_out in _expert_matmuls(einsum):
        # [E, G, C, D] x [E, D, F]: 2 x (G x E x C) rows x D x F, the closed form
        assert ops[w_in].cost.flops == 2 * G * E * C * D * F
        assert ops[w_out].cost.flops == 2 * G * E * C * F * D
    skewed = s.estimate(expert_load=2.0)
    assert skewed.compute_s == e.compute_s and skewed.memory == e.memory
    assert skewed.step_s == e.step_s


def test_dropped_choices_on_the_einsum_form_match_a_hand_count(einsum):
    s = wb.Session(einsum, wb.Mesh({"expert": 4}), [wb.EP("expert")])
    for f in layer_facts(einsum):
        assert (f["top_k"], f["tokens"], f["groups"], f["capacity"]) == (K, T, G, C)
    # skew 2: expert 0 takes half the 32 choices of a group (16, 6 over its 10 slots), the
    # others 16/3 each (under capacity): 6 of 32 dropped
    e = s.estimate(expert_load=2.0)
    assert len(e.experts) == 2
    for r in e.experts:
        assert (r.form, r.experts, r.top_k, r.tokens, r.groups, r.capacity) == (
            "einsum", E, K, T, G, C,
        )  # fmt: skip
        assert r.dropped == pytest.approx(6 / 32)
        assert r.devices == 4 and r.device_load == pytest.approx(2.0)
    assert "capacity 10 per expert" in str(e) and "19% of token choices dropped" in str(e)
    assert "MoE at skew 2" in repr(e) and "MoE at skew 2" in e._repr_html_()
    # relative loads 3:2:2:1 of 32 choices: 12, 8, 8, 4 -> 2 over capacity
    e = s.estimate(expert_load=[3, 2, 2, 1])
    assert all(r.dropped == pytest.approx(2 / 32) for r in e.experts)
    assert all(r.device_load == pytest.approx(4 * 3 / 8) for r in e.experts)
    # balanced: 8 choices an expert, under its 10 slots
    assert all(r.dropped == 0 for r in s.estimate(expert_load=1.0).experts)


def test_none_is_todays_estimate_and_loads_are_cached(einsum):
    s = wb.Session(einsum, wb.Mesh({"expert": 4}), [wb.EP("expert")])
    e = s.estimate(wb.hardware.H100)
    assert s.estimate(wb.hardware.H100, expert_load=None) is e
    assert e.experts == () and e.expert_load is None and "MoE" not in str(e)
    fresh = estimate(einsum, s.mesh, s.state, s.plan(), wb.hardware.H100)
    assert fresh == e
    skewed = s.estimate(wb.hardware.H100, expert_load=2.0)
    assert s.estimate(wb.hardware.H100, expert_load=2) is skewed
    assert s.estimate(wb.hardware.H100, expert_load=[2, 2 / 3, 2 / 3, 2 / 3]) is not skewed
    assert s.estimate(wb.hardware.H100) is e  # the balanced one is untouched


def test_a_maxtext_capacity_moe_written_outside_the_project():
    fn, args = maxtext.example()
    program = wb.capture(fn, *args)
    cap = int(maxtext.SEQ * maxtext.TOP_K / maxtext.EXPERTS * maxtext.CAPACITY_FACTOR)  # 6
    e = wb.Session(program, wb.Mesh({"x": 1})).estimate(expert_load=[3, 1, 1, 1])
    assert len(e.experts) == maxtext.LAYERS
    for r in e.experts:
        assert (r.form, r.top_k, r.tokens, r.groups, r.capacity) == (
            "einsum", maxtext.TOP_K, maxtext.SEQ, maxtext.BATCH, cap,
        )  # fmt: skip
        # 16 choices a sequence, half to expert 0: 8 for its 6 slots
        assert r.dropped == pytest.approx(2 / 16)
        assert r.devices == 1 and r.device_load == 1.0


def test_bad_loads_are_refused_saying_what_works(einsum):
    s = wb.Session(einsum, wb.Mesh({"x": 1}))
    cases = {
        0.5: "from 1 (balanced) to E / top_k = 2",
        3.0: "give a skew in [1, 2]",
        float("nan"): "a skew is",
        (1, 1, 1): "has 3 loads, but the MoE layers",
        (1, -1, 1, 1): "non-negative",
        (0, 0, 0, 0): "not all zero",
        (5, 1, 1, 1): "at most 1/2",
        "2": "neither a skew nor a list",
        True: "neither a skew nor a list",
        ("a", 1, 1, 1): "must be numbers",
    }
    for load, words in cases.items():
        with pytest.raises(InputError, match=None) as err:
            s.estimate(expert_load=list(load) if isinstance(load, tuple) else load)
        assert words in str(err.value), (load, str(err.value))
    dense = wb.capture(*_dense())
    with pytest.raises(InputError, match="no mixture-of-experts layers"):
        wb.Session(dense, wb.Mesh({"x": 1})).estimate(expert_load=2.0)


def _dense():
    ex = build("lm", lm.Config.preset("tiny"), abstract=True)
    return ex.fn, *ex.args


def test_dropless_without_ep_every_device_runs_every_row(ragged):
    s = wb.Session(ragged, wb.Mesh({"batch": 4}), [wb.BP("batch")])
    e, skewed = s.estimate(), s.estimate(expert_load=2.0)
    assert skewed.compute_s == e.compute_s and skewed.flops == e.flops
    assert skewed.memory == e.memory  # static buffers: the load moves no memory
    for r in skewed.experts:
        assert r.form == "ragged" and r.devices == 1 and r.device_load == 1.0
        assert r.dropped == 0 and len(r.ops) == 6  # 2 forward, 4 backward grouped matmuls


def _tiled(program, mesh, plan, ops, axis):
    """``plan`` with the groups of the grouped matmuls ``ops`` tiled over ``axis`` (the rhs's
    group dim, or a weight gradient's result's), as expert parallelism runs them."""
    out = list(plan.ops)
    for o in ops:
        rdn = program.ops[o].params["ragged_dot_dimension_numbers"]
        (lc, _), _ = rdn.dot_dimension_numbers
        p = out[o]

        def tile(layout, d):
            dims = list(layout.dims)
            dims[d] = (axis,)
            return dataclasses.replace(layout, dims=tuple(dims))

        if rdn.lhs_ragged_dimensions[0] in lc:
            out[o] = dataclasses.replace(p, results=(tile(p.results[0], 0), *p.results[1:]))
        else:
            g = rdn.rhs_group_dimensions[0]
            out[o] = dataclasses.replace(
                p, operands=(p.operands[0], tile(p.operands[1], g), *p.operands[2:])
            )
    return dataclasses.replace(plan, ops=tuple(out))


@pytest.mark.parametrize("n", [2, 4])
def test_dropless_grouped_matmuls_scale_to_the_busiest_device(wide, n):
    """Priced on a plan whose grouped matmuls run their own experts (as EP over ``n``
    devices runs them): each one's FLOPs times n x the busiest block's share."""
    hw = wb.hardware.H100
    s = wb.Session(wide, wb.Mesh({"expert": n}))
    base = s.estimate(hw)
    ops = [o for f in layer_facts(wide) for o in f["ops"]]
    plan = _tiled(wide, s.mesh, s.plan(), ops, "expert")
    e = loaded(base, ("skew", 2.0), wide, s.mesh, s.state, plan, hw)
    factor = {2: 2 * (0.5 + 1 / 6), 4: 4 * 0.5}[n]  # the block holding expert 0
    assert busiest(shares(("skew", 2.0), E), n) == pytest.approx(factor)
    before, after = {o.op: o for o in base.ops}, {o.op: o for o in e.ops}
    delta = 0.0
    for o in ops:
        b, a = before[o], after[o]
        assert a.cost.flops == pytest.approx(b.cost.flops * factor)
        assert a.cost.bytes_accessed == b.cost.bytes_accessed
        dtype = wide.values[wide.ops[o].results[0]].dtype
        assert a.seconds == pytest.approx(op_time(a.cost, hw, dtype) + hw.op_overhead)
        if op_time(b.cost, hw, dtype) > b.cost.bytes_accessed / hw.hbm_bandwidth:  # bound by FLOPs
            assert a.seconds - hw.op_overhead == pytest.approx(
                (b.seconds - hw.op_overhead) * factor
            )
        delta += (a.seconds - b.seconds) * b.count
    assert delta > 0 and e.compute_s == pytest.approx(base.compute_s + delta)
    assert e.step_s == pytest.approx(e.compute_s + e.communication_s)  # overlap "none"
    assert all(r.devices == n and r.device_load == pytest.approx(factor) for r in e.experts)
    assert e.memory == base.memory
    assert {o.op for o in e.ops if o != before[o.op]} == set(ops)


def test_dropless_under_ep_scales_by_the_busiest_device(wide):
    """With EP on the ragged form, the session's own plan: the step's compute rises by the
    grouped matmuls' scaled time (skew 2 over 4 devices: 2x their FLOPs)."""
    mesh, hw = wb.Mesh({"expert": 4}), wb.hardware.H100
    try:
        s = wb.Session(wide, mesh, [wb.EP("expert")])
    except TacticError as err:
        pytest.skip(f"EP does not split the ragged form here: {err}")
    base, e = s.estimate(hw), s.estimate(hw, expert_load=2.0)
    before = {o.op: o for o in base.ops}
    scaled = [o for o in e.ops if o != before[o.op]]
    assert scaled and all(
        o.cost.flops == pytest.approx(before[o.op].cost.flops * 2.0) for o in scaled
    )
    delta = sum((o.seconds - before[o.op].seconds) * o.count for o in scaled)
    assert e.compute_s == pytest.approx(base.compute_s + delta) and delta > 0
    assert e.memory == base.memory
    assert all(r.devices == 4 and r.device_load == pytest.approx(2.0) for r in e.experts)


class _Without(Liveness):
    """The sweep with the buffers of ``values`` left out (all of them: None)."""

    values: frozenset = frozenset()

    def sweep(self, spans, copies, end, in_place, held=frozenset()):
        self.spans = spans
        kept = {k: v for k, v in spans.items() if k[0] not in self.values}
        return super().sweep(kept, copies, end, in_place, held)


def test_the_dispatch_buffers_are_held_at_the_peak(einsum):
    """The one-hot dispatch [G, T, E, C] and the dispatched tokens [E, G, C, D] (the
    einsum's [G, D, E, C] result, written transposed: one buffer) are buffers of their
    closed-form bytes, and the peak holds them: without them it falls by exactly those."""
    s = wb.Session(einsum, wb.Mesh({"x": 1}))
    args = (einsum, s.mesh, s.state, s.plan(), wb.hardware.H100)
    whole = _Without(*args)
    memory = whole.memory()
    assert memory == s.estimate(wb.hardware.H100).memory
    buffers, expected = set(), 0
    for layer in einsum.anatomy().experts:
        op = einsum.ops[layer.dispatch[0]]
        mask = next(v for v in op.operands if einsum.values[v].shape == (G, T, E, C))
        (made,) = op.results  # [G, D, E, C], written transposed once (a folded matmul)
        (reader,) = einsum.users[made]
        (tokens,) = einsum.ops[reader].results
        assert einsum.values[tokens].shape == (E, G, C, D)
        assert not [k for k in whole.spans if k[0] == made]
        for v, nbytes in ((mask, G * T * E * C * 4), (tokens, G * D * E * C * 4)):
            assert [span[2] for k, span in whole.spans.items() if k[0] == v] == [nbytes]
            buffers.add(v)
            expected += nbytes
    without = _Without(*args)
    without.values = frozenset(buffers)
    assert memory.peak - without.memory().peak == expected


def test_the_estimate_record_defaults_keep_old_constructors():
    fields = {f.name: f for f in dataclasses.fields(Estimate)}
    assert fields["experts"].default == () and fields["expert_load"].default is None
