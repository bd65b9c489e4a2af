"""Reduction synthesis: the grammar's programs, the cheapest one found by search equal to a
brute-force minimum over every program, and how the estimate prices reductions with it."""

import random

import pytest

import workbench as wb
from workbench.core.hardware import H100, Link, collective_time
from workbench.core.hardware.collectives import synthesised
from workbench.core.hardware.formulas import all_reduce_time, reduce_scatter_time
from workbench.core.hardware.synthesis import Program, Step, best, price, programs


def levels_of(*specs):
    return tuple((Link(f"l{j}", bw, lat), n) for j, (bw, lat, n) in enumerate(specs))


def test_the_grammar_has_the_textbook_programs():
    found = {p.steps for p in programs("all-reduce", 2)}
    hierarchical = (
        Step("reduce-scatter", (0,)),
        Step("all-reduce", (1,)),
        Step("all-gather", (0,)),
    )
    assert hierarchical in found
    assert (Step("all-reduce", (0, 1)),) in found  # the default: one flat ring
    assert (Step("all-reduce", (0,)), Step("all-reduce", (1,))) in found
    # every program reduces every level once and ends with nothing scattered
    for p in programs("all-reduce", 3):
        reduced = [j for s in p.steps if s.kind != "all-gather" for j in s.levels]
        assert sorted(reduced) == [0, 1, 2]
    # a reduce-scatter is each ordering and grouping of the levels' scatters
    assert {p.steps for p in programs("reduce-scatter", 2)} == {
        (Step("reduce-scatter", (0, 1)),),
        (Step("reduce-scatter", (0,)), Step("reduce-scatter", (1,))),
        (Step("reduce-scatter", (1,)), Step("reduce-scatter", (0,))),
    }


def test_an_all_gather_gathers_each_level_once_the_last_major():
    by_steps = {p.steps: p.permuted for p in programs("all-gather", 2)}
    outer_first = (Step("all-gather", (1,)), Step("all-gather", (0,)))
    inner_first = (Step("all-gather", (0,)), Step("all-gather", (1,)))
    assert set(by_steps) == {outer_first, inner_first, (Step("all-gather", (0, 1)),)}
    # the axis's outer level must end up major, so it is gathered last
    assert by_steps[inner_first] is False and by_steps[outer_first] is True
    # the cheap order (the slow level on the small pieces) pays the permutation, last
    levels = levels_of((450e9, 1e-6, 8), (50e9, 5e-6, 4))
    s = best("all-gather", 1e8, levels, copy_s=1e-5, order=((1, 0),))
    assert s.program.steps == outer_first and s.program.permuted
    assert s.program.describe(["nv", "ib"]) == "AG ib, AG nv, permute blocks"
    assert s.step_s[-1] == 1e-5 and sum(s.step_s) == pytest.approx(s.seconds)
    assert len(programs("all-gather", 3)) == 13


def test_a_scatter_out_of_the_results_order_is_permuted():
    by_steps = {p.steps: p.permuted for p in programs("reduce-scatter", 2)}
    # one axis over two levels: its index has the inner level fastest, so the outer
    # level's scatter must come first for the blocks to land in place
    assert by_steps[(Step("reduce-scatter", (1,)), Step("reduce-scatter", (0,)))] is False
    assert by_steps[(Step("reduce-scatter", (0,)), Step("reduce-scatter", (1,)))] is True
    assert by_steps[(Step("reduce-scatter", (0, 1)),)] is False


