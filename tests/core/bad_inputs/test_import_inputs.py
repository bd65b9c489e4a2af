"""Bad inputs to capture and to Session.from_jax: each a typed error that says what was
given and what would work."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import workbench as wb
from tests.core.bad_inputs.common import expect
from workbench.core.errors import CaptureError, InputError, MeshError


def step(w, x):
    return jnp.tanh(x @ w).sum()


W, X = jnp.ones((16, 16)), jnp.ones((8, 16))
MESH = wb.Mesh({"batch": 2, "model": 4})
RULES = [("batch", "batch"), ("mlp", "model")]

CASES = {
    "capture a number": (lambda: wb.capture(3, W, X), CaptureError, r"needs a function; got int 3"),
    "capture too few arguments": (lambda: wb.capture(step, W), CaptureError, r"could not trace step.*missing"),
    "capture a string argument": (lambda: wb.capture(step, W, "x"), CaptureError, r"could not trace"),
    "from_jax a number": (lambda: wb.Session.from_jax(5, W, X, mesh=MESH), CaptureError, r"needs a function"),
    "from_jax mesh None": (lambda: wb.Session.from_jax(step, W, X, mesh=None), MeshError, r"mesh of None"),
    "from_jax mesh an int": (lambda: wb.Session.from_jax(step, W, X, mesh=8), MeshError, r"a number is not a mesh"),
    "in_shardings one for two": (
        lambda: wb.Session.from_jax(step, W, X, mesh=MESH, in_shardings=(P(),)),
        InputError, r"has 1 entries but the step takes 2 arguments",
    ),
    "in_shardings a string": (
        lambda: wb.Session.from_jax(step, W, X, mesh=MESH, in_shardings="batch"),
        InputError, r"in_shardings='batch' is not a sharding.*P\('batch'\)",
    ),
    "in_shardings an int": (
        lambda: wb.Session.from_jax(step, W, X, mesh=MESH, in_shardings=3),
        InputError, r"in_shardings=3 is not a sharding",
    ),
    "out_shardings a string": (
        lambda: wb.Session.from_jax(step, W, X, mesh=MESH, out_shardings="x"),
        InputError, r"out_shardings='x' is not a sharding",
    ),
    "a spec naming another axis": (
        lambda: wb.Session.from_jax(step, W, X, mesh=MESH, in_shardings=(P(), P("nope"))),
        wb.WorkbenchError, r"names mesh axis 'nope'.*pass the mesh the shardings were written for",
    ),
    "logical_axes without rules": (
        lambda: wb.Session.from_jax(step, W, X, mesh=MESH, logical_axes=(None, ("batch", None))),
        wb.WorkbenchError, r"needs the rules",
    ),
    "logical_axes an int": (
        lambda: wb.Session.from_jax(step, W, X, mesh=MESH, logical_axes=3, rules=RULES),
        InputError, r"logical_axes=3 is not one entry per argument",
    ),
    "logical_axes one for two": (
        lambda: wb.Session.from_jax(step, W, X, mesh=MESH, logical_axes=(None,), rules=RULES),
        InputError, r"one entry per argument of the step \(2\)",
    ),
    "rules an int": (
        lambda: wb.Session.from_jax(step, W, X, mesh=MESH, logical_axes=(None, None), rules=5),
        InputError, r"rules=5 is not a list of \(logical name, mesh axes\) pairs",
    ),
    "rules a string": (
        lambda: wb.Session.from_jax(step, W, X, mesh=MESH, logical_axes=(None, None), rules="batch"),
        InputError, r"rules='batch' is not a list",
    ),
    "a rule of three": (
        lambda: wb.Session.from_jax(step, W, X, mesh=MESH, logical_axes=(None, None), rules=[("a", "b", "c")]),
        InputError, r"rules holds \('a', 'b', 'c'\), not a \(logical name",
    ),
    "a rule naming an int axis": (
        lambda: wb.Session.from_jax(step, W, X, mesh=MESH, logical_axes=(None, None), rules=[("mlp", 3)]),
        InputError, r"rules holds \('mlp', 3\)",
    ),
}  # fmt: skip


@pytest.mark.parametrize("call, error, message", list(CASES.values()), ids=list(CASES))
def test_bad_import_input_is_a_clear_error(call, error, message):
    expect(call, error, message)


def test_good_rules_still_import():
    s = wb.Session.from_jax(
        step, W, X, mesh=MESH, logical_axes=(None, ("batch", None)), rules=RULES
    )
    assert s.sharding(s.program.values[s.program.inputs[1]].name).uses("batch")
    assert jax.tree.leaves(s.specs(outputs=False))
