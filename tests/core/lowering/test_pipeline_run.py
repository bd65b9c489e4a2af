"""The pipeline lowering: a captured step run as a pipeline of stages over one mesh axis
computes what the unpartitioned step computes, in the order its schedule table gives."""

import ast
import re
from functools import cache

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb
from workbench.core.anatomy.stages import stage_cuts
from workbench.core.errors import InputError, TacticError
from workbench.core.lowering.pipeline import lower_pipeline
from workbench.core.lowering.pipeline_segments import ticks
from workbench.core.lowering.run import (
    compare,
    example_inputs,
    reference_outputs,
    tolerance_dtypes,
)
from workbench.core.plan.schedule import schedule
from workbench.models import build, lm

BATCH, WIDTH = 8, 16


def _mlp_step(norm: bool):
    """Four tanh layers, a masked mean loss, global-norm clipping and SGD; ``norm``: each
    layer centred on its batch mean (couples the examples of a batch)."""

    def step(params, x, y, mask):
        def loss_fn(params):
            h = x
            for w in params:
                h = jnp.tanh(h @ w)
                if norm:
                    h = h - h.mean(0)
            err = jnp.sum((h - y) ** 2, axis=-1)
            return jnp.sum(err * mask) / jnp.sum(mask)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        norm2 = jnp.sqrt(sum(jnp.sum(g**2) for g in grads))
        scale = jnp.minimum(1.0, 0.5 / norm2)
        return [w - 0.1 * scale * g for w, g in zip(params, grads)], loss

    return step


@cache
def mlp(norm: bool = False):
    """The captured MLP step and its inputs: the mask keeps 5 of 8 examples, so microbatches
    hold different numbers (a mean of microbatch means would differ)."""
    rng = np.random.default_rng(0)
    params = [jnp.asarray(rng.normal(0, 0.5, (WIDTH, WIDTH)), jnp.float32) for _ in range(4)]
    x = jnp.asarray(rng.normal(size=(BATCH, WIDTH)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(BATCH, WIDTH)), jnp.float32)
    mask = jnp.asarray([1, 1, 1, 1, 1, 0, 0, 0], jnp.float32)
    program = wb.capture(_mlp_step(norm), params, x, y, mask)
    return program, [*params, x, y, mask]


@cache
def zoo_lm(layers: int = 4, kind: str = "lm"):
    ex = build(kind, lm.Config.preset("tiny", n_layers=layers))
    program = wb.capture(ex.fn, *ex.args)
    return program, example_inputs(program)


@cache
def abstract_lm(layers: int = 4):
    """The zoo LM captured from shapes alone, and its inputs' shapes (to trace, not run)."""
    ex = build("lm", lm.Config.preset("tiny", n_layers=layers), abstract=True)
    program = wb.capture(ex.fn, *ex.args)
    return program, [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in program.input_values]


def pipelined(program, kind, S, M, mesh=None, state=None, v=1):
    mesh = mesh or wb.Mesh({"stage": S})
    cuts, sched = stage_cuts(program, S * v), schedule(kind, S, M, v)
    return lower_pipeline(program, mesh, "stage", cuts, sched, state=state)


def session(program, mesh, kind, M, *others, v=1):
    pp = wb.PP("stage", microbatches=M, schedule=kind, virtual_stages=v)
    return wb.Session(program, mesh, [pp, *others])


def assert_agrees(program, flat, lowered):
    out = lowered(*flat)
    ref = reference_outputs(program, flat)
    assert len(out) == len(ref)
    worst_abs, worst_rel, ok = compare(out, ref, tolerance_dtypes(program))
    assert ok, f"pipelined outputs differ: worst abs {worst_abs:.3g}, rel {worst_rel:.3g}"


# -- the order of work: what each stage's code runs is its row of the table ----------------
@pytest.mark.parametrize("kind", ["gpipe", "1f1b", "zero-bubble"])
def test_each_stage_emits_its_row_of_the_schedule(kind):
    program, flat = mlp()
    sched = schedule(kind, 2, 4)
    lowered = pipelined(program, kind, 2, 4)
    jax.eval_shape(lowered.fn, *flat)  # traces: each stage's branches emit their work
    assert [tuple(row) for row in lowered.emitted] == [tuple(row) for row in sched.table]


