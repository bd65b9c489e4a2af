"""``GraphPanel``: the Workbench's program graph, its fold state and its replay.

It draws ``viz.graph_picture`` into a `GraphView` and answers the view's messages: a
click on a folded box opens it and a click on an opened block's frame folds it back; a
click on a value (an edge, an op, an input) inspects it; a click on a collective shows
why it is there; a search selects a value by name. The replay plays
``Session.events(step)`` as ``viz.replay_frames`` over the drawing.
"""

from __future__ import annotations

import ipywidgets as w

from workbench.core.gcpause import without_gc
from workbench.viz import (
    event_elements,
    event_frames,
    find_value,
    graph_picture,
    to_svg,
    value_elements,
)
from workbench.viz.blocks import default_expand, op_layers
from workbench.widgets import render
from workbench.widgets.controls import error_line, panel
from workbench.widgets.graphview import GraphView

COLLAPSE = [
    ("blocks", "blocks"),
    ("scopes, auto", "auto"),
    ("every op", None),
    ("phases", 0),
    ("top scopes", 1),
    ("depth 2", 2),
]
PHASES = ("forward", "backward", "optimizer")


class GraphPanel:
    """The graph, how it is folded, and the replay of a step's propagation."""

    def __init__(self, bench):
        self.bench = bench
        program = bench.session.program
        self.expanded: set[str] = set(opening_expand(program))
        self.picture = None
        self.held = False  # the opening's first drawing waits for the page (``hold``)
        self._layers = None  # viz.blocks.op_layers of the program, once
        self._replayed = (None, ())  # the state replayed, and its events
        self.collapse = w.Dropdown(options=COLLAPSE, value="blocks", description="fold by")
        self.expand = w.Text(
            placeholder="scopes to draw op by op: layer0/attn, … (enter)",
            continuous_update=False,
            layout=w.Layout(display="none"),
        )
        self.phases = {
            p: w.Checkbox(value=True, description=p, indent=False, layout=w.Layout(width="100px"))
            for p in PHASES
        }
        self.error = error_line()

        def redraw(what, action):
            return bench.redraw(what, action, where=self.error)

        for control in (self.collapse, self.expand, *self.phases.values()):
            control.observe(lambda _: redraw("draw the graph", self.draw), "value")
        self.replay_step = w.Dropdown(
            description="replay", layout=w.Layout(width="320px", max_width="100%")
        )
        self.replay_step.observe(lambda _: redraw("replay", self.replay), "value")
        self.view = GraphView()
        self.view.add_class("wb-graph")
        self.view.on("click", lambda m: redraw("click the graph", lambda: self.click(m)))
        self.view.on("search", lambda m: redraw("find", lambda: self.search(m["text"])))
        # the page shows the widget: the graph and charts the opening held back follow
        self.view.on("shown", lambda _: bench.show_held())
        self.why = w.HTML()
        self.why.add_class("wb-graph-why")
        self.legend = w.HTML()  # folding by blocks: the colours' key, beside the drawing
        self.legend.add_class("wb-graph-legend")
        self.box = panel(
            "graph",
            [
                w.HBox(
                    [self.collapse, *self.phases.values()], layout=w.Layout(flex_flow="row wrap")
                ),
                self.expand,
                self.error,
                self.legend,
                self.view,
                self.replay_step,
                self.why,
            ],
            flex="1 1 auto",
        )

    # -- drawing -----------------------------------------------------------------------------
    def hold(self) -> None:
        """Leave the panel empty (the page says it is drawing) until ``draw``."""
        self.held = True
        self.picture = None
        self.view.svg = ""
        self.replay_step.options = []

    @without_gc  # a 70B step's objects make each full collection cost a tenth of a second
    def draw(self, focus=None) -> None:
        self.held = False
        s = self.bench.session
        blocks = self.collapse.value == "blocks"
        self.expand.layout.display = "none" if blocks else ""
        phases = [p for p, box in self.phases.items() if box.value] or PHASES
        if blocks:
            expand = sorted(self.expanded)
        else:
            expand = [x.strip() for x in self.expand.value.split(",") if x.strip()]
        self.picture = pic = graph_picture(
            s.program,
            s.state,
            s.mesh,
            collectives=s.collectives(),
            collapse=self.collapse.value,
            expand=expand,
            phases=phases,
            layers=self.layers() if blocks else None,
            legend=not blocks,  # its key above the drawing instead: the drawing stays narrow
        )
        self.legend.value = render.axis_legend(s.mesh) if blocks else ""
        svg = to_svg(pic.digraph)
        self.view.folds = dict(pic.folds)
        self.view.svg = svg[svg.index("<svg") :]
        self.view.show(focus if focus is not None else focus_ids(pic))
        self.select(self.bench.inspect_value.value.strip())
        steps = [(f"step {i}: {t}", i) for i, t in enumerate(s.history, 1)][: s.step]
        current = s.step if s.step else None
        self.replay_step.options = steps
        self.replay_step.value = current
        self.replay()

    def layers(self) -> dict[int, int]:
        if self._layers is None:
            self._layers = op_layers(self.bench.session.program)
        return self._layers

    def replay(self) -> None:
        """Send the events of the step chosen (once per state) and where they land."""
        s, step = self.bench.session, self.replay_step.value
        if self.picture is None or not step:
            self._replayed = (None, ())
            self.view.frames, self.view.where, self.view.replay_title = [], {}, ""
            return
        state = s.state_at(step)
        if self._replayed[0] is not state:
            events = s.events(step)
            self._replayed = (state, events)
            self.view.where = event_elements(self.picture, s.program, events)
            self.view.replay_title = f"step {step}: {s.history[step - 1]}"
            self.view.frames = event_frames(events, s.mesh)
        else:
            self.view.where = event_elements(self.picture, s.program, self._replayed[1])

    def select(self, name: str) -> None:
        """Mark the value ``name`` in the graph (nothing if it is not a value)."""
        program = self.bench.session.program
        vid = find_value(program, name, exact=True) if name and self.picture else None
        ids = () if vid is None else value_elements(self.picture, program, vid)
        self.view.selected = list(ids)

    # -- what the view says ----------------------------------------------------------------------
    def click(self, message: dict) -> None:
        pic, eid = self.picture, message.get("id", "")
        program = self.bench.session.program
        if eid in pic.folds:
            key = pic.folds[eid]
            opened = eid in pic.nodes.groups  # a folded box: open it; a frame: fold it
            (self.expanded.add if opened else self.expanded.discard)(key)
            self.draw(focus=[])
            inside = (key, key + "/", key.removesuffix("s"))  # "forward/layers" -> its layers
            again = [e for e, k in self.picture.folds.items() if k.startswith(inside)]
            self.view.show(again)  # at a readable size, whatever the zoom was
            return
        if eid in pic.collectives:
            self.why.value = render.collective_why(pic.collectives[eid], program)
            return
        vid = pic.element_value(eid)
        if vid is not None:
            self.inspect(vid)

    def inspect(self, vid: int) -> None:
        s = self.bench.session
        name = s.program.values[vid].name
        self.bench.inspect(name)
        self.why.value = (
            f"<b><code>{render.esc(name)}</code></b>: <code>{render.esc(s.sharding(name))}</code>"
            " · more in the “Inspect a value” tab below"
        )

    def search(self, text: str) -> None:
        program = self.bench.session.program
        vid = find_value(program, text.strip())
        if vid is None:
            self.why.value = render.note(f"no value named like {text.strip()!r}")
            return
        self.inspect(vid)
        if self.picture is not None:  # not while the opening holds the graph back
            self.view.show(value_elements(self.picture, program, vid))


def opening_expand(program) -> tuple[str, ...]:
    """What the panel opens: the phases folded, the forward one open on its boxes (before
    the layers, the repeated block with its count, after them): a few readable boxes for
    the whole program. With no repeated blocks, ``viz.blocks.default_expand``."""
    if program.anatomy().layers.blocks:
        return ("forward",)
    return default_expand(program)


def focus_ids(picture) -> list[str]:
    """What the view fits on after a drawing: what the last step changed (ops drawn one by
    one first, then values, then the rest), or, when nothing changed (the opening, a step
    that changed nothing), the folded boxes and the inputs and outputs: the whole program."""

    def rank(element: str) -> int:
        return 0 if element.startswith("op") else 1 if element.startswith("e") else 2

    if picture.changed:
        return sorted(picture.changed, key=rank)
    io = [n for n in picture.node_values if n.startswith(("in", "out"))]
    return [e for e in picture.folds if e in picture.nodes.groups] + io
