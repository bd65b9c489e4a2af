"""The simulator's accelerator presets against published training runs: MaxText's measured
step times on TPU v5e (the runs and how they are rebuilt: ``benchmarks/published_runs.py``,
whose table docs/benchmarks.md quotes)."""

import importlib
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


@pytest.fixture(scope="module")
def runs():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("published_runs")
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.mark.slow
@pytest.mark.parametrize(("size", "slices"), [("16B", 1), ("32B", 1), ("16B", 2)])
def test_step_times_are_within_15_percent_of_maxtexts_on_tpu_v5e(runs, size, slices):
    published, estimate, flops = runs.compare(size, slices)
    assert 0.85 < estimate.step_s / published < 1.15, (estimate.step_s, published)
    # the model FLOPs MaxText counts are all in the estimate, plus the recomputed forward
    assert flops < estimate.flops < 1.6 * flops
