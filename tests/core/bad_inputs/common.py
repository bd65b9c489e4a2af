"""What every bad-input case asserts: the error's type, a fragment of its message, and a
session left exactly as it was."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

import workbench as wb


@dataclass(frozen=True)
class Snapshot:
    """What a user can see of a session: its cursor, history, redo stack and current state."""

    step: int
    history: tuple
    redo: tuple
    state: object

    @classmethod
    def of(cls, s: wb.Session) -> Snapshot:
        return cls(s.step, tuple(map(str, s.history)), tuple(map(str, s.redo_stack)), s.state)


def expect(call, error: type[BaseException], fragment: str, session: wb.Session | None = None):
    """Run ``call()``; it must raise ``error`` (a WorkbenchError) whose message holds
    ``fragment`` (a case-insensitive regular expression), leaving ``session`` unchanged."""
    assert issubclass(error, wb.WorkbenchError), f"{error} is not a WorkbenchError"
    before = Snapshot.of(session) if session is not None else None
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert re.search(fragment, message, re.IGNORECASE | re.DOTALL), (
        f"message {message!r} does not match {fragment!r}"
    )
    if session is not None:
        assert Snapshot.of(session) == before, "the session changed after a failure"
    return info.value
