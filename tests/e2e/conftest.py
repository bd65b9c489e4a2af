"""Fixtures for the real-browser test: a headless JupyterLab and a Chromium page driven by Playwright.

``lab_server`` starts JupyterLab on a free port with all of its state (config, data, runtime,
IPython profile) in a temporary directory and serves a temporary copy of ``notebooks/``, so
the test never writes into the repository. Kernels get 8 virtual CPU devices through
``XLA_FLAGS``. ``browser_page`` opens a Chromium page on it and records console errors and
uncaught page errors. The helpers drive the notebook through JupyterLab's own command
registry (exposed as ``window.jupyterapp``) and the workbench widget through its DOM contract:
the ``wb-*`` classes.

Chromium is Debian's (``apt-get install chromium``; ``./scripts/test`` installs it when run as
root). Set ``WORKBENCH_SKIP_BROWSER=1`` to skip these tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# JupyterLab's news and update checks: their pop-up would cover the notebook in screenshots.
# scripts/setup writes this override into the environment's lab settings; the server here
# reads a copy of those settings with this added where it is missing.
NOTIFICATION_OVERRIDES = {
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}
}
# Render every cell (no windowing), so the widget is in the DOM wherever it sits.
USER_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"}
}

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
VIEWPORT = {"width": 1440, "height": 1000}

SERVER_START_TIMEOUT_S = 120
KERNEL_START_TIMEOUT_S = 180
RUN_ALL_TIMEOUT_S = 600
WIDGET_TIMEOUT_S = 120
ACTION_TIMEOUT_S = 180
QUIET_S = 0.75


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the item, so fixtures can tell whether the test failed."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


# -- the server -----------------------------------------------------------------------------


@dataclass
class LabServer:
    url: str  # http://127.0.0.1:PORT, no trailing slash
    root_dir: Path  # what the server serves: a copy of notebooks/
    log_path: Path
    process: subprocess.Popen

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no server log)"
        return "\n".join(text.splitlines()[-lines:])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url: str, timeout: float = 5) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def _lab_settings_dir(tmp: Path) -> tuple[Path, dict]:
    """A copy of the environment's lab settings (``overrides.json`` and the rest), with the
    notification override added where the environment does not set it; and the overrides."""
    from jupyterlab.commands import get_app_dir

    source = Path(get_app_dir()) / "settings"
    target = tmp / "lab-settings"
    if source.is_dir():
        shutil.copytree(source, target)
    target.mkdir(parents=True, exist_ok=True)
    overrides_path = target / "overrides.json"
    overrides = json.loads(overrides_path.read_text()) if overrides_path.exists() else {}
    for plugin, values in NOTIFICATION_OVERRIDES.items():
        for key, value in values.items():
            overrides.setdefault(plugin, {}).setdefault(key, value)
    overrides_path.write_text(json.dumps(overrides, indent=2))
    return target, overrides


def _descendants(pid: int) -> list:
    try:
        import psutil

        return psutil.Process(pid).children(recursive=True)
    except Exception:
        return []


def _stop_server(process: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (the server shuts its kernels down), SIGKILL
    after a grace period, then kill any kernel still running: kernels get sessions of their
    own, so they are not in the server's group."""
    kernels = _descendants(process.pid)
    for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        if process.poll() is not None:
            break
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace)
    for child in kernels:
        try:
            if child.is_running():
                child.kill()
        except Exception:
            pass


