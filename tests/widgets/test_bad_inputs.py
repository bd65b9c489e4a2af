"""Bad inputs to the Workbench's constructor: each a typed error before anything is built."""

import pytest

import workbench as wb
from tests.core.bad_inputs.common import expect
from workbench.core.errors import InputError, LimitError, MeshError
from workbench.models import build

EX = build("mlp", "tiny")
MESH = wb.Mesh({"batch": 2, "model": 4})

CASES = {
    "mesh an int": (dict(mesh=7), MeshError, r"a number is not a mesh"),
    "mesh None": (dict(mesh=None), MeshError, r"mesh of None"),
    "hardware an unknown name": (
        dict(hardware="h1000"),
        InputError,
        r"not a hardware preset.*h100",
    ),
    "hardware a dict": (dict(hardware={"flops": 1}), InputError, r"is not hardware"),
    "overlap an unknown word": (dict(overlap="some"), InputError, r"overlap='some'"),
    "overlap 2": (dict(overlap=2), InputError, r"overlap=2 is not a fraction in \[0, 1\]"),
    "auto_budget 0": (dict(auto_budget=0), LimitError, r"budget=0 .*outside 1 to 100,000"),
    "auto_budget a string": (
        dict(auto_budget="40"),
        InputError,
        r"budget='40' is not a whole number",
    ),
    "schedule an int": (dict(schedule=3), InputError, r"schedule"),
}


@pytest.mark.parametrize("kwargs, error, message", list(CASES.values()), ids=list(CASES))
def test_a_bad_workbench_argument_is_a_clear_error(kwargs, error, message):
    expect(lambda: wb.Workbench(EX.fn, *EX.args, **{"mesh": MESH, **kwargs}), error, message)


def test_a_preset_name_is_taken():
    bench = wb.Workbench(EX.fn, *EX.args, mesh=MESH, hardware="tpu v5e")
    assert bench.hardware is wb.hardware.TPU_V5E
