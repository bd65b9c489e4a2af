"""``AnatomyPanel``: what the workbench sees in the model, and a form to correct a role.

The table is ``viz.anatomy_html`` of the session's anatomy as the ``Role`` steps so far
corrected it; the form builds a ``Role`` and hands it to ``Workbench.act`` like every other
tactic, so a correction lands in the schedule (undo, redo, save and export follow) and a bad
one shows in the error line.
"""

from __future__ import annotations

import ipywidgets as w

from workbench.core.strategies.roles import ROLES, Role
from workbench.viz import anatomy_html, anatomy_rows
from workbench.widgets import render
from workbench.widgets.controls import button, error_line, heading, name_field, panel

TITLE = "What the workbench sees in your model"
HELP = (
    "Read from the program's structure alone, never from names. If a role is wrong, correct "
    "it: data (batch on dim), parameter, none (neither), embedding (vocabulary on dim), heads "
    "or hidden (the dim MP splits). The named strategies applied after the correction follow it."
)


class AnatomyPanel:
    """The anatomy table, and selector + role + dim -> a ``Role`` correction."""

    def __init__(self, bench, names):
        self.bench = bench
        self.table = w.HTML()
        self.table.add_class("wb-anatomy")
        self.selector = name_field(
            names, "the values to correct: a name, a glob (batch/*) or tag:name", "420px"
        )
        self.selector.add_class("wb-role-selector")
        self.role = w.Dropdown(options=ROLES, value="data", description="role")
        self.role.layout.width = "220px"
        self.dim = w.IntText(value=0, description="dim", layout=w.Layout(width="140px"))
        self.no_dim = w.Checkbox(value=False, description="no dim", indent=False)
        self.no_dim.layout.width = "90px"
        self.no_dim.observe(lambda change: setattr(self.dim, "disabled", change["new"]), "value")
        self.apply_button = button(
            "Apply correction", "wb-role-apply", "add this Role step to the schedule", "primary"
        )
        self.apply_button.on_click(lambda _: self.apply())
        self.error = error_line()
        self.box = panel(
            "anatomy",
            [
                heading(TITLE),
                w.HTML(render.note(HELP)),
                self.table,
                heading("Correct a role"),
                self.selector,
                w.HBox(
                    [self.role, self.dim, self.no_dim, self.apply_button],
                    layout=w.Layout(flex_flow="row wrap"),
                ),
                self.error,
            ],
        )

    def tactic(self) -> Role:
        dim = None if self.no_dim.value else self.dim.value
        return Role(self.selector.value.strip(), self.role.value, dim)

    def apply(self) -> None:
        what = f"Role {self.selector.value!r} as {self.role.value!r}"
        self.bench.act(what, self.tactic, self.error)

    def update(self, session) -> None:
        self.table.value = anatomy_html(anatomy_rows(session))
