"""``Workbench``: the notebook widget over one `Session`.

Every action goes through ``act`` (apply a tactic) or ``move`` (undo, redo, reset, jump):
it clears the error lines, runs the call, and redraws every view from the session; a
failure shows in the panel where the user acted and in the error line at the top
(``WorkbenchError`` as its message, anything else with its traceback), leaves the session
as it was, and every view is redrawn from it. The views only show what core and viz return:
graph, estimate, collectives, inspector, anatomy, run, exports, placement and what-if.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import ipywidgets as w

from workbench.core import hardware as presets
from workbench.core.errors import WorkbenchError
from workbench.core.estimate import check_overlap
from workbench.core.gcpause import without_gc
from workbench.core.io.export import to_json
from workbench.core.ir.capture import capture
from workbench.core.ir.program import Program
from workbench.core.search.tree import Auto
from workbench.core.session import Session
from workbench.viz import (
    collective_rows,
    device_grid,
    device_grid_text,
    estimates_over_schedule,
    memory_breakdown,
    pipeline_timeline,
    schedule_estimates,
    schedule_labels,
    time_breakdown,
)
from workbench.widgets import render
from workbench.widgets.anatomy import AnatomyPanel
from workbench.widgets.controls import (
    AutoPanel,
    HistoryPanel,
    StrategyBar,
    TacticBuilder,
    button,
    error_line,
    heading,
    name_field,
    panel,
    row,
    simulator_choices,
)
from workbench.widgets.graphpanel import GraphPanel
from workbench.widgets.placement import PlacementPanel
from workbench.widgets.whatif import WhatIfPanel

CALIBRATED = "calibrated: the attached devices"
EXPORTS = ("Python", "plain JAX", "JSON")
PLOTLY_MIME = "application/vnd.plotly.v1+json"
CSS = (Path(__file__).parent / "workbench.css").read_text()


def _display(out: w.Output, fig) -> None:
    """Show ``fig`` in ``out`` (in a kernel; outside one there is no screen to show it on).

    Sent as plotly's own mime type, which JupyterLab's plotly extension draws. Going
    through ``fig.show()`` instead would import plotly's renderer registry, and with it
    nbformat and jsonschema: about 2 s on the first chart of a session."""
    from IPython import get_ipython
    from IPython.display import display
    from plotly.io import to_json

    if get_ipython() is None:
        return
    figure = json.loads(to_json(fig, validate=False, remove_uids=False))
    figure.get("layout", {}).pop("width", None)  # as wide as its panel (workbench.css)
    bundle = {PLOTLY_MIME: figure}
    with out:
        out.clear_output(wait=True)
        display(bundle, raw=True)


class Workbench(w.VBox):
    """Plan the partitioning of ``fn(*args)`` on ``mesh``, one tactic at a time.

    ``fn`` may also be a captured `Program`. ``hardware`` is the simulator's spec (default
    H100; a dropdown switches presets, or measures the attached devices). ``schedule``
    applies tactics at the start; ``auto_budget`` is the search's default evaluations.
    The session is ``.session``; the figures last drawn are in ``.figures``.
    """

    @without_gc  # a 70B step's objects make each full collection cost a tenth of a second
    def __init__(
        self,
        fn,
        *args,
        mesh,
        hardware=None,
        schedule=(),
        overlap="none",
        auto_budget: int = 200,
        **kwargs,
    ):
        hardware = presets.H100 if hardware is None else presets.resolve(hardware)
        check_overlap(overlap)
        program = fn if isinstance(fn, Program) else capture(fn, *args, **kwargs)
        self.session = Session(program, mesh, schedule)
        Auto(self.session.mesh.names[0], budget=auto_budget)  # the budget, checked as Auto does
        self.names = program.names()  # what the name fields offer (``controls.name_field``)
        self.hardware = hardware
        self.overlap = overlap
        self.figures: dict = {}
        self._opening = True  # the first drawing holds its graph and charts back (``show_held``)
        self._charts_held = False
        self._charts_for: tuple = ()  # (estimates over the schedule, their labels)
        self.last_error: BaseException | None = None
        self._calibrated = None
        self._run_for = None  # the state the run panel's result is for
        self.last_run = None

        self.title = w.HTML()
        self.status = w.HTML()
        self.status.add_class("wb-status")
        self.error = w.HTML()
        self.error.add_class("wb-error")  # below: each panel's (``redraw``'s ``where``)
        self.estimate_error, self.table_error, self.inspect_error = (error_line() for _ in "123")
        self.run_error, self.export_error, self.save_error = (error_line() for _ in "123")

        self.strategies = StrategyBar(self)
        self.builder = TacticBuilder(self)
        self.auto = AutoPanel(self, auto_budget)
        self.history = HistoryPanel(self)
        self.anatomy = AnatomyPanel(self, self.names)
        self.placement = PlacementPanel(self)  # the "Placement" tab: where the axes lie
        self.whatif = WhatIfPanel(self, _display)  # the "What if" tab: other clusters

        # the program graph: pan, zoom, fold, click, replay (see graphpanel.py)
        self.graph_panel = GraphPanel(self)
        self.graph = self.graph_panel.view
        self.collapse, self.expand = self.graph_panel.collapse, self.graph_panel.expand
        self.phases = self.graph_panel.phases

        # the simulator
        self._specs = dict(presets.PRESETS)  # the dropdown's label -> its spec
        given = self.hardware.name
        if presets.PRESETS.get(given) != self.hardware:  # a spec of the user's: kept by name
            given = given if given not in presets.PRESETS else f"{given} (given)"
            self._specs = {given: self.hardware, **self._specs}
        self.spec, self.overlap_choice, self.fused = simulator_choices(
            [*self._specs, CALIBRATED], given, overlap, self.hardware.fused_attention
        )
        for widget, what, change in (
            (self.spec, "change the hardware", self.change_spec),
            (self.fused, "change the attention kernels", self.change_spec),
            (self.overlap_choice, "change the overlap", self.change_overlap),
        ):
            widget.observe(
                lambda _, what=what, change=change: self.redraw(
                    what, change, where=self.estimate_error
                ),
                "value",
            )
        self.summary = w.HTML()
        self.summary.add_class("wb-estimate")
        self.time_chart, self.memory_chart, self.schedule_chart = w.Output(), w.Output(), w.Output()
        for chart in (self.time_chart, self.memory_chart, self.schedule_chart):
            chart.add_class("wb-chart")
        self.conflicts = w.HTML()

        # the collective plan, the inspector, the run panel, the export panel
        self.table = w.HTML()
        self.table.add_class("wb-collectives")
        self.inspect_value = name_field(self.names, "a value to inspect", "360px")
        self.inspect_value.observe(
            lambda _: self.redraw("inspect", self.draw_inspector, where=self.inspect_error),
            "value",
        )
        self.inspector = w.HTML()
        self.inspector.add_class("wb-inspector")
        self.grid_chart = w.Output()
        self.lowering = w.Dropdown(
            options=["explicit", "constrained"], value="explicit", description="lowering"
        )
        self.run_button = button("Run on devices", "wb-run", "run one step on the attached devices")
        self.run_button.on_click(lambda _: self.redraw("run", self.run, where=self.run_error))
        self._run_text = render.note("Not run yet.")  # the run panel's result, for _run_for
        self.run_result = w.HTML(self._run_text)
        self.run_result.add_class("wb-run-result")
        self.export_kind = w.ToggleButtons(options=EXPORTS, value="Python")
        self.export_kind.observe(
            lambda _: self.redraw("export", self.draw_export, where=self.export_error), "value"
        )
        self.export = w.Textarea(layout=w.Layout(width="100%", height="260px"))
        self.export.add_class("wb-export")
        self.save_path = w.Text(value="strategy.json", description="file")
        self.save_path.add_class("wb-save-path")
        self.save_button = button("Save JSON", "wb-save", "write the strategy file")
        self.save_button.on_click(lambda _: self.redraw("save", self.save, where=self.save_error))
        self.saved = w.HTML()

        left = w.VBox(
            [self.strategies.box, self.builder.box, self.auto.box, self.history.box],
            layout=w.Layout(width="440px", flex="0 0 auto"),
        )
        left.add_class("wb-left")
        right = self.graph_panel.box
        self.sections = sections = w.Tab(
            [
                w.VBox([self.table_error, self.table]),
                w.VBox([self.inspect_value, self.inspect_error, self.inspector, self.grid_chart]),
                w.VBox([w.HBox([self.lowering, self.run_button]), self.run_error, self.run_result]),
                self.anatomy.box,
                self.placement.box,
                self.whatif.box,
            ],
            titles=("Collectives", "Inspect a value", "Run", "Anatomy", "Placement", "What if"),
            layout=w.Layout(min_width="0", max_width="100%"),
        )
        sections.add_class("wb-panel")
        sections.add_class("wb-panel-sections")
        self.placement.show_in(sections)  # ranks the placements while its tab is open
        estimate = panel(
            "estimate",
            [
                heading("Estimate"),
                w.HBox(
                    [self.spec, self.overlap_choice, self.fused],
                    layout=w.Layout(flex_flow="row wrap"),
                ),
                self.estimate_error,
                self.summary,
                self.conflicts,
                row([self.time_chart, self.memory_chart], "wb-charts"),
                self.schedule_chart,
            ],
        )
        export = panel(
            "export",
            [
                heading("Export"),
                self.export_kind,
                self.export_error,
                self.export,
                w.HBox(
                    [self.save_path, self.save_button, self.saved],
                    layout=w.Layout(flex_flow="row wrap"),
                ),
                self.save_error,
            ],
        )
        top = panel(
            "session", [w.HTML(f"<style>{CSS}</style>"), self.title, self.status, self.error]
        )
        super().__init__(
            [
                top,
                w.HBox([left, right], layout=w.Layout(max_width="100%")),
                estimate,
                sections,
                export,
            ],
            layout=w.Layout(max_width="100%"),
        )
        self.add_class("wb-workbench")
        self.redraw("draw the workbench", lambda: None, everything=True)
        self._opening = False

    # -- actions ---------------------------------------------------------------------------
    def act(self, what: str, make_tactic, where: w.HTML | None = None) -> bool:
        """Apply the tactic ``make_tactic()`` returns; True if it applied. A failure shows in
        ``where`` (the error line of the panel acted in) too."""
        return self.redraw(
            what, lambda: self.session.apply(make_tactic()), everything=True, where=where
        )

    def move(self, what: str, step, where: w.HTML | None = None) -> bool:
        """``step(session)`` moves along the history (undo, redo, reset, jump)."""
        return self.redraw(what, lambda: step(self.session), everything=True, where=where)

    @without_gc
    def redraw(
        self, what: str, action, *, everything: bool = False, where: w.HTML | None = None
    ) -> bool:
        """Run ``action`` then redraw (every view, or none beyond what ``action`` drew). A
        failure shows in the error line and in ``where``, the panel acted in, and every view
        is redrawn from the session (which the failure left as it was). True if all went
        through."""
        self.clear_errors()
        self.last_error = None
        self.add_class("wb-busy")
        try:
            try:
                action()
            except Exception as exc:  # shown in the UI, never swallowed
                self.show_error(what, exc, where)
                self.refresh()
                return False
            return self.refresh() if everything else True
        finally:
            self.remove_class("wb-busy")

    def error_lines(self) -> list[w.HTML]:
        """Every panel's error line."""
        panels = (self.strategies, self.builder, self.auto, self.history, self.anatomy)
        panels += (self.placement, self.whatif)
        return [p.error for p in panels] + [
            self.graph_panel.error,
            self.estimate_error,
            self.table_error,
            self.inspect_error,
            self.run_error,
            self.export_error,
            self.save_error,
        ]

    def clear_errors(self) -> None:
        self.error.value = ""
        for line in self.error_lines():
            line.value = ""

    def show_error(self, what: str, exc: BaseException, where: w.HTML | None = None) -> None:
        """The error line (added to what this action already showed) and ``where``'s: a
        `WorkbenchError` as its message, anything else with its trace."""
        self.last_error = exc
        text = render.error(what, exc, trace=not isinstance(exc, WorkbenchError))
        self.error.value += text
        if where is not None:
            where.value += text

    def refresh(self) -> bool:
        """Redraw every view from the session; a view that fails says so in its panel and
        the others are drawn. True if all were."""
        s = self.session
        views = (
            (None, lambda: setattr(self.title, "value", render.header(s, self.hardware))),
            (None, lambda: setattr(self.status, "value", render.status(s))),
            (self.history.error, lambda: self.history.update(s)),
            (
                self.estimate_error,
                lambda: setattr(self.conflicts, "value", render.conflicts(s.conflicts)),
            ),
            (self.graph_panel.error, self.draw_graph),
            (self.estimate_error, self.draw_estimate),
            (self.table_error, self.draw_table),
            (self.anatomy.error, lambda: self.anatomy.update(s)),
            (self.placement.error, lambda: self.placement.update(s)),
            (self.inspect_error, self.draw_inspector),
            (self.export_error, self.draw_export),
            (self.run_error, self.draw_run),
        )
        ok = True
        for where, draw in views:
            try:
                draw()
            except Exception as exc:  # shown in the UI, never swallowed
                self.show_error("draw the view", exc, where)
                ok = False
        return ok

    def draw_table(self) -> None:
        self.table.value = render.collective_table(
            collective_rows(self.session, hardware=self.hardware)
        )

    def draw_run(self) -> None:
        """The run panel: the last run's result if it was at this state."""
        if self._run_for is self.session.state or self._run_for is None:
            self.run_result.value = self._run_text
        else:
            self.run_result.value = render.note("Not run at this step yet.")

    def draw_graph(self) -> None:
        if self._opening:  # the page shows the widget first, then the graph (show_held)
            self.graph_panel.hold()
            return
        self.graph_panel.draw()

    def inspect(self, name: str) -> None:
        """Show the value ``name`` in the inspector (its tab opens) and mark it in the graph."""
        self.sections.selected_index = 1
        if self.inspect_value.value == name:
            self.draw_inspector()
        else:
            self.inspect_value.value = name  # its observer draws the inspector

    def draw_estimate(self) -> None:
        s, hw = self.session, self.hardware
        steps = estimates_over_schedule(s, hw, overlap=self.overlap)
        e = self.estimate = steps[-1]  # the current step's
        self.summary.value = render.estimate(e)
        self._charts_for = (steps, schedule_labels(s))
        if self._opening:  # the page draws the widget first, then the charts (show_charts)
            self._charts_held = True
            return
        self.draw_charts()

    def draw_charts(self) -> None:
        steps, labels = self._charts_for
        self._charts_held = False
        last = steps[-1]  # a pipelined step's time is its stages' timeline
        self.figures["time"] = (
            pipeline_timeline(last.pipeline) if last.pipeline else time_breakdown(last)
        )
        self.figures["memory"] = memory_breakdown(steps[-1])
        self.figures["schedule"] = schedule_estimates(steps, labels)
        for out, key in (
            (self.time_chart, "time"),
            (self.memory_chart, "memory"),
            (self.schedule_chart, "schedule"),
        ):
            _display(out, self.figures[key])

    def show_held(self) -> None:
        """Draw what the opening held back; the graph panel calls this once the page shows
        the widget. The schedule, estimate and collective table come first: the graph's
        ``dot`` takes a second on a 70B step, and the first plotly chart would hold up the
        whole widget while the page loads plotly.js (2 to 3 s on a two-core machine) and
        the kernel while plotly's validators load. Not through ``redraw``, which would
        clear an error the opening showed."""
        if self.graph_panel.held:
            try:
                self.graph_panel.draw()
            except Exception as exc:  # shown in the UI, never swallowed
                self.show_error("draw the graph", exc, self.graph_panel.error)
        if self._charts_held:
            self.draw_charts()

    def draw_inspector(self) -> None:
        name = self.inspect_value.value.strip()
        self.graph_panel.select(name)
        if not name:
            self.inspector.value = render.note("Pick a value to see its sharding and provenance.")
            return
        s = self.session
        if not s.program.has_value(name):  # typed so far: the field offers the names
            self.inspector.value = render.note(f"No value is named {name!r} (yet).")
            return
        sharding = s.sharding(name)
        self.inspector.value = render.inspector(
            name,
            sharding,
            s.why(name),
            sharding.local_shape(s.mesh),
            device_grid_text(sharding, s.mesh),
        )
        self.figures["grid"] = device_grid(sharding, s.mesh)
        _display(self.grid_chart, self.figures["grid"])

    def draw_export(self) -> None:
        s = self.session
        kind = self.export_kind.value
        if kind == "Python":
            text = s.export_code()
        elif kind == "plain JAX":
            text = s.export_jax()
        else:
            text = json.dumps(to_json(s), indent=2)
        self.export.value = text

    def change_spec(self) -> None:
        """The chosen spec, its attention fused or not as the checkbox says."""
        if self.spec.value == CALIBRATED:
            spec = self.calibrated()
        else:
            spec = self._specs.get(self.spec.value, self.hardware)
        if spec.fused_attention != self.fused.value:
            spec = dataclasses.replace(spec, fused_attention=self.fused.value)
        self.hardware = spec
        self.refresh()

    def change_overlap(self) -> None:
        self.overlap = self.overlap_choice.value
        self.refresh()

    def calibrated(self):
        """A spec measured on the attached devices (once; quick mode)."""
        if self._calibrated is None:
            from workbench.core.hardware.calibrate import calibrate

            self._calibrated = calibrate(quick=True)
        return self._calibrated

    def run(self) -> None:
        s = self.session
        self.run_result.value = render.note("running…")
        result = s.run(lowering=self.lowering.value)
        spec = self.calibrated()
        predicted = s.estimate(spec, overlap=self.overlap).step_s
        self._run_text = render.run_result(result, predicted, spec.name)
        self.last_run, self._run_for = result, s.state
        self.run_result.value = self._run_text

    def save(self) -> None:
        path = self.session.save(self.save_path.value)
        self.saved.value = render.note(f"saved {path}")
