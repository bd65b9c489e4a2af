"""Every model of the third-party matrix runs partitioned and computes what it computes
unpartitioned, under each named strategy and the search, on a {"data": 2, "model": 4} mesh.

One capture per model (real "tiny" arrays, shared with test_external) serves all its
schedules, so the unpartitioned and float64 references are computed once per model.
"""

from __future__ import annotations

import warnings

import pytest

import workbench as wb
from tests.models.programs import program
from workbench.models.external import EXTERNAL

# compiles and runs partitioned programs: in the full suite (CI), not the fast lane
pytestmark = pytest.mark.slow

MESH = wb.Mesh({"data": 2, "model": 4})

#: schedule name -> (tactics, mesh axes some input must be tiled on)
#: (BP and MP alone run inside the compositions: each of their layouts is there)
SCHEDULES = {
    "none": (lambda: [], ()),
    "bp_z3": (lambda: [wb.BP("data"), wb.Z3("data")], ("data",)),
    "bp_mp_sp": (lambda: [wb.BP("data"), wb.MP("model"), wb.SP("model")], ("data", "model")),
    # the search may leave the model axis unused on a tiny model: BP's tiling must remain
    "bp_auto": (lambda: [wb.BP("data"), wb.Auto("model", budget=16)], ("data",)),
}

#: models SP does not apply to: they run BP+MP in its place
NO_SP = {
    "nnx_vit": "an encoder over 17 tokens (the cls token and 16 patches): the workbench sees "
    "no residual stream with a sequence dimension, and 17 does not split 4 ways",
}


def tactics(name: str, schedule: str) -> tuple[list, tuple[str, ...]]:
    if schedule == "bp_mp_sp" and name in NO_SP:
        return [wb.BP("data"), wb.MP("model")], ("data", "model")
    make, axes = SCHEDULES[schedule]
    return make(), axes


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("name", list(EXTERNAL))
def test_runs_partitioned_like_the_unpartitioned_step(name, schedule):
    p = program(name)
    steps, axes = tactics(name, schedule)
    s = wb.Session(p, MESH, steps)
    tiled = {ax for v in p.inputs for ax in MESH.names if s.state.shardings[v].uses(ax)}
    if schedule == "none":
        assert not tiled
    assert set(axes) <= tiled, f"{schedule} tiled no input on {set(axes) - tiled}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = s.run(repeats=1)
    assert result.matches, str(result)


def test_sp_is_left_out_only_where_it_cannot_apply():
    for name in NO_SP:
        with pytest.raises(wb.WorkbenchError, match="no residual stream"):
            wb.Session(program(name), MESH, [wb.BP("data"), wb.MP("model"), wb.SP("model")])
