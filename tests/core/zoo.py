"""Captured zoo programs, built once per test session."""

from functools import cache

import workbench as wb
from workbench.models import build

ZOO = ("mlp", "lm", "lm_scan", "cnn", "gnn")


@cache
def program(name: str, size: str = "tiny") -> wb.Program:
    ex = build(name, size, abstract=True)
    return wb.capture(ex.fn, *ex.args)
