"""The simulator against closed forms and against what XLA compiles for the same shardings."""

from dataclasses import replace
from functools import cache

import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import workbench as wb
from tests.core.lowering.strategies import CASES, strategies
from tests.core.zoo import program
from workbench.core import hardware as hw
from workbench.core.xla.crosscheck import abstract_inputs, compiled_memory, compiled_text
from workbench.models import build, lm

MESH = wb.Mesh({"batch": 2, "model": 4})


@cache
def mixed_precision_lm():
    config = lm.Config.preset("small", dtype="bfloat16", master_weights=True, batch=8, seq_len=32)
    ex = build("lm", config, abstract=True)
    return config, wb.capture(ex.fn, *ex.args)


@pytest.mark.parametrize("stage", ["DP", "ZeRO-1", "ZeRO-2", "ZeRO-3"])
def test_model_state_memory_matches_the_zero_formulas(stage):
    # mixed precision with Adam: parameters 2 bytes, gradients 2, optimizer 12 (fp32 master
    # copy, m, v) per parameter, each divided over the data axis as the stage says
    config, prog = mixed_precision_lm()
    p, n = config.n_params, 8
    mesh = wb.Mesh({"data": n})
    bp = wb.BP("data")
    schedule, expected = {
        "DP": ([bp], (2 * p, 2 * p, 12 * p)),
        "ZeRO-1": (
            [wb.Replicate("grads/**", "data"), bp, wb.Z2("data")],
            (2 * p, 2 * p, 12 * p / n),
        ),
        "ZeRO-2": ([bp, wb.Z2("data")], (2 * p, 2 * p / n, 12 * p / n)),
        "ZeRO-3": ([bp, wb.Z3("data")], (2 * p / n, 2 * p / n, 12 * p / n)),
    }[stage]
    session = wb.Session(prog, mesh, schedule)
    assert not session.conflicts  # the bf16 parameters stay whole in the compute
    states = session.estimate(hw.H100).memory.states
    got = (states["parameters"], states["gradients"], states["optimizer"])
    assert got == pytest.approx(expected, rel=0.05)


def test_a_ring_all_reduce_costs_what_the_formula_says():
    def f(x, w):
        return x @ w

    s = wb.Session(wb.capture(f, jnp.ones((16, 64)), jnp.ones((64, 32))), wb.Mesh({"model": 8}))
    s.apply(wb.Tile("w", 0, "model"))  # contraction split: the product is reduced at the output
    e = s.estimate(hw.H100)
    (c,) = e.collectives
    assert c.collective.kind == "all-reduce" and c.collective.bytes == 16 * 32 * 4
    link = hw.H100.link(s.mesh, "model")
    bandwidth, latency = link.figures_for("all-reduce")  # NCCL's measured bus bandwidth
    assert (bandwidth, latency) == (pytest.approx(480e9), link.latency)
    n, nbytes = 8, 16 * 32 * 4
    expected = 2 * (n - 1) / n * nbytes / bandwidth + 2 * (n - 1) * latency
    assert c.seconds == pytest.approx(expected, rel=1e-9)
    assert e.by_kind["all-reduce"] == pytest.approx(expected)


def test_combined_gradient_all_reduces_pay_one_latency():
    # data parallelism: XLA's combiner runs the gradients' all-reduces as one collective
    s = wb.Session(program("mlp"), MESH, [wb.BP("batch")])
    grads = [c for c in s.estimate(hw.H100).collectives if c.collective.kind == "all-reduce"]
    assert len(grads) > 1
    total = sum(c.collective.bytes for c in grads)
    one = hw.collective_time("all-reduce", total, ("batch",), MESH, hw.H100)
    assert sum(c.seconds for c in grads) == pytest.approx(one, rel=1e-9)
    # each shares it by its bytes, so the breakdown still names every gradient's tactic
    assert all(c.seconds == pytest.approx(one * c.collective.bytes / total) for c in grads)
    apart = replace(hw.H100, all_reduce_combine_bytes=1)  # no two gradients fit: none combine
    separate = [c for c in s.estimate(apart).collectives if c.collective.kind == "all-reduce"]
    expected = [
        hw.collective_time("all-reduce", c.collective.bytes, ("batch",), MESH, apart)
        for c in separate
    ]
    assert [c.seconds for c in separate] == pytest.approx(expected, rel=1e-9)
    assert sum(expected) > one + (len(grads) - 1.5) * 2 * hw.H100.link(MESH, "batch").latency


