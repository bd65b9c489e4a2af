"""One fault per run on each model of the third-party matrix (tests/core/lowering/faults.py;
the zoo gets every fault): each is reported as DIFFER, naming the output it hit where the
fault has one. The models' programs and references are shared with test_matrix_runs."""

from __future__ import annotations

import functools
import warnings

import jax
import pytest

import workbench as wb
from tests.core.lowering.test_faults import FAULTS, inject
from tests.models.programs import program, tiny
from workbench.core.lowering import run as running
from workbench.models.external import EXTERNAL

# compiles and runs partitioned programs: in the full suite (CI), not the fast lane
pytestmark = pytest.mark.slow

MESH = wb.Mesh({"data": 2, "model": 4})

CASES = [(name, FAULTS[i % len(FAULTS)]) for i, name in enumerate(EXTERNAL)]


def schedule(fault: str) -> list:
    if fault == "one_axis_unreduced":  # the batch over both axes: gradients summed over two
        return [wb.BP("data"), wb.BP("model")]
    if fault == "shards_out_of_order":  # parameters gathered from their shards
        return [wb.BP("data"), wb.Z3("data")]
    return [wb.BP("data"), wb.MP("model")]


@functools.cache
def stepped(name: str, steps: int = 3):
    """The example's arguments after a few steps."""
    ex = tiny(name)
    step, args = jax.jit(ex.fn), ex.args
    for _ in range(steps):
        params, opt_state, *_ = step(*args)
        args = (params, opt_state, *args[2:])
    return args


@pytest.mark.parametrize("name, fault", CASES)
def test_a_fault_in_a_third_party_model_is_caught(name, fault, monkeypatch):
    p = program(name)
    s = wb.Session(p, MESH, schedule(fault))
    injected = inject(fault, monkeypatch, p)
    # where the runs part is located on the zoo (test_faults); here only the verdict counts
    monkeypatch.setattr(running, "first_difference", lambda *a, **k: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # a few steps in: a warmup schedule's first step moves no parameter
        args = stepped(name) if fault == "stale_parameter" else None
        result = s.run(repeats=1, args=args)
    assert injected.struck, f"{injected.name} found nothing to strike in {name}"
    assert not result.matches, f"{injected.name} ({injected.size}) passed on {name}: {result}"
    if injected.outputs:
        hit = {p.output_names[j] for j in injected.outputs}
        assert hit & {c.name for c in result.differing}, (hit, str(result))
