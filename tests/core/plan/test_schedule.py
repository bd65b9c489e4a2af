"""Pipeline schedules and their simulated timelines against the closed forms."""

from __future__ import annotations

import itertools

import pytest

from workbench.core.errors import InputError, LimitError
from workbench.core.estimate.timeline import simulate
from workbench.core.plan.schedule import SCHEDULES, Schedule, Work, schedule

SIZES = [(2, 2), (2, 5), (3, 7), (4, 4), (4, 8), (8, 16), (5, 3)]


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("S", "M"), SIZES)
def test_gpipe_and_1f1b_bubble_share_is_the_closed_form(kind, S, M):
    t = simulate(schedule(kind, S, M), forward=1.0, backward=2.0)
    assert t.bubble_share == pytest.approx((S - 1) / (M + S - 1))
    # every stage idles the same (S-1)(T_F+T_B)
    assert t.idle == pytest.approx([(S - 1) * 3.0] * S)
    assert t.makespan == pytest.approx((M + S - 1) * 3.0)


@pytest.mark.parametrize(("S", "M"), SIZES)
def test_gpipe_holds_every_microbatch_and_1f1b_holds_min_m_s_minus_i(S, M):
    gpipe = simulate(schedule("gpipe", S, M), 1.0, 2.0)
    assert gpipe.peak_in_flight == (M,) * S
    ofob = simulate(schedule("1f1b", S, M), 1.0, 2.0)
    assert ofob.peak_in_flight == tuple(min(M, S - i) for i in range(S))


@pytest.mark.parametrize(("S", "M"), [(2, 4), (4, 8), (4, 12), (8, 16), (3, 9)])
@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_bubble_share_and_peak(S, M, v):
    # per chunk a v-th of a stage's work: T_F = 1/v, T_B = 2/v
    t = simulate(schedule("interleaved", S, M, v), forward=1.0 / v, backward=2.0 / v)
    assert t.bubble_share == pytest.approx((S - 1) / (v * M + S - 1))
    assert t.idle == pytest.approx([(S - 1) * 3.0 / v] * S)
    # Megatron's warmup 2(S-1-i) + (v-1)S chunk forwards, then one more before the first
    # backward: stage i holds vS + S - 1 - 2i chunks, stage 0 S + (S-1)/v microbatches
    # (Korthikanti et al. 2022), all M on a stage whose warmup covers every chunk
    want = [min(v * M, v * S + S - 1 - 2 * i) for i in range(S)]
    assert list(t.peak_chunks) == want
    assert t.peak_in_flight[0] == pytest.approx(min(M, S + (S - 1) / v))


@pytest.mark.parametrize(("S", "v"), [(2, 2), (4, 2), (4, 3), (3, 4)])
def test_interleaved_sends_v_times_on_each_link(S, v):
    M = 2 * S
    plain, inter = schedule("1f1b", S, M).transfers(), schedule("interleaved", S, M, v).transfers()
    for s in range(S - 1):
        assert plain[(s, s + 1, "activation")] == plain[(s + 1, s, "gradient")] == M
        assert inter[(s, s + 1, "activation")] == inter[(s + 1, s, "gradient")] == v * M
    # the wrap from the last stage to the first carries the v-1 chunk boundaries
    assert (S - 1, 0, "activation") not in plain
    assert inter[(S - 1, 0, "activation")] == inter[(0, S - 1, "gradient")] == (v - 1) * M
    assert sum(inter.values()) == 2 * M * (v * S - 1)
    assert sum(plain.values()) == 2 * M * (S - 1)


