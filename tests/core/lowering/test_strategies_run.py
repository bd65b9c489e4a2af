"""Every zoo model under every named strategy, on a 2x4 mesh of virtual devices: both
lowerings run and compute what the unpartitioned program computes."""

from functools import cache

import pytest

import workbench as wb
from tests.core.lowering.strategies import CASES, strategies
from workbench.models import build

MESH = wb.Mesh({"batch": 2, "model": 4})


@cache
def concrete(model: str) -> wb.Program:
    ex = build(model, "tiny")
    return wb.capture(ex.fn, *ex.args)


@cache
def session(model: str, strategy: str) -> wb.Session:
    return wb.Session(concrete(model), MESH, strategies(model)[strategy])


@pytest.mark.parametrize("model, strategy", CASES)
@pytest.mark.parametrize("lowering", ["explicit", "constrained"])
def test_partitioned_outputs_match(model, strategy, lowering):
    s = session(model, strategy)
    result = s.run(lowering=lowering, repeats=1)
    assert result.matches, str(result)
    assert result.max_rel_error < 1e-4


@pytest.mark.parametrize("model", ["lm", "gnn", "cnn", "mlp"])
def test_strategies_shard_what_they_say(model):
    bp = session(model, "BP")
    assert all(sh.dims[0] == ("batch",) for sh in bp.shardings("batch/**").values())
    z3 = session(model, "Z3")
    params = z3.shardings("params/**")
    assert sum(bool(sh.tiled_axes) for sh in params.values()) >= len(params) // 2
    assert all("batch" in sh.atomic for sh in params.values())


def test_a_run_names_the_outputs_out_of_tolerance():
    from workbench.core.run import _differing, compare, example_inputs, reference_outputs

    program = concrete("mlp")
    reference = reference_outputs(program, example_inputs(program))
    outputs = list(reference)
    k = max(range(len(outputs)), key=lambda i: outputs[i].size)
    outputs[k] = outputs[k] * 1.01  # one output off by 1%
    assert not compare(outputs, reference)[2]
    ((name, rel),) = _differing(program, outputs, reference)
    assert name == program.values[program.outputs[k]].name and rel > 0.009
    assert _differing(program, reference, reference) == ()
