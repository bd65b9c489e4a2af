"""The interleaved schedule priced: v model chunks per stage (Megatron-LM's order), each a
virtual stage of the cuts, in a session's estimate and its collective plan, and one device's
`price_pipeline`."""

from __future__ import annotations

import pytest

import workbench as wb
from tests.models import programs as external
from workbench.core.errors import InputError, TacticError
from workbench.core.estimate.pipelined import price_pipeline
from workbench.core.estimate.timeline import simulate
from workbench.core.plan.schedule import schedule
from workbench.core.strategies.pipeline import pipeline_of
from workbench.models import build, lm

MESH = wb.Mesh({"stage": 4, "data": 2})
S, M, V = 4, 8, 2


@pytest.fixture(scope="module")
def program():
    ex = build("lm", lm.Config.preset("tiny", n_layers=8))
    return wb.capture(ex.fn, *ex.args)


def session(program, kind="interleaved", v=V):
    return wb.Session(
        program, MESH, [wb.PP("stage", microbatches=M, schedule=kind, virtual_stages=v)]
    )


@pytest.fixture(scope="module")
def priced(program):
    """The interleaved and the 1F1B estimates (sends hidden), and their pipelines."""
    out = {}
    for kind, v in (("interleaved", V), ("1f1b", 1)):
        s = session(program, kind, v)
        out[kind] = (s, s.estimate("h100", overlap="full"), pipeline_of(program, MESH, s.state))
    return out


def test_chunk_c_of_stage_s_is_virtual_stage_c_times_s_plus_s(priced):
    _, e, pipe = priced["interleaved"]
    assert len(pipe.cuts.stages) == S * V and pipe.virtual_stages == V
    assert [[c.blocks for c in pipe.chunks(s)] for s in range(S)] == [
        [(s,), (S + s,)] for s in range(S)
    ]
    assert "blocks 0+4 | 1+5 | 2+6 | 3+7" in str(pipe) and "2 chunks per stage" in str(pipe)
    pe = e.pipeline
    assert len(pe.forward) == len(pe.peak) == len(pe.state) == S  # per physical stage
    assert len(pe.p2p) == len(pe.links) == S  # the wrap link S-1 -> 0 among them
    assert [len(row) for row in pe.chunks] == [V] * S
    for s in range(S):  # a stage's passes are its chunks' added up
        assert pe.forward[s] == pytest.approx(sum(f for f, *_ in pe.chunks[s]))
        assert pe.backward[s] == pytest.approx(sum(b for _, b, *_ in pe.chunks[s]))
        assert pe.activations[s] == sum(a for *_, a in pe.chunks[s])
    assert e.step_s == pytest.approx(pe.timeline.makespan + max(pe.optimizer))
    assert "S=4 M=8 v=2" in str(pe)


def test_the_bubble_is_the_timeline_of_the_chunk_prices_and_under_1f1b(priced):
    """The timeline is the simulator's on the priced per-chunk times; with every chunk at
    their mean it is the closed form (S-1)/(vM+S-1), and interleaving halves 1F1B's."""
    pe = priced["interleaved"][1].pipeline
    one = priced["1f1b"][1].pipeline
    fwd = [[f for f, *_ in row] for row in pe.chunks]
    bwd = [[b for _, b, *_ in row] for row in pe.chunks]
    again = simulate(pe.schedule, fwd, bwd, 0.0, 0.0)
    assert again.makespan == pe.timeline.makespan and again.busy == pe.timeline.busy
    assert pe.bubble_share == again.bubble_share
    f, b = (sum(map(sum, t)) / (S * V) for t in (fwd, bwd))
    even = simulate(pe.schedule, f, b, 0.0, 0.0)
    assert even.bubble_share == pytest.approx((S - 1) / (V * M + S - 1), rel=1e-9)
    flat = simulate(schedule("1f1b", S, M), f * V, b * V, 0.0, 0.0)
    assert flat.bubble_share == pytest.approx((S - 1) / (M + S - 1), rel=1e-9)
    assert pe.bubble_share < one.bubble_share
    assert pe.bubble_s < one.bubble_s and pe.step_s < one.step_s


def test_each_link_carries_v_times_the_sends_of_1f1b(priced):
    def per_link(kind):
        s, e, pipe = priced[kind]
        link = {x: b.after % S for b in pipe.cuts.boundaries for x in b.values}
        sends = [c for c in s.collectives() if c.kind == "collective-permute"]
        counts, nbytes = [0] * S, [0] * S
        for c in sends:
            counts[link[c.value]] += c.count
            nbytes[link[c.value]] += c.bytes * c.count
        return counts, nbytes, e.pipeline

    counts, nbytes, pe = per_link("interleaved")
    one_counts, one_bytes, one = per_link("1f1b")
    for k in range(S - 1):  # s -> s+1: one boundary per chunk
        assert counts[k] == V * one_counts[k] == V * 2 * M  # each way, every microbatch
        assert nbytes[k] == V * one_bytes[k] > 0
        assert pe.link_sends[k] == pytest.approx(V * one.link_sends[k])
    assert counts[S - 1] == (V - 1) * 2 * M and one_counts[S - 1] == 0  # the wrap S-1 -> 0
    transfers = pe.schedule.transfers()
    assert counts[0] == transfers[0, 1, "activation"] + transfers[1, 0, "gradient"]
    assert sum(counts) == 2 * M * (S * V - 1)
    assert any(
        "stage 3 (chunk 0) sends each microbatch's" in c.why
        for c in priced["interleaved"][0].collectives()
    )


