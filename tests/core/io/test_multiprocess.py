"""Past one machine: the module ``export_jax()`` writes runs unchanged as a multi-process JAX
program (two processes x four CPU devices over gloo) and gets what one process with eight
devices gets; a pipelined step's (the pipeline compiled by jax.export) too."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import types
from pathlib import Path

import jax
import numpy as np
import pytest

import workbench as wb
from workbench.models import build, lm

WORKER = Path(__file__).with_name("multiprocess_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize(
    "model, schedule",
    [("lm", ("BP", "MP")), ("mlp", ("BP", "Z3")), ("lm:4", ("PP", "BP"))],  # lm:4: 4 layers
)
def test_an_exported_plan_runs_as_two_processes(model, schedule, tmp_path):
    if model == "lm:4":  # a pipeline over 4 stages, its microbatches split over "data"
        ex = build("lm", lm.Config.preset("tiny", n_layers=4))
        mesh = wb.Mesh({"stage": 4, "data": 2})
    else:
        ex = build(model, "tiny")
        mesh = wb.Mesh({"data": 2, "model": 4})
    parts = {
        "BP": wb.BP("data"),
        "MP": wb.MP("model"),
        "Z3": wb.Z3("data"),
        "PP": wb.PP("stage", microbatches=4),
    }
    session = wb.Session(wb.capture(ex.fn, *ex.args), mesh, [parts[p] for p in schedule])
    exported = tmp_path / "plan.py"
    exported.write_text(session.export_jax())

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    outs = [tmp_path / f"out{i}.npz" for i in range(2)]
    workers = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(i), str(port), str(exported), model, str(outs[i])],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = []
    try:
        for w in workers:
            logs.append(w.communicate(timeout=300)[0])
    finally:
        for w in workers:
            w.kill()
    assert all(w.returncode == 0 for w in workers), "\n".join(logs)

    # the same module in this one process with eight devices
    module = types.ModuleType("exported")
    exec(compile(exported.read_text(), str(exported), "exec"), module.__dict__)
    expected = [np.asarray(x) for x in jax.tree.leaves(module.partitioned(ex.fn)(*ex.args))]
    for path in outs:
        got = np.load(path)
        assert int(got["process_count"]) == 2 and int(got["device_count"]) == 8
        assert int(got["local_devices"]) == 4
        for i, want in enumerate(expected):
            np.testing.assert_allclose(got[f"out{i}"], want, rtol=1e-5, atol=1e-6)
