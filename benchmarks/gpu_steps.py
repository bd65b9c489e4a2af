"""The simulator against training steps measured on one accelerator, per strategy.

On one chip no partitioned step can run whole, but each device's share of it can: the
explicit lowering is a per-device program, so it is run here on the one attached device,
with the inputs cut to each device's shard and every collective replaced by a stand-in of
the same result shape (an all-gather by copies of the local block, a reduce-scatter by a
slice, an all-to-all by a slice and copies, an all-reduce and a permute by nothing). What
is timed is the device's compute in that strategy, at the shapes it would have on the
full mesh; it is set beside the simulator's compute for the same plan on the preset of
the attached card (the H100 or H200 preset, vendor figures, nothing calibrated). The
strategy "none" is the whole step on one device: every device of the mesh computes it.
The simulator's communication is printed beside, not checked: one chip has no links.

Models: the zoo LM (bfloat16 with float32 master weights) and a Flax NNX decoder LM and an
Equinox decoder LM written as their libraries' docs write them (workbench/models/external).
A measured step is the median of ``--repeats`` runs after two warm-ups.

    JAX_PLATFORMS=cuda python benchmarks/gpu_steps.py [--small] [--check-runs] [--out rows.jsonl]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import workbench as wb
from workbench.core import hardware as hw
from workbench.core.lowering import steps
from workbench.core.lowering.explicit import _Explicit
from workbench.core.lowering.run import example_inputs
from workbench.core.strategies.named import BP, MP, Z3
from workbench.models import build, lm
from workbench.models.external import Size, build_external

MESH = {"batch": 2, "model": 4}
STRATEGIES = {
    "none": [],
    "BP": [BP("batch")],
    "MP": [MP("model")],
    "BP+MP": [BP("batch"), MP("model")],
    "BP+Z3": [BP("batch"), Z3("batch")],
    "BP+MP+Z3": [BP("batch"), MP("model"), Z3("batch")],
}


def models(small: bool) -> dict:
    if small:  # a shake-out on the CPU
        return {
            "zoo LM": lambda: build("lm", lm.Config.preset("small", dtype="bfloat16", master_weights=True)),
            "NNX LM": lambda: build_external("nnx_lm", Size(batch=8, seq_len=32, d_model=64, n_heads=4, d_ff=256, vocab=512, n_layers=2)),
        }  # fmt: skip
    big = dict(batch=16, seq_len=1024, d_model=1024, n_heads=16, d_ff=4096, vocab=32768, n_layers=8)
    return {
        "zoo LM 8x1024": lambda: build("lm", lm.Config(**big, d_head=64, dtype="bfloat16", master_weights=True)),
        "NNX LM 8x1024": lambda: build_external("nnx_lm", Size(**big)),
        "Equinox LM 8x1024": lambda: build_external("eqx_lm", Size(**big)),
    }  # fmt: skip


def _stand_in(x, step, mesh, again=False):
    """A collective's local result shape without its communication (see the module doc)."""
    kind = step.kind
    n = int(np.prod([mesh.axis_size(a) for a in step.axes]))
    if kind == "all-gather":
        return jnp.concatenate([x] * n, axis=step.dim)
    if kind == "reduce-scatter":
        return lax.slice_in_dim(x, 0, x.shape[step.dim] // n, axis=step.dim)
    if kind == "all-to-all":
        part = lax.slice_in_dim(x, 0, x.shape[step.dim] // n, axis=step.dim)
        return jnp.concatenate([part] * n, axis=step.dim_from)
    if kind in ("all-reduce", "collective-permute"):
        return x
    return _ORIGINAL(x, step, mesh, again)


_ORIGINAL = steps._run


@contextlib.contextmanager
def collectives_stood_in():
    steps._run = _stand_in
    try:
        yield
    finally:
        steps._run = _ORIGINAL


def local_step(session):
    """One device's share of the session's step, compiled for the one attached device, with
    inputs cut to that device's shards."""
    program, mesh, state = session.program, session.mesh, session.state
    plan = session.plan()
    device = jax.devices()[0]
    jmesh = jax.sharding.Mesh(
        np.asarray([device], dtype=object).reshape((1,) * len(mesh.names)), mesh.names
    )
    interp = _Explicit(program, mesh, plan, state)
    flat = example_inputs(program)
    local = []
    for v, a in zip(program.inputs, flat):
        shape = state.shardings[v].local_shape(mesh)
        a = np.asarray(a) if not jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key) else a
        local.append(jax.device_put(a[tuple(slice(0, n) for n in shape)], device))
    n_out = len(plan.outputs)

    def per_device(*xs):
        return tuple(interp(*xs))

    with collectives_stood_in():
        fn = jax.jit(
            jax.shard_map(
                per_device,
                mesh=jmesh,
                in_specs=tuple(PartitionSpec() for _ in local),
                out_specs=tuple(PartitionSpec() for _ in range(n_out)),
                check_vma=False,
            )
        )
        t0 = time.perf_counter()
        compiled = fn.lower(*local).compile()
        compile_s = time.perf_counter() - t0
    return (lambda: compiled(*local)), compile_s


def timed(fn, repeats: int) -> float:
    for _ in range(2):
        jax.block_until_ready(fn())
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def check_runs():
    """``s.run()`` of BP on a one-device mesh, checked as a user's run is (docs/runs.md)."""
    checks = {
        "zoo LM small bf16": lambda: build("lm", lm.Config.preset("small", dtype="bfloat16", master_weights=True)),
        "zoo LM small f32": lambda: build("lm", "small"),
        "NNX LM tiny": lambda: build_external("nnx_lm"),
        "Equinox LM tiny": lambda: build_external("eqx_lm"),
        "NNX ViT tiny": lambda: build_external("nnx_vit"),
    }  # fmt: skip
    for name, make in checks.items():
        try:
            ex = make()
            s = wb.Session(wb.capture(ex.fn, *ex.args), wb.Mesh({"batch": 1}), [BP("batch")])
            print(f"{name}: {str(s.run()).splitlines()[0]}", flush=True)
        except Exception as e:
            print(f"{name}: could not run: {type(e).__name__}: {e}", flush=True)


def preset():
    kind = jax.devices()[0].device_kind
    if "H200" in kind:
        return hw.H200
    if "H100" in kind:
        return hw.H100
    return hw.CPU


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="small models: a shake-out on the CPU")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default=None, help="write the rows as JSON lines here")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    parser.add_argument("--check-runs", action="store_true", help="also s.run() small models")
    args = parser.parse_args()
    spec = preset()
    device = jax.devices()[0]
    print(
        f"Measured {datetime.date.today()}, {device.device_kind} ({device.platform}), "
        f"jax {jax.__version__}; simulator preset {spec.name}; per-device shares of a "
        f"{MESH} mesh",
        flush=True,
    )
    out = open(args.out, "a") if args.out else None  # noqa: SIM115 - rows stream out as measured
    rows = []
    for name, make in models(args.small).items():
        try:
            ex = make()
            t0 = time.perf_counter()
            program = wb.capture(ex.fn, *ex.args)
            capture_s = time.perf_counter() - t0
        except Exception:
            print(
                f"{name}: could not build or capture:\n{traceback.format_exc(limit=3)}", flush=True
            )
            continue
        for strategy in args.strategies:
            if name.split()[0] != "zoo" and strategy in ("MP", "BP+Z3") and not args.small:
                continue  # the third-party models: four strategies, to fit the device's time
            try:
                s = wb.Session(program, wb.Mesh(MESH), STRATEGIES[strategy])
                e = s.estimate(spec)
                fn, compile_s = local_step(s)
                measured = timed(fn, args.repeats)
            except Exception:
                print(
                    f"{name} {strategy}: could not run:\n{traceback.format_exc(limit=4)}",
                    flush=True,
                )
                continue
            row = dict(
                model=name, strategy=strategy, flops=e.flops, simulated_compute_s=e.compute_s,
                simulated_communication_s=e.communication_s, measured_s=measured,
                ratio=measured / e.compute_s, compile_s=compile_s, capture_s=capture_s,
                peak_bytes=e.memory.peak if hasattr(e.memory, "peak") else None,
                device=device.device_kind, preset=spec.name,
            )  # fmt: skip
            rows.append(row)
            print(
                f"| {name} | {strategy} | {e.flops / 1e12:.2f} TFLOP | {e.compute_s * 1e3:.2f} ms | "
                f"{measured * 1e3:.2f} ms | {measured / e.compute_s:.2f} | "
                f"{e.communication_s * 1e3:.2f} ms | {measured and e.flops / measured / 1e12:.0f} TFLOP/s |",
                flush=True,
            )
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()
    if rows:
        ratios = [r["ratio"] for r in rows]
        print(
            f"measured / simulated compute: median {statistics.median(ratios):.2f}, "
            f"range {min(ratios):.2f}-{max(ratios):.2f} over {len(rows)} rows",
            flush=True,
        )
    if args.check_runs:
        check_runs()
    if os.environ.get("JAX_PLATFORMS", "") == "cpu" and not args.small:
        print("(on the CPU: use --small)")


if __name__ == "__main__":
    main()