@pytest.mark.parametrize(("S", "M"), [(2, 4), (4, 4), (4, 8), (8, 16), (3, 10)])
@pytest.mark.parametrize(("tf", "tb", "tw"), [(1, 1, 1), (1, 1.2, 0.8), (2, 1, 1), (1, 2, 1)])
def test_zero_bubble_h1_bubble_and_memory(S, M, tf, tb, tw):
    zb = simulate(schedule("zero-bubble", S, M), tf, tb, tw)
    ofob = simulate(schedule("1f1b", S, M), tf, tb, tw)  # B and W as one backward
    # the closed form of Qi et al. 2023 (M >= S, T_W <= T_B)
    assert zb.idle == pytest.approx([(S - 1) * (tf + tb - tw)] * S)
    assert ofob.idle == pytest.approx([(S - 1) * (tf + tb + tw)] * S)
    if tf == tb == tw:
        assert zb.bubble == pytest.approx(ofob.bubble / 3)
    # held to B, each stage holds what 1F1B holds; held to W (which reads the stored
    # inputs) every stage holds S, 1F1B's peak (its stage 0)
    assert zb.peak_to_b == ofob.peak_chunks == tuple(min(M, S - i) for i in range(S))
    assert zb.peak_chunks == (min(M, S),) * S == (max(ofob.peak_chunks),) * S


def test_zero_bubble_defers_w_by_the_stage_index():
    S, M = 4, 6
    sched = schedule("zero-bubble", S, M)
    for i, row in enumerate(sched.table):
        kinds = [w.kind for w in row]
        assert kinds[: S - i] == ["F"] * (S - i)
        first_w = kinds.index("W")
        assert kinds[:first_w].count("B") == i + 1  # W of microbatch 0 after B of 0..i
    assert [str(w) for w in sched.table[0][:10]] == [
        "F0",
        "F1",
        "F2",
        "F3",
        "B0",
        "W0",
        "F4",
        "B1",
        "W1",
        "F5",
    ]


def test_orders_follow_1f1b_and_megatron_interleaving():
    # 1F1B: stage i runs S-1-i forwards, then F and B in turn
    assert [str(w) for w in schedule("1f1b", 3, 4).table[0]] == (
        ["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"]
    )
    # Megatron-LM's interleaved order, S=2, v=2: stage 0 warms up with 2(S-1) + (v-1)S = 4
    # chunk forwards, microbatches in groups of S per chunk, backwards from the last chunk
    stage0 = schedule("interleaved", 2, 4, 2).table[0]
    assert " ".join(map(str, stage0)) == (
        "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3"
    )


@pytest.mark.parametrize(("S", "M"), [(2, 3), (4, 8), (5, 2)])
def test_p2p_time_lengthens_the_step(S, M):
    p = 0.25
    base = simulate(schedule("gpipe", S, M), 1.0, 2.0)
    slow = simulate(schedule("gpipe", S, M), 1.0, 2.0, p2p=p)
    # the first forward crosses S-1 links, the last backward S-1 back
    assert slow.makespan == pytest.approx(base.makespan + 2 * (S - 1) * p)
    for kind in ("1f1b", "zero-bubble"):
        a = simulate(schedule(kind, S, M), 1.0, 2.0, 0.5).makespan
        b = simulate(schedule(kind, S, M), 1.0, 2.0, 0.5, p2p=p).makespan
        assert b >= a + 2 * (S - 1) * p - 1e-9


@pytest.mark.parametrize(("S", "v"), [(2, 2), (4, 2), (3, 3)])
def test_p2p_crosses_v_times_the_links_interleaved(S, v):
    M, p = 2 * S, 0.1
    base = simulate(schedule("interleaved", S, M, v), 1.0 / v, 2.0 / v)
    slow = simulate(schedule("interleaved", S, M, v), 1.0 / v, 2.0 / v, p2p=p)
    assert slow.makespan >= base.makespan + 2 * (v * S - 1) * p - 1e-9


@pytest.mark.parametrize(("S", "p"), [(4, 0.1), (3, 0.3), (2, 1.0)])
def test_1f1b_steady_state_is_bound_by_the_round_trip(S, p):
    # S microbatches in flight on stage 0; each needs F down and B back across 2(S-1) sends,
    # so each S more microbatches add S(T_F+T_B) + 2(S-1)p
    def span(M):
        return simulate(schedule("1f1b", S, M), 1.0, 2.0, p2p=p).makespan

    assert span(3 * S) - span(2 * S) == pytest.approx(S * 3.0 + 2 * (S - 1) * p)


