"""The tour in a real browser: run notebooks/00_tour.ipynb in JupyterLab and drive the workbench
widget with clicks: strategies, undo and redo, Auto."""

from __future__ import annotations

import os
import re
import shutil
import time

import pytest

from .conftest import (
    REPO,
    VIEWPORT,
    click,
    click_strategy,
    graph_labels,
    graph_view,
    open_and_run_all,
    record_progress,
    recorded_progress,
    wait_for_workbench,
    wait_settled,
    workbench,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TOUR = "00_tour.ipynb"
AUTO_TIMEOUT_S = 400
MIN_LABEL_PX = 10.0  # the graph's labels at its default view, on screen
FIT_WIDTH = 1280  # the narrowest JupyterLab the workbench fits
FIT_LABEL_PX = 11.0  # node labels in view at FIT_WIDTH
FIT_LABELS = 3
# the collective table's code cells (short text, the whole lines on hover), and its overflow
CODE_JS = """
(root) => {
  const table = root.querySelector('.wb-collectives table');
  const panel = table && table.closest('.wb-panel');
  return {
    cells: [...root.querySelectorAll('.wb-collectives td.wb-code')].map(
      td => ({text: td.textContent.trim(), title: td.getAttribute('title') || ''})),
    header: table ? [...table.querySelectorAll('th')].map(th => th.textContent) : [],
    over: table && panel && panel.getClientRects().length
      ? table.getBoundingClientRect().right - panel.getBoundingClientRect().right : null,
  };
}
"""
TOUR_LINE = re.compile(
    r"\.py:\d+ \([^)]*\btrain_step\b"
)  # a line of the tour's step (or within it)
SCREENSHOT = REPO / "docs" / "images" / "workbench_tour.png"

STEP_TIME = re.compile(r"step\D{0,20}?\d+(\.\d+)?\s*(ns|µs|us|ms|s)\b")


def step(state: dict) -> tuple[int, int]:
    """(N, count) from the status text "step N of count: ..."."""
    match = re.search(r"step (\d+) of (\d+)", state["status"] or "")
    assert match, f"no 'step N of M' in .wb-status: {state['status']!r}"
    return int(match[1]), int(match[2])


def check_sound(state: dict, when: str) -> None:
    assert not state["error"], f"{when}: .wb-error says {state['error']!r}"
    assert state["graph"], f"{when}: no <svg> in .wb-graph"
    assert STEP_TIME.search(state["estimate"] or ""), (
        f"{when}: no step time in .wb-estimate: {state['estimate']!r}"
    )
    assert state["export"] is not None, f"{when}: no .wb-export textarea"


def timed(what: str, action, *args, **kwargs):
    """``action(*args, **kwargs)``, printing how long it took and the status after it."""
    t = time.monotonic()
    result = action(*args, **kwargs)
    status = result.get("status") if isinstance(result, dict) else None
    print(f"{what}: {time.monotonic() - t:.1f} s" + (f" ({status})" if status else ""))
    return result


def view_at(page, width: int) -> dict:
    """The graph's nodes and labels in view with the page ``width`` px wide (the view fits
    again on a new size)."""
    page.set_viewport_size({"width": width, "height": VIEWPORT["height"]})
    page.wait_for_timeout(1500)
    return graph_view(page)


def test_tour_in_browser(lab_server, browser_page, page_log, tmp_path):
    page = browser_page
    timed("open the tour and run all", open_and_run_all, page, lab_server.url, TOUR)
    assert not page_log.page_errors, page_log.describe()
    wait_for_workbench(page)
    start = timed("the widget", wait_settled, page)
    check_sound(start, "after run-all")
    charts = page.locator(".wb-workbench .js-plotly-plot")
    charts.first.wait_for(timeout=60_000)
    assert charts.count() >= 3, f"the estimate's charts are not drawn: {charts.count()} plots"

    # at open, in a 1,280 px JupyterLab: the whole folded program in view, readable
    view = view_at(page, FIT_WIDTH)
    boxes = [n for n in view["nodes"] if "wb-box" in n["cls"]]
    assert len(boxes) >= 4, f"the folded phases and blocks are not drawn as boxes: {view['nodes']}"
    assert all(n["inside"] for n in boxes), f"phase boxes out of view at open: {view}"
    io = [n for n in view["nodes"] if "wb-io" in n["cls"]]
    assert io and all(n["inside"] for n in io), f"inputs or outputs out of view at open: {view}"
    readable = [lab for lab in view["labels"] if lab["px"] >= FIT_LABEL_PX]
    assert len(readable) >= FIT_LABELS, f"labels in view at open: {view['labels']}"
    print(
        f"at open: {len(view['nodes'])} nodes, {len(readable)} labels in view, zoom {view['zoom']}"
    )
    page.set_viewport_size(VIEWPORT)

    bp = timed("BP", click_strategy, page, "BP")
    check_sound(bp, "after BP")
    assert step(bp)[0] == 1, bp["status"]
    assert "BP(" in bp["export"], bp["export"]
    assert bp["graph"] != start["graph"], "the graph did not change after BP"
    assert bp["estimate"] != start["estimate"], (
        f"the estimate did not change after BP: {bp['estimate']!r}"
    )

    mp = timed("MP", click_strategy, page, "MP")
    check_sound(mp, "after MP")
    view = view_at(page, FIT_WIDTH)
    readable = [lab for lab in view["labels"] if lab["px"] >= FIT_LABEL_PX]
    assert len(readable) >= FIT_LABELS, f"labels in view after BP+MP: {view}"
    cut = [n for n in view["nodes"] if n["cutLeft"]]
    assert not cut, f"nodes cut at the graph's left edge after BP+MP: {cut}"
    inside = [n for n in view["nodes"] if n["inside"]]
    print(
        f"after BP+MP: {len(inside)} of {len(view['nodes'])} nodes, {len(readable)} labels in view"
    )
    code = workbench(page).evaluate(CODE_JS)
    assert "code" in code["header"], f"no code column in the collective table: {code['header']}"
    lines = [c for c in code["cells"] if TOUR_LINE.search(c["text"])]
    assert lines, f"no collective names a line of the tour's train_step: {code['cells'][:5]}"
    assert all(c["title"].startswith("/") and TOUR_LINE.search(c["title"]) for c in lines), lines
    assert code["over"] is not None and code["over"] <= 1, f"the table runs {code['over']} px over"
    page.set_viewport_size(VIEWPORT)
    labels = graph_labels(page)
    assert labels and min(lab["h"] for lab in labels) >= MIN_LABEL_PX, (
        f"the graph is not legible at its default view after MP: {labels[:5]}"
    )
    assert step(mp) == (2, 2), mp["status"]
    assert "BP(" in mp["export"] and "MP(" in mp["export"], mp["export"]
    assert mp["graph"] != bp["graph"], "the graph did not change after MP"
    assert mp["estimate"] != bp["estimate"], (
        f"the estimate did not change after MP: {mp['estimate']!r}"
    )

    undo = timed("Undo", click, page, "button.wb-undo")
    check_sound(undo, "after Undo")
    assert step(undo)[0] == 1, undo["status"]
    assert "MP(" not in undo["export"] and "BP(" in undo["export"], undo["export"]
    assert undo["estimate"] == bp["estimate"], "Undo did not restore the estimate after BP"

    redo = timed("Redo", click, page, "button.wb-redo")
    check_sound(redo, "after Redo")
    assert step(redo)[0] == 2, redo["status"]
    assert "MP(" in redo["export"], redo["export"]
    assert redo["estimate"] == mp["estimate"], "Redo did not restore the estimate after MP"

    undo = timed("Undo", click, page, "button.wb-undo")
    assert step(undo)[0] == 1, undo["status"]

    record_progress(page)
    auto = timed("Auto", click, page, "button.wb-auto", timeout_s=AUTO_TIMEOUT_S)
    progress = recorded_progress(page)
    print(f"Auto progress, in percent: {[p.get('value') for p in progress if p.get('visible')]}")
    assert any(p.get("visible") and (p.get("value") or 0) > 0 for p in progress), (
        f"the Auto progress bar (.wb-auto-progress) never showed progress: {progress}"
    )
    check_sound(auto, "after Auto")
    assert step(auto)[0] == 2, auto["status"]
    assert auto["export"] != undo["export"], (
        "the export did not change after Auto (it holds neither Auto nor a tactic Auto chose); "
        f"estimate before: {undo['estimate']!r}, after: {auto['estimate']!r}; export:\n{auto['export']}"
    )

    # The page as a user sees it, the widget at the top.
    page.locator(".wb-workbench").first.evaluate("el => el.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(500)
    shot = tmp_path / "workbench_tour.png"
    page.screenshot(path=str(shot), full_page=True)
    if os.environ.get("WORKBENCH_UPDATE_SCREENSHOT") == "1":
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, SCREENSHOT)

    print(page_log.describe())
    assert not page_log.page_errors, page_log.describe()
