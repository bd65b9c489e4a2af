"""``PlacementPanel`` (the "Placement" tab): where the mesh's axes lie on the chosen
hardware's levels, and a button that fixes one as a step of the schedule.

It lists ``Session.placements(hardware)`` as core ranks them (fastest first, each with its
step and its ratio to the fastest), draws the chosen one (``viz.placement_picture``) and
the reductions synthesised under it (``viz.synthesis_timeline`` of its estimate), and
"Place" calls ``Session.place`` through ``Workbench.redraw`` like any tactic (the history
shows the step, undo takes it back, a failure shows here and changes nothing). Pricing
every placement takes a tenth of a second each on a 70B step, so the panel ranks them
only while its tab is open (``show_in``).
"""

from __future__ import annotations

import ipywidgets as w

from workbench.core.hardware.levels import HardwareError
from workbench.core.units import format_seconds
from workbench.viz import placement_picture, placement_rows, synthesis_rows, synthesis_timeline
from workbench.widgets import render
from workbench.widgets.controls import button, error_line, heading, panel

SHOWN = 10  # placements listed, fastest first
REDUCTIONS = 4  # synthesised programs drawn
NONE_SPANS = (
    "No reduction's group spans levels under this placement: each runs as one collective "
    "on the level its axes lie on."
)


def _scroll(svg: str) -> str:
    """A picture that scrolls in its own box rather than widening the panel."""
    return f'<div style="overflow-x:auto;max-width:100%">{svg}</div>'


class PlacementPanel:
    """The ranked placements to choose from, the chosen one's picture and synthesised
    reductions, and "Place"."""

    def __init__(self, bench):
        self.bench = bench
        self.ranked: list = []  # the placements drawn, as core ranked them
        self.head = w.HTML()
        self.head.add_class("wb-placement-head")
        self.choice = w.Select(options=[], rows=6, layout=w.Layout(width="100%"))
        self.choice.add_class("wb-placement-choice")
        self.choice.observe(self._picked, "value")
        self.place_button = button(
            "Place", "wb-place", "fix the chosen placement as a step of the schedule", "primary"
        )
        self.place_button.on_click(lambda _: self.place())
        self.picture = w.HTML(layout=w.Layout(max_width="100%"))
        self.picture.add_class("wb-placement-picture")
        self.reductions = w.HTML(layout=w.Layout(max_width="100%"))
        self.reductions.add_class("wb-synthesis")
        self.error = error_line()
        self.box = panel(
            "placement",
            [
                heading("Where the mesh's axes lie on the hardware"),
                self.head,
                self.choice,
                self.place_button,
                self.error,
                self.picture,
                heading("Reductions synthesised per level"),
                self.reductions,
            ],
        )
        self._tabs = None
        self._stale = True
        self._syncing = False

    # -- when to draw ----------------------------------------------------------------------
    def show_in(self, tabs: w.Tab) -> None:
        """Draw only while ``tabs`` shows this panel; opening it draws what changed."""
        self._tabs = tabs
        tabs.observe(self._opened, "selected_index")

    def shown(self) -> bool:
        tabs = self._tabs
        return tabs is None or tabs.selected_index == list(tabs.children).index(self.box)

    def _opened(self, _) -> None:
        """Draw on opening, saying what failed here (as ``Workbench.show_held`` does: the
        error lines of the last action stay)."""
        if not (self._stale and self.shown()):
            return
        bench = self.bench
        self.error.value = ""
        bench.add_class("wb-busy")
        try:
            self.update(bench.session)
        except Exception as exc:  # shown in the UI, never swallowed
            bench.show_error("rank the placements", exc, self.error)
        finally:
            bench.remove_class("wb-busy")

    def update(self, session) -> None:
        """Rank the placements on the Workbench's hardware (if the tab is open)."""
        self._stale = True
        if not self.shown():
            return
        hardware, overlap = self.bench.hardware, self.bench.overlap
        try:
            ranked = session.placements(hardware, overlap=overlap)
        except HardwareError as exc:  # the mesh does not fill the levels' groups: said plainly
            self.ranked = []
            self._offer([])
            self.head.value = render.note(f"No placement to choose on {hardware.name}: {exc}")
            self.picture.value = self.reductions.value = ""
            self._stale = False
            return
        rows = placement_rows(ranked, session.state.placement, SHOWN)
        self.ranked = list(ranked)[: len(rows)]
        self.head.value = self._head(session, ranked, rows)
        self._offer(rows)
        self.draw_chosen()
        self._stale = False

    def _head(self, session, ranked, rows) -> str:
        hw, mesh = self.bench.hardware, session.mesh
        levels = ", ".join(x.name for x in hw.links)
        if len(hw.links) == 1:
            text = (
                f"{hw.name} has one level ({levels}): every device reaches every other over "
                "the same link, so there is no placement to choose."
            )
        elif ranked.total == 1:
            text = (
                f"The mesh {mesh} has one placement on {hw.name}'s levels ({levels}): "
                f"{rows[0]['text']}. Nothing to choose."
            )
        else:
            some = f"The {len(rows)} fastest of the" if len(rows) < ranked.total else "The"
            more = f" (the first {ranked.limit} priced)" if ranked.total > len(ranked) else ""
            text = (
                f"{some} {ranked.total} placements{more} of the mesh {mesh} on {hw.name}'s "
                f"levels ({levels}), by the simulated step of this plan (and its ratio to "
                "the fastest's)."
            )
        placed = session.state.placement
        text += f" Placed: {placed}." if placed else " No Place step yet."
        note = session.estimate(hw, overlap=self.bench.overlap).note
        return render.note(text) + (render.note(f" Note: {note}.") if note else "")

    def _offer(self, rows) -> None:
        """The choice (hidden with the button where there is nothing to choose), on the
        session's placement where it is listed, else the fastest."""
        several = len(rows) > 1
        for widget in (self.choice, self.place_button):
            widget.layout.display = None if several else "none"
        options = [
            (
                f"{r['rank']} · step {format_seconds(r['step_s'])} · {r['ratio']:.2f}x · "
                f"{r['text']}" + ("   (placed)" if r["current"] else ""),
                i,
            )
            for i, r in enumerate(rows)
        ]
        current = next((i for i, r in enumerate(rows) if r["current"]), 0)
        self._syncing = True
        try:
            self.choice.options = options
            self.choice.value = current if options else None
        finally:
            self._syncing = False

    # -- the chosen placement --------------------------------------------------------------
    def chosen(self):
        """The `Ranked` placement chosen (None where none is listed)."""
        i = self.choice.value
        return self.ranked[i] if self.ranked and i is not None else None

    def _picked(self, change) -> None:
        if not self._syncing and change["new"] is not None:
            self.bench.redraw("show the placement", self.draw_chosen, where=self.error)

    def draw_chosen(self) -> None:
        r = self.chosen()
        if r is None:
            self.picture.value = self.reductions.value = ""
            return
        self.picture.value = _scroll(placement_picture(r.placement, self.bench.session.mesh))
        rows = synthesis_rows(r.estimate)
        self.reductions.value = (
            _scroll(synthesis_timeline(rows, REDUCTIONS)) if rows else render.note(NONE_SPANS)
        )

    def place(self) -> None:
        r = self.chosen()
        what = f"Place({r.placement})" if r is not None else "Place"
        self.bench.redraw(
            what, lambda: self.bench.session.place(r), everything=True, where=self.error
        )
