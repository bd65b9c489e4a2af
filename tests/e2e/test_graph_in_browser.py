"""The program graph in a real browser: legible at its default view, zoomed by the wheel,
a value clicked into the inspector, a box opened, and a tactic's propagation replayed event
by event (the events the Session reports, in order, the graph changing with each)."""

from __future__ import annotations

import time

import pytest

import workbench as wb
from workbench.models import build

from .conftest import graph_labels, wait_for_workbench, wait_settled, workbench, write_and_run

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NOTEBOOK = "graph_view.ipynb"
MIN_LABEL_PX = 10.0
SCHEDULE = "[wb.BP('batch'), wb.MP('model')]"
CELLS = [
    'import os\nos.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")',
    "import workbench as wb\nfrom workbench.models import build\n"
    'ex = build("lm", "tiny")\n'
    'bench = wb.Workbench(ex.fn, *ex.args, mesh=wb.Mesh({"batch": 2, "model": 4}),\n'
    f"                     schedule={SCHEDULE})\nbench",
]

# a label's on-screen size: its glyph box's height, and its font size times the scale the
# page draws it at (the glyph box snaps to whole pixels, the font size does not)
TEXT_HEIGHT_JS = """
([root, i]) => {
  const t = root.querySelectorAll('.wb-graph svg g.node text, .wb-graph svg g.edge text')[i];
  const m = t.getScreenCTM();
  return [t.getBoundingClientRect().height,
          parseFloat(t.getAttribute('font-size')) * Math.hypot(m.a, m.b)];
}
"""
LIT_JS = """
(root) => [...root.querySelectorAll('.wb-graph svg .wb-lit, .wb-graph svg .wb-current')]
  .map(e => e.id + (e.classList.contains('wb-current') ? '*' : '')).join(' ')
  + ' #' + (root.querySelector('.wb-graph svg .wb-replay-badge')?.textContent ?? '')
"""


def _events():
    ex = build("lm", "tiny")
    s = wb.Session(
        wb.capture(ex.fn, *ex.args),
        wb.Mesh({"batch": 2, "model": 4}),
        [wb.BP("batch"), wb.MP("model")],
    )
    return s.events()


def _panel(page):
    return workbench(page).locator(".wb-graph").first


def _wait(predicate, timeout_s: float = 60, what: str = "") -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - start