def test_transposed_operand_copies_are_priced_at_their_own_size():
    # a matmul contracting the left side's leading dimensions (a weight gradient) reads it
    # through a transposed copy; on a spec whose transposes slow down with size, each copy
    # pays the rate measured at its local size (log-log between the measured points)
    def f(x, w):
        return jnp.einsum("bji,bjk->ik", x, w)

    program = wb.capture(f, jnp.ones((8, 256, 128)), jnp.ones((8, 256, 64)))
    size = 8 * 256 * 128 * 4  # x, copied whole on one device
    flat = replace(hw.H100, transpose_bandwidth=1e9)
    curve = replace(hw.H100, transpose_bandwidth=((size / 4, 1e9), (size * 4, 0.25e9)))
    alone = wb.Session(program, wb.Mesh({"batch": 4}))
    extra = alone.estimate(curve).compute_s - alone.estimate(flat).compute_s
    assert extra == pytest.approx(2 * size * (1 / 0.5e9 - 1 / 1e9), rel=1e-9)
    split = wb.Session(program, wb.Mesh({"batch": 4}), [wb.Tile("x", 0, "batch")])
    extra = split.estimate(curve).compute_s - split.estimate(flat).compute_s
    assert extra == pytest.approx(2 * (size / 4) * (1 / 1e9 - 1 / 1e9), abs=1e-12)


def test_a_batched_transposed_copy_is_priced_per_slice():
    # a batched matmul contracting the left side's middle dimension transposes each batch
    # element's slice on its own: the rate is the one measured at a slice's size
    def f(x, w):
        return jnp.einsum("bji,bjk->bik", x, w)

    program = wb.capture(f, jnp.ones((8, 256, 128)), jnp.ones((8, 256, 64)))
    size = 8 * 256 * 128 * 4
    flat = replace(hw.H100, transpose_bandwidth=1e9)
    curve = replace(hw.H100, transpose_bandwidth=((size / 32, 1e9), (size / 2, 0.25e9)))
    s = wb.Session(program, wb.Mesh({"batch": 4}))
    extra = s.estimate(curve).compute_s - s.estimate(flat).compute_s
    # a slice is size / 8: a quarter of the way from size / 32 to size / 2 on log axes
    assert extra == pytest.approx(2 * size * (1 / 0.5e9 - 1 / 1e9), rel=1e-9)


def test_a_copy_that_moves_whole_cache_lines_streams():
    # attention scores: q [b, q, h, d] is wanted as [b, h, q, d], which keeps d innermost;
    # with rows of d floats a cache line long or longer the copy streams at memory
    # bandwidth, shorter rows pay the transpose rate. k is wanted as [b, h, d, k]: d moves.
    def scores(d):
        shape = (4, 64, 2, d)
        program = wb.capture(
            lambda q, k: jnp.einsum("bqhd,bkhd->bhqk", q, k), jnp.ones(shape), jnp.ones(shape)
        )
        s = wb.Session(program, wb.Mesh({"batch": 4}))
        slow = replace(hw.H100, transpose_bandwidth=1e9)
        fast = replace(hw.H100, transpose_bandwidth=1e30)
        return s.estimate(slow).compute_s - s.estimate(fast).compute_s, 4 * 64 * 2 * d * 4

    extra, size = scores(32)  # rows of 128 bytes: only k's copy pays the transpose rate
    assert extra == pytest.approx(2 * size / 1e9)
    extra, size = scores(8)  # rows of 32 bytes: both copies do
    assert extra == pytest.approx(4 * size / 1e9)


