"""The zoo LM with ``remat``: each block recomputed in the backward pass (``jax.checkpoint``).
The step computes what it computes without remat, partitions and runs the same, and the
simulator sees the trade: more flops, far less memory kept for the backward pass."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import workbench as wb
from workbench.core import hardware
from workbench.models import build, lm

# compiles and runs partitioned programs: in the full suite (CI), not the fast lane
pytestmark = pytest.mark.slow

MESH = wb.Mesh({"batch": 2, "model": 4})


@pytest.mark.parametrize("name", ["lm", "lm_scan"])
def test_remat_computes_the_same_step(name):
    plain, remat = build(name, "tiny"), build(name, "tiny", remat=True)
    a, b = jax.jit(plain.fn)(*plain.args), jax.jit(remat.fn)(*remat.args)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


def test_remat_recomputes_the_blocks_forward_ops_in_the_backward_pass():
    def matmuls(program, phase):
        return sum(op.primitive == "dot_general" and op.phase == phase for op in program.ops)

    plain, remat = (
        wb.capture(ex.fn, *ex.args) for ex in (build("lm", "tiny"), build("lm", "tiny", remat=True))
    )
    assert matmuls(remat, "forward") == matmuls(plain, "forward")
    # each block's forward matmuls run again before its backward ones, but for those whose
    # results the backward pass does not read (dead code, which capture drops)
    blocks = matmuls(plain, "forward") - 1  # less the unembedding, outside the blocks
    again = matmuls(remat, "backward") - matmuls(plain, "backward")
    n_layers = lm.Config().n_layers
    assert 0 < again < blocks and again % n_layers == 0, (again, blocks)


def test_a_partitioned_remat_step_runs_and_matches():
    ex = build("lm", "tiny", remat=True)
    s = wb.Session(wb.capture(ex.fn, *ex.args), MESH)
    for tactic in (wb.BP("batch"), wb.MP("model"), wb.Z3("batch")):
        s.apply(tactic)
    result = s.run(repeats=1)
    assert result.matches, str(result)


@pytest.mark.parametrize("name", ["lm", "lm_scan"])
def test_the_estimate_trades_flops_for_memory(name):
    config = lm.Config.preset("large", n_layers=8, batch=64)
    estimates = {}
    for remat in (False, True):
        ex = build(name, config, abstract=True, remat=remat)
        s = wb.Session(wb.capture(ex.fn, *ex.args), wb.Mesh({"data": 8, "model": 4}))
        for tactic in (wb.BP("data"), wb.MP("model"), wb.Z3("data")):
            s.apply(tactic)
        estimates[remat] = s.estimate(hardware.H100)
    plain, remat = estimates[False], estimates[True]
    assert 1.1 < remat.flops / plain.flops < 1.4  # about one more forward pass of the blocks
    assert remat.memory.peak < 0.5 * plain.memory.peak