def test_graph_in_browser(lab_server, browser_page, page_log, tmp_path):
    page = browser_page
    write_and_run(page, lab_server, NOTEBOOK, CELLS)
    wait_for_workbench(page)
    wait_settled(page)
    panel = _panel(page)

    # legible at the default view
    labels = graph_labels(page)
    assert len(labels) >= 5, f"too few labels in view: {labels}"
    smallest = min(labels, key=lambda lab: lab["h"])
    assert smallest["h"] >= MIN_LABEL_PX, f"a label {smallest} is under {MIN_LABEL_PX} px high"

    # a wheel zoom-in grows a label by the zoom factor
    label = max(labels, key=lambda lab: lab["h"])
    zoom0 = float(panel.get_attribute("data-zoom"))
    h0 = page.evaluate(TEXT_HEIGHT_JS, [panel.element_handle(), label["i"]])
    page.mouse.move(label["x"], label["y"])
    page.mouse.wheel(0, -240)
    _wait(lambda: float(panel.get_attribute("data-zoom")) != zoom0, what="the wheel to zoom")
    page.wait_for_timeout(200)
    zoom1 = float(panel.get_attribute("data-zoom"))
    h1 = page.evaluate(TEXT_HEIGHT_JS, [panel.element_handle(), label["i"]])
    assert zoom1 > zoom0 * 1.05, (zoom0, zoom1)
    factor = zoom1 / zoom0
    assert h1[1] == pytest.approx(h0[1] * factor, rel=0.01), (h0, h1, zoom0, zoom1)
    assert abs(h1[0] - h0[0] * factor) <= 2.5, (h0, h1, zoom0, zoom1)  # whole pixels
    panel.locator(".wb-readable").click()

    # clicking a value shows it in the inspector and marks it in the graph
    edge = next(lab for lab in graph_labels(page) if lab["owner"].startswith("e"))
    before = wait_settled(page)
    page.mouse.click(edge["x"], edge["y"])
    _wait(lambda: panel.locator(".wb-selected").count() > 0, what="the clicked value marked")
    why = workbench(page).locator(".wb-graph-why").inner_text()
    name = why.split(":")[0].strip()
    inspector = workbench(page).locator(".wb-inspector")
    _wait(lambda: name in inspector.inner_text(), what=f"{name} in the inspector")
    assert before["status"] == wait_settled(page)["status"]

    # from the keyboard: + zooms in; n walks to a value, Enter inspects it
    stage = panel.locator(".wb-gv-stage")
    stage.focus()
    zoom = float(panel.get_attribute("data-zoom"))
    page.keyboard.press("+")
    _wait(lambda: float(panel.get_attribute("data-zoom")) > zoom, what="+ to zoom in")
    page.keyboard.press("1")
    for _ in range(200):
        page.keyboard.press("n")
        cursor = panel.evaluate("el => el.querySelector('.wb-cursor')?.id || ''")
        if cursor.startswith("e"):
            break
    assert cursor.startswith("e"), f"n never reached an edge: {cursor}"
    shown = inspector.inner_text()
    page.keyboard.press("Enter")
    _wait(lambda: inspector.inner_text() != shown, what="Enter to inspect the value")
    assert panel.evaluate(
        f"el => el.querySelector('[id=\"{cursor}\"]').classList.contains('wb-selected')"
    )

    # a folded box opens on a click
    panel.locator(".wb-fit").click()
    page.wait_for_timeout(200)  # svg-pan-zoom moves the drawing on the next frame
    box = panel.locator("g.node.wb-foldable polygon").first.bounding_box()
    svg_before = panel.locator("svg").first.evaluate("s => s.outerHTML.length")
    clusters = panel.locator("g.cluster.wb-foldable").count()
    started = time.monotonic()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    _wait(
        lambda: (
            panel.locator("g.cluster.wb-foldable").count() != clusters
            or panel.locator("svg").first.evaluate("s => s.outerHTML.length") != svg_before
        ),
        what="the box to open",
    )
    print(f"open a box: {time.monotonic() - started:.2f} s")

    # boxes open into boxes (a phase, the repeated block, a layer): open until a frame shows
    for _ in range(4):
        if panel.locator("g.cluster.wb-foldable").count():
            break
        wait_settled(page)
        svg_before = panel.locator("svg").first.evaluate("s => s.outerHTML.length")
        panel.locator("g.node.wb-foldable").first.dispatch_event("click")
        _wait(
            lambda s=svg_before: (
                panel.locator("svg").first.evaluate("s => s.outerHTML.length") != s
            ),
            what="a box to open",
        )

    # and an opened block's frame folds it again (a click event on its title: the view
    # opens on what was opened, where the title may sit outside the panel)
    wait_settled(page)
    frames = panel.locator("g.cluster.wb-foldable")
    n_frames = frames.count()
    started = time.monotonic()
    frames.first.locator("text").first.dispatch_event("click")
    _wait(lambda: frames.count() < n_frames, what="the block to fold")
    print(f"fold a block: {time.monotonic() - started:.2f} s")

    # the replay steps through the Session's events in order, the graph changing each step
    events = _events()
    count = workbench(page).locator(".wb-replay-count")
    assert count.inner_text().startswith(f"{len(events)} events"), count.inner_text()
    panel.locator(".wb-replay-start").click()
    text = workbench(page).locator(".wb-replay-text")
    seen = [panel.evaluate(LIT_JS)]
    for k in range(1, 9):
        started = time.monotonic()
        panel.locator(".wb-replay-forward").click()
        _wait(lambda k=k: text.inner_text().startswith(f"{k}."), what=f"event {k}")
        print(f"replay step {k}: {time.monotonic() - started:.3f} s")
        assert text.inner_text() == f"{events[k - 1].index}. {events[k - 1].text}"
        assert f"event {k} of {len(events)}" in count.inner_text()
        seen.append(panel.evaluate(LIT_JS))
        assert seen[-1] != seen[-2], f"the graph did not change at event {k}"
    panel.locator(".wb-replay-back").click()
    _wait(lambda: text.inner_text().startswith("7."), what="a step back")
    assert panel.evaluate(LIT_JS) == seen[7]
    panel.screenshot(path=str(tmp_path / "graph.png"))
    print(f"screenshot: {tmp_path / 'graph.png'}")
    assert not page_log.page_errors, page_log.describe()