def test_estimates_on_one_program_do_not_leak_between_meshes():
    # op prices are cached on the program: the same layout on a mesh whose axes have other
    # sizes has other local shapes, so its price must not be reused
    prog = program("mlp")
    small, large = wb.Mesh({"batch": 2, "model": 4}), wb.Mesh({"batch": 8, "model": 16})

    def step(mesh):
        return wb.Session(prog, mesh, [wb.BP("batch")]).estimate(hw.H100).compute_s

    alone = step(large)
    step(small)
    assert step(large) == alone
    ex = build("mlp", "tiny", abstract=True)
    fresh = wb.capture(ex.fn, *ex.args)  # the same program, nothing cached on it yet
    assert wb.Session(fresh, small, [wb.BP("batch")]).estimate(hw.H100).compute_s == step(small)


def test_a_transposed_copy_reads_the_inputs_of_the_kernel_it_is_fused_into():
    # x = a * b + c feeds a batched matmul in the wrong order: the compiler fuses the copy
    # into the kernel that makes x, which then reads a, b and c in transposed order and
    # writes x once, at the transpose rate of the bytes it reads
    def f(a, b, c, w):
        return jnp.einsum("bji,bjk->bik", a * b + c, w)

    shape = (8, 256, 128)
    program = wb.capture(f, *(jnp.ones(shape),) * 3, jnp.ones((8, 256, 64)))
    size = 8 * 256 * 128 * 4
    s = wb.Session(program, wb.Mesh({"batch": 4}))
    fast = replace(hw.H100, transpose_bandwidth=1e30)

    def extra(spec):
        return s.estimate(spec).compute_s - s.estimate(fast).compute_s

    assert extra(replace(hw.H100, transpose_bandwidth=1e9)) == pytest.approx(4 * size / 1e9)
    # the rate is the one measured at what it reads of one batch element's slice: the three
    # arrays' slices, 3 x size / 8 (here 1e9 x slice / bytes)
    slice_ = size / 8
    curve = replace(hw.H100, transpose_bandwidth=((slice_, 1e9), (4 * slice_, 0.25e9)))
    assert extra(curve) == pytest.approx(4 * size / (1e9 / 3), rel=1e-9)
    # split over the batch, each device's copy reads and writes a quarter
    split = wb.Session(program, wb.Mesh({"batch": 4}), [wb.Tile("a", 0, "batch")])
    flat = replace(hw.H100, transpose_bandwidth=1e9)
    assert split.estimate(flat).compute_s - split.estimate(fast).compute_s == pytest.approx(
        size / 1e9
    )
    # made by a matmul, not by an elementwise kernel: the copy reads the operand alone
    made = wb.capture(
        lambda a, b, w: jnp.einsum("bji,bjk->bik", a @ b, w),
        jnp.ones(shape),
        jnp.ones((128, 128)),
        jnp.ones((8, 256, 64)),
    )
    alone = wb.Session(made, wb.Mesh({"batch": 4}))
    assert alone.estimate(flat).compute_s - alone.estimate(fast).compute_s == pytest.approx(
        2 * size / 1e9
    )


def test_a_fused_copy_stops_at_a_value_the_plan_redistributes():
    # x = broadcast(a) * 2 + b feeds a weight-gradient matmul: its copy reads a (8x smaller
    # than x) and b; where the plan redistributes a value on that chain, the value has a
    # buffer of its own and the copy reads it there instead of what makes it
    from workbench.core.estimate.compute import Compute as _Simulator

    def f(a, b, w):
        t = jnp.broadcast_to(a, (8, 256, 128)) * 2.0
        return jnp.einsum("bji,bjk->ik", t + b, w)

    prog = wb.capture(f, jnp.ones((256, 128)), jnp.ones((8, 256, 128)), jnp.ones((8, 256, 64)))
    s = wb.Session(prog, wb.Mesh({"batch": 4}))
    dot = next(op.id for op in prog.ops if op.primitive == "dot_general")
    t = next(op.results[0] for op in prog.ops if op.primitive == "mul")
    size = 8 * 256 * 128 * 4
    plan = s.plan()
    assert _Simulator(prog, s.mesh, s.state, plan, hw.H100).copy_bytes(dot, 0) == (
        size / 8 + size,
        size,
    )
    moved = replace(plan, redistributed=plan.redistributed | {t})
    assert _Simulator(prog, s.mesh, s.state, moved, hw.H100).copy_bytes(dot, 0) == (
        2 * size,
        size,
    )


