"""Export a session: Python that rebuilds its schedule, plain JAX that needs no workbench, and
a JSON strategy file (data only; loading it never executes anything).

Every string written into exported text goes through ``repr``, so value names holding
quotes, newlines or code stay inert data.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, fields
from pathlib import Path

from workbench.core.errors import WorkbenchError
from workbench.core.layout.mesh import Mesh

FORMAT = "workbench-strategy/1"


def tactic_classes() -> dict[str, type]:
    """Every tactic a strategy file may name, by class name."""
    from workbench.core.io.imports import Imported
    from workbench.core.propagate import tactics
    from workbench.core.strategies import NAMED

    classes = {c.__name__: c for c in (tactics.Tile, tactics.Replicate, tactics.Atomic, Imported)}
    classes.update(NAMED)  # the named strategies and Role, as each registered itself
    try:
        from workbench.core.search.tree import Auto

        classes["Auto"] = Auto
    except ImportError:  # pragma: no cover - the search is optional
        pass
    return classes


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
        # str() of a search holds only repr()s of its fields: one line, inert
        note = "decided:" if chosen else "decided to leave every input as it was"
        lines.append(f"    # {' '.join(str(tactic).split())} {note}")
        lines += [f"    {_tactic_code(t)}," for t in chosen]
    return lines


def _tactic_code(tactic) -> str:
    """``Tile(selector='params/**/w_in', dim=1, axis='model')``: every field left at its
    default omitted, every value written with ``repr`` (strings stay inert data)."""
    args = []
    for f in fields(tactic):
        if not f.init or f.name.startswith("_"):
            continue
        value = getattr(tactic, f.name)
        if f.default is MISSING or value != f.default:
            value = list(value) if isinstance(value, tuple) else value
            args.append(f"{f.name}={value!r}")
    return f"{type(tactic).__name__}({', '.join(args)})"


def export_code(session) -> str:
    """Python source that rebuilds this session's state from a captured program."""
    from workbench.core.strategies import named as registry

    tactics = exported_tactics(session)
    used = sorted({type(t).__name__ for t in tactics})
    named = [n for n in used if n in registry.NAMED]  # imported from the registry
    core = [n for n in used if n not in named]  # the primitive tactics, from ``workbench``
    lines = [
        f'"""The partitioning schedule of {session.program.name!r} on {session.mesh}, exported by workbench.',
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
        f"MESH = workbench.Mesh({dict(session.mesh.axes)!r})",
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
    schedule = []
    for tactic in exported_tactics(session):
        entry = {"tactic": type(tactic).__name__}
        for f in fields(tactic):
            if f.init and not f.name.startswith("_"):
                value = getattr(tactic, f.name)
                entry[f.name] = list(value) if isinstance(value, tuple) else value
        schedule.append(entry)
    return {
        "format": FORMAT,
        "program": session.program.name,
        "mesh": dict(session.mesh.axes),
        "schedule": schedule,
    }


def save(session, path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(to_json(session), indent=2) + "\n")
    return path


_SCALARS = (str, int, float, bool, type(None))


def _plain(value, where: str):
    """Only strings, numbers, booleans, null and lists of those: a strategy is data."""
    if isinstance(value, list):
        return tuple(_plain(v, where) for v in value)
    if isinstance(value, _SCALARS):
        return value
    raise WorkbenchError(
        f"{where} holds a {type(value).__name__}; only strings, numbers and lists are allowed."
    )


#: Tactic fields that hold objects, not data: never read from a file.
_NOT_DATA = frozenset({"callback", "hardware"})
_TYPES = {
    "str": str,
    "int": int,
    "float": float,
    "bool": bool,
    "Selector": str,
    "Triples": "triples",
}


def _strings(v) -> bool:
    return isinstance(v, str) or (isinstance(v, tuple) and all(isinstance(x, str) for x in v))


#: Per kind of field: what a value read from a file must pass, and how to say it.
_ACCEPTS = {
    str: (_strings, "a string or a list of strings"),
    tuple: (_strings, "a list of strings"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    float: (lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number"),
    bool: (lambda v: isinstance(v, bool), "true or false"),
    "triples": (
        lambda v: isinstance(v, tuple) and all(isinstance(t, tuple) and len(t) == 3 for t in v),
        "a list of [selector, dim, axis] lists",
    ),
}


def _check_type(cls, f, value, where: str) -> None:
    """A field gets the kind of value its declaration or default says (selectors: a string
    or a list of strings; numbers: ints where floats go too; ``X | None``: null too)."""
    declared = str(f.type)
    if value is None and ("None" in declared or f.default is None):
        return
    base = declared.split("|")[0].strip()
    if f.default not in (MISSING, None):
        kind = type(f.default)
    else:
        kind = tuple if base.startswith("tuple") else _TYPES.get(base)
    if kind in _ACCEPTS and not _ACCEPTS[kind][0](value):
        raise WorkbenchError(
            f"{where} of {cls.__name__} must be {_ACCEPTS[kind][1]}; got {value!r}."
        )


def tactics_from_json(data, source: str = "strategy file") -> tuple[Mesh, list]:
    """The mesh and tactics a strategy file describes, checked field by field; messages name
    ``source`` as where the schedule came from (the command line passes ``--tactics``)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise WorkbenchError(
            f'not a workbench strategy: expected a JSON object with "format": "{FORMAT}".'
        )
    mesh_data = data.get("mesh")
    if not isinstance(mesh_data, dict) or not all(isinstance(v, int) for v in mesh_data.values()):
        raise WorkbenchError(
            f'{source}: "mesh" must map axis names to sizes, e.g. {{"batch": 2, "model": 4}}.'
        )
    mesh = Mesh(mesh_data)
    classes = tactic_classes()
    tactics = []
    for i, entry in enumerate(data.get("schedule", [])):
        if not isinstance(entry, dict) or entry.get("tactic") not in classes:
            name = entry.get("tactic") if isinstance(entry, dict) else entry
            raise WorkbenchError(
                f"{source}: schedule[{i}] names tactic {name!r}; known tactics are {sorted(classes)}."
            )
        cls = classes[entry["tactic"]]
        fields_by_name = {
            f.name: f
            for f in fields(cls)
            if f.init and not f.name.startswith("_") and f.name not in _NOT_DATA
        }
        allowed = set(fields_by_name)
        kwargs = {}
        for key, value in entry.items():
            if key == "tactic":
                continue
            if key not in allowed:
                raise WorkbenchError(
                    f"{source}: schedule[{i}] ({cls.__name__}) has field {key!r}; it takes {sorted(allowed)}."
                )
            where = f"{source}: schedule[{i}].{key}"
            kwargs[key] = _plain(value, where)
            _check_type(cls, fields_by_name[key], kwargs[key], where)
        try:
            tactics.append(cls(**kwargs))
        except TypeError as err:
            raise WorkbenchError(f"{source}: schedule[{i}] ({cls.__name__}): {err}") from err
    return mesh, tactics


def read(path) -> tuple[Mesh, list]:
    """The mesh and schedule a JSON strategy file holds (``Session.load`` builds the session)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise WorkbenchError(f"cannot read strategy file {str(path)!r}: {err}") from err
    return tactics_from_json(data)
