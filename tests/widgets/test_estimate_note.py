"""The workbench's estimate line shows the estimate's note (a session's placement that the
hardware cannot take), escaped, and nothing where there is none."""

import html

import workbench as wb
from workbench.core.hardware.placement import Placement
from workbench.models import build
from workbench.widgets import render


def test_the_estimate_line_shows_the_note():
    ex = build("mlp", "tiny", abstract=True)
    s = wb.Session(wb.capture(ex.fn, *ex.args), wb.Mesh({"batch": 2, "model": 4}))
    s.apply(wb.BP("batch"))
    assert "note:" not in render.estimate(s.estimate("h100"))
    s.place(Placement(("nvlink", "infiniband"), (("batch", (2, 1)), ("model", (2, 2)))))
    e = s.estimate("h100")
    assert e.note and f"note: {html.escape(e.note, quote=True)}</span>" in render.estimate(e)
