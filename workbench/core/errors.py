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


class InputError(WorkbenchError, ValueError):
    """An argument that cannot be used: its message says what was given, why it is wrong and
    what would work. Also a ``ValueError``, so code that catches those keeps working."""


class LimitError(InputError):
    """A budget, a duration or a size outside what the workbench will take on."""


class FileFormatError(InputError):
    """A strategy or session file that is not one: missing, unreadable, or not the schema."""


class DeviceError(WorkbenchError):
    """The attached devices cannot run what was asked (too few of them, a wrong kind)."""


def given(value, limit: int = 80) -> str:
    """``value`` as an error message shows what was given: its repr, cut to ``limit``
    characters, with its type when the repr does not say it."""
    text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    kind = type(value).__name__
    plain = isinstance(value, str | int | float | bool | type(None) | list | tuple | dict)
    return text if plain else f"{text} (a {kind})"


def closest_names(name: str, candidates, limit: int = 3) -> list[str]:
    """The candidates most like `name`, for "did you mean" hints."""
    import difflib

    return difflib.get_close_matches(name, list(candidates), n=limit, cutoff=0.5)