def _copy_read_values(program, per_reader=True) -> set:
    """The values the program's one transposed operand copy reads from memory."""
    from workbench.core.estimate.static import Static as _Static

    static = _Static.of(program)
    ((op_id, (k,)),) = static.copies
    _, reads = static.fusion(program, per_reader)[1][(op_id, k)]
    return {program.ops[reader].operands[i] for reader, i in reads}


def test_a_fused_copy_recomputes_a_cheap_value_a_matmul_reads_from_a_buffer():
    # h = x * 2 is written for the matmul that reads it, yet the copy of h + c (the
    # weight-gradient matmul's operand) recomputes h from x, as XLA duplicates a cheap
    # producer with one full-size input into every fused kernel that reads it
    def f(x, c, w1, w2):
        h = x * 2.0
        return jnp.einsum("bij,jk->bik", h, w1), jnp.einsum("bji,bjk->ik", h + c, w2)

    shape = (8, 256, 128)
    prog = wb.capture(f, jnp.ones(shape), jnp.ones(shape), jnp.ones((128, 64)), jnp.ones(shape))
    x, c = prog.inputs[0], prog.inputs[1]
    assert _copy_read_values(prog) == {x, c}


def test_a_fused_copy_reads_a_sum_a_reduction_reads_from_its_buffer():
    # r = a + b is read by a row reduction (its own kernel on CPU, fusing nothing), so the
    # compiler writes r; the copy of (r - mean) * 2 reads r there rather than a and b again.
    # A shift by a broadcast bias has one full-size input: the copy recomputes it
    def f(a, b, w):
        r = a + b
        return jnp.einsum("bji,bjk->ik", (r - r.mean(-1, keepdims=True)) * 2.0, w)

    def g(a, bias, w):
        r = a + bias
        return jnp.einsum("bji,bjk->ik", (r - r.mean(-1, keepdims=True)) * 2.0, w)

    shape = (8, 256, 128)
    summed = wb.capture(f, jnp.ones(shape), jnp.ones(shape), jnp.ones(shape))
    r = next(op.results[0] for op in summed.ops if op.primitive == "add")
    assert r in _copy_read_values(summed)
    assert not {summed.inputs[0], summed.inputs[1]} & _copy_read_values(summed)
    shifted = wb.capture(g, jnp.ones(shape), jnp.ones((128,)), jnp.ones(shape))
    assert shifted.inputs[0] in _copy_read_values(shifted)


def test_fresh_per_step_buffers_pay_their_first_touch():
    # a runtime that maps big buffers fresh each step (XLA's CPU runtime under glibc) pays
    # to touch the temporaries (one buffer) and each output it does not write in place
    def f(x):
        return (jnp.tanh(x) * 2.0) @ x

    s = wb.Session(wb.capture(f, jnp.ones((256, 256))), wb.Mesh({"batch": 4}))
    base = s.estimate(hw.H100)
    temporaries, output = base.memory.temporaries, 256 * 256 * 4
    assert temporaries >= output  # tanh(x) * 2 is held for the matmul
    assert base.fresh_memory_s == 0.0

    def fresh_above(threshold):
        spec = replace(hw.H100, fresh_buffer_bytes=threshold, first_touch_bandwidth=1e9)
        return s.estimate(spec)

    both = fresh_above(1.0)
    assert both.fresh_memory_s == pytest.approx((temporaries + output) / 1e9)
    assert both.compute_s - base.compute_s == pytest.approx(both.fresh_memory_s)
    assert both.step_s - base.step_s == pytest.approx(both.fresh_memory_s)
    assert fresh_above(max(temporaries, output)).fresh_memory_s == 0.0
    # a training step writes its updated parameters and optimizer state over the inputs
    # they replace (donation): of its outputs only the loss is allocated
    step = wb.Session(program("lm"), MESH, [wb.BP("batch")])
    spec = replace(hw.H100, fresh_buffer_bytes=1.0, first_touch_bandwidth=1e9)
    e = step.estimate(spec)
    assert e.fresh_memory_s == pytest.approx((e.memory.temporaries + 4) / 1e9)


