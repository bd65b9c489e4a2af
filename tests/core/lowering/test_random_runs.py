"""Random tactic sequences on the zoo's models, lowered explicitly and run on 8 virtual
devices, compute what the unpartitioned programs compute: 200 generated cases a run."""

from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import workbench as wb
from workbench.core.strategies.named import BP, MP, Z2, Z3
from workbench.models import build, lm

MESH = wb.Mesh({"batch": 2, "model": 4})
#: Models weighted by how cheap they are to compile, so 200 cases stay within minutes.
MODELS = ["mlp"] * 8 + ["gnn"] * 5 + ["cnn"] * 4 + ["lm"] * 2 + ["lm_scan"]
CONFIGS = {
    "lm": lm.Config.preset("tiny", n_layers=1),
    "lm_scan": lm.Config.preset("tiny", n_layers=2),
}


@cache
def program(name: str) -> wb.Program:
    ex = build(name, CONFIGS.get(name, "tiny"))
    return wb.capture(ex.fn, *ex.args)


@st.composite
def tactic(draw, p):
    kind = draw(st.sampled_from(["tile"] * 6 + ["replicate", "atomic", "named"]))
    axis = draw(st.sampled_from(MESH.names))
    if kind == "named":
        return draw(
            st.sampled_from([BP(axis), Z3(axis), Z2(axis), MP(axis, hidden="params/**/w*")])
        )
    candidates = [
        v
        for v in p.values
        if v.shape and (v.kind == "input" or v.name.startswith(("grads/", "out/")))
    ]
    v = draw(st.sampled_from(candidates))
    if kind == "tile":
        return wb.Tile(v.name, draw(st.integers(0, len(v.shape) - 1)), axis)
    return (wb.Replicate if kind == "replicate" else wb.Atomic)(v.name, axis)


@pytest.mark.slow
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=False
)
@given(st.sampled_from(MODELS), st.data())
def test_random_schedules_run_and_match(name, data):
    s = wb.Session(program(name), MESH)
    for _ in range(data.draw(st.integers(1, 4), label="tactics")):
        t = data.draw(tactic(s.program), label="tactic")
        try:
            s.apply(t)
        except wb.WorkbenchError:
            continue
    result = s.run(repeats=1)
    assert result.matches, f"{s}\n{result}"
