"""The errors users see. Every message names the thing, shows what was given, and says what would work."""

from __future__ import annotations


class WorkbenchError(Exception):
    """Base of every user-facing error. A session is unchanged after one is raised."""


class CaptureError(WorkbenchError):
    """The function could not be traced into a program."""


class MeshError(WorkbenchError):
    """A mesh was described wrongly, or does not fit the devices at hand."""


class SelectorError(WorkbenchError):
    """A selector is malformed or matches no value."""


class TacticError(WorkbenchError):
    """A tactic cannot be applied to the values it selects."""


class LeftWhole(TacticError):
    """A tactic left a value it targets whole on its axis, and the session (or the tactic) is strict."""


class NothingTiled(LeftWhole):
    """A named strategy tiled nothing: no value it targets got its axis."""


class UnknownValueError(WorkbenchError):
    """A value name that the program does not have."""


class HistoryError(WorkbenchError):
    """Undo, redo or a jump past either end of the history."""


def closest_names(name: str, candidates, limit: int = 3) -> list[str]:
    """The candidates most like `name`, for "did you mean" hints."""
    import difflib

    return difflib.get_close_matches(name, list(candidates), n=limit, cutoff=0.5)
