"""The verdict catches real faults: each fault of ``faults`` injected into a partitioned run
of a zoo model (whose inputs differ per shard) is reported as DIFFER, with the output it hit."""

from __future__ import annotations

from functools import cache

import pytest

import workbench as wb
from tests.core.lowering import faults
from tests.core.lowering.strategies import MP_FOR
from workbench.core.lowering import run as running
from workbench.models import build

# compiles and runs partitioned programs: in the full suite (CI), not the fast lane
pytestmark = pytest.mark.slow

MESH = wb.Mesh({"data": 2, "model": 4})


@cache
def program(model: str) -> wb.Program:
    ex = build(model, "tiny")
    return wb.capture(ex.fn, *ex.args)


def schedule(model: str, fault: str) -> list:
    if fault == "one_axis_unreduced":  # the batch over both axes: gradients summed over two
        return [wb.BP("data"), wb.BP("model")]
    if fault == "shards_out_of_order":  # parameters gathered from their shards
        return [wb.BP("data"), wb.Z3("data")]
    mp = MP_FOR[model]
    return [wb.BP("data"), wb.MP("model", hidden=mp.hidden) if mp.hidden else wb.MP("model")]


FAULTS = [
    "dropped_all_reduce",
    "doubled_all_reduce",
    "shards_out_of_order",
    "one_axis_unreduced",
    "stale_parameter",
    "one_shard_gradient_off",
]


def inject(name: str, monkeypatch, p):
    make = getattr(faults, name)
    if name == "stale_parameter":
        return make(monkeypatch, p)
    if name == "one_shard_gradient_off":
        return make(monkeypatch, p, MESH)
    return make(monkeypatch)


@pytest.mark.parametrize("model", ["mlp", "lm"])
def test_the_correct_plans_agree(model):
    p = program(model)
    for fault in ("dropped_all_reduce", "one_axis_unreduced"):
        result = wb.Session(p, MESH, schedule(model, fault)).run(repeats=1)
        assert result.matches, str(result)


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("model", ["mlp", "lm"])
def test_every_fault_is_caught(model, fault, monkeypatch):
    p = program(model)
    s = wb.Session(p, MESH, schedule(model, fault))
    injected = inject(fault, monkeypatch, p)
    # where the runs part is located in test_verdict (a dropped all-reduce); here the verdict
    monkeypatch.setattr(running, "first_difference", lambda *a, **k: None)
    result = s.run(repeats=1)
    assert injected.struck, f"{injected.name} found nothing to strike"
    assert not result.matches, f"{injected.name} ({injected.size}) passed: {result}"
    text = str(result)
    assert "DIFFER" in text
    differing = {c.name for c in result.differing}
    if injected.outputs:  # the output the fault hit is named among those that differ
        hit = {p.output_names[j] for j in injected.outputs}
        assert hit & differing, (hit, differing)
        assert any(name in text for name in hit & differing)
