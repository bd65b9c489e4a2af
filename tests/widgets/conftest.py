"""Fixtures the widget tests share: the tiny zoo LM, captured once per module."""

import pytest

import workbench as wb
from workbench.models import build

MESH = {"batch": 2, "model": 4}


@pytest.fixture(scope="module")
def program():
    ex = build("lm", "tiny")
    return wb.capture(ex.fn, *ex.args)
