"""The workbench's input panels: each turns clicks into one call on the `Workbench`.

``TacticBuilder`` (value, kind, dim, axis -> a Tile / Replicate / Atomic), ``StrategyBar``
(one button per named strategy, PP with its microbatches, schedule and chunks, and CP's
ring), ``AutoPanel`` (the search, with a progress bar) and
``HistoryPanel`` (the schedule, undo / redo / reset / jump). None of them changes the
session itself: they build tactics and hand them to ``Workbench.act``.
"""

from __future__ import annotations

import ipywidgets as w

from workbench.core.ir.selectors import select
from workbench.core.plan.schedule import SCHEDULES
from workbench.core.propagate.tactics import Atomic, Replicate, Tile
from workbench.core.search.tree import Auto
from workbench.core.strategies.context import ring_for
from workbench.core.strategies.named import (
    NAMED,
    STRATEGIES,
    conventional_axis,
    suggested_axis,
)
from workbench.core.units import format_bytes, format_seconds
from workbench.widgets.render import notes

SUGGESTED = "suggested"
OFFERED = 50  # value names a name field offers at a time
GIB = 2**30


def button(text: str, css: str, tooltip: str = "", style: str = "") -> w.Button:
    b = w.Button(description=text, tooltip=tooltip or text, button_style=style)
    b.layout = w.Layout(width="auto", min_width=f"{12 + 9 * len(text)}px", flex="0 0 auto")
    b.add_class(css)
    return b


def name_field(names: list[str], placeholder: str, width: str) -> w.Combobox:
    """A field for a value name or selector that offers the ``OFFERED`` first ``names``
    containing what is typed (inputs come first in a program's names). Offering all of a
    70B step's 30,000 names would send 600 KB per field to the page. Its value follows
    each keystroke."""
    field = w.Combobox(
        placeholder=placeholder,
        options=names[:OFFERED],
        ensure_option=False,
        layout=w.Layout(width=width),
    )

    def offer(change) -> None:
        text = change["new"].strip()
        offered = [n for n in names if text in n][:OFFERED] if text else names[:OFFERED]
        if offered != list(field.options):
            field.options = offered

    field.observe(offer, "value")
    return field


def error_line() -> w.HTML:
    """Where a panel shows the failure of what the user did in it (``Workbench.redraw``)."""
    line = w.HTML(layout=w.Layout(max_width="100%"))
    line.add_class("wb-panel-error")
    return line


def panel(name: str, children, **layout) -> w.VBox:
    """A panel of the workbench: ``wb-panel wb-panel-<name>`` (the browser test's handles)."""
    box = w.VBox(children, layout=w.Layout(min_width="0", max_width="100%", **layout))
    box.add_class("wb-panel")
    box.add_class(f"wb-panel-{name}")
    return box


def simulator_choices(labels, given: str, overlap, fused: bool):
    """The estimate's choices: the hardware (``labels``, ``given`` chosen), how collectives
    overlap compute, and whether attention runs as fused kernels (FlashAttention-style)."""
    spec = w.Dropdown(options=[(k, k) for k in labels], value=given, description="hardware")
    policies = [("no overlap", "none"), ("prefetch (FSDP)", "prefetch"), ("full overlap", "full")]
    overlap_choice = w.Dropdown(
        options=[*policies, ("half", 0.5)], value=overlap, description="overlap"
    )
    tip = "price each attention as one flash-style kernel per pass, its logits kept on chip"
    fused_choice = w.Checkbox(value=fused, description="fused attention", indent=False)
    fused_choice.tooltip = tip
    return spec, overlap_choice, fused_choice


def heading(text: str) -> w.HTML:
    return w.HTML(f"<h4 style='margin:8px 0 2px 0'>{text}</h4>")


def row(children, css: str) -> w.HBox:
    """Panels side by side, wrapping onto a new row where the width runs out."""
    box = w.HBox(children, layout=w.Layout(flex_flow="row wrap", max_width="100%"))
    box.add_class(css)
    return box


