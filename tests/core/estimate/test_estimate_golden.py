"""The simulator's figures pinned: zoo x {BP, BP+MP, BP+MP+Z3, BP+Z3} x every preset x overlap.

A restructuring of the engine must leave every estimate as it was (step time, compute,
communication by kind, FLOPs, kernels, memory peak and its parts, collective bytes).
Regenerate the table only for a deliberate change of the model, and list the rows that
changed, before and after, in docs/benchmarks.md:

    python -m tests.core.estimate.test_estimate_golden > tests/core/estimate/golden/estimates.json
"""

from __future__ import annotations

import json
import math
import pathlib

import pytest

import workbench as wb
from tests.core import zoo

GOLDEN = pathlib.Path(__file__).parent / "golden" / "estimates.json"
MESH = {"batch": 2, "model": 4}
STRATEGIES = {
    "BP": lambda: [wb.BP("batch")],
    "BP+MP": lambda: [wb.BP("batch"), wb.MP("model")],
    "BP+MP+Z3": lambda: [wb.BP("batch"), wb.MP("model"), wb.Z3("batch")],
    "BP+Z3": lambda: [wb.BP("batch"), wb.Z3("batch")],  # the CNN and the GNN have no MP
}
OVERLAPS = ("none", "prefetch")


def figures(est) -> dict:
    """The figures of one estimate that the golden table pins."""
    mem = est.memory
    return {
        "step_s": est.step_s,
        "compute_s": est.compute_s,
        "communication_s": est.communication_s,
        "by_kind": dict(est.by_kind),
        "flops": est.flops,
        "kernels": est.kernels,
        "fresh_memory_s": est.fresh_memory_s,
        "peak": mem.peak,
        "at_peak": dict(mem.at_peak),
        "arguments": mem.arguments,
        "outputs": mem.outputs,
        "temporaries": mem.temporaries,
        "states": dict(mem.states),
        "collectives": len(est.collectives),
        "collective_bytes": sum(c.collective.bytes * c.collective.count for c in est.collectives),
    }


def session(model: str, strategy: str) -> wb.Session:
    s = wb.Session(zoo.program(model), wb.Mesh(MESH))
    for tactic in STRATEGIES[strategy]():
        s.apply(tactic)
    return s


def table() -> dict:
    """Every row of the golden table, computed now."""
    rows = {}
    for model in zoo.ZOO:
        for strategy in STRATEGIES:
            try:
                s = session(model, strategy)
            except wb.WorkbenchError as e:  # MP finds nothing to split in a CNN or a GNN
                rows[f"{model} | {strategy}"] = {"refused": type(e).__name__}
                continue
            for name, hw in sorted(wb.hardware.PRESETS.items()):
                for overlap in OVERLAPS:
                    rows[f"{model} | {strategy} | {name} | {overlap}"] = figures(
                        s.estimate(hw, overlap=overlap)
                    )
    return rows


def _close(a, b, path: str, bad: list[str]) -> None:
    if isinstance(a, dict):
        if set(a) != set(b):
            bad.append(f"{path}: keys {sorted(a)} != {sorted(b)}")
        for k in set(a) & set(b):
            _close(a[k], b[k], f"{path}.{k}", bad)
    elif isinstance(a, str) or isinstance(b, str):
        if a != b:
            bad.append(f"{path}: {a!r} now, {b!r} pinned")
    elif not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15):
        bad.append(f"{path}: {a!r} now, {b!r} pinned")


@pytest.fixture(scope="module")
def now() -> dict:
    return table()


def test_every_row_is_pinned(now):
    pinned = json.loads(GOLDEN.read_text())
    assert set(now) == set(pinned)


@pytest.mark.parametrize("model", zoo.ZOO)
def test_estimates_equal_the_pinned_figures(now, model):
    pinned = json.loads(GOLDEN.read_text())
    bad: list[str] = []
    for key, row in now.items():
        if key.startswith(f"{model} |") and key in pinned:
            _close(row, pinned[key], key, bad)
    assert not bad, "\n".join(bad[:20])


if __name__ == "__main__":
    import tests.conftest  # noqa: F401  (8 virtual CPU devices, as under pytest)

    print(json.dumps(table(), indent=1, sort_keys=True))
