"""Every zoo model under every named strategy, on a 2x4 mesh of virtual devices: both
lowerings run and compute what the unpartitioned program computes."""

from functools import cache

import pytest

import workbench as wb
from tests.core.lowering.strategies import CASES, strategies
from workbench.models import build

# compiles and runs partitioned programs: in the full suite (CI), not the fast lane
pytestmark = pytest.mark.slow

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
    data = bp.program.anatomy().data  # each data input on its batch dim (a GNN's edge lists
    assert data and all(  # carry none: they stay whole)
        bp.state.shardings[v].dims[d] == ("batch",) for v, d in data if d is not None
    )
    z3 = session(model, "Z3")
    params = z3.shardings("params/**")
    assert sum(bool(sh.tiled_axes) for sh in params.values()) >= len(params) // 2
    assert all("batch" in sh.atomic for sh in params.values())


def test_a_run_names_the_outputs_out_of_tolerance():
    from workbench.core.lowering.run import example_inputs, references, tolerance_dtypes
    from workbench.core.lowering.verdict import judge

    program = concrete("mlp")
    flat = example_inputs(program)
    n = len(program.outputs)
    unpart, ref, scales = references(program, flat)
    outputs = list(unpart)
    k = max(range(n), key=lambda i: outputs[i].size)
    outputs[k] = outputs[k] * 1.01  # one output off by 1%
    verdict = judge(program, outputs, unpart, ref, scales, tolerance_dtypes(program))
    (bad,) = verdict.differing
    assert bad.name == program.output_names[k] and not verdict.agree
    assert bad.bad > 0 and program.output_names[k] in str(verdict)
    assert judge(program, unpart, unpart, ref, scales, tolerance_dtypes(program)).agree


@pytest.mark.parametrize("lowering", ["explicit", "constrained", "propagated"])
def test_runs_step_as_a_training_loop(lowering):
    """Parameters and optimizer state are donated (as the simulator assumes), each step
    reads the outputs of the one before, and the caller's arrays are never consumed."""
    import jax

    ex = build("lm", "tiny")
    s = wb.Session(wb.capture(ex.fn, *ex.args), MESH, strategies("lm")["BP+MP+Z3"])
    result = s.run(lowering=lowering, args=ex.args, repeats=2)
    assert result.matches, str(result)
    assert any(n.startswith("params/") for n in result.donated)
    assert any(n.startswith("opt") for n in result.donated)
    assert result.memory["alias_size_in_bytes"] > 0 and "as a training loop" in str(result)
    assert not any(a.is_deleted() for a in jax.tree.leaves(ex.args))
    assert all(not o.is_deleted() for o in jax.tree.leaves(result.outputs))
    kept = s.run(lowering=lowering, args=ex.args, repeats=1, training_loop=False)
    assert kept.donated == () and kept.memory["alias_size_in_bytes"] == 0
    assert kept.matches and "inputs kept" in str(kept)


def test_a_training_step_feeds_its_outputs_to_the_next():
    from workbench.core.lowering.run import TrainingStep, example_inputs

    program = concrete("mlp")
    s = wb.Session(program, MESH, strategies("mlp")["BP+MP+Z3"])
    step = TrainingStep(s, example_inputs(program))
    assert step.donated and len(step.feed) == len(step.donated)
    first = step(keep=True)
    second = step()
    for j, i in step.feed:
        assert not first[j].is_deleted()  # kept: the second step read copies
        assert step.inputs[i] is second[j]  # the third step reads the second's outputs
    step()
    assert all(second[j].is_deleted() for j, _ in step.feed)  # donated to the third
