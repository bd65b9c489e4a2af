"""Fixtures the widget tests share: the tiny zoo LM, captured once per module."""

import pytest

import workbench as wb
from workbench.models import build

MESH = {"batch": 2, "model": 4}


@pytest.fixture(scope="module")
def program():
    ex = build("lm", "tiny")
    return wb.capture(ex.fn, *ex.args)


def on_page(bench):
    """What the page sends once it shows the Workbench: the graph and charts the opening
    held back are drawn."""
    bench.graph._message(bench.graph, {"event": "shown"}, [])
    return bench