class StrategyBar:
    """One button per named strategy, each on its suggested axis unless one is chosen; PP
    (on a stage-like axis unless one is chosen) with its microbatches, schedule and model
    chunks per stage; CP's ring kind."""

    def __init__(self, bench):
        self.bench = bench
        mesh = bench.session.mesh
        self.axis = w.Dropdown(
            options=[(f"{SUGGESTED} axis", SUGGESTED), *[(a, a) for a in mesh.names]],
            value=SUGGESTED,
            layout=w.Layout(width="150px"),
        )
        self.buttons = {}
        for name, cls in STRATEGIES.items():
            doc = (cls.__doc__ or name).strip().splitlines()[0]
            b = button(name, f"wb-strategy-{name}", f"{name}: {doc}")
            b.on_click(lambda _, name=name: self.apply(name))
            self.buttons[name] = b
        pp = self.buttons["PP"] = button(
            "PP", "wb-strategy-PP", "PP: pipeline the repeated blocks over the axis in stages"
        )
        pp.on_click(lambda _: self.apply_pipeline())
        ring = self.buttons["CP ring"] = button(
            "CP ring",
            "wb-strategy-CP-ring",
            "CP ring: context parallelism with ring attention: keys and values passed around "
            "the axis, an online softmax over the blocks; balanced under a causal mask",
        )
        ring.on_click(lambda _: self.apply_ring())
        named = list(STRATEGIES)
        order = [*named[: named.index("CP") + 1], "CP ring"]  # the ring beside CP
        self.buttons = {n: self.buttons[n] for n in [*order, *self.buttons] if n in self.buttons}
        small = w.Layout(width="170px")
        self.microbatches = w.BoundedIntText(
            value=0, min=0, max=1 << 16, description="microbatches", layout=small,
            tooltip="microbatches per step (0: four per stage, as the batch allows)",
        )  # fmt: skip
        self.schedule = w.Dropdown(options=SCHEDULES, value="1f1b", layout=w.Layout(width="120px"))
        self.chunks = w.BoundedIntText(
            value=1, min=1, max=64, description="chunks", layout=small,
            tooltip="model chunks per stage (more than 1: the interleaved schedule)",
        )  # fmt: skip
        self.error = error_line()
        self.box = panel(
            "strategies",
            [
                heading("Named strategies"),
                w.HBox([*self.buttons.values()], layout=w.Layout(flex_flow="row wrap")),
                self.axis,
                w.HBox(
                    [self.microbatches, self.schedule, self.chunks],
                    layout=w.Layout(flex_flow="row wrap"),
                ),
                self.error,
            ],
        )

    def axis_for(self, name: str) -> str:
        mesh = self.bench.session.mesh
        if self.axis.value != SUGGESTED:
            return self.axis.value
        return conventional_axis("stage", mesh) if name == "PP" else suggested_axis(name, mesh)

    def apply(self, name: str) -> None:
        self.bench.act(f"{name}", lambda: STRATEGIES[name](self.axis_for(name)), self.error)

    def apply_ring(self) -> None:
        axis = self.axis_for("CP")
        s = self.bench.session
        self.bench.act("CP ring", lambda: ring_for(s.program, s.mesh, axis), self.error)

    def apply_pipeline(self) -> None:
        def make():
            return NAMED["PP"](
                self.axis_for("PP"),
                microbatches=self.microbatches.value or None,
                schedule=self.schedule.value,
                virtual_stages=self.chunks.value,
            )

        self.bench.act("PP", make, self.error)


class TacticBuilder:
    """Tile / Replicate / Atomic on the values a name, glob or tag selects."""

    def __init__(self, bench):
        self.bench = bench
        session = bench.session
        self.value = name_field(
            bench.names, "a value name, a glob (params/**/w_in) or tag:name", "360px"
        )
        self.value.add_class("wb-value")
        self.kind = w.ToggleButtons(options=["Tile", "Replicate", "Atomic"], value="Tile")
        self.kind.style.button_width = "92px"
        self.dim = w.Dropdown(options=[("dim 0", 0)], value=0, layout=w.Layout(width="150px"))
        self.axis = w.Dropdown(options=list(session.mesh.names), layout=w.Layout(width="120px"))
        self.apply_button = button("Apply", "wb-apply", "apply this tactic", "primary")
        self.apply_button.on_click(lambda _: self.apply())
        self.value.observe(lambda _: self.update_dims(), "value")
        self.kind.observe(lambda _: self.update_dims(), "value")
        self.error = error_line()
        self.box = panel(
            "tactic",
            [
                heading("Tactic"),
                self.value,
                w.HBox([self.kind]),
                w.HBox([self.dim, self.axis, self.apply_button]),
                self.error,
            ],
        )

    def update_dims(self) -> None:
        """Dims of the first value the selector matches, with their sizes."""
        self.dim.disabled = self.kind.value != "Tile"
        program = self.bench.session.program
        try:
            ids = select(program, self.value.value, required=False) if self.value.value else []
        except Exception:  # a half-typed selector: keep the dims as they are
            return
        if ids:
            shape = program.values[ids[0]].shape
            options = [(f"dim {d} (size {n})", d) for d, n in enumerate(shape)] or [("dim 0", 0)]
            if [o[1] for o in options] != [o[1] for o in self.dim.options] or len(ids) == 1:
                self.dim.options = options

    def tactic(self):
        selector, axis = self.value.value.strip(), self.axis.value
        if self.kind.value == "Tile":
            return Tile(selector, self.dim.value, axis)
        return (Replicate if self.kind.value == "Replicate" else Atomic)(selector, axis)

    def apply(self) -> None:
        self.bench.act(f"{self.kind.value} {self.value.value!r}", self.tactic, self.error)


