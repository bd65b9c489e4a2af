"""ZeRO-3 plans a layer stack alike unrolled and under ``lax.scan``: each pass over the layers
gathers the weights it reads (the backward pass gathers them again), and each layer's
gradients are reduce-scattered as they are made, inside the loop under ``scan``. So the two
forms launch the same collectives and estimate the same step."""

from collections import Counter
from functools import cache

import pytest

import workbench as wb
from tests.core.zoo import program
from workbench.core import hardware as hw
from workbench.models import build, lm

MESH = wb.Mesh({"data": 2, "model": 4})
FSDP = [wb.BP("data"), wb.MP("model"), wb.Z3("data")]
LAYERS = lm.Config.preset("small").n_layers


@cache
def planned(name: str) -> wb.Session:
    return wb.Session(program(name, "small"), MESH, FSDP)


def _phase(s, c) -> str:
    return s.program.ops[c.op].phase if c.op is not None else "output"


def test_the_backward_pass_gathers_the_weights_again():
    s = planned("lm")
    p = s.program
    gathered = {}
    for c in s.collectives():
        if c.kind == "all-gather" and c.value in p.anatomy().parameters:
            gathered.setdefault(p.values[c.value].name, set()).add(_phase(s, c))
    weights = [n for n in gathered if n.startswith("params/layers/") and "/mlp/" in n]
    assert len(weights) == 2 * LAYERS  # w_in and w_out of every layer
    assert all(gathered[n] == {"forward", "backward"} for n in weights), gathered


def test_a_gathered_weight_is_not_held_from_the_forward_to_the_backward_pass():
    held = planned("lm").estimate(hw.H100).memory.peak
    # a plan that keeps the forward's gathered weights: the same shardings with ZeRO-3
    # gathering nothing (every weight whole) needs more at its peak
    s = wb.Session(program("lm", "small"), MESH, FSDP[:2])
    assert held < s.estimate(hw.H100).memory.peak


def test_under_scan_each_step_reduce_scatters_the_gradients_it_makes():
    s = planned("lm_scan")
    p = s.program
    in_loop = [c for c in s.collectives() if c.kind == "reduce-scatter" and c.count == LAYERS]
    assert in_loop and all(_phase(s, c) == "backward" for c in in_loop)
    stacked = [n for n in p.names("grads/layers/**")]
    assert len(in_loop) == len(stacked) == 10
    for n in stacked:  # the stacked gradients are sharded like their parameters, not pending
        assert s.sharding(n).dims == s.sharding(n.replace("grads/", "params/", 1)).dims
        assert not s.sharding(n).partial


def test_both_forms_launch_the_same_collectives():
    def per_kind(name):
        out = Counter()
        for c in planned(name).collectives():
            out[c.kind, c.axes] += c.count
        return out

    assert per_kind("lm") == per_kind("lm_scan")


@pytest.mark.slow  # seconds each: in the full suite
@pytest.mark.parametrize("chip", [hw.H100, hw.TPU_V5E], ids=lambda c: c.name)
def test_a_70b_step_estimates_alike_unrolled_and_under_scan(chip):
    """The zoo LM at LLaMA-3-70B's widths (d 8,192, 64 heads, ffn 28,672; bf16 with float32
    master weights and Adam), 8 layers, 2,048 sequences on a 2,048 x 4 mesh: the same
    collectives at the same price, and the step within 4%. The compute differs by up to 7%
    (TPU v5e, whose memory is slowest): ``scan`` stacks as residuals the elementwise values
    an unrolled step's backward fusions recompute, a few memory-bound kernels per layer
    (a tiny step differs by more)."""
    estimates = []
    for name in ("lm", "lm_scan"):
        ex = build(name, lm.Config.preset("huge", n_layers=8, batch=2048), abstract=True)
        s = wb.Session(wb.capture(ex.fn, *ex.args), wb.Mesh({"data": 2048, "model": 4}), FSDP)
        estimates.append(s.estimate(chip))
    unrolled, scanned = estimates
    assert unrolled.by_kind == pytest.approx(scanned.by_kind, rel=1e-9)
    assert unrolled.compute_s == pytest.approx(scanned.compute_s, rel=0.08)
    assert unrolled.step_s == pytest.approx(scanned.step_s, rel=0.04)