def test_overlap_policies():
    s = wb.Session(program("lm"), MESH, [wb.BP("batch"), wb.MP("model")])
    none, full, half = (s.estimate(hw.H100, overlap=o) for o in ("none", "full", 0.5))
    assert none.step_s == pytest.approx(none.compute_s + none.communication_s)
    assert full.step_s == pytest.approx(max(full.compute_s, full.communication_s))
    assert half.step_s == pytest.approx(
        none.step_s - 0.5 * min(none.compute_s, none.communication_s)
    )
    with pytest.raises(wb.InputError, match=r"overlap=2\.0 is not a fraction in \[0, 1\]"):
        s.estimate(hw.H100, overlap=2.0)


def test_each_collective_is_linked_to_the_tactic_behind_it():
    s = wb.Session(program("lm"), MESH, [wb.BP("batch"), wb.MP("model")])
    by_tactic = s.estimate(hw.H100).by_tactic()
    assert set(by_tactic) == {0, 1} and all(t > 0 for t in by_tactic.values())


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(CASES), st.sampled_from([hw.H100, hw.TPU_V5E, hw.CPU]))
def test_estimates_are_deterministic_and_non_negative(case, hardware):
    model, strategy = case
    s = wb.Session(program(model), MESH, strategies(model)[strategy])
    a, b = s.estimate(hardware), s.estimate(hardware)
    assert a.step_s == b.step_s and a.memory.peak == b.memory.peak
    assert a.compute_s >= 0 and a.communication_s >= 0 and a.memory.peak > 0
    assert all(o.seconds >= 0 for o in a.ops) and all(c.seconds >= 0 for c in a.collectives)


@pytest.mark.slow
@pytest.mark.parametrize("model, strategy", CASES)
def test_against_what_xla_compiles(model, strategy):
    s = wb.Session(program(model), MESH, strategies(model)[strategy])
    e = s.estimate(hw.CPU)
    fn, jmesh = s.lower("explicit")
    lowered = fn.lower(*abstract_inputs(s, jmesh))
    memory = lowered.compile().memory_analysis()
    assert e.memory.arguments == memory.argument_size_in_bytes
    assert e.memory.outputs == memory.output_size_in_bytes
    # the same ops on both sides: the per-device HLO before XLA rewrites it, loop bodies once
    xla = lowered.cost_analysis()["flops"]
    ours = sum(o.cost.flops + o.cost.transcendentals for o in e.ops)
    # XLA also counts one flop per element an all-reduce adds up
    ours += sum(c.bytes // c.src.dtype.itemsize for c in s.collectives() if c.kind == "all-reduce")
    assert ours == pytest.approx(xla, rel=0.02)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["lm", "lm_scan", "cnn"])