def test_a_stage_holds_its_chunks_state_and_its_chunk_microbatches_in_flight(program, priced):
    _, e, pipe = priced["interleaved"]
    pe, a = e.pipeline, program.anatomy()
    owned = {x for q in a.parameters for x in a.state.get(q, ())}
    counter = sum(program.values[x].nbytes for x in a.optimizer_state if x not in owned)
    assert counter > 0  # Adam's step count: once per stage, not once per chunk
    for s in range(S):
        chunks = [c.parameters for c in pipe.chunks(s)]
        assert not set(chunks[0]) & set(chunks[1])  # no parameter on two chunks of a stage
        held = [q for c in chunks for q in c]
        nbytes = sum(program.values[q].nbytes for q in held)  # nothing tiled: whole
        moments = sum(program.values[x].nbytes for q in held for x in a.state.get(q, ()))
        assert pe.state[s]["parameters"] == nbytes > 0
        assert pe.state[s]["optimizer"] == moments + counter  # the step counter once
        largest = max(act for *_, act in pe.chunks[s])
        peak = sum(pe.state[s].values()) + round(pe.timeline.peak_chunks[s] * largest)
        assert pe.peak[s] == peak
    assert e.memory.peak == max(pe.peak)
    one = priced["1f1b"][1].pipeline  # the same blocks per stage, so the same state
    assert [sum(st.values()) for st in pe.state] == [sum(st.values()) for st in one.state]
    # Megatron's warmup holds more chunk-microbatches: (v-1)S + 2(S-1-s) + 1 on stage s
    assert list(pe.timeline.peak_chunks) == [(V - 1) * S + 2 * (S - 1 - s) + 1 for s in range(S)]


def test_one_device_prices_interleaved_chunks(program):
    """Interleaving halves the bubble where sends hide; where they do not and outweigh a
    chunk's work (a tiny model), its v times as many sends make the step longer."""
    e, u = (
        {
            overlap: price_pipeline(
                program, S, M, "h100", schedule=kind, virtual_stages=v, overlap=overlap
            )
            for overlap in ("full", "none")
        }
        for kind, v in (("interleaved", V), ("1f1b", 1))
    )
    full = e["full"]
    assert len(full.cuts.stages) == S * V and len(full.forward) == S
    assert sum(full.flops) == pytest.approx(sum(u["full"].flops))
    assert sum(full.kernels) == sum(u["full"].kernels)
    assert full.bubble_share < u["full"].bubble_share
    assert min(full.p2p) > max(f + b for row in full.chunks for f, b, *_ in row)
    assert e["none"].step_s > u["none"].step_s


def test_too_few_blocks_or_microbatches_say_what_would_work(program):
    with pytest.raises(
        TacticError,
        match=r"4 stages x 3 model chunks need 12 repeated blocks .*has 8; give virtual_stages <= 2",
    ):
        session(program, v=3)
    with pytest.raises(TacticError, match=r"must be a multiple of 4, got 2; use 4 microbatches"):
        wb.Session(
            program,
            MESH,
            [wb.PP("stage", microbatches=2, schedule="interleaved", virtual_stages=2)],
        )
    with pytest.raises(TacticError, match=r"'1f1b' schedule runs one model chunk per stage"):
        session(program, "1f1b", 2)
    s = wb.Session(program, MESH, [wb.PP("stage", schedule="interleaved", virtual_stages=2)])
    assert pipeline_of(program, MESH, s.state).microbatches % S == 0  # default: a multiple of S
    with pytest.raises(InputError, match=r"need 16 repeated blocks"):
        price_pipeline(program, S, M, "h100", schedule="interleaved", virtual_stages=4)


def test_a_third_party_model_of_two_blocks_says_what_would_work():
    p = external.program("eqx_lm")
    mesh = wb.Mesh({"stage": 2, "data": 4})
    with pytest.raises(TacticError, match=r"2 stages x 2 model chunks need 4 repeated blocks"):
        wb.Session(
            p, mesh, [wb.PP("stage", microbatches=2, schedule="interleaved", virtual_stages=2)]
        )
    e = price_pipeline(p, 1, 2, "h100", schedule="interleaved", virtual_stages=2)
    assert [len(row) for row in e.chunks] == [2] and all(f > 0 for f, *_ in e.chunks[0])