def test_uneven_stages_and_per_link_times():
    # a slow last stage sets the pace; each stage is busy for what it was given
    t = simulate(schedule("1f1b", 3, 6), forward=[1, 1, 2], backward=[2, 2, 4], p2p=[0.5, 0.0])
    assert t.busy == pytest.approx((18.0, 18.0, 36.0))
    # the slow stage never waits: the fill before it (1 + 1 + 0.5) and the drain after (2 + 2 + 0.5)
    assert t.makespan == pytest.approx(2.5 + 36.0 + 4.5)
    for row in t.slots:
        assert all(a.end <= b.start + 1e-12 for a, b in itertools.pairwise(row))


def test_in_flight_series_matches_the_peak():
    t = simulate(schedule("1f1b", 4, 8), 1.0, 2.0)
    for s in range(4):
        counts = [n for _, n in t.in_flight[s]]
        assert max(counts) == t.peak_chunks[s] and counts[-1] == 0
        times = [x for x, _ in t.in_flight[s]]
        assert times == sorted(times)


def test_a_deadlocking_order_is_reported():
    F, B = (lambda m: Work("F", m)), (lambda m: Work("B", m))
    table = ((F(0), B(0), F(1), B(1)), (F(1), B(1), F(0), B(0)))
    sched = Schedule("custom", 2, 2, 1, False, table)
    with pytest.raises(InputError, match=r"deadlocks: stage 0 at B0 waits for B0 on stage 1"):
        simulate(sched, 1.0, 2.0)


def test_a_user_table_that_runs_is_simulated():
    F, B = (lambda m: Work("F", m)), (lambda m: Work("B", m))
    # GPipe with the backwards in reverse: the same bubble as GPipe
    rows = tuple((F(0), F(1), F(2), B(2), B(1), B(0)) for _ in range(2))
    t = simulate(Schedule("custom", 2, 3, 1, False, rows), 1.0, 2.0)
    assert t.bubble_share == pytest.approx(1 / 4)


@pytest.mark.parametrize(
    ("call", "error", "fragment"),
    [
        (lambda: schedule("pipedream", 4, 8), InputError, "pick one of"),
        (lambda: schedule("1F1B", 4, 8), InputError, "did you mean '1f1b'"),
        (lambda: schedule("1f1b", 0, 8), InputError, "stages must be a whole number >= 1, got 0"),
        (lambda: schedule("gpipe", 4, 2.5), InputError, "microbatches .* got 2.5"),
        (lambda: schedule("interleaved", 4, 6, 2), InputError, "multiple of 4, got 6; use 4 or 8"),
        (lambda: schedule("interleaved", 4, 8), InputError, "virtual_stages >= 2"),
        (lambda: schedule("1f1b", 4, 8, 2), InputError, "use 'interleaved'"),
        (lambda: schedule("gpipe", 1000, 1000, 1), LimitError, "over the 1000000"),
        (lambda: simulate(schedule("1f1b", 2, 2), -1.0, 2.0), InputError, "forward durations"),
        (lambda: simulate(schedule("1f1b", 3, 3), [1, 1], 2.0), InputError, "3 of them"),
        (lambda: simulate(schedule("1f1b", 3, 3), 1.0, 2.0, p2p=[1] * 3), InputError, "2 of them"),
        (lambda: simulate("1f1b", 1.0, 2.0), InputError, "takes a pipeline Schedule"),
        (
            lambda: Schedule("custom", 2, 1, 1, False, ((Work("F", 0), Work("B", 0)),) * 1),
            InputError,
            "table of 1 rows",
        ),
        (
            lambda: Schedule("custom", 1, 2, 1, False, ((Work("F", 0), Work("B", 0)),)),
            InputError,
            "never runs F1, B1",
        ),
        (
            lambda: Schedule("custom", 1, 1, 1, False, ((Work("B", 0), Work("F", 0)),)),
            InputError,
            "runs B0 .* before F0",
        ),
        (
            lambda: Schedule("custom", 1, 1, 1, False, ((Work("F", 0), Work("W", 0)),)),
            InputError,
            "not a work item",
        ),
    ],
)
def test_bad_inputs(call, error, fragment):
    with pytest.raises(error, match=fragment):
        call()


def test_every_named_schedule_runs_on_one_stage():
    for kind in SCHEDULES:
        v = 2 if kind == "interleaved" else 1
        t = simulate(schedule(kind, 1, 3, v), 1.0, 2.0, 1.0)
        assert t.bubble == pytest.approx(0.0)