@pytest.fixture(scope="session")
def notebooks_source() -> Path:
    """The notebooks the server serves (a copy of them)."""
    return REPO / "notebooks"


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory, notebooks_source, chromium_path) -> Iterator[LabServer]:
    """JupyterLab on a copy of ``notebooks_source``; stopped, kernels included, at the end."""
    tmp = tmp_path_factory.mktemp("lab")
    root_dir = tmp / "notebooks"
    shutil.copytree(notebooks_source, root_dir, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    config_dir, data_dir, runtime_dir = tmp / "config", tmp / "data", tmp / "runtime"
    for d in (config_dir, data_dir, runtime_dir):
        d.mkdir()
    for name, values in USER_SETTINGS.items():
        path = config_dir / "lab" / "user-settings" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))

    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        flags = f"{flags} --xla_force_host_platform_device_count=8".strip()
    env.update(
        XLA_FLAGS=flags,
        JUPYTER_CONFIG_DIR=str(config_dir),
        JUPYTER_DATA_DIR=str(data_dir),
        JUPYTER_RUNTIME_DIR=str(runtime_dir),
        IPYTHONDIR=str(tmp / "ipython"),
        PYTHONUNBUFFERED="1",
    )
    env.pop("JUPYTERLAB_SETTINGS_DIR", None)
    env.pop("JUPYTERLAB_WORKSPACES_DIR", None)

    settings_dir, overrides = _lab_settings_dir(tmp)
    port = _free_port()
    args = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        "--IdentityProvider.token=",
        f"--ServerApp.root_dir={root_dir}",
        "--ServerApp.terminals_enabled=False",
        f"--LabApp.app_settings_dir={settings_dir}",
        "--LabApp.expose_app_in_browser=True",
    ]
    if os.geteuid() == 0:
        args.append("--allow-root")
    log_path = tmp / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            args,
            cwd=root_dir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = LabServer(f"http://127.0.0.1:{port}", root_dir, log_path, process)
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(
                    f"JupyterLab exited with code {process.returncode}:\n{server.log_tail()}"
                )
            try:
                _get_json(f"{server.url}/api/status")
                break
            except (OSError, urllib.error.URLError, ValueError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"JupyterLab did not answer {server.url}/api/status within "
                    f"{SERVER_START_TIMEOUT_S} s:\n{server.log_tail()}"
                )
            time.sleep(0.25)
        # The settings overrides are in force: without them the news pop-up covers the page.
        plugin = "@jupyterlab/apputils-extension:notification"
        schema = _get_json(f"{server.url}/lab/api/settings/{plugin}")
        defaults = {k: v.get("default") for k, v in schema["schema"]["properties"].items()}
        expected = overrides[plugin]
        assert {k: defaults.get(k) for k in expected} == expected, (
            f"the lab settings override did not apply: notification defaults are {defaults}"
        )
        yield server
    finally:
        _stop_server(process)


# -- the browser ----------------------------------------------------------------------------


@dataclass
class PageLog:
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)

    def describe(self) -> str:
        parts = [f"page errors: {self.page_errors or 'none'}"]
        parts.append(
            "console errors:" + ("".join(f"\n  {e}" for e in self.console_errors) or " none")
        )
        return "\n".join(parts)


@pytest.fixture(scope="session")
def chromium_path() -> str:
    if os.environ.get("WORKBENCH_SKIP_BROWSER") == "1":
        pytest.skip("WORKBENCH_SKIP_BROWSER=1")
    path = shutil.which("chromium")
    if path is None:
        pytest.fail(
            "the browser test needs Debian's chromium, which is not on PATH: run ./scripts/test as "
            "root (it installs it) or `apt-get install chromium`; set WORKBENCH_SKIP_BROWSER=1 to "
            "skip this test",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="session")
def browser(chromium_path):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the browser test needs playwright: pip install -e '.[test]'", pytrace=False)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page_log() -> PageLog:
    return PageLog()


@pytest.fixture
def browser_page(request, browser, lab_server, page_log, tmp_path):
    """A page on the server. On failure: a screenshot in tmp_path, the widget's status and
    error text, the console and the server log's tail are printed."""
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(60_000)
    page = context.new_page()
    page.on("pageerror", lambda error: page_log.page_errors.append(error.stack or str(error)))
    page.on(
        "console",
        lambda message: (
            page_log.console_errors.append(f"{message.text} ({message.location.get('url', '')})")
            if message.type == "error"
            else None
        ),
    )
    try:
        yield page
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            _report_failure(page, page_log, lab_server, tmp_path)
        elif page_log.page_errors:
            pytest.fail(f"uncaught errors in the page:\n{page_log.describe()}")
    finally:
        context.close()


def _report_failure(page, page_log: PageLog, lab_server: LabServer, tmp_path: Path) -> None:
    shot = tmp_path / "failure.png"
    try:
        page.screenshot(path=str(shot), full_page=True)
        print(f"screenshot: {shot}")
    except Exception as error:
        print(f"no screenshot: {error}")
    try:
        print(f"widget: {_short(widget_state(page))}")
    except Exception as error:
        print(f"no widget state: {error}")
    print(page_log.describe())
    print(f"server log:\n{lab_server.log_tail()}")


# -- notebook helpers ------------------------------------------------------------------------