def test_each_device_emits_its_row_of_the_interleaved_schedule_chunks_included():
    program, flat = abstract_lm()
    sched = schedule("interleaved", 2, 4, 2)
    lowered = pipelined(program, "interleaved", 2, 4, v=2)
    jax.eval_shape(lowered.fn, *flat)
    assert [tuple(row) for row in lowered.emitted] == [tuple(row) for row in sched.table]
    assert {w.chunk for row in lowered.emitted for w in row} == {0, 1}


CASES = [(k, S, M, 1) for k in ("gpipe", "1f1b", "zero-bubble") for S, M in
         [(2, 2), (4, 4), (4, 8), (3, 5)]]  # fmt: skip
CASES += [("interleaved", S, M, v) for S, M, v in [(2, 2, 2), (2, 4, 3), (4, 8, 2), (3, 6, 2)]]


@pytest.mark.parametrize("kind, S, M, v", CASES)
def test_ticks_respect_the_dependencies(kind, S, M, v):
    """F of virtual stage g = c*S + s after F of g-1 (device S-1's chunk c before device
    0's chunk c+1), B after B of g+1, each message stored on the device that runs it."""
    sched = schedule(kind, S, M, v)
    done, stored, V = {}, set(), S * v
    for t, tick in enumerate(ticks(sched)):
        for s, items in enumerate(tick.stores):
            for pool, g, m in items:
                assert g % S == s
                stored.add((pool, g, m))
        for s, w in enumerate(tick.work):
            if w is None:
                continue
            g = w.chunk * S + s
            if w.kind == "F" and g > 0:
                assert done["F", g - 1, w.microbatch] < t and ("fin", g, w.microbatch) in stored
            if w.kind == "B" and g < V - 1:
                assert done["B", g + 1, w.microbatch] < t and ("bin", g, w.microbatch) in stored
            done[w.kind, g, w.microbatch] = t
    rows = [[w for tick in ticks(sched) if (w := tick.work[s])] for s in range(S)]
    assert rows == [list(row) for row in sched.table]
    assert len(stored) == 2 * M * (V - 1)  # every boundary, both ways, every microbatch


def test_gpipe_keeps_every_microbatch_and_1f1b_at_most_the_stages():
    program, _ = mlp()
    assert pipelined(program, "gpipe", 2, 4).slots["saved"] == 4
    assert pipelined(program, "1f1b", 2, 4).slots["saved"] == 2
    assert pipelined(program, "zero-bubble", 2, 4).slots["saved"] == 2


def test_interleaved_chunks_share_a_devices_slots_as_many_as_its_table_holds_in_flight():
    """A device keeps each chunk's microbatch from its F to its B; at S=2, M=4, v=2 stage
    0 runs 4 forwards before its first backward, so it holds 5 (not v * 4 = 8)."""
    program, _ = abstract_lm()
    sched = schedule("interleaved", 2, 4, 2)
    flight = []
    for row in sched.table:
        n = peak = 0
        for w in row:
            n += 1 if w.kind == "F" else -1
            peak = max(peak, n)
        flight.append(peak)
    assert flight == [5, 3]
    assert pipelined(program, "interleaved", 2, 4, v=2).slots["saved"] == max(flight)


# -- the parts: what runs before, per microbatch, and after --------------------------------
def test_the_token_count_runs_before_and_the_update_after():
    program, _ = mlp()
    parts = pipelined(program, "1f1b", 2, 2).parts
    assert parts.pre and parts.post
    assert {program.ops[o].phase for o in parts.post} >= {"optimizer"}
    grads = {v for vs in parts.accumulated.values() for v in vs}
    assert len(grads) >= 4 + 1  # a sum per layer's gradient, and the loss's


@pytest.mark.slow  # compiles for ~5 s
def test_agrees_with_a_masked_mean_and_global_norm_clipping():
    program, flat = mlp()
    assert_agrees(program, flat, pipelined(program, "1f1b", 2, 4))


# -- bad input ------------------------------------------------------------------------------
def test_batch_coupling_ops_are_refused_by_name():
    program, _ = mlp(norm=True)
    with pytest.raises(TacticError, match=r"op \d+ \(\w+, forward.*batch normalisation"):
        pipelined(program, "gpipe", 2, 2)