@pytest.mark.parametrize("seed", range(40))
def test_search_finds_the_brute_force_minimum(seed):
    rng = random.Random(seed)
    k = rng.choice([2, 2, 3])
    kind = rng.choice(["all-reduce", "reduce-scatter", "all-gather"])
    specs = [
        (
            rng.choice([10e9, 50e9, 100e9, 450e9]),
            rng.choice([0.0, 1e-6, 5e-6, 2e-5]),
            rng.choice([2, 3, 4, 8]),
        )
        for _ in range(k)
    ]
    levels = levels_of(*specs)
    nbytes = rng.choice([1e2, 1e4, 1e6, 1e8, 1e10])
    copy = rng.choice([0.0, 1e-5, 1e-3])
    order = (tuple(reversed(range(k))),)
    found = best(kind, nbytes, levels, copy, order)
    every = programs(kind, k, order)
    cheapest = min(price(p, levels, nbytes, copy) for p in every)
    assert found.seconds == pytest.approx(cheapest, rel=1e-9)
    assert found.program in every
    assert price(found.program, levels, nbytes, copy) == pytest.approx(found.seconds)
    assert found.seconds <= found.default_s * (1 + 1e-12)
    # each part's time, in the order describe lists them, adds up to the program's
    assert len(found.step_s) == len(found.program.describe(["a", "b", "c"]).split(", "))
    assert sum(found.step_s) == pytest.approx(found.seconds)


def test_two_levels_run_the_hierarchical_algorithm_and_say_why():
    fast, slow = (450e9, 1e-6, 8), (50e9, 5e-6, 4)
    levels = levels_of(fast, slow)
    nbytes = 1e9
    s = best("all-reduce", nbytes, levels)
    expected = all_reduce_time(nbytes, 8, 450e9, 1e-6) + all_reduce_time(nbytes / 8, 4, 50e9, 5e-6)
    assert s.seconds == pytest.approx(expected)
    assert s.default_s == pytest.approx(all_reduce_time(nbytes, 32, 50e9, 5e-6))
    assert s.speedup > 3
    text = str(s)
    assert "RS l0, AR l1, AG l0" in text and "x the default's" in text


def test_the_default_is_kept_where_nothing_beats_it():
    # one link, no latency: splitting the ring saves nothing (with latency it would: two
    # rings of 4 and 2 take 3 + 1 steps, one of 8 takes 7)
    same = levels_of((50e9, 0.0, 4), (50e9, 0.0, 2))
    s = best("reduce-scatter", 1e6, same, copy_s=1.0, order=((1, 0),))
    assert s.program.steps == (Step("reduce-scatter", (0, 1)),)
    assert s.speedup == 1.0
    assert "one collective" in str(s)
    assert s.seconds == pytest.approx(reduce_scatter_time(1e6, 8, 50e9, 0.0))


def test_an_expensive_permutation_turns_the_scatters_around():
    levels = levels_of((450e9, 1e-6, 8), (50e9, 5e-6, 4))
    cheap = best("reduce-scatter", 1e8, levels, copy_s=0.0, order=((1, 0),))
    assert cheap.program == Program(
        "reduce-scatter",
        (Step("reduce-scatter", (0,)), Step("reduce-scatter", (1,))),
        permuted=True,
    )
    dear = best("reduce-scatter", 1e8, levels, copy_s=1.0, order=((1, 0),))
    assert not dear.program.permuted


def test_the_estimate_prices_reductions_across_levels_by_synthesis():
    mesh = wb.Mesh({"data": 64, "model": 4})
    for axes in (("data",), ("data", "model")):
        for kind in ("all-reduce", "reduce-scatter", "all-gather"):
            s = synthesised(kind, 1e8, axes, mesh, H100)
            assert collective_time(kind, 1e8, axes, mesh, H100) == s.seconds
            flat = collective_time(kind, 1e8, axes, mesh, H100, hierarchical=False)
            assert s.default_s == pytest.approx(flat)
            assert s.seconds < flat
    # a group on one level is one collective, as before
    inside = collective_time("all-reduce", 1e8, ("model",), mesh, H100)
    nvlink = H100.links[0]
    assert inside == pytest.approx(all_reduce_time(1e8, 4, *nvlink.figures_for("all-reduce")))


def test_synthesised_refuses_what_it_does_not_synthesise():
    with pytest.raises(wb.core.hardware.HardwareError, match="only"):
        synthesised("all-to-all", 1e6, ("data",), wb.Mesh({"data": 16}), H100)