class AutoPanel:
    """The search on one axis, with its budget, a memory limit and a progress bar."""

    def __init__(self, bench, budget: int):
        self.bench = bench
        mesh = bench.session.mesh
        self.axis = w.Dropdown(
            options=list(mesh.names),
            value=conventional_axis("model", mesh),
            description="axis",
            layout=w.Layout(width="170px"),
        )
        self.budget = w.IntText(  # unbounded: a bad budget gets Auto's own message
            value=budget,
            description="evaluations",
            layout=w.Layout(width="200px"),
        )
        self.budget.add_class("wb-auto-budget")
        self.memory_gib = w.BoundedFloatText(
            value=0.0,
            min=0.0,
            max=1e6,
            description="memory limit GiB (0: none)",
            style={"description_width": "initial"},
            layout=w.Layout(width="250px"),
        )
        self.run_button = button("Auto", "wb-auto", "search for the best tactics on this axis")
        self.run_button.on_click(lambda _: self.run())
        self.progress = w.IntProgress(value=0, min=0, max=budget, layout=w.Layout(width="200px"))
        self.progress.add_class("wb-auto-progress")
        self.label = w.HTML("")
        self.error = error_line()
        self.box = panel(
            "auto",
            [
                heading("Automatic search"),
                w.HBox([self.axis, self.budget]),
                w.HBox([self.memory_gib, self.run_button]),
                w.HBox([self.progress, self.label], layout=w.Layout(flex_flow="row wrap")),
                self.error,
            ],
        )

    def report(self, p) -> None:
        self.progress.max = max(p.budget, 1)
        self.progress.value = min(p.evaluations, p.budget)
        self.label.value = (
            f"{p.evaluations} evaluations, best step {format_seconds(p.best_step_s)}, "
            f"{p.elapsed_s:.1f} s"
        )

    def tactic(self):
        limit = self.memory_gib.value * GIB or None
        self.progress.value, self.progress.max = 0, max(self.budget.value, 1)
        self.label.value = "searching…"
        return Auto(
            self.axis.value,
            memory_limit=limit,
            budget=self.budget.value,
            hardware=self.bench.hardware,
            callback=self.report,
        )

    def run(self) -> None:
        limit = self.memory_gib.value * GIB
        what = f"Auto on {self.axis.value!r}" + (f" within {format_bytes(limit)}" if limit else "")
        if not self.bench.act(what, self.tactic, self.error):
            self.label.value = ""  # the search did not land: no progress to speak of


class HistoryPanel:
    """The schedule as a list of steps; selecting one jumps there. A step that left values
    it targets whole says how many; below the list, what the current step could not do."""

    def __init__(self, bench):
        self.bench = bench
        self.steps = w.Select(options=[("0 · nothing applied", 0)], value=0, rows=8)
        self.steps.layout.width = "360px"
        self.steps.add_class("wb-history")
        self.notes = w.HTML()
        self.notes.add_class("wb-notes")
        self.undo = button("Undo", "wb-undo", "go back one step")
        self.redo = button("Redo", "wb-redo", "re-apply the step undone last")
        self.reset = button("Reset", "wb-reset", "back to nothing applied (redo replays)")
        self.error = error_line()
        self.undo.on_click(lambda _: bench.move("undo", lambda s: s.undo(), self.error))
        self.redo.on_click(lambda _: bench.move("redo", lambda s: s.redo(), self.error))
        self.reset.on_click(lambda _: bench.move("reset", lambda s: s.reset(), self.error))
        self._syncing = False
        self.steps.observe(self._picked, "value")
        self.box = panel(
            "history",
            [
                heading("Schedule"),
                self.steps,
                self.notes,
                w.HBox([self.undo, self.redo, self.reset]),
                self.error,
            ],
        )

    def _picked(self, change) -> None:
        if self._syncing or change["new"] is None or change["new"] == self.bench.session.step:
            return
        self.bench.move(
            f"jump to step {change['new']}", lambda s: s.jump(change["new"]), self.error
        )

    def update(self, session) -> None:
        total = session.step + len(session.redo_stack)
        final = session.state_at(total).schedule
        said = [session.notes(i + 1) for i in range(total)]
        options = [("0 · nothing applied", 0)] + [
            (
                f"{i + 1} · {t}"
                + (f"   ({len(said[i])} left whole)" if said[i] else "")
                + ("   (undone)" if i >= session.step else ""),
                i + 1,
            )
            for i, t in enumerate(final)
        ]
        self.notes.value = notes(session.step, said[session.step - 1] if session.step else ())
        self._syncing = True
        try:
            self.steps.options = options
            self.steps.value = session.step
        finally:
            self._syncing = False
        self.undo.disabled = session.step == 0
        self.redo.disabled = not session.redo_stack
