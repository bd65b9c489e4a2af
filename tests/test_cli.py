"""The ``workbench`` command: plan, models, hardware; bad input exits 2 with a message."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import workbench as wb
from workbench.cli import main
from workbench.core import hardware as hw
from workbench.core.units import format_bytes, format_seconds
from workbench.models import build

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "strategies" / "lm_bp_mp.json"
MESH = wb.Mesh({"batch": 2, "model": 4})


def lm_tiny() -> wb.Program:
    ex = build("lm", "tiny", abstract=True)
    return wb.capture(ex.fn, *ex.args)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A BP+MP session on lm:tiny and the strategy file it saved."""
    session = wb.Session(lm_tiny(), MESH, [wb.BP("batch"), wb.MP("model")])
    return session, session.save(tmp_path_factory.mktemp("strategy") / "strategy.json")


def estimate(path, hardware=None, **kwargs):
    """The estimate of the saved strategy, on a program captured afresh (as the command does):
    the simulator caches op costs per program, so one program serves one hardware spec."""
    return wb.Session.load(lm_tiny(), path).estimate(hardware, **kwargs)


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def table_rows(out: str) -> list[list[str]]:
    """The rows of the collective table (after its ``#  kind ...`` header)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["#", "kind"])
    return [line.split() for line in lines[start + 1 :]]


def test_plan_prints_the_estimate_and_the_collective_plan(saved, capsys):
    session, path = saved
    est = estimate(path, hw.H100)
    code, out, err = run(
        capsys, "plan", "--model", "lm:tiny", "--strategy", path, "--hardware", "H100", "--top", 0
    )
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("model     lm:tiny (") and "20,800 parameters" in lines[0]
    assert "batch=2, model=4 (8 devices)" in out and "BP('batch'), MP('model')" in out
    step = next(line for line in lines if line.startswith("step time"))
    assert step.split()[2:] == format_seconds(est.step_s).split()
    assert f"of {format_bytes(est.memory.capacity)} per device: fits" in out
    rows = table_rows(out)
    assert len(rows) == len(session.collectives())
    model_all_reduces = [r for r in rows if r[1] == "all-reduce" and r[3] == "model"]
    assert len(model_all_reduces) == sum(
        c.kind == "all-reduce" and c.axes == ("model",) for c in session.collectives()
    )
    assert model_all_reduces and all("MP('model')" in " ".join(r) for r in model_all_reduces)


def test_top_lists_the_costliest(saved, capsys):
    _, path = saved
    code, out, _ = run(capsys, "plan", "--model", "lm", "--strategy", path, "--top", 3)
    assert code == 0 and "the 3 costliest (--top 0 lists all)" in out
    assert len(table_rows(out)) == 3


def test_json_equals_the_session_estimate(saved, capsys):
    session, path = saved
    est = estimate(path, hw.H100, overlap=0.5)
    code, out, _ = run(
        capsys,
        "plan",
        "--model",
        "lm:tiny",
        "--strategy",
        path,
        "--hardware",
        "h100",
        "--overlap",
        "0.5",
        "--json",
    )
    assert code == 0
    data = json.loads(out)
    got = data["estimate"]
    assert (got["step_s"], got["compute_s"], got["communication_s"]) == (
        est.step_s,
        est.compute_s,
        est.communication_s,
    )
    assert got["by_kind"] == dict(est.by_kind) and got["flops"] == est.flops
    memory = got["memory"]
    assert (memory["peak"], memory["capacity"], memory["fits"]) == (
        est.memory.peak,
        est.memory.capacity,
        est.memory.fits,
    )
    assert memory["at_peak"] == dict(est.memory.at_peak)
    assert data["mesh"] == {"batch": 2, "model": 4} and data["params"] == 20800
    assert data["schedule"] == ["BP('batch')", "MP('model')"]
    assert (data["hardware"], data["overlap"]) == ("H100 SXM", 0.5)
    rows = data["collectives"]
    assert [(r["kind"], tuple(r["axes"]), r["bytes"], r["count"]) for r in rows] == [
        (c.kind, c.axes, c.bytes, c.count) for c in session.collectives()
    ]
    assert [r["seconds"] for r in rows] == [c.total_s for c in est.collectives]


def test_fused_attention_prices_as_the_session_does_on_that_hardware(saved, capsys):
    import dataclasses

    _, path = saved
    fused = dataclasses.replace(hw.H100, fused_attention=True)
    est = estimate(path, fused)
    args = ("plan", "--model", "lm:tiny", "--strategy", path, "--hardware", "h100")
    code, out, _ = run(capsys, *args, "--fused-attention", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["fused_attention"] is True and data["estimate"]["step_s"] == est.step_s
    assert data["estimate"]["step_s"] < estimate(path, hw.H100).step_s
    code, out, _ = run(capsys, *args, "--fused-attention")
    assert code == 0 and "H100 SXM, overlap none, attention fused" in out


def test_default_hardware_is_the_sessions_default(saved, capsys):
    _, path = saved
    code, out, _ = run(capsys, "plan", "--model", "lm:tiny", "--strategy", path, "--json")
    assert code == 0
    assert json.loads(out)["estimate"]["step_s"] == estimate(path).step_s


def test_tactics_on_the_command_line_match_the_strategy_file(saved, capsys):
    _, path = saved
    _, from_file, _ = run(capsys, "plan", "--model", "lm:tiny", "--strategy", path, "--json")
    code, from_tactics, err = run(
        capsys,
        "plan",
        "--model",
        "lm:tiny",
        "--mesh",
        "batch=2,model=4",
        "--tactics",
        "BP('batch')",
        "MP(axis='model')",
        "--json",
    )
    assert code == 0, err
    assert json.loads(from_tactics)["estimate"] == json.loads(from_file)["estimate"]
    # selectors as keyword arguments, for models whose names differ from the defaults
    code, out, err = run(
        capsys,
        "plan",
        "--model",
        "mlp:small",
        "--mesh",
        "batch=2,model=4",
        "--tactics",
        "BP('batch')",
        "MP('model', hidden='params/layers/0/w')",
    )
    assert code == 0, err
    assert "hidden='params/layers/0/w'" in out


def test_a_placement_on_the_command_line_is_priced_or_said_not_to_apply(capsys):
    """``Place`` is a tactic like the others: on hardware whose levels it fits, the step is
    priced under it; on H100's nodes of 8 (the mesh's 8 devices in one) the plan says it
    does not apply and prices the mesh order."""
    place = "Place(['nvlink', 'infiniband'], [['batch', [2, 1]], ['model', [2, 2]]])"
    argv = ["plan", "--model", "lm:tiny", "--mesh", "batch=2,model=4", "--hardware", "h100"]
    code, out, err = run(capsys, *argv, "--tactics", "BP('batch')", "MP('model')", place)
    assert code == 0, err
    assert "schedule  BP('batch'), MP('model'), Place(batch: nvlink 2; model: nvlink 2 x" in out
    assert (
        "note      the session's placement (batch: nvlink 2; model: nvlink 2 x infiniband 2;" in out
    )
    assert "does not apply to H100 SXM" in out
    code, placed, _ = run(capsys, *argv, "--json", "--tactics", "BP('batch')", "MP('model')", place)
    code, bare, _ = run(capsys, *argv, "--json", "--tactics", "BP('batch')", "MP('model')")
    placed, bare = json.loads(placed)["estimate"], json.loads(bare)["estimate"]
    assert placed["note"].endswith("priced in mesh order") and bare["note"] == ""
    assert placed["step_s"] == bare["step_s"]
    code, _, err = run(capsys, *argv, "--tactics", "Place(['nvlink'], [['batch', [2]]])")
    assert code == 2 and "places axes ['batch'], but the mesh is" in err


def test_mesh_may_repeat_the_files_mesh(saved, capsys):
    _, path = saved
    code, _, err = run(
        capsys, "plan", "--model", "lm", "--strategy", path, "--mesh", "batch=2,model=4"
    )
    assert code == 0, err


def test_the_example_strategy_loads(saved, capsys):
    """The example is a version 1 file: migrated, it is what Session.save writes today."""
    from workbench.core.io.schema import migrate

    assert migrate(json.loads(EXAMPLE.read_text())) == json.loads(saved[1].read_text())
    session = wb.Session.load(lm_tiny(), EXAMPLE)
    assert session.mesh == MESH and session.history == (wb.BP("batch"), wb.MP("model"))
    code, out, _ = run(capsys, "plan", "--model", "lm:small", "--strategy", EXAMPLE)
    assert code == 0 and "all-reduce" in out


def test_models_lists_the_zoo(capsys):
    code, out, _ = run(capsys, "models")
    assert code == 0
    for line in ("lm:tiny", "20,800", "lm_scan:huge", "mlp:small", "gnn:large"):
        assert line in out


def test_hardware_lists_the_presets(capsys):
    code, out, _ = run(capsys, "hardware")
    assert code == 0
    for preset in hw.PRESETS:
        assert preset in out
    assert "h100" in out and "tpu_v5e" in out and "nvlink 450 GB/s" in out


SAVED = object()  # the saved strategy file's path


class Text(str):
    """A file holding this text."""


def file_arg(arg, saved_path, tmp_path):
    """``SAVED``, a ``Text`` or a schedule (list) as a file path; anything else as it is."""
    if arg is SAVED:
        return saved_path
    if isinstance(arg, list):
        mesh = {"batch": 2, "model": 4}
        arg = Text(json.dumps({"format": "workbench-strategy/1", "mesh": mesh, "schedule": arg}))
    if isinstance(arg, Text):
        path = tmp_path / "bad.json"
        path.write_text(arg)
        return path
    return arg


LM = ["--model", "lm"]
TACTICS = ["--model", "lm", "--mesh", "batch=2", "--tactics"]
CODE_SELECTOR = "__import__('os').system('exit 1')"
BAD = {
    "unknown model": (
        ["--model", "transformer", "--strategy", SAVED],
        ["--model 'transformer'", "no model 'transformer'", "'lm'", "workbench models"],
    ),
    "unknown preset": (
        ["--model", "lm:medium", "--strategy", SAVED],
        ["--model 'lm:medium'", "no preset 'medium'", "'small'"],
    ),
    "malformed mesh": (
        [*LM, "--mesh", "batch:2,model:4"],
        ["--mesh 'batch:2,model:4'", "is not AXIS=SIZE", "batch=2,model=4"],
    ),
    "zero-sized mesh axis": (
        [*LM, "--mesh", "batch=0", "--tactics", "BP('batch')"],
        ["--mesh 'batch=0'", "size 0", "positive integer"],
    ),
    "no mesh": (LM, ["plan needs a mesh", "--mesh batch=2,model=4"]),
    "mesh disagrees with the file": (
        [*LM, "--strategy", SAVED, "--mesh", "batch=4,model=2"],
        ["--mesh 'batch=4,model=2' disagrees", "batch=2,model=4", "drop --mesh"],
    ),
    "unknown hardware": (
        [*LM, "--strategy", SAVED, "--hardware", "h1000"],
        ["--hardware='h1000' is not a hardware preset", "h100", "tpu_v5e", "Did you mean"],
    ),
    "bad overlap": (
        [*LM, "--strategy", SAVED, "--overlap", "half"],
        ["--overlap 'half'", "'none', 'full'", "0 to 1"],
    ),
    "missing strategy file": (
        [*LM, "--strategy", "missing.json"],
        ["--strategy 'missing.json' does not exist", "Session.save"],
    ),
    "not JSON": ([*LM, "--strategy", Text("{oops")], ["bad.json' is not JSON", "line 1 column 2"]),
    "not a strategy": (
        [*LM, "--strategy", Text('{"a": 1}')],
        ['"format" field is missing', '"format": "workbench-strategy"'],
    ),
    "empty strategy file": ([*LM, "--strategy", Text("")], ["bad.json' is empty"]),
    "truncated strategy file": (
        [*LM, "--strategy", Text('{"format": "workbench-strategy", "mesh": {"batch"')],
        ["is not JSON", "truncated?"],
    ),
    "a directory as the strategy file": ([*LM, "--strategy", "."], ["'.' is a directory"]),
    "a schedule that is a number": (
        [
            *LM,
            "--strategy",
            Text('{"format": "workbench-strategy", "mesh": {"b": 2}, "schedule": 3}'),
        ],
        ['"schedule" is 3', "a list of tactics"],
    ),
    "a newer version": (
        [*LM, "--strategy", Text('{"format": "workbench-strategy", "version": 99}')],
        ["version 99, written by a newer workbench", "upgrade workbench"],
    ),
    "a huge search budget in the file": (
        [*LM, "--strategy", [{"tactic": "Auto", "axes": "model", "budget": 10**9}]],
        ["schedule[0] (Auto)", "budget=1,000,000,000", "outside 1 to 100,000"],
    ),
    "NaN seconds in the file": (
        [
            *LM,
            "--strategy",
            Text(
                '{"format": "workbench-strategy", "mesh": {"b": 2}, '
                '"schedule": [{"tactic": "Auto", "axes": "b", "seconds": NaN}]}'
            ),
        ],
        ["NaN is not a number a strategy file may hold"],
    ),
    "a huge search budget on the command line": (
        [*TACTICS, "Auto('batch', budget=10**9)"],
        ["arguments must be literals"],
    ),
    "a huge literal search budget on the command line": (
        [*TACTICS, "Auto('batch', budget=1000000000)"],
        ["--tactics: schedule[0] (Auto)", "outside 1 to 100,000"],
    ),
    "an infinite duration on the command line": (
        [*TACTICS, "Auto('batch', seconds=1e999)"],
        ["--tactics: schedule[0].seconds is inf", "finite"],
    ),
    "unknown tactic in the file": (
        [*LM, "--strategy", [{"tactic": "exec"}]],
        ["schedule[0] names tactic 'exec'", "'BP'"],
    ),
    "tactic fails on the model": (
        [*LM, "--strategy", [{"tactic": "BP", "axis": "data"}]],
        ["bad.json' on lm:", "axis 'data' is not in Mesh(batch=2, model=4)", "'batch'"],
    ),
    "code in a selector stays a string": (
        [
            *LM,
            "--strategy",
            [{"tactic": "Tile", "selector": CODE_SELECTOR, "dim": 0, "axis": "batch"}],
        ],
        [CODE_SELECTOR, "matches"],
    ),
    "a field of the wrong type": (
        [*LM, "--strategy", [{"tactic": "SP", "axis": "model", "stream": 3}]],
        ["stream of SP must be a string or a list of strings"],
    ),
    "named strategy fails on the model": (
        ["--model", "mlp", "--mesh", "batch=2,model=4", "--tactics", "MP('model')"],
        [
            "--tactics on mlp: MP('model'): the workbench sees no attention or MLP projection",
            "hidden=",
        ],
    ),
    "tactics that are not a call": (
        [*TACTICS, "__import__('os').getcwd()"],
        ["is not a tactic call", "BP('batch')"],
    ),
    "tactics with code in an argument": (
        [*TACTICS, "BP(open('x').read())"],
        ["arguments must be literals"],
    ),
    "unknown tactic on the command line": (
        [*TACTICS, "DP('batch')"],
        ["names no known tactic 'DP'", "BP, CP, EMB, EP"],
    ),
    "unknown field on the command line": (
        [*TACTICS, "BP('batch', size=2)"],
        ["BP has no field 'size'", "axis, inputs, dim"],
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_exits_2_with_a_message(case, saved, tmp_path, capsys):
    argv, expected = BAD[case]
    code, out, err = run(capsys, "plan", *(file_arg(a, saved[1], tmp_path) for a in argv))
    assert code == 2 and out == ""
    assert err.startswith("workbench plan: error: ") and "Traceback" not in err
    for text in expected:
        assert text in err


def test_no_arguments_and_no_model_exit_2_with_usage(capsys):
    for argv in ([], ["plan"], ["plan", "--mesh", "batch=2"]):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "" and "Traceback" not in err
        assert "usage: workbench" in err and "required" in err


def test_an_internal_error_is_one_line_and_exit_1(monkeypatch, capsys):
    """A bug (not bad input) still prints no traceback: one line that says to report it."""
    import workbench.cli as cli

    def broken(args):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(cli, "cmd_models", broken)
    monkeypatch.delenv("WORKBENCH_TRACEBACK", raising=False)
    code, out, err = run(capsys, "models")
    assert code == 1 and out == "" and "Traceback" not in err
    assert "internal error: RuntimeError: simulated bug" in err and "report it" in err


def test_usage_errors_exit_2(capsys):
    assert run(capsys, "plan", "--strategy", "x.json")[0] == 2  # no --model
    assert run(capsys, "plan", "--model", "lm", "--top", "many")[0] == 2
    code, _, err = run(capsys, "simulate")
    assert code == 2 and "invalid choice: 'simulate'" in err
    assert run(capsys, "--help")[0] == 0


def test_the_entry_point_runs(saved):
    """The console script (or ``python -m workbench.cli`` where it is not installed)."""
    script = Path(sys.executable).parent / "workbench"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "workbench.cli"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [*command, "plan", "--model", "lm:tiny", "--strategy", str(EXAMPLE), "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["estimate"]["step_s"] == estimate(EXAMPLE).step_s
    bad = subprocess.run(
        [sys.executable, "-m", "workbench.cli", "plan", "--model", "lm:nope", "--mesh", "a=2"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert bad.returncode == 2 and "no preset 'nope'" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], "the following arguments are required"),
        (["plan", "--model", "lm", "--strategy", "no/such/strategy.json"], "does not exist"),
        (["plan", "--model", "lm", "--mesh", "batch=2", "--hardware", "h1000"], "h100"),
    ],
    ids=["no arguments", "missing strategy file", "unknown hardware"],
)
def test_the_module_fails_cleanly_in_a_subprocess(argv, expected, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("WORKBENCH_TRACEBACK", None)
    done = subprocess.run(
        [sys.executable, "-m", "workbench.cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert expected in done.stderr and "Traceback" not in done.stderr
