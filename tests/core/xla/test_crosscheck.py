"""The explicit lowering compiles to exactly the collectives of our plan: every zoo model and
strategy, kind and bytes, read back from XLA's compiled HLO."""

from functools import cache

import pytest

import workbench as wb
from tests.core.lowering.strategies import CASES, strategies
from tests.core.zoo import program
from workbench.core.xla.crosscheck import crosscheck

# compiles every zoo model under every strategy: in the full suite (CI), not the fast lane
pytestmark = pytest.mark.slow

MESH = wb.Mesh({"batch": 2, "model": 4})


@cache
def session(model, strategy):
    return wb.Session(program(model), MESH, strategies(model)[strategy])


@pytest.mark.parametrize("model, strategy", CASES)
def test_explicit_lowering_compiles_to_the_plan(model, strategy):
    check = crosscheck(session(model, strategy))
    assert check.identical, str(check)
    assert sum(check.ours.values()) > 0  # every strategy here moves something


def test_the_constrained_lowering_is_read_back_too():
    check = crosscheck(session("lm", "BP+MP"), lowering="constrained")
    assert check.xla["all-reduce"] > 0  # XLA placed the Megatron and gradient reductions itself