@pytest.mark.parametrize("strategy", ["none", "BP", "MP", "BP+MP"])
def test_transposed_copies_against_what_xla_compiles(model, strategy):
    """The bytes the simulator's transposed operand copies read match what XLA's
    transposing kernels read for the same plan: within 15% in all, and within 5% over
    the eight largest (the LM's copies for its weight gradients, which recompute the
    residual stream's gradient through every later layer, unrolled or in a scan; the CNN's
    copies of activations into the order its convolutions read)."""
    from workbench.core.estimate.compute import Compute as _Simulator
    from workbench.core.estimate.static import Static as _Static
    from workbench.core.xla.transposes import parse_transposes

    schedule = [] if strategy == "none" else strategies(model)[strategy]
    s = wb.Session(program(model, "small"), MESH, schedule)
    plan = s.plan()
    sim = _Simulator(s.program, MESH, s.state, plan, hw.CPU)
    ours = [
        sim.copy_bytes(op_id, k)[0]
        for op_id, ks in _Static.of(s.program).copies
        if plan.ops[op_id] is not None
        for k in ks
        for _ in range(plan.ops[op_id].repeats)
    ]
    xla = [t.read for t in parse_transposes(compiled_text(s)) for _ in range(t.count)]
    assert sum(ours) == pytest.approx(sum(xla), rel=0.15)
    assert sum(sorted(ours)[-8:]) == pytest.approx(sum(sorted(xla)[-8:]), rel=0.05)


# where the simulator's memory is known to miss XLA's by more than 25% (benchmarks/memory.py);
# the GNN's BP+MP+Z3 miss went with BP tiling the nodes alone (its edge lists carry no batch
# dimension in its anatomy), so none is known today
MEMORY_MISSES: dict[tuple[str, str], str] = {}


@pytest.mark.slow
@pytest.mark.parametrize("model", ["mlp", "lm", "lm_scan", "cnn", "gnn"])
@pytest.mark.parametrize("strategy", ["none", *strategies("lm")])
def test_memory_against_what_xla_compiles(model, strategy, request):
    """Temporaries and peak per device within 25% of XLA's for the explicit lowering of the
    same plan, compiled with the inputs donated that the simulator assumes a training loop
    donates (the "small" zoo models: large enough that buffers, not bookkeeping, count)."""
    if (model, strategy) in MEMORY_MISSES:
        request.applymarker(pytest.mark.xfail(reason=MEMORY_MISSES[model, strategy], strict=True))
    schedule = [] if strategy == "none" else strategies(model)[strategy]
    s = wb.Session(program(model, "small"), MESH, schedule)
    ours = s.estimate(hw.CPU).memory
    temporaries, peak = compiled_memory(s, donate=True)
    assert ours.temporaries == pytest.approx(temporaries, rel=0.25)
    assert ours.peak == pytest.approx(peak, rel=0.25)


def test_estimates_on_several_specs_do_not_mix():
    """Times priced on one spec are never reused for another on the same program."""
    ex = build("lm", "tiny")
    schedule = [wb.BP("batch"), wb.MP("model")]
    mesh = wb.Mesh({"batch": 2, "model": 4})
    shared = wb.Session(wb.capture(ex.fn, *ex.args), mesh, schedule)
    for chip in (hw.CPU, hw.H100, hw.CPU, hw.TPU_V5E):
        fresh = wb.Session(wb.capture(ex.fn, *ex.args), mesh, schedule).estimate(chip)
        assert shared.estimate(chip).compute_s == fresh.compute_s


@pytest.mark.slow
def test_fsdp_with_master_weights_runs_and_matches():
    config = lm.Config.preset("tiny", master_weights=True)
    ex = build("lm", config)
    s = wb.Session(wb.capture(ex.fn, *ex.args), {"batch": 2, "model": 4})
    s.apply(wb.BP("batch")).apply(wb.Z3("batch"))
    assert not s.conflicts
    assert s.sharding("params/layers/0/mlp/w_in").uses("batch")
    assert s.sharding("opt_state/master/layers/0/mlp/w_in").uses("batch")
    assert s.run(repeats=1).matches


def test_ops_alike_share_a_price_that_is_their_own():
    """Ops of repeated layers are priced once per layout: each shared price is exactly the
    price of the op itself."""
    from workbench.core.estimate.compute import Compute as _Simulator

    ex = build("lm", lm.Config.preset("tiny", n_layers=3))
    s = wb.Session(wb.capture(ex.fn, *ex.args), MESH, [wb.BP("batch"), wb.MP("model")])
    e = s.estimate(hw.CPU)
    sim = _Simulator(s.program, MESH, s.state, s.plan(), hw.CPU)
    alike = sim.static.alike
    assert len(set(alike.values())) < len(alike) / 2  # the layers do share
    redistributed = s.plan().redistributed
    for o in e.ops:
        plan = s.plan().ops[o.op]
        fused = tuple(v not in redistributed for v in sim.static.fusing[o.op])
        assert (o.cost, o.seconds, o.kernel) == sim.price(o.op, plan, fused)