def test_bad_inputs_say_what_would_work():
    program, _ = mlp()
    cuts, sched = stage_cuts(program, 2), schedule("gpipe", 2, 2)
    with pytest.raises(InputError, match="not an axis of the mesh"):
        lower_pipeline(program, wb.Mesh({"stage": 2}), "pipe", cuts, sched)
    with pytest.raises(InputError, match="cut the step into 4 stages"):
        lower_pipeline(program, wb.Mesh({"stage": 4}), "stage", cuts, sched)
    with pytest.raises(InputError, match=r"equal microbatches.*\[1, 2, 4, 8\]"):
        lower_pipeline(program, wb.Mesh({"stage": 2}), "stage", cuts, schedule("gpipe", 2, 3))
    with pytest.raises(InputError, match=r"an axis named 'microbatch'.*rename that axis"):
        lower_pipeline(program, wb.Mesh({"stage": 2, "microbatch": 2}), "stage", cuts, sched)
    tiled = wb.Session(program, wb.Mesh({"stage": 2}), [wb.BP("stage")]).state
    with pytest.raises(InputError, match=r"over 'stage'.*the pipeline's stage axis"):
        lower_pipeline(program, wb.Mesh({"stage": 2}), "stage", cuts, sched, state=tiled)
    with pytest.raises(InputError, match=r"2 devices of 2 model chunks.*into 4 stages"):
        sched = schedule("interleaved", 2, 2, virtual_stages=2)
        lower_pipeline(program, wb.Mesh({"stage": 2}), "stage", cuts, sched)


# -- the zoo LM: every schedule agrees with the unpartitioned step -------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, S, M",
    [
        ("gpipe", 2, 4),
        ("gpipe", 4, 2),
        ("1f1b", 2, 2),
        ("1f1b", 4, 4),
        ("zero-bubble", 4, 4),
    ],
)
def test_zoo_lm_pipelined_agrees(kind, S, M):
    program, flat = zoo_lm()
    assert_agrees(program, flat, pipelined(program, kind, S, M))


@pytest.mark.slow
def test_zoo_lm_on_stages_beside_a_replicated_axis():
    program, flat = zoo_lm()
    mesh = wb.Mesh({"stage": 4, "data": 2})
    assert_agrees(program, flat, pipelined(program, "1f1b", 4, 2, mesh=mesh))


@pytest.mark.slow
def test_a_flax_nnx_lm_pipelined_agrees():
    from tests.models.programs import program as external

    program = external("nnx_lm")
    flat = example_inputs(program)
    assert_agrees(program, flat, pipelined(program, "1f1b", 2, 2))


# -- beside SPMD layouts on the other axes --------------------------------------------------
def test_a_stage_runs_in_the_steps_layouts_with_the_batch_split_further_into_microbatches():
    """Each gradient a stage accumulates is pending over the microbatches and the data axis;
    after the pipeline it is pending over the data axis alone, as in the step's state, so
    the update's plan reduces it there exactly once."""
    program, flat = mlp()
    s = session(program, wb.Mesh({"stage": 2, "data": 2}), "1f1b", 2, wb.BP("data"))
    lowered = pipelined(program, "1f1b", 2, 2, mesh=s.mesh, state=s.state)
    micro = lowered.micro.shardings
    for v, d in program.anatomy().data:
        assert micro[v].dims[d] == ("data", "microbatch")
    sums = [v for vs in lowered.parts.accumulated.values() for v in vs]
    assert len(sums) >= 4 + 1
    for v in sums:
        assert {"data", "microbatch"} <= set(micro[v].partial_axes)
        assert s.state.shardings[v].partial_axes == ("data",)
    out = jax.eval_shape(lowered.fn, *flat)  # traces under the step's in and out specs
    assert [o.shape for o in out] == [program.values[v].shape for v in program.outputs]


@pytest.mark.slow  # compiles for ~5 s
def test_a_masked_mean_beside_data_parallelism_counts_its_tokens_once():
    program, flat = mlp()
    s = session(program, wb.Mesh({"stage": 2, "data": 2}), "zero-bubble", 2, wb.BP("data"))
    result = s.run(repeats=1, args=flat, devices=jax.devices()[:4])
    assert result.matches, result


@pytest.mark.slow  # ~30 s each: compiles a 4-stage, 2-way data-parallel pipeline
@pytest.mark.parametrize("kind", ["1f1b", "zero-bubble"])  # gpipe: the same segments
def test_zoo_lm_pipelined_beside_data_parallelism_agrees(kind):
    program, _ = zoo_lm()
    s = session(program, wb.Mesh({"stage": 4, "data": 2}), kind, 4, wb.BP("data"))
    result = s.run(repeats=1)
    assert result.matches, result


