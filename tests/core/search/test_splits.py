"""Where BP cannot split the batch over an axis (it does not divide it, or a pipeline's
microbatches need whole examples on each device), Auto tries BP on another dim the data
inputs share (the sequence); its composition grows on whichever free axis helps most."""

from functools import cache

import pytest

import workbench as wb
from tests.core.zoo import program as zoo_program
from workbench.core import hardware as hw
from workbench.core.search.candidates import other_splits
from workbench.core.search.tree import Auto
from workbench.core.strategies.pipeline import PP
from workbench.models import build, lm


@cache
def lm_of(batch: int, n_layers: int = 2, seq_len: int = 16) -> wb.Program:
    config = lm.Config(batch=batch, n_layers=n_layers, seq_len=seq_len)
    ex = build("lm", config, abstract=True)
    return wb.capture(ex.fn, *ex.args)


def step(program, mesh, schedule) -> float:
    return wb.Session(program, mesh, schedule).estimate(hw.H100).step_s


def test_other_splits_are_the_data_inputs_shared_dims_the_axis_divides():
    p = lm_of(4)  # tokens and targets: [batch 4, sequence 16]
    assert other_splits(
        p, wb.Mesh({"data": 4}), wb.Session(p, wb.Mesh({"data": 4})).state, "data"
    ) == [wb.BP("data", dim=1)]
    odd = wb.Mesh({"data": 3})  # 3 divides neither the batch nor the sequence
    assert other_splits(p, odd, wb.Session(p, odd).state, "data") == []


def test_a_pipeline_that_keeps_whole_examples_gets_the_sequence_split_instead():
    p, mesh = lm_of(4), wb.Mesh({"stage": 2, "data": 4})  # 4 examples: 4 microbatches or 4-way BP
    pp, auto = PP("stage", microbatches=4), Auto("data", budget=1)
    s = wb.Session(p, mesh, [pp, auto])
    priced = {c.tactics: c for c in auto.report(p, mesh, s.state_at(1)).candidates}
    on_batch, on_sequence = priced[(wb.BP("data"),)], priced[(wb.BP("data", dim=1),)]
    assert not on_batch.applies and "microbatches" in on_batch.error
    assert on_sequence.applies
    assert on_sequence.step_s == pytest.approx(step(p, mesh, [pp, wb.BP("data", dim=1)]), rel=1e-9)
    assert s.estimate(hw.H100).step_s <= on_sequence.step_s * (1 + 1e-9)
    assert s.state.pipeline == pp


def test_where_the_batch_does_not_divide_the_axis_bp_splits_the_sequence():
    p, mesh = lm_of(2), wb.Mesh({"data": 4})
    auto = Auto("data", budget=1)
    s = wb.Session(p, mesh, [auto])
    priced = {c.tactics: c for c in auto.report(p, mesh, s.state_at(0)).candidates}
    assert not priced[(wb.BP("data"),)].applies
    assert priced[(wb.BP("data", dim=1),)].applies
    assert s.estimate(hw.H100).step_s <= step(p, mesh, [wb.BP("data", dim=1)]) * (1 + 1e-9)


def test_a_batch_that_splits_gets_no_sequence_split():
    p, mesh = lm_of(8), wb.Mesh({"data": 4})
    auto = Auto("data", budget=1)
    s = wb.Session(p, mesh, [auto])
    names = [c.tactics for c in auto.report(p, mesh, s.state_at(0)).candidates]
    assert (wb.BP("data"),) in names and (wb.BP("data", dim=1),) not in names


def test_the_composition_grows_on_each_free_axis_not_only_the_next_one():
    p, mesh = zoo_program("mlp"), wb.Mesh({"stage": 2, "data": 2, "model": 2})
    auto = Auto(("stage", "data", "model"), budget=1)
    report = auto.report(p, mesh, wb.Session(p, mesh).state)
    pairs = [c for c in report.candidates if c.name.count(" + ") == 1]
    (first,) = {c.tactics[0] for c in pairs}  # every pair grows from the best single move
    assert {c.tactics[1].axis for c in pairs} == set(auto.axes) - {first.axis}


@pytest.mark.slow  # about 30 s: some seventy candidates on a 70B-wide step of 8 layers
def test_auto_finds_the_pipeline_with_the_sequence_split_at_scale():
    config = lm.Config.preset("huge", n_layers=8, batch=64, remat=True)
    ex = build("lm", config, abstract=True)
    p = wb.capture(ex.fn, *ex.args)
    mesh = wb.Mesh({"stage": 8, "data": 64, "model": 4})  # 64 examples: 64-way BP leaves one
    auto = Auto(("stage", "data", "model"), memory_limit=hw.H100.memory_bytes, budget=1)
    s = wb.Session(p, mesh, [auto])
    expert = [PP("stage", microbatches=32), wb.BP("data", dim=1), wb.MP("model")]
    assert s.estimate(hw.H100).step_s <= step(p, mesh, expert) * (1 + 1e-9)
    tactics = auto.report(p, mesh, s.state_at(0)).tactics
    # the sequence split: BP on it, or CP (which also keeps attention's keys whole)
    split = {wb.BP("data", dim=1), wb.CP("data")}
    assert s.state.pipeline is not None and split & set(tactics) and not s.conflicts
