"""The workbench fits the page, in a real browser at 1,280 and 1,600 px: the graph opens
fitted on the folded program and, after each step, on what the step changed, with labels
readable; no panel runs wider than itself and every chart legend lies inside its panel; a
failure provoked from each panel shows its message in that panel while every panel still
shows the session."""

from __future__ import annotations

import pytest

from .conftest import (
    click,
    click_strategy,
    graph_view,
    wait_for_workbench,
    wait_settled,
    write_and_run,
)
from .conftest import workbench as root_of

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NOTEBOOK = "fit_view.ipynb"
WIDTHS = (1280, 1600)
MIN_FONT_PX = 11.0
MIN_LABELS = 3
CELLS = [
    'import os\nos.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")',
    # 16 devices in the plan, 8 attached: planning works, running fails
    "import workbench as wb\nfrom workbench.models import build\n"
    'ex = build("lm", "tiny")\n'
    'bench = wb.Workbench(ex.fn, *ex.args, mesh=wb.Mesh({"batch": 4, "model": 4}))\nbench',
]

# node labels inside the graph's visible box, with their rendered font size
LABELS_JS = """
(root) => {
  const stage = root.querySelector('.wb-gv-stage').getBoundingClientRect();
  const out = [];
  for (const t of root.querySelectorAll('.wb-graph svg g.node text')) {
    const r = t.getBoundingClientRect(), m = t.getScreenCTM();
    if (!t.textContent.trim() || r.height === 0 || !m) continue;
    if (r.left < stage.left || r.right > stage.right || r.top < stage.top || r.bottom > stage.bottom) continue;
    out.push({text: t.textContent, px: parseFloat(t.getAttribute('font-size')) * Math.hypot(m.a, m.b)});
  }
  return out;
}
"""
# every panel (and the root, each chart) whose content is wider than its box
OVERFLOW_JS = """
(root) => [root, ...root.querySelectorAll('.wb-panel, .wb-chart, .wb-left')]
  .filter(e => e.getClientRects().length && e.scrollWidth > e.clientWidth + 1)
  .map(e => `${e.className.split(' ').filter(c => c.startsWith('wb-')).join('.')}: `
            + `scrollWidth ${e.scrollWidth} > clientWidth ${e.clientWidth}`)
"""
# every chart legend item whose box leaves its chart's panel
LEGEND_JS = """
(root) => {
  const out = [], items = [];
  for (const chart of root.querySelectorAll('.wb-chart')) {
    const panel = chart.getBoundingClientRect();
    for (const item of chart.querySelectorAll('.legend .traces')) {
      const r = item.getBoundingClientRect();
      items.push(item.textContent);
      if (r.left < panel.left - 1 || r.right > panel.right + 1 || r.top < panel.top - 1
          || r.bottom > panel.bottom + 1) {
        out.push(`${item.textContent}: [${r.left}, ${r.right}] outside [${panel.left}, ${panel.right}]`);
      }
    }
  }
  return {items, out};
}
"""


def check_fits(page, when: str) -> None:
    root = root_of(page)
    overflow = root.evaluate(OVERFLOW_JS)
    assert not overflow, f"{when}: panels wider than themselves: {overflow}"
    legends = root.evaluate(LEGEND_JS)
    assert legends["items"], f"{when}: no chart legend on the page"
    assert not legends["out"], f"{when}: legend items cut: {legends['out']}"
    labels = [lab for lab in root.evaluate(LABELS_JS) if lab["px"] >= MIN_FONT_PX]
    assert len(labels) >= MIN_LABELS, (
        f"{when}: {len(labels)} node labels of {MIN_FONT_PX} px and up in the graph's view: "
        f"{root.evaluate(LABELS_JS)[:8]}"
    )


def check_whole(page, when: str) -> None:
    """The whole folded program in view: every box, input and output."""
    view = graph_view(page)
    kept = [n for n in view["nodes"] if "wb-box" in n["cls"] or "wb-io" in n["cls"]]
    assert len(kept) >= 5, f"{when}: the folded program is not drawn: {view['nodes']}"
    out = [n for n in kept if not n["inside"]]
    assert not out, f"{when}: out of the graph's view (zoom {view['zoom']}): {out}"


def at_each_width(page, when: str, whole: bool = False) -> None:
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 1000})
        page.wait_for_timeout(1500)  # the panels, the charts and the graph's fit follow the size
        check_fits(page, f"{when} at {width} px")
        if whole:
            check_whole(page, f"{when} at {width} px")


def panel_error(page, name: str) -> str:
    lines = root_of(page).locator(f".wb-panel-{name} .wb-panel-error")
    return " ".join(lines.all_inner_texts()).strip()


def check_session_shown(state: dict, when: str) -> None:
    assert "step 2 of 2" in (state["status"] or ""), f"{when}: status {state['status']!r}"
    assert state["graph"], f"{when}: no graph"
    assert "MP(" in (state["export"] or ""), f"{when}: export {state['export']!r}"
    assert "step" in (state["estimate"] or ""), f"{when}: estimate {state['estimate']!r}"


def test_fit_in_browser(lab_server, browser_page, page_log):
    page = browser_page
    write_and_run(page, lab_server, NOTEBOOK, CELLS)
    wait_for_workbench(page)
    wait_settled(page)
    root_of(page).locator(".js-plotly-plot").first.wait_for(timeout=60_000)
    root_of(page).scroll_into_view_if_needed()
    at_each_width(page, "at open", whole=True)

    click_strategy(page, "BP")
    state = click_strategy(page, "MP")
    assert not state["error"], state["error"]
    at_each_width(page, "after BP and MP")

    # a failure from each panel: its message there, every panel still on the session
    root = root_of(page)
    root.locator(".wb-value input").fill("params/nothing")
    state = click(page, "button.wb-apply")
    assert "matches no value" in panel_error(page, "tactic")
    check_session_shown(state, "after a bad tactic")

    budget = root.locator(".wb-auto-budget input")
    budget.fill("0")
    budget.press("Enter")
    state = click(page, "button.wb-auto")
    assert "budget=0" in panel_error(page, "auto"), panel_error(page, "auto")
    assert not panel_error(page, "tactic"), "the last action's error line was not cleared"
    check_session_shown(state, "after Auto refused")

    root.locator(".wb-panel-sections .lm-TabBar-tab", has_text="Run").click()
    state = click(page, "button.wb-run")
    assert "run failed" in panel_error(page, "sections"), panel_error(page, "sections")
    assert "running" not in root.locator(".wb-run-result").inner_text()
    check_session_shown(state, "after a failed run")

    path = root.locator(".wb-save-path input")
    path.fill(str(lab_server.root_dir))  # a folder, not a file
    path.press("Enter")
    state = click(page, "button.wb-save")
    assert "save failed" in panel_error(page, "export"), panel_error(page, "export")
    check_session_shown(state, "after a bad save")
    check_fits(page, "after the failures")
    assert not page_log.page_errors, page_log.describe()
