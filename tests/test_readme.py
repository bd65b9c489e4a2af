"""The README runs as written: its Python blocks, its shell example, and ``./scripts/lab``."""

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
VENV_BIN = str(Path(sys.executable).parent)


def env(**extra) -> dict:
    """The environment a reader has after ``./scripts/lab``: the venv first on PATH."""
    out = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    out.pop("WORKBENCH_TRACEBACK", None)
    return {**out, **extra}


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README, re.DOTALL | re.MULTILINE)


def shell_examples() -> list[str]:
    """Every ``workbench ...`` command the README's text writes in backquotes."""
    return re.findall(r"`(workbench (?:plan|models|hardware)[^`]*)`", README)


def test_the_readme_has_what_these_tests_run():
    assert len(python_blocks()) >= 2 and shell_examples()


@pytest.mark.slow
def test_the_python_blocks_run_in_order(tmp_path):
    """The blocks build on each other (the second uses the first's ``train_step``): one
    script, run as a reader would, on 8 virtual CPU devices."""
    script = tmp_path / "readme.py"
    script.write_text("\n\n".join(python_blocks()))
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env(XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu"),
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.mark.parametrize("command", shell_examples())
def test_the_shell_example_runs_as_written(command):
    """From the repository's root, as the README says, with the venv on PATH."""
    done = subprocess.run(
        shlex.split(command),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env(JAX_PLATFORMS="cpu"),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    if command.startswith("workbench plan"):
        assert "step time" in done.stdout and "collectives" in done.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
    except urllib.error.HTTPError:  # it answered, if only to ask for its token
        return True
    except OSError:
        return False
    return True


@pytest.mark.slow
def test_scripts_lab_serves_jupyterlab():
    """``./scripts/lab`` starts JupyterLab on the port asked for, without a browser; it is
    stopped once it answers. Skipped where its set-up would install something first."""
    stamp = ROOT / ".venv" / ".installed"
    if not stamp.exists() or (ROOT / "pyproject.toml").stat().st_mtime > stamp.stat().st_mtime:
        pytest.skip("scripts/setup would (re)install the virtual environment first")
    if subprocess.run(["sh", "-c", "command -v dot"], capture_output=True).returncode:
        pytest.skip("scripts/setup would install graphviz first")
    port = free_port()
    lab_env = env(WORKBENCH_LAB_PORT=str(port), WORKBENCH_LAB_IP="127.0.0.1")
    lab_env.pop("DISPLAY", None)  # no browser
    proc = subprocess.Popen(
        [str(ROOT / "scripts" / "lab")],
        cwd=ROOT,
        env=lab_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        url = f"http://127.0.0.1:{port}/api"
        while not answers(url):
            assert proc.poll() is None, proc.stderr.read().decode()[-4000:]
            assert time.monotonic() < deadline, "JupyterLab did not answer within 120 s"
            time.sleep(1)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