@pytest.mark.slow  # ~40 s
def test_zoo_lm_pipelined_beside_data_and_model_parallelism_agrees():
    program, _ = zoo_lm()
    mesh = wb.Mesh({"stage": 2, "model": 2, "data": 2})
    s = session(program, mesh, "zero-bubble", 4, wb.BP("data"), wb.MP("model"))
    result = s.run(repeats=1)
    assert result.matches, result


@pytest.mark.slow
def test_a_flax_nnx_lm_pipelined_beside_data_parallelism_agrees():
    from tests.models.programs import program as external

    program = external("nnx_lm")
    s = session(program, wb.Mesh({"stage": 2, "data": 2}), "1f1b", 2, wb.BP("data"))
    result = s.run(repeats=1, devices=jax.devices()[:4])
    assert result.matches, result


# -- blocks under a loop (scan): each stage runs its range of the loop's iterations -----------
def _scanned_step(aux: bool):
    """tanh layers under a lax.scan, the carry starting from the input; ``aux``: the loss
    also reads a per-layer stack the forward loop makes (a stage holds its range only)."""

    def step(ws, x):
        def loss_fn(ws):
            def body(h, w):
                h = jnp.tanh(h @ w)
                return h, jnp.sum(h * h) if aux else None

            h, ys = jax.lax.scan(body, x, ws)
            return jnp.mean(h**2) + (jnp.sum(ys) if aux else 0.0)

        loss, grads = jax.value_and_grad(loss_fn)(ws)
        return ws - 0.1 * grads, loss

    return step


@cache
def scanned_mlp(aux: bool = False):
    rng = np.random.default_rng(0)
    ws = jnp.asarray(rng.normal(0, 0.5, (4, WIDTH, WIDTH)), jnp.float32)
    x = jnp.asarray(rng.normal(size=(BATCH, WIDTH)), jnp.float32)
    return wb.capture(_scanned_step(aux), ws, x), [ws, x]


def test_scanned_blocks_run_each_stage_over_its_range_of_the_loops_iterations():
    ex = build("lm_scan", lm.Config.preset("tiny", n_layers=4), abstract=True)
    program = wb.capture(ex.fn, *ex.args)
    parts = pipelined(program, "1f1b", 2, 2).parts
    loop = parts.loop
    assert loop.ranges == ((0, 2), (2, 4))
    for s in range(2):  # both loops on every stage; the stacked gradients summed on each
        assert loop.forward in parts.segments[s, "F"] and loop.backward in parts.segments[s, "B"]
        assert set(loop.local - loop.fresh) <= set(parts.accumulated[s])
        assert set(loop.fresh) <= set(parts.saved[s])  # the forward's stacks of its range
    carry_f = [v for v, out in loop.sends.items() if out in loop.carry_out[loop.forward]]
    carry_b = [v for v in loop.sends if v not in carry_f]
    assert parts.fwd == (tuple(carry_f),) and parts.bwd == (tuple(carry_b),)


def test_a_loops_stack_read_beyond_its_backward_is_refused_naming_the_reader():
    program, _ = scanned_mlp(aux=True)
    with pytest.raises(InputError, match=r"under a loop \(scan\).*read by op \d+, reduce_sum"):
        pipelined(program, "1f1b", 2, 2)


@pytest.mark.slow  # ~10 s
@pytest.mark.parametrize("kind", ["gpipe", "zero-bubble"])
def test_a_scanned_mlp_pipelined_beside_data_parallelism_agrees(kind):
    program, flat = scanned_mlp()  # the carry starts from an input, before the pipeline
    s = session(program, wb.Mesh({"stage": 4, "data": 2}), kind, 2, wb.BP("data"))
    result = s.run(repeats=1, args=flat)
    assert result.matches, result


@pytest.mark.slow  # ~30 s
def test_the_zoo_scanned_lm_pipelined_agrees():
    ex = build("lm_scan", lm.Config.preset("tiny", n_layers=4))
    program = wb.capture(ex.fn, *ex.args)
    s = wb.Session(program, wb.Mesh({"stage": 2, "data": 2}), [wb.PP("stage", microbatches=2)])
    result = s.run(repeats=1, devices=jax.devices()[:4])
    assert result.matches, result


@pytest.mark.slow  # ~20 s
def test_the_zoo_scanned_lm_on_four_stages_beside_data_parallelism_agrees():
    ex = build("lm_scan", lm.Config.preset("tiny", n_layers=4))
    program = wb.capture(ex.fn, *ex.args)
    s = session(program, wb.Mesh({"stage": 4, "data": 2}), "zero-bubble", 2, wb.BP("data"))
    result = s.run(repeats=1)
    assert result.matches, result


