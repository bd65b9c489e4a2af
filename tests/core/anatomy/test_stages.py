"""Pipeline stage cuts: along the repeated blocks, balanced, with the residual stream crossing."""

from __future__ import annotations

import itertools
from functools import cache

import pytest

import workbench as wb
from tests.core.zoo import program as zoo_program
from workbench.core.anatomy.stages import stage_cuts
from workbench.core.errors import InputError
from workbench.models import build, lm


@cache
def lm4(name: str) -> wb.Program:
    ex = build(name, lm.Config.preset("tiny", n_layers=4), abstract=True)
    return wb.capture(ex.fn, *ex.args)


def stream_shape(program) -> tuple[int, ...]:
    """[batch, seq, d_model], read from the token input and the embedding table."""
    a = program.anatomy()
    table, vocab_dim = a.layers.embeddings[0]
    tokens = next(v for v, d in a.data if len(program.values[v].shape) == 2)
    return (*program.values[tokens].shape, program.values[table].shape[1 - vocab_dim])


def check_cover(program, cuts, n_blocks):
    """Blocks split into contiguous, non-empty runs; every forward op in one stage: in its
    forward, or when it runs after the backward began (a recomputation) in its backward
    (or unplaced, with why: a step counter's update reads no stage's value)."""
    blocks = [b for s in cuts.stages for b in s.blocks]
    assert blocks == list(range(n_blocks)) and all(s.blocks for s in cuts.stages)
    placed = [o for s in cuts.stages for o in s.forward] + [
        o for o in cuts.looped if program.ops[o].phase == "forward"
    ]
    body, top = program.body, program.top_level
    first = next(i for i, o in enumerate(body) if program.ops[o].phase == "backward")
    late = {o for o in body[first:] if program.ops[o].phase == "forward"}
    forward = [op.id for op in program.ops if op.phase == "forward" and top[op.id] not in late]
    assert sorted(placed) == forward
    recomputed = {op.id for op in program.ops if top[op.id] in late}
    backward = {o for s in cuts.stages for o in s.backward} | set(cuts.looped)
    assert recomputed <= backward | {o for o, _ in cuts.unplaced}  # unplaced: a step counter
    costs = [s.cost for s in cuts.stages]
    assert cuts.balance == pytest.approx(max(costs) * len(costs) / sum(costs))


def check_balanced(program, cuts, n_blocks):
    """No other contiguous grouping has a smaller largest stage."""
    best = max(s.cost for s in cuts.stages)
    for alt in itertools.combinations(range(1, n_blocks), len(cuts.stages) - 1):
        other = stage_cuts(program, len(cuts.stages), layers=list(alt))
        assert max(s.cost for s in other.stages) >= best * (1 - 1e-9)


