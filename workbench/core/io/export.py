"""Export a session: Python that rebuilds its schedule, plain JAX that needs no workbench, and
a JSON strategy file (data only; ``schema`` checks what is read, and executes nothing).

Every value written into generated code goes through ``literal`` (comments through
``comment``), so names holding quotes, newlines, backslashes or code stay inert data,
inside code, comments and docstrings alike.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from dataclasses import MISSING, fields
from pathlib import Path

from workbench.core.errors import InputError, WorkbenchError, given
from workbench.core.io import schema
from workbench.core.io.schema import tactic_classes
from workbench.core.layout.mesh import Mesh

FORMAT = schema.FORMAT
__all__ = ["FORMAT", "export_code", "literal", "read", "save", "tactic_classes", "to_json"]


# -- quoting ------------------------------------------------------------------------------------
def _char(ch: str) -> str:
    if ch in "\\'\"":
        return "\\" + ch
    return ch if " " <= ch <= "~" else ascii(ch)[1:-1]


def literal(value) -> str:
    """Python source for ``value`` (str, int, float, bool, None, and lists, tuples and dicts
    of those) that is inert anywhere in generated code: strings are single-quoted printable
    ASCII with every quote, backslash and other character escaped, so no name can end a
    string, a docstring or a comment line. Anything else raises ``InputError``."""
    if isinstance(value, str):
        return "'" + "".join(map(_char, value)) + "'"
    if isinstance(value, bool | type(None)):
        return repr(value)
    if isinstance(value, numbers.Integral):
        return repr(int(value))
    if isinstance(value, numbers.Real):
        value = float(value)
        return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
    if isinstance(value, list):
        return "[" + ", ".join(map(literal, value)) + "]"
    if isinstance(value, tuple):
        inner = ", ".join(map(literal, value))
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    raise InputError(
        f"cannot write {given(value)} into generated code; only strings, numbers, booleans, "
        "None and lists, tuples and dicts of those are written."
    )


def comment(text: str) -> str:
    """``text`` for a one-line ``#`` comment: printable ASCII, every other character escaped."""
    return "".join(ch if " " <= ch <= "~" else ascii(ch)[1:-1] for ch in str(text))


def exported_tactics(session) -> list:
    """The schedule as tactics that rebuild it; a search is written as what it decided."""
    out = []
    for i, tactic in enumerate(session.history):
        decided = getattr(tactic, "decisions", None)
        out.extend(
            decided(session.program, session.mesh, session.state_at(i)) if decided else [tactic]
        )
    return out


def _schedule_lines(session) -> list[str]:
    """One line per tactic; a search's decisions under a comment naming the search."""
    lines = []
    for i, tactic in enumerate(session.history):
        decided = getattr(tactic, "decisions", None)
        if decided is None:
            lines.append(f"    {_tactic_code(tactic)},")
            continue
        chosen = decided(session.program, session.mesh, session.state_at(i))
        note = "decided:" if chosen else "decided to leave every input as it was"
        lines.append(f"    # {comment(' '.join(str(tactic).split()))} {note}")
        lines += [f"    {_tactic_code(t)}," for t in chosen]
    return lines


def _tactic_code(tactic) -> str:
    """``Tile(selector='params/**/w_in', dim=1, axis='model')``: every field left at its
    default omitted, every value written by ``literal`` (strings stay inert data)."""
    args = []
    for f in fields(tactic):
        if not f.init or f.name.startswith("_"):
            continue
        value = getattr(tactic, f.name)
        if f.default is MISSING or value != f.default:
            value = list(value) if isinstance(value, tuple) else value
            args.append(f"{f.name}={literal(value)}")
    return f"{type(tactic).__name__}({', '.join(args)})"


def export_code(session) -> str:
    """Python source that rebuilds this session's state from a captured program."""
    from workbench.core.strategies import named as registry

    tactics = exported_tactics(session)
    used = sorted({type(t).__name__ for t in tactics})
    named = [n for n in used if n in registry.NAMED]  # imported from the registry
    core = [n for n in used if n not in named]  # the primitive tactics, from ``workbench``
    lines = [
        f'"""The partitioning schedule of {literal(session.program.name)} on a '
        f"{literal(dict(session.mesh.axes))} mesh, exported by workbench.",
        "",
        "    session = build(workbench.capture(fn, *args))",
        '"""',
        "",
        "import workbench",
    ]
    if core:
        lines.append(f"from workbench import {', '.join(core)}")
    if named:
        lines.append(f"from {registry.__name__} import {', '.join(named)}")
    lines += [
        "",
        f"MESH = workbench.Mesh({literal(dict(session.mesh.axes))})",
        "SCHEDULE = [",
        *_schedule_lines(session),
        "]",
        "",
        "",
        "def build(program):",
        '    """The session for ``program`` with this schedule applied."""',
        "    return workbench.Session(program, MESH, SCHEDULE)",
        "",
    ]
    return "\n".join(lines)


# -- JSON strategy files ------------------------------------------------------------------------
def to_json(session) -> dict:
    """The session's strategy as a document at ``schema.VERSION``."""
    schedule = []
    for tactic in exported_tactics(session):
        entry = {"tactic": type(tactic).__name__}
        for name in schema.data_fields(type(tactic)):
            value = getattr(tactic, name)
            entry[name] = list(value) if isinstance(value, tuple) else value
        schedule.append(_lists(entry))
    return {
        "format": schema.FORMAT,
        "version": schema.VERSION,
        "program": session.program.name,
        "mesh": dict(session.mesh.axes),
        "schedule": schedule,
    }


def _lists(value):
    """Tuples as lists, all the way down (JSON has lists)."""
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_lists(v) for v in value]
    return value


def save(session, path) -> Path:
    """Write the session's strategy to ``path`` (its folder must exist): only a document the
    loader reads back is written, and a failed write leaves no half-written file."""
    if not isinstance(path, str | Path) or not str(path).strip():
        raise InputError(f"save needs a file path (a str or a Path); got {given(path)}.")
    path = Path(path)
    if path.is_dir():
        raise InputError(
            f"save: {str(path)!r} is a folder; give a file path in it, e.g. "
            f"{str(path / 'strategy.json')!r}."
        )
    if not path.parent.is_dir():
        raise InputError(
            f"save: the folder {str(path.parent)!r} of {str(path)!r} does not exist; create "
            "it first (e.g. os.makedirs) or save to a file in an existing folder."
        )
    data = to_json(session)
    try:
        schema.tactics_from_data(data, source="the strategy to save")
        text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    except (WorkbenchError, TypeError, ValueError) as err:
        raise InputError(
            f"save: this session's schedule cannot be written as a strategy file ({err}); "
            "export_code() writes it as Python instead."
        ) from err
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    except OSError as err:
        temporary.unlink(missing_ok=True)
        raise InputError(f"save: cannot write {str(path)!r} ({err.strerror or err}).") from err
    return path


def tactics_from_json(data, source: str = "strategy file") -> tuple[Mesh, list]:
    """The mesh and tactics a strategy document describes (any known version), checked by
    ``schema``; messages name ``source`` (the command line passes ``--tactics``)."""
    return schema.tactics_from_data(schema.migrate(data, source), source)


def read(path, source: str | None = None) -> tuple[Mesh, list]:
    """The mesh and schedule a JSON strategy file holds (``Session.load`` builds the session);
    a file that is not one raises ``FileFormatError`` (``LimitError`` if too large)."""
    source = source or f"strategy file {given(str(path))}"
    return schema.tactics_from_data(schema.read_data(path, source), source)