_OPEN_AND_RUN_JS = """
(path) => {
  const st = window.__wbRun = {phase: 'lab', error: null};
  (async () => {
    const app = window.jupyterapp;
    await app.restored;
    app.shell.collapseLeft();
    st.phase = 'open';
    const panel = await app.commands.execute('docmanager:open', {path, factory: 'Notebook'});
    window.__wbPanel = panel;
    await panel.context.ready;
    st.phase = 'kernel';
    await panel.sessionContext.ready;
    while (!(panel.sessionContext.session?.kernel?.status === 'idle'
             && panel.sessionContext.session.kernel.connectionStatus === 'connected')) {
      await new Promise(resolve => setTimeout(resolve, 200));
    }
    st.phase = 'run';
    app.shell.activateById(panel.id);
    await app.commands.execute('runmenu:run-all');
    st.phase = 'ran';
  })().catch(error => { st.error = String((error && error.stack) || error); });
}
"""

_CELLS_JS = """
() => {
  const panel = window.__wbPanel;
  const cells = [];
  panel.content.widgets.forEach((cell, index) => {
    if (cell.model.type !== 'code') return;
    const outputs = cell.model.outputs.toJSON();
    cells.push({
      index,
      count: cell.model.executionCount,
      running: cell.model.executionState === 'running'
               || (cell.promptNode?.textContent || '').includes('*'),
      errors: outputs.filter(o => o.output_type === 'error')
                     .map(o => `${o.ename}: ${o.evalue}\\n` + (o.traceback || []).join('\\n')),
    });
  });
  return {kernel: panel.sessionContext.session?.kernel?.status ?? 'none', cells};
}
"""


_WIDGET_OUTPUTS_JS = """
() => {
  const found = [];
  window.__wbPanel?.content.widgets.forEach((cell, index) => {
    if (cell.model.type !== 'code') return;
    for (const o of cell.model.outputs.toJSON()) {
      const data = o.data || {};
      if ('application/vnd.jupyter.widget-view+json' in data) {
        found.push({cell: index, text: String(data['text/plain'] || '').slice(0, 300)});
      }
    }
  });
  return found;
}
"""


def _dialog_text(page) -> str:
    dialogs = page.locator(".jp-Dialog")
    return " | ".join(dialogs.all_inner_texts()) if dialogs.count() else ""


def _wait_phase(page, phase: str, timeout_s: float, what: str) -> None:
    phases = ["lab", "open", "kernel", "run", "ran"]
    later = phases[phases.index(phase) :]
    deadline = time.monotonic() + timeout_s
    while True:
        state = page.evaluate("() => window.__wbRun")
        if state["error"]:
            pytest.fail(f"{what} failed in JupyterLab: {state['error']}", pytrace=False)
        if state["phase"] in later:
            return
        if time.monotonic() > deadline:
            pytest.fail(
                f"{what} did not happen within {timeout_s:.0f} s (stuck at {state['phase']!r}); "
                f"dialog: {_dialog_text(page) or 'none'}",
                pytrace=False,
            )
        time.sleep(0.5)


def write_and_run(page, lab_server: LabServer, notebook: str, cells: list[str]) -> dict:
    """Write ``cells`` as a Python 3 notebook named ``notebook`` into the server's root, then
    open it and run every cell (``open_and_run_all``)."""
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, lab_server.root_dir / notebook)
    return open_and_run_all(page, lab_server.url, notebook)


def open_and_run_all(page, url: str, notebook: str, timeout_s: float = RUN_ALL_TIMEOUT_S) -> dict:
    """Open ``notebook`` (a path under the server's root) in JupyterLab at ``url``, wait for its
    kernel, run all cells and wait until they have finished. Fails on an error in any cell
    (with its traceback). Returns the kernel status and the code cells' execution counts."""
    page.goto(f"{url}/lab?reset", wait_until="domcontentloaded")
    page.wait_for_function(
        "() => window.jupyterapp !== undefined", timeout=SERVER_START_TIMEOUT_S * 1000
    )
    page.evaluate(_OPEN_AND_RUN_JS, notebook)
    _wait_phase(page, "kernel", 120, f"opening {notebook}")
    _wait_phase(page, "run", KERNEL_START_TIMEOUT_S, f"starting the kernel for {notebook}")
    started = time.monotonic()
    deadline = started + timeout_s
    while True:
        state = page.evaluate("() => window.__wbRun")
        if state["error"]:
            pytest.fail(f"running {notebook} failed in JupyterLab: {state['error']}", pytrace=False)
        cells = page.evaluate(_CELLS_JS)
        errors = [(c["index"], e) for c in cells["cells"] for e in c["errors"]]
        if errors:
            index, error = errors[0]
            error = re.sub(r"\x1b\[[0-9;]*m", "", error)  # the traceback's colours
            pytest.fail(f"{notebook}: cell {index} raised\n{error}", pytrace=False)
        finished = state["phase"] == "ran" and cells["kernel"] == "idle"
        if finished and not any(c["running"] or c["count"] is None for c in cells["cells"]):
            cells["seconds"] = round(time.monotonic() - started, 1)
            return cells
        if time.monotonic() > deadline:
            pytest.fail(
                f"{notebook}: run-all did not finish within {timeout_s:.0f} s; kernel "
                f"{cells['kernel']}, cells {[(c['index'], c['count']) for c in cells['cells']]}",
                pytrace=False,
            )
        time.sleep(0.5)


