"""``WhatIfPanel`` (the "What if" tab): the session's program priced over chip kinds, chip
counts and mesh shapes (`workbench.core.whatif.sweep`), with the answers (the smallest
cluster that fits, the best MFU per chip count) and the Pareto chart of step time against
chip-seconds (`viz.whatif`). Shapes stay the program's: to vary a batch or a sequence
length, call ``sweep`` with a function of them (or ``workbench sweep`` in a shell)."""

from __future__ import annotations

import ipywidgets as w

from workbench.core import hardware as presets
from workbench.core.errors import InputError
from workbench.core.whatif import counts, sweep
from workbench.viz.whatif import answer_rows, pareto_chart
from workbench.widgets import render
from workbench.widgets.controls import button, error_line, heading, panel


class WhatIfPanel:
    """Inputs, a "Sweep" button, the answers and the chart."""

    def __init__(self, bench, show_chart):
        self.bench, self.show_chart = bench, show_chart
        self.chips = w.Text(value="8,16,32,64", description="chips", layout=w.Layout(width="220px"))
        self.stages = w.Text(value="1,2,4", description="stages", layout=w.Layout(width="160px"))
        names = list(presets.PRESETS)
        chosen = bench.hardware.name if bench.hardware.name in names else names[0]
        self.kinds = w.SelectMultiple(
            options=names, value=(chosen,), rows=4, description="chips of"
        )
        self.run_button = button(
            "Sweep", "wb-whatif-run", "price every plan of the grid", "primary"
        )
        self.run_button.on_click(lambda _: self.run())
        self.progress = w.HTML()
        self.answers = w.HTML(layout=w.Layout(max_width="100%"))
        self.answers.add_class("wb-whatif-answers")
        self.chart = w.Output()
        self.error = error_line()
        self.result = None
        self.box = panel(
            "whatif",
            [
                heading("What if: this step on other clusters"),
                w.HBox([self.chips, self.stages], layout=w.Layout(flex_flow="row wrap")),
                self.kinds,
                w.HBox([self.run_button, self.progress]),
                self.error,
                self.answers,
                self.chart,
            ],
        )

    def run(self) -> None:
        """Sweep the grid the inputs give; a bad input or a failure shows here."""
        bench = self.bench
        self.error.value = ""
        bench.add_class("wb-busy")
        try:
            chips = counts(self.chips.value, "chips")
            stages = counts(self.stages.value, "stages")
            kinds = [presets.PRESETS[n] for n in self.kinds.value]
            if not kinds:
                raise InputError("choose at least one chip kind to sweep over.")

            def step(done, total):
                self.progress.value = f"priced {done} of {total}"

            self.result = sweep(
                bench.session.program, hardware=kinds, chips=chips, stages=stages, progress=step
            )
            self.answers.value = render.answers(answer_rows(self.result))
            self.show_chart(self.chart, pareto_chart(self.result))
            self.progress.value = f"{len(self.result.points)} plans in {self.result.seconds:.1f} s"
        except Exception as exc:  # shown in the UI, never swallowed
            bench.show_error("sweep", exc, self.error)
        finally:
            bench.remove_class("wb-busy")
