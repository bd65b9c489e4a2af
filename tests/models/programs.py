"""The third-party models' "tiny" examples and their captured programs, built once per test
session and shared by the test modules that train, capture and run them."""

from __future__ import annotations

import functools
import warnings

import workbench as wb
from workbench.models import Example
from workbench.models.external import build_external


@functools.cache
def tiny(name: str) -> Example:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_external(name)


@functools.cache
def program(name: str) -> wb.Program:
    ex = tiny(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return wb.capture(ex.fn, *ex.args)