# -- workbench widget helpers ------------------------------------------------------------------

_STATE_JS = """
(root) => {
  const text = sel => {
    const el = root.querySelector(sel);
    return el ? el.textContent.replace(/\\s+/g, ' ').trim() : null;
  };
  // the graph's SVG runs to hundreds of kilobytes: compare its length and an FNV-1a hash
  const fingerprint = s => {
    let h = 2166136261;
    for (let i = 0; i < s.length; i++) { h ^= s.charCodeAt(i); h = Math.imul(h, 16777619); }
    return `svg, ${s.length} characters, hash ${(h >>> 0).toString(16)}`;
  };
  const svg = root.querySelector('.wb-graph svg');
  const textarea = root.querySelector('.wb-export textarea');
  return {
    busy: root.classList.contains('wb-busy'),
    status: text('.wb-status'),
    error: text('.wb-error'),
    estimate: text('.wb-estimate'),
    graph: svg ? fingerprint(svg.outerHTML) : null,
    export: textarea ? textarea.value : null,
  };
}
"""
STATE_KEYS = ("status", "error", "estimate", "graph", "export")


def workbench(page):
    """The workbench widget's root element (the first, if the notebook shows several)."""
    return page.locator(".wb-workbench").first


def wait_for_workbench(page, timeout_s: float = WIDGET_TIMEOUT_S):
    """Wait for the workbench widget to be rendered and visible; return its locator."""
    root = workbench(page)
    try:
        root.wait_for(state="visible", timeout=timeout_s * 1000)
        return root
    except Exception:
        pass
    outputs = page.evaluate(_WIDGET_OUTPUTS_JS)
    pytest.fail(
        f"no visible .wb-workbench within {timeout_s:.0f} s after run-all "
        f"({page.locator('.wb-workbench').count()} in the DOM); the notebook's widget outputs: "
        f"{outputs or 'none'}",
        pytrace=False,
    )


def widget_state(page) -> dict:
    """busy, the status, error and estimate text, a fingerprint of the graph's SVG and the
    export code, as they are now."""
    root = workbench(page)
    if not root.count():
        return {"widget": "no .wb-workbench on the page"}
    return root.evaluate(_STATE_JS)


def _short(state: dict) -> dict:
    """The state for a message, long texts cut."""
    short = {}
    for key, value in state.items():
        if isinstance(value, str) and len(value) > 300:
            value = value[:300] + "…"
        short[key] = value
    return short


def wait_settled(page, before: dict | None = None, timeout_s: float = ACTION_TIMEOUT_S) -> dict:
    """Wait until the widget is not busy, differs from ``before`` (when given) and has not
    changed for QUIET_S seconds; return its state."""
    deadline = time.monotonic() + timeout_s
    last, since = None, time.monotonic()
    while True:
        state = widget_state(page)
        changed = before is None or any(state.get(k) != before.get(k) for k in STATE_KEYS)
        if state != last:
            last, since = state, time.monotonic()
        elif not state.get("busy") and changed and time.monotonic() - since >= QUIET_S:
            return state
        if time.monotonic() > deadline:
            what = "change and settle" if before is not None else "settle"
            raise AssertionError(
                f"the workbench did not {what} within {timeout_s:.0f} s.\n"
                f"before: {_short(before or {})}\nnow: {_short(state)}"
            )
        time.sleep(0.2)


def click(
    page, selector: str, expect_change: bool = True, timeout_s: float = ACTION_TIMEOUT_S
) -> dict:
    """Click the button ``selector`` inside the workbench and wait for the callback to finish:
    the busy class gone, the widget changed (unless ``expect_change`` is false) and quiet.
    Returns the widget's state afterwards."""
    before = wait_settled(page, timeout_s=timeout_s)
    button = workbench(page).locator(selector)
    assert button.count() == 1, f"expected one {selector} in the workbench, found {button.count()}"
    button.click()
    if not expect_change:
        # the class goes on and off with the round trip to the kernel; give it time to appear
        with contextlib.suppress(Exception):
            workbench(page).locator("xpath=self::*[contains(@class, 'wb-busy')]").wait_for(
                timeout=2000
            )
    return wait_settled(page, before if expect_change else None, timeout_s)