@pytest.mark.slow  # seconds each: in the full suite
@pytest.mark.parametrize("chip", [hw.H100, hw.TPU_V5E], ids=lambda c: c.name)
@pytest.mark.parametrize("strategy", ["BP", "BP+MP", "BP+MP+Z2"])
def test_a_70b_step_communicates_alike_unrolled_and_under_scan(strategy, chip):
    """The same 70B step without ZeRO-3: each layer's gradient all-reduces are combined alike
    in both forms (in the order they are made, up to the runtime's threshold), and ZeRO-2's
    gather of a stacked updated parameter runs as one gather per layer, as unrolled. So the
    communication is the same, the step differs by the compute alone, and on H100s (where
    communication dominates) by under 2%."""
    tactics = {"BP": [wb.BP("data")], "BP+MP": FSDP[:2], "BP+MP+Z2": [*FSDP[:2], wb.Z2("data")]}
    estimates = []
    for name in ("lm", "lm_scan"):
        ex = build(name, lm.Config.preset("huge", n_layers=8, batch=2048), abstract=True)
        mesh = wb.Mesh({"data": 2048, "model": 4})
        estimates.append(wb.Session(wb.capture(ex.fn, *ex.args), mesh, tactics[strategy]))
    unrolled, scanned = (s.estimate(chip) for s in estimates)
    assert unrolled.by_kind == pytest.approx(scanned.by_kind, rel=1e-9)
    assert unrolled.communication_s == pytest.approx(scanned.communication_s, rel=1e-9)
    assert unrolled.compute_s == pytest.approx(scanned.compute_s, rel=0.08)
    apart = abs(unrolled.step_s - scanned.step_s)
    assert apart <= abs(unrolled.compute_s - scanned.compute_s) * (1 + 1e-9) + 1e-12
    if chip is hw.H100:
        assert unrolled.step_s == pytest.approx(scanned.step_s, rel=0.02)


@pytest.mark.parametrize("name", ["lm", "lm_scan"])
def test_prefetch_hides_the_weights_gathers_and_the_gradients_reductions(name):
    from workbench.core.estimate.communication import Communication as _Simulator

    s = planned(name)
    sim = _Simulator(s.program, MESH, s.state, s.plan(), hw.H100)
    kinds = Counter()
    for c in s.collectives():
        kinds[c.kind, c.axes, sim.hidden(c)] += 1
        if c.axes == ("model",):  # Megatron's activations: made by the step, needed at once
            assert not sim.hidden(c), c
        elif c.kind == "all-gather" or (c.kind == "reduce-scatter" and _phase(s, c) != "forward"):
            assert sim.hidden(c), c  # a weight, or a gradient (not the embedding's activations)
    assert kinds["all-gather", ("data",), True] and kinds["reduce-scatter", ("data",), True]
    e = s.estimate(hw.H100, overlap="prefetch")
    hidden = sum(c.total_s for c in e.collectives if sim.hidden(c.collective))
    exposed = e.communication_s - hidden
    assert exposed > 0
    assert e.step_s == pytest.approx(max(e.compute_s, hidden) + exposed)
    full, none = (s.estimate(hw.H100, overlap=o).step_s for o in ("full", "none"))
    assert full <= e.step_s * (1 + 1e-9) and e.step_s < none


def test_a_flax_linen_stack_under_nn_scan_is_planned_as_the_zoo_one():
    """Flax Linen's ``nn.scan`` over blocks (``variable_axes={"params": 0}``, as Flax's docs
    scan layers): Z3 reduce-scatters each step's gradients inside the backward loop, and
    each pass over the blocks gathers the weights it reads."""
    from workbench.models.external import Size
    from workbench.models.external.linen_lm import build

    size = Size(n_layers=4)
    ex = build(size, abstract=True, scan_layers=True)
    s = wb.Session(wb.capture(ex.fn, *ex.args), MESH, FSDP)
    assert not s.conflicts
    looped = Counter(
        (c.kind, _phase(s, c)) for c in s.collectives() if c.count == 4 and c.axes == ("data",)
    )
    stacked = [v for v in s.program.anatomy().parameters if s.program.values[v].shape[:1] == (4,)]
    assert looped["reduce-scatter", "backward"] == len(stacked) > 0
    assert looped["all-gather", "forward"] > 0 and looped["all-gather", "backward"] > 0


@pytest.mark.parametrize("name", ["linen_lm", "nnx_lm"])
def test_a_clipped_update_reduce_scatters_the_gradients(name):
    """optax's ``clip_by_global_norm`` squares each gradient for the norm: that square is
    tiled like the parameter, so the gradient is reduce-scattered into it and only each
    shard's sum of squares is all-reduced (a scalar), not the whole gradient."""
    import warnings

    from workbench.models.external import build_external

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = build_external(name, "tiny", abstract=True)
    s = wb.Session(wb.capture(ex.fn, *ex.args), MESH, [wb.BP("data"), wb.Z3("data")])
    update = [
        c
        for c in s.collectives()
        if c.axes == ("data",) and c.op is not None and _phase(s, c) == "optimizer"
    ]
    a = s.program.anatomy()
    sharded = [p for p in a.parameters if s.state.shardings[p].uses("data")]
    reduced = {c.value for c in update if c.kind == "reduce-scatter"}
    pending = {a.gradients[p] for p in sharded if s.state.shardings[a.gradients[p]].partial}
    assert len(pending) > 20 and reduced == pending
    assert all(c.bytes <= 4 for c in update if c.kind == "all-reduce")
