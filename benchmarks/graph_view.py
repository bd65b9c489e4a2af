"""The graph panel in a real browser: open, zoom, expand and replay, at 8 and 80 layers.

The zoo LM at the "huge" preset's widths (the 70B shape: d 8192, 64 heads, ffn 28672, bf16
with f32 master weights and Adam) planned from shapes on a 2,048 x 4 mesh, BP then MP, in a
Workbench shown in JupyterLab and driven in headless Chromium (Playwright), as the browser
tests drive it. Per depth:

- Python: capture, ``Workbench`` (all of its views), and one redraw of the graph
  (``graph_picture`` + ``dot`` + the replay's placement), the MP step's events and the
  bytes the panel is sent (SVG, events, where they land);
- browser, measured in the page from the action to the second animation frame after it:
  the first drawing of the panel (parse the SVG, pan/zoom, open on what MP changed),
  a zoom-in by the button and by the wheel, a replay step forward and a jump of the slider
  to the middle of the events;
- browser, end to end: a click on the folded repeated block (``layers 1–79 ×79``) until the
  panel has drawn one box per layer (a round trip to the kernel, a redraw in Python, a
  drawing in the page), and a click on layer 0's frame until it is folded again.

Target (issue "The graph you can read and watch"): each under 1 s at 80 layers.

    python benchmarks/graph_view.py [--layers 8 80] [--repeats 5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the e2e helpers

import nbformat

import workbench as wb
from tests.e2e import conftest as e2e
from workbench.models import build, lm
from workbench.viz import event_elements, event_frames, graph_picture, to_svg
from workbench.viz.blocks import default_expand, op_layers

MESH = {"data": 2048, "model": 4}
SETUP = (
    "import os\n"
    'os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")\n'
    "import time\nimport workbench as wb\nfrom workbench.models import build, lm\n"
    'ex = build("lm", lm.Config.preset("huge", n_layers={n}), abstract=True)\n'
    "program = wb.capture(ex.fn, *ex.args)\n"
)
SHOW = (
    "t = time.perf_counter()\n"
    f"bench = wb.Workbench(program, mesh=wb.Mesh({MESH!r}), "
    'schedule=[wb.BP("data"), wb.MP("model")])\n'
    "print(f'workbench {time.perf_counter() - t:.2f} s')\nbench"
)

TIMED_JS = """
async ([root, what]) => {
  const frame = () => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const stage = root.querySelector('.wb-gv-stage');
  const box = stage.getBoundingClientRect();
  const t0 = performance.now();
  if (what === 'zoom') root.querySelector('.wb-zoom-in').click();
  if (what === 'wheel') stage.querySelector('svg').dispatchEvent(new WheelEvent('wheel', {
      deltaY: -120, clientX: box.left + box.width / 2, clientY: box.top + box.height / 2,
      bubbles: true, cancelable: true}));
  if (what === 'fit') root.querySelector('.wb-fit').click();
  if (what === 'step') root.querySelector('.wb-replay-forward').click();
  if (what === 'back') root.querySelector('.wb-replay-back').click();
  if (what === 'jump') {
    const s = root.querySelector('.wb-replay-slider');
    s.value = String(Math.floor(Number(s.max) / 2)); s.dispatchEvent(new Event('input'));
  }
  await frame();
  return performance.now() - t0;
}
"""


@contextlib.contextmanager
def lab(root: Path):
    """JupyterLab on ``root`` with its state in a temporary directory, as the e2e tests run it."""
    tmp = Path(tempfile.mkdtemp(prefix="graph-view-bench-"))
    config = tmp / "config"
    for name, values in e2e.USER_SETTINGS.items():
        path = config / "lab" / "user-settings" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    settings, _ = e2e._lab_settings_dir(tmp)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(config), JUPYTER_DATA_DIR=str(tmp / "data"))
    env.update(JUPYTER_RUNTIME_DIR=str(tmp / "runtime"), IPYTHONDIR=str(tmp / "ipython"))
    port = e2e._free_port()
    args = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1"]
    args += [f"--port={port}", "--IdentityProvider.token=", f"--ServerApp.root_dir={root}"]
    args += [f"--LabApp.app_settings_dir={settings}", "--LabApp.expose_app_in_browser=True"]
    args += ["--allow-root"] if os.geteuid() == 0 else []
    log = (tmp / "server.log").open("wb")
    process = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(480):
            with contextlib.suppress(Exception):
                e2e._get_json(f"{url}/api/status")
                break
            time.sleep(0.25)
        yield url
    finally:
        e2e._stop_server(process)


def python_side(n_layers: int) -> dict:
    ex = build("lm", lm.Config.preset("huge", n_layers=n_layers), abstract=True)
    t = time.perf_counter()
    program = wb.capture(ex.fn, *ex.args)
    capture = time.perf_counter() - t
    s = wb.Session(program, wb.Mesh(MESH), [wb.BP("data"), wb.MP("model")])
    layers = op_layers(program)
    events = s.events()

    def redraw():
        pic = graph_picture(
            program, s.state, s.mesh, collectives=s.collectives(), collapse="blocks",
            expand=default_expand(program), layers=layers,
        )  # fmt: skip
        return pic, to_svg(pic.digraph), event_elements(pic, program, events)

    pic, svg, where = redraw()
    return dict(
        ops=len(program.ops),
        capture=capture,
        redraw=_common.median_time(redraw),
        events=len(events),
        svg_kb=len(svg) / 1024,
        events_kb=len(json.dumps(event_frames(events, s.mesh))) / 1024,
        where_kb=len(json.dumps(where)) / 1024,
        nodes=len(pic.nodes.drawn) + len(pic.nodes.groups),
    )


def _draws(panel) -> int:
    return int(panel.get_attribute("data-draws") or 0)


def _click_until_drawn(page, panel, locator) -> float:
    """Click ``locator`` (a click event on it: at 80 layers it may be a pixel high in view)
    and wait until the panel has drawn again: seconds."""
    before = _draws(panel)
    t = time.perf_counter()
    locator.dispatch_event("click")
    while _draws(panel) == before:
        if time.perf_counter() - t > 120:
            raise TimeoutError("the panel did not draw again within 120 s of a click")
        time.sleep(0.01)
    return time.perf_counter() - t


def browser_side(page, url: str, notebook: str, repeats: int) -> dict:
    ran = e2e.open_and_run_all(page, url, notebook, timeout_s=900)
    e2e.wait_for_workbench(page)
    panel = e2e.workbench(page).locator(".wb-graph").first
    page.wait_for_function("(el) => el.dataset.drawMs", arg=panel.element_handle())
    panel.scroll_into_view_if_needed()
    e2e.wait_settled(page, timeout_s=300)
    first = float(panel.get_attribute("data-draw-ms")) / 1000
    labels = e2e.graph_labels(page)
    if not labels:
        page.screenshot(path="/tmp/graph_view_nolabels.png")
        raise AssertionError("no label in view at the default view (/tmp/graph_view_nolabels.png)")
    label_px = min(lab["h"] for lab in labels)
    handle = panel.element_handle()

    def timed(what: str) -> float:
        times = [page.evaluate(TIMED_JS, [handle, what]) / 1000 for _ in range(repeats)]
        return statistics.median(times)

    zoom, wheel = timed("zoom"), timed("wheel")
    panel.locator(".wb-replay-start").click()
    step, back, jump = timed("step"), timed("back"), timed("jump")
    repeated = re.compile(r"layers \d+–\d+ ×\d+")  # the folded repeated block
    block = panel.locator("g.node.wb-foldable", has_text=repeated).locator("polygon").first
    expand = _click_until_drawn(page, panel, block)
    e2e.wait_settled(page, timeout_s=300)
    frame = panel.locator("g.cluster.wb-foldable > text").first
    fold = _click_until_drawn(page, panel, frame)
    return dict(run_all=ran["seconds"], first_draw=first, label_px=label_px, zoom=zoom,
                wheel=wheel, step=step, back=back, jump=jump, expand=expand, fold=fold)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[8, 80])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    root = Path(tempfile.mkdtemp(prefix="graph-view-notebooks-"))
    rows_py, rows_browser = [], []
    with lab(root) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=e2e.shutil.which("chromium"),
                                    args=e2e.CHROMIUM_ARGS)  # fmt: skip
        for n in args.layers:
            py = python_side(n)
            rows_py.append([n, py["ops"], f"{py['capture']:.1f}", f"{py['redraw']:.2f}",
                            py["nodes"], py["events"], f"{py['svg_kb']:.0f}",
                            f"{py['events_kb']:.0f}", f"{py['where_kb']:.0f}"])  # fmt: skip
            name = f"graph_view_{n}.ipynb"
            cells = [SETUP.format(n=n), SHOW]
            nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
            nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
            nbformat.write(nb, root / name)
            context = browser.new_context(viewport=e2e.VIEWPORT)
            context.set_default_timeout(300_000)
            page = context.new_page()
            try:
                b = browser_side(page, url, name, args.repeats)
            finally:
                context.close()
            rows_browser.append([n, f"{b['run_all']:.0f}", f"{b['first_draw']:.2f}",
                                 f"{b['label_px']:.1f}", f"{b['zoom'] * 1000:.0f}",
                                 f"{b['wheel'] * 1000:.0f}", f"{b['step'] * 1000:.0f}",
                                 f"{b['back'] * 1000:.0f}", f"{b['jump'] * 1000:.0f}",
                                 f"{b['expand']:.2f}", f"{b['fold']:.2f}"])  # fmt: skip
        browser.close()
    print(f"machine: {_common.machine()}")
    print("\nPython: the graph of BP then MP (redraw = picture + dot + placing the replay)\n")
    print(_common.table(["layers", "ops", "capture s", "redraw s", "nodes", "MP events",
                         "SVG KiB", "events KiB", "where KiB"], rows_py))  # fmt: skip
    print("\nBrowser (Chromium, headless): first draw in s, the rest in ms, then s end to end\n")
    print(_common.table(["layers", "run-all s", "first draw s", "smallest label px",
                         "zoom ms", "wheel ms", "step ms", "back ms", "jump ms",
                         "expand s", "fold s"], rows_browser))  # fmt: skip


if __name__ == "__main__":
    main()