def click_strategy(page, name: str, **kwargs) -> dict:
    """Click the strategy button ``name`` ("BP", "MP", ...)."""
    return click(page, f"button.jupyter-button.wb-strategy-{name}", **kwargs)


_PROGRESS_RECORDER_JS = """
(root) => {
  const log = window.__wbProgress = [];
  const read = () => {
    const el = root.querySelector('.wb-auto-progress');
    if (!el) { log.push({present: false}); return; }
    const style = getComputedStyle(el);
    const visible = el.getClientRects().length > 0 && style.visibility !== 'hidden';
    const bar = el.querySelector('.progress-bar');
    const native = el.tagName === 'PROGRESS' ? el : el.querySelector('progress');
    let value = null;
    if (bar) value = parseFloat(bar.style.width || bar.style.height || '0');
    else if (native) value = 100 * native.value / (native.max || 1);
    const last = log[log.length - 1];
    if (!last || last.visible !== visible || last.value !== value) log.push({present: true, visible, value});
  };
  read();
  const observer = new MutationObserver(read);
  observer.observe(root, {attributes: true, childList: true, subtree: true, characterData: true});
  window.__wbProgressStop = () => observer.disconnect();
}
"""


def record_progress(page) -> None:
    """Record the Auto progress bar (visible, percent) on every change in the widget."""
    workbench(page).evaluate(_PROGRESS_RECORDER_JS)


def recorded_progress(page) -> list[dict]:
    return page.evaluate("() => { window.__wbProgressStop?.(); return window.__wbProgress || []; }")


# -- the graph panel ---------------------------------------------------------------------------

_GRAPH_LABELS_JS = """
(root) => {
  const stage = root.querySelector('.wb-gv-stage').getBoundingClientRect();
  const out = [];
  root.querySelectorAll('.wb-graph svg g.node text, .wb-graph svg g.edge text').forEach((t, i) => {
    const r = t.getBoundingClientRect();
    if (r.height > 0 && r.left >= stage.left && r.right <= stage.right
        && r.top >= stage.top && r.bottom <= stage.bottom && t.textContent.trim()) {
      out.push({i, h: r.height, x: r.left + r.width / 2, y: r.top + r.height / 2,
                text: t.textContent, owner: t.closest('g.node, g.edge').id});
    }
  });
  return out;
}
"""


def graph_labels(page) -> list[dict]:
    """The labels inside the graph panel's visible area: index, on-screen height, centre,
    text and the id of the node or edge they belong to."""
    panel = workbench(page).locator(".wb-graph").first
    page.wait_for_function(
        "(el) => el.querySelector('svg') && el.dataset.zoom", arg=panel.element_handle()
    )
    panel.scroll_into_view_if_needed()
    return panel.evaluate(_GRAPH_LABELS_JS)


# the graph's nodes (their box against the visible stage) and the node labels in view
_VIEW_JS = """
(root) => {
  const stage = root.querySelector('.wb-gv-stage').getBoundingClientRect();
  const inside = r => r.left >= stage.left - 0.5 && r.right <= stage.right + 0.5
                      && r.top >= stage.top - 0.5 && r.bottom <= stage.bottom + 0.5;
  const nodes = [], labels = [];
  for (const g of root.querySelectorAll('.wb-graph svg g.node')) {
    const r = g.getBoundingClientRect();
    if (!r.width) continue;
    nodes.push({id: g.id, cls: g.getAttribute('class') || '', text: g.textContent.trim().slice(0, 40),
                inside: inside(r), cutLeft: r.left < stage.left - 0.5 && r.right > stage.left + 0.5});
  }
  for (const t of root.querySelectorAll('.wb-graph svg g.node text')) {
    const r = t.getBoundingClientRect(), m = t.getScreenCTM();
    if (!t.textContent.trim() || !r.height || !m || !inside(r)) continue;
    labels.push({text: t.textContent, px: parseFloat(t.getAttribute('font-size')) * Math.hypot(m.a, m.b)});
  }
  return {nodes, labels, zoom: root.querySelector('.wb-graph').dataset.zoom};
}
"""


def graph_view(page) -> dict:
    """The graph's nodes (id, class, text; ``inside`` the visible stage, ``cutLeft``: across
    its left edge) and the node labels in view with their font size in CSS px."""
    graph_labels(page)  # the drawing is there, and scrolled into view
    return workbench(page).evaluate(_VIEW_JS)
