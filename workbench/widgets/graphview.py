"""``GraphView``: the program graph as a panel you pan, zoom, click and replay.

An anywidget: the browser side (``graphview.js``, with svg-pan-zoom from ``vendor/``, all
shipped in the package) pans and zooms, shows tips, and plays a replay's frames; clicks
and searches come back as messages to the handlers the owner registers. It holds no logic:
what to draw, open, select or replay is the owner's (the `Workbench`) to decide.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anywidget
import traitlets

from workbench.core.errors import InputError, given

HERE = Path(__file__).parent
MODES = ("fit", "readable")


def _esm() -> str:
    """The panel's module: svg-pan-zoom (BSD-2, see vendor/), then graphview.js."""
    vendor = (HERE / "vendor" / "svg-pan-zoom.min.js").read_text()
    return (
        "const svgPanZoom = (function (define, require) {\n"
        f"{vendor}\n"
        "return window.svgPanZoom;\n})();\n" + (HERE / "graphview.js").read_text()
    )


class GraphView(anywidget.AnyWidget):
    """The graph panel. ``svg``: the drawing; ``folds``: element id -> the key it opens or
    folds; ``focus``: ``{"ids": [...], "mode": "fit" | "readable", "keep_zoom": bool}`` the
    elements to show (set a new dict to move there: see ``show``); ``selected``: element ids marked as the inspected value;
    ``frames``: a replay (``viz.event_frames``), its ``replay_title``, and ``where`` its
    events land in this drawing (``viz.event_elements``)."""

    _esm = _esm()
    _css = (HERE / "graphview.css").read_text()

    svg = traitlets.Unicode("").tag(sync=True)
    folds = traitlets.Dict().tag(sync=True)
    focus = traitlets.Dict({"ids": [], "mode": "fit", "keep_zoom": False}).tag(sync=True)
    selected = traitlets.List().tag(sync=True)
    frames = traitlets.List().tag(sync=True)
    where = traitlets.Dict().tag(sync=True)
    replay_title = traitlets.Unicode("").tag(sync=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._handlers: dict[str, Callable[[dict], None]] = {}
        self.on_msg(self._message)

    def on(self, event: str, handler: Callable[[dict], None]) -> None:
        """Call ``handler(message)`` on ``event``: ``"click"`` (``id``: the element),
        ``"search"`` (``text``) or ``"shown"`` (a view is first on the page, painted)."""
        self._handlers[event] = handler

    def _message(self, _widget, content: dict, _buffers) -> None:
        handler = self._handlers.get(content.get("event"))
        if handler is not None:
            handler(content)

    def show(self, ids, mode: str = "fit", keep_zoom: bool = False) -> None:
        """Move the view onto the elements ``ids``: ``"fit"`` as large as they fit with labels
        still readable (11 px and up), the window holding most of them where they do not
        all fit; ``"readable"`` at the readable scale; ``keep_zoom`` at the zoom it has. The
        view stays on the drawing. No ids: the top of the whole drawing."""
        if mode not in MODES:
            raise InputError(
                f"GraphView.show: mode {given(mode)} is not a way to show; use one of {MODES}"
            )
        n = self.focus.get("n", 0) + 1
        self.focus = {"ids": list(ids), "mode": mode, "keep_zoom": keep_zoom, "n": n}