@pytest.mark.slow
def test_the_compiled_schedules_hold_what_the_simulator_says_they_hold():
    """At M=8, S=4 GPipe holds M microbatches' activations on a stage and 1F1B at most S:
    XLA's temporary bytes fall from GPipe to 1F1B by what the simulator's activations in
    flight fall, within 20%. (The ratio of the totals differs: this lowering keeps every
    stage's parameters, gradients and update on each device, which the simulator, pricing
    a real pipeline, does not.)"""
    ex = build("lm", lm.Config.preset("tiny", n_layers=4, batch=16))
    program = wb.capture(ex.fn, *ex.args)
    flat = example_inputs(program)
    temp, flight = {}, {}
    for kind in ("gpipe", "1f1b"):
        s = wb.Session(
            program,
            wb.Mesh({"stage": 4, "data": 2}),
            [wb.PP("stage", microbatches=8, schedule=kind)],
        )
        fn, _ = s.lower()
        temp[kind] = fn.lower(*flat).compile().memory_analysis().temp_size_in_bytes
        pe = s.estimate().pipeline
        flight[kind] = max(p - sum(st.values()) for p, st in zip(pe.peak, pe.state))
    measured = temp["gpipe"] - temp["1f1b"]
    simulated = flight["gpipe"] - flight["1f1b"]
    assert measured > 0 and abs(measured / simulated - 1) < 0.2, (temp, flight)


# -- interleaved: v model chunks per device, device S-1 sending back to device 0 ------------
def test_interleaved_sends_wrap_from_the_last_device_to_the_first_as_the_plan_lists():
    """The lowered program permutes device 3's chunk-0 activations to device 0 (and the
    cotangents back), and the session's collectives list those sends, M a step each."""
    program, flat = abstract_lm(8)
    mesh = wb.Mesh({"stage": 4, "data": 2})
    s = session(program, mesh, "interleaved", 4, wb.BP("data"), v=2)
    fn, _ = s.lower()
    text = str(jax.make_jaxpr(fn)(*flat))
    perms = [ast.literal_eval(p) for p in re.findall(r"perm=(\(\([0-9, ()]*\)\))", text)]
    assert sum((3, 0) in p for p in perms) == sum((0, 3) in p for p in perms) == 4
    whys = {c.why.split(" (PP")[0]: c for c in s.collectives() if "(chunk 1)" in c.why}
    forward = [w for w in whys if w.startswith("stage 3 (chunk 0) sends each")]
    back = [w for w in whys if w.startswith("stage 0 (chunk 1) sends the gradient")]
    assert forward and len(back) == len(forward)
    assert all(w.endswith("to stage 0 (chunk 1)") for w in forward)
    assert all(whys[w].kind == "collective-permute" and whys[w].count == 4 for w in forward + back)


@pytest.mark.slow  # ~50 s (half of it the unpartitioned references): 8 blocks on 4 x 2
def test_zoo_lm_interleaved_beside_data_parallelism_agrees():
    program, _ = zoo_lm(8)
    s = session(program, wb.Mesh({"stage": 4, "data": 2}), "interleaved", 4, wb.BP("data"), v=2)
    result = s.run(repeats=1)
    assert result.matches, result


@pytest.mark.slow  # ~20 s
def test_zoo_lm_interleaved_beside_data_and_model_parallelism_agrees():
    program, _ = zoo_lm()
    mesh = wb.Mesh({"stage": 2, "model": 2, "data": 2})
    s = session(program, mesh, "interleaved", 2, wb.BP("data"), wb.MP("model"), v=2)
    result = s.run(repeats=1)
    assert result.matches, result


@pytest.mark.slow  # ~25 s
def test_the_zoo_scanned_lm_interleaved_runs_each_chunk_over_its_range():
    program, _ = zoo_lm(4, "lm_scan")
    s = session(program, wb.Mesh({"stage": 2, "data": 2}), "interleaved", 2, wb.BP("data"), v=2)
    parts = pipelined(program, "interleaved", 2, 2, mesh=s.mesh, state=s.state, v=2).parts
    assert parts.loop.ranges == ((0, 1), (1, 2), (2, 3), (3, 4))  # virtual stage g: block g
    result = s.run(repeats=1, devices=jax.devices()[:4])
    assert result.matches, result