@pytest.mark.parametrize("stages", [2, 4])
def test_unrolled_lm_cuts_on_the_residual_stream(stages):
    program = lm4("lm")
    a = program.anatomy()
    cuts = stage_cuts(program, stages)
    check_cover(program, cuts, 4)
    check_balanced(program, cuts, 4)
    assert cuts.loop is None and not cuts.looped and not cuts.shared
    assert [len(s.blocks) for s in cuts.stages] == [4 // stages] * stages
    for b in cuts.boundaries:  # one value per cut: the residual stream
        assert [program.values[v].shape for v in b.values] == [stream_shape(program)]
        assert b.nbytes == program.values[b.values[0]].nbytes
    for s in cuts.stages:  # a block's parameters, gradients and updates sit with it
        for k in s.blocks:
            for p in a.layers.blocks[k]:
                assert p in s.parameters
                assert program.values[a.gradients[p]].producer in s.backward
                assert program.values[a.new_params[p]].producer in s.optimizer
    assert a.layers.embeddings[0][0] in cuts.stages[0].parameters
    assert a.layers.heads_out[0][0] in cuts.stages[-1].parameters
    assert {v for v, _ in a.data} == {*cuts.stages[0].inputs, *cuts.stages[-1].inputs}
    # what is left: the step counter and schedule every stage's update reads
    assert all(program.ops[o].phase == "optimizer" for o, _ in cuts.unplaced)
    assert len(cuts.unplaced) < 10


def test_a_heavy_block_moves_the_cut_and_layers_override():
    program = lm4("lm")
    even = stage_cuts(program, 2)
    assert [s.blocks for s in even.stages] == [(0, 1), (2, 3)]
    first = {o for o in stage_cuts(program, 4).stages[0].forward}
    weigh = lambda o: 20.0 if o in first else 1.0  # noqa: E731
    heavy = stage_cuts(program, 2, cost=weigh)
    assert [s.blocks for s in heavy.stages] == [(0,), (1, 2, 3)]
    assert heavy.balance < stage_cuts(program, 2, cost=weigh, layers=[2]).balance
    given = stage_cuts(program, 2, layers=[3])
    assert [s.blocks for s in given.stages] == [(0, 1, 2), (3,)] and given.chosen == "layers"
    assert given.balance > even.balance


@pytest.mark.parametrize("stages", [2, 4])
def test_scanned_lm_splits_the_loop_iterations(stages):
    program = lm4("lm_scan")
    a = program.anatomy()
    cuts = stage_cuts(program, stages)
    check_cover(program, cuts, 4)
    check_balanced(program, cuts, 4)
    loop = program.ops[cuts.loop]
    assert loop.phase == "forward" and loop.regions and cuts.loop in cuts.looped
    for b in cuts.boundaries:  # the loop's carry (the residual stream) crosses every cut
        carried = [v for v in b.values if program.values[v].region_of == cuts.loop]
        assert [program.values[v].shape for v in carried] == [stream_shape(program)]
    for s in cuts.stages:
        assert set(a.layers.stacked) <= set(s.parameters)
    assert a.layers.embeddings[0][0] in cuts.stages[0].parameters
    assert a.layers.heads_out[0][0] in cuts.stages[-1].parameters
    # the same model unrolled costs the same, stage by stage (but for the mask the loop
    # builds once)
    unrolled = [s.cost for s in stage_cuts(lm4("lm"), stages).stages]
    assert [s.cost for s in cuts.stages] == pytest.approx(unrolled, rel=1e-3)


@pytest.mark.parametrize(
    "model", ["nnx_lm", *(pytest.param(m, marks=pytest.mark.slow) for m in ("eqx_lm", "hf_gpt2"))]
)
def test_third_party_models_cut_in_two(model):
    from tests.models.programs import program as external

    program = external(model)
    cuts = stage_cuts(program, 2)
    check_cover(program, cuts, 2)
    assert [s.blocks for s in cuts.stages] == [(0,), (1,)]
    (boundary,) = cuts.boundaries
    shapes = [program.values[v].shape for v in boundary.values]
    assert shapes.count(stream_shape(program)) == 1  # the stream; a mask may cross too
    assert boundary.nbytes == sum(program.values[v].nbytes for v in boundary.values)
    a = program.anatomy()
    for k, s in enumerate(cuts.stages):
        for p in a.layers.blocks[k][1:]:  # the first may be the last block's bias
            assert p in s.parameters
    placed = {o for s in cuts.stages for o in s.optimizer} | {o for o, _ in cuts.unplaced}
    assert placed >= {op.id for op in program.ops if op.phase == "optimizer"}


def test_a_checkpointed_step_recomputes_each_block_on_its_own_stage():
    """Under jax.checkpoint the backward recomputes each block from its input: that
    recomputation is the block's stage's backward, and only the stream crosses a cut."""
    ex = build("lm", lm.Config.preset("tiny", n_layers=4, remat=True))
    program = wb.capture(ex.fn, *ex.args)
    cuts = stage_cuts(program, 4)
    check_cover(program, cuts, 4)
    stream = stream_shape(program)
    assert [[program.values[v].shape for v in b.values] for b in cuts.boundaries] == [[stream]] * 3
    plain = stage_cuts(lm4("lm"), 4)
    for s, t in zip(cuts.stages[1:3], plain.stages[1:3]):  # middle stages: one block each
        assert len(s.backward) > len(t.backward)  # the recomputed forward joins the backward
    assert len(cuts.stages[1].backward) == len(cuts.stages[2].backward)


def test_bad_requests_say_what_would_work():
    program = zoo_program("lm")  # two layers
    for bad in (0, -1, 2.0, "2", True):
        with pytest.raises(InputError, match="give an int >= 1"):
            stage_cuts(program, bad)
    with pytest.raises(InputError, match="more than the 2 repeated blocks"):
        stage_cuts(program, 3)
    with pytest.raises(InputError, match="1 block indices"):
        stage_cuts(program, 2, layers=[0, 1])
    with pytest.raises(InputError, match="increase strictly"):
        stage_cuts(program, 2, layers=[2])
    with pytest.raises(InputError, match="increase strictly"):
        stage_cuts(lm4("lm"), 3, layers=[2, 1])
    with pytest.raises(InputError, match="not callable"):
        stage_cuts(program, 2, cost=3)
    with pytest.raises(InputError, match="finite number >= 0"):
        stage_cuts(program, 2, cost=lambda o: -1.0)
    with pytest.raises(InputError, match="sees no repeated blocks in 'train_step'"):
        stage_cuts(zoo_program("cnn"), 2)
