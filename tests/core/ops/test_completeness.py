"""Every primitive the project's own programs capture has a record: the zoo (fast, at its
tiny size), and in the slow lane the zoo at every preset (what the benchmarks and the course
notebooks build) and the third-party model matrix. Each notebook's own captures are checked
as it runs (tests/notebooks/test_notebooks.py)."""

from __future__ import annotations

import pathlib
import warnings

import pytest

import workbench as wb
from tests.core.zoo import ZOO, program
from workbench.core import ops
from workbench.models import ZOO as MODELS
from workbench.models import build

NOTEBOOKS = pathlib.Path(wb.__file__).parents[1] / "notebooks"


def unregistered(primitives) -> list[str]:
    return sorted(p for p in primitives if ops.record(p) is None)


def test_every_primitive_the_zoo_captures_is_registered():
    for name in ZOO:
        assert not unregistered(program(name).primitives), name


def _capture(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return wb.capture(fn, *args)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_preset_of_the_zoo_is_registered(name):
    """Every preset (the benchmarks and notebooks build these, with other layer counts and
    batches), at two layers where the model has layers: the primitives do not depend on it."""
    for size in MODELS[name].config_cls.PRESETS:
        config = MODELS[name].config(size)
        if hasattr(config, "n_layers"):
            config = config.replace(n_layers=min(config.n_layers, 2))
        ex = build(name, config, abstract=True)
        assert not unregistered(_capture(ex.fn, *ex.args).primitives), (name, size)


@pytest.mark.slow
def test_every_primitive_of_the_model_matrix_is_registered():
    from workbench.models.external import EXTERNAL, build_external

    for name in EXTERNAL:
        ex = build_external(name, "tiny", abstract=True)
        assert not unregistered(_capture(ex.fn, *ex.args).primitives), name