def test_donations_name_the_inputs_a_training_loop_overwrites():
    from workbench.core.estimate import donations

    ex = build("lm", "tiny")
    s = wb.Session(wb.capture(ex.fn, *ex.args), MESH, [wb.BP("batch")])
    p = s.program
    pairs = {p.values[v].name: p.values[p.inputs[i]].name for v, i in donations(p, s.state).items()}
    assert pairs and all(out == "out/" + name for out, name in pairs.items())
    assert any(name.startswith("params/") for name in pairs.values())
    assert any(name.startswith("opt") for name in pairs.values())


def test_canonical_shardings_are_shared():
    from workbench.core.layout.sharding import Sharding, canonical

    a = Sharding((8, 4), jnp.float32, (("batch",), ()))
    b = Sharding((8, 4), jnp.float32, (("batch",), ()))
    assert a == b and a is not b and canonical(a) is canonical(b)
    ex = build("lm", lm.Config.preset("tiny", n_layers=2))
    s = wb.Session(wb.capture(ex.fn, *ex.args), MESH, [wb.MP("model")])
    w0, w1 = (s.sharding(f"params/layers/{i}/mlp/w_in") for i in (0, 1))
    assert w0 == w1 and w0 is w1


def _step_s(build_one, layers: int, chip) -> float:
    ex = build_one(layers)
    s = wb.Session(
        wb.capture(ex.fn, *ex.args), MESH_DM, [wb.BP("data"), wb.MP("model"), wb.Z3("data")]
    )
    return s.estimate(chip).step_s


MESH_DM = wb.Mesh({"data": 2, "model": 4})


@pytest.mark.slow
@pytest.mark.parametrize("model", ["lm", "lm_scan", "hf_llama"])
def test_the_time_per_layer_is_the_same_at_every_depth(model):
    """The estimated time per layer (the slope of step time against depth) between 2 and 8
    layers and between 8 and 32 agrees within 5% on an accelerator preset: a transposed
    copy fused into a chain reads what one layer's chain reads, not every later layer's."""
    import warnings

    from workbench.models.external import Size, build_external

    def build_one(layers):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if model == "hf_llama":
                size = Size(batch=8, seq_len=64, d_model=128, n_heads=4, d_ff=512, n_layers=layers)
                return build_external(model, size, abstract=True)
            return build(model, lm.Config.preset("small", n_layers=layers), abstract=True)

    t2, t8, t32 = (_step_s(build_one, n, hw.H100) for n in (2, 8, 32))
    assert (t32 - t8) / 24 == pytest.approx((t8 - t2) / 6, rel=0.05)


def test_only_a_cpu_recomputes_a_sum_in_every_reader():
    """XLA's CPU fusion recomputes the residual stream's gradient in every transposed copy
    that reads it, so the copies of an unrolled LM read more the deeper they sit; on an
    accelerator the sum is written once per layer and every layer's copies read alike."""
    from workbench.core.estimate.compute import Compute as _Simulator
    from workbench.core.estimate.static import Static as _Static

    s = wb.Session(program("lm", "small"), MESH, strategies("lm")["BP"])
    reads = {}
    for chip in (hw.CPU, hw.H100):
        sim = _Simulator(s.program, MESH, s.state, s.plan(), chip)
        reads[chip.name] = sorted(
            sim.copy_bytes(op_id, k)[0] for op_id, ks in _Static.of(s.program).copies for k in ks
        )
    assert sum(reads[hw.CPU.name]) > 1.2 * sum(reads[hw.H100.name])
    assert max(reads[hw.H100.name]) < max(reads[hw.CPU.name])
