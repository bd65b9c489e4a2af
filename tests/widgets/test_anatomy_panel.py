"""The anatomy panel: what the workbench sees in the model, and a role corrected by clicks."""

import pytest

import workbench as wb
from tests.core.zoo import program
from workbench.core import hardware as hw
from workbench.core.errors import WorkbenchError
from workbench.viz import anatomy_html, anatomy_rows
from workbench.widgets import Workbench

MESH = {"batch": 2, "model": 4}


def bench(name: str) -> Workbench:
    return Workbench(program(name), mesh=MESH, hardware=hw.TPU_V5E, auto_budget=8)


def correct(b: Workbench, selector: str, role: str, dim: int | None) -> None:
    panel = b.anatomy
    panel.selector.value, panel.role.value = selector, role
    panel.no_dim.value = dim is None
    if dim is not None:
        panel.dim.value = dim
    panel.apply_button.click()


def test_the_panel_lists_what_the_workbench_sees():
    b = bench("lm")
    table = b.anatomy.table.value
    assert table == anatomy_html(anatomy_rows(b.session))
    for role in ("parameter", "gradient", "batch", "attention 0", "mlp hidden", "embedding"):
        assert f"<b>{role}</b>" in table
    assert "batch/tokens" in table and "params/layers/0/attn/wq" in table
    assert "wb-anatomy" in b.anatomy.table._dom_classes
    assert "wb-role-apply" in b.anatomy.apply_button._dom_classes


def test_a_correction_is_a_step_and_bp_follows_it():
    b = bench("gnn")
    b.strategies.buttons["BP"].click()
    assert not b.session.sharding("batch/senders").uses("batch")
    b.history.undo.click()

    before = b.anatomy.table.value
    correct(b, "batch/{senders,receivers}", "data", 0)
    assert not b.error.value, b.error.value
    assert b.session.history == (wb.Role("batch/{senders,receivers}", "data", dim=0),)
    assert "(corrected)" in b.anatomy.table.value and b.anatomy.table.value != before
    assert "Role(" in b.export.value
    assert [label for label, _ in b.history.steps.options][-1].startswith("1 · Role(")

    b.strategies.buttons["BP"].click()
    assert b.session.sharding("batch/senders").dim_of("batch") == 0
    assert b.session.sharding("batch/receivers").dim_of("batch") == 0

    b.history.reset.click()  # the table follows the history
    assert b.anatomy.table.value == before
    b.history.steps.value = 1
    assert "(corrected)" in b.anatomy.table.value
    b.history.undo.click()
    assert b.anatomy.table.value == before
    b.history.redo.click()
    assert "(corrected)" in b.anatomy.table.value


@pytest.mark.parametrize(
    "selector, role, dim, words",
    [
        ("batch/tokens", "data", None, ["needs dim=", "data"]),
        ("batch/nothing", "data", 0, ["matches no value"]),
        ("batch/tokens", "embedding", 5, ["out of range"]),
    ],
)
def test_a_bad_correction_shows_and_changes_nothing(selector, role, dim, words):
    b = bench("lm")
    b.strategies.buttons["BP"].click()
    before = (b.session.state, b.session.history, b.anatomy.table.value, b.export.value)
    correct(b, selector, role, dim)
    assert isinstance(b.last_error, WorkbenchError)
    assert all(word in b.error.value for word in words), b.error.value
    assert "traceback" not in b.error.value
    after = (b.session.state, b.session.history, b.anatomy.table.value, b.export.value)
    assert after == before


def test_no_dim_disables_the_dim_box():
    panel = bench("mlp").anatomy
    panel.selector.value = "batch/*"  # an empty selector is refused when the Role is built
    panel.no_dim.value = True
    assert panel.dim.disabled and panel.tactic().dim is None
    panel.no_dim.value = False
    assert not panel.dim.disabled and panel.tactic().dim == panel.dim.value
