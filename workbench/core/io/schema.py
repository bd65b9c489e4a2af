"""The strategy file's schema: what a file may hold, checked before anything is built.

A strategy file is JSON data, read in three guarded steps: the bytes (a regular file,
at most ``MAX_BYTES``, UTF-8), the text (nested at most ``MAX_DEPTH`` deep, checked before
the JSON parser recurses; no NaN or Infinity, no repeated keys), then the document: its
``format`` and ``version`` (older versions are migrated, newer ones refused), a ``mesh``
of axis sizes and a ``schedule`` of tactics, each named from a fixed table of classes
(``tactic_classes``) with fields of the kinds their declarations say. Reading imports
nothing a file names and executes nothing. Version 1 (``"format": "workbench-strategy/1"``,
no ``version``) is version 2 without the ``version`` field; version 3 adds ``Imported``'s
``whole`` (the values a type holds whole per axis), which a version-2 file never names;
version 4 adds ``Place`` (where the mesh's axes lie on a hardware's levels), which no older
file names: each migration copies the document and sets its version.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import MISSING, fields
from pathlib import Path

from workbench.core.errors import FileFormatError, InputError, LimitError, MeshError, given
from workbench.core.layout.mesh import Mesh

FORMAT = "workbench-strategy"
VERSION = 4
MAX_BYTES = 4 * 2**20
MAX_DEPTH = 8  # a file nests 5 deep: document, schedule, tactic, field, a triple
MAX_TACTICS = 1000
MAX_INT = 2**31
MAX_DEVICES = 2**20
_FORMATS = {FORMAT: None, f"{FORMAT}/1": 1}  # format -> the version it implies


class FileLimitError(LimitError, FileFormatError):
    """A strategy file larger or deeper than the workbench reads."""


def tactic_classes() -> dict[str, type]:
    """Every tactic a strategy file may name, by class name."""
    from workbench.core.io.imports import Imported
    from workbench.core.propagate import tactics
    from workbench.core.strategies import NAMED

    classes = {c.__name__: c for c in (tactics.Tile, tactics.Replicate, tactics.Atomic, Imported)}
    classes.update(NAMED)  # the named strategies, Role and Place, as each registered itself
    from workbench.core.search.tree import Auto

    classes["Auto"] = Auto
    return classes


# -- bytes and text -----------------------------------------------------------------------------
def read_data(path, source: str | None = None):
    """The JSON document in the file at ``path``, at ``VERSION`` (see the module doc)."""
    if not isinstance(path, str | Path):
        raise InputError(f"a strategy file's path must be a str or a Path; got {given(path)}.")
    path = Path(path)
    source = source or f"strategy file {given(str(path))}"
    try:
        if not path.exists():
            folder = "" if path.parent.is_dir() else f" (nor does its folder {str(path.parent)!r})"
            raise FileFormatError(
                f"{source} does not exist{folder}; give the path of a file Session.save wrote."
            )
        if not path.is_file():
            kind = "a directory" if path.is_dir() else "not a regular file"
            raise FileFormatError(f"{source} is {kind}; give the path of a JSON strategy file.")
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except (OSError, ValueError) as err:  # a name too long, a NUL in it, no permission
        if isinstance(err, FileFormatError):
            raise
        raise FileFormatError(f"{source} cannot be read ({err}).") from err
    return migrate(parse(raw, source), source)


def parse(raw: bytes | str, source: str = "strategy file"):
    """The JSON value ``raw`` holds, refusing what is too large, too deep or not JSON."""
    if len(raw) > MAX_BYTES:
        raise FileLimitError(
            f"{source} holds more than {MAX_BYTES // 2**20} MiB; a strategy file is a few "
            "kilobytes: give the file Session.save wrote."
        )
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8-sig")
        except UnicodeDecodeError as err:
            raise FileFormatError(
                f"{source} is not UTF-8 text (byte {raw[err.start : err.start + 1]!r} at "
                f"offset {err.start}); a strategy file is JSON in UTF-8."
            ) from err
    if not raw.strip():
        raise FileFormatError(f"{source} is empty; a strategy file is a JSON object.")
    depth, still_open = _depths(raw)
    if depth > MAX_DEPTH:
        raise FileLimitError(
            f"{source} nests {depth} levels deep; a strategy file nests at most {MAX_DEPTH}."
        )
    try:
        return json.loads(raw, parse_constant=_no_constant, object_pairs_hook=_no_repeats)
    except _Refused as err:
        raise FileFormatError(f"{source}: {err}") from None
    except json.JSONDecodeError as err:
        ends_early = still_open > 0 or err.msg.startswith("Unterminated string")
        cut = (
            " (the file ends early: truncated?)"
            if ends_early or err.pos >= len(raw.rstrip())
            else ""
        )
        raise FileFormatError(
            f"{source} is not JSON: {err.msg.removesuffix(' at')} at line {err.lineno} column {err.colno}{cut}."
        ) from err


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")


def nesting(text: str) -> int:
    """How deep brackets nest in JSON ``text`` (outside strings), without parsing it."""
    return _depths(text)[0]


def _depths(text: str) -> tuple[int, int]:
    """The deepest nesting in ``text`` and the depth still open at its end."""
    depth = deepest = 0
    for m in _BRACKETS.finditer(_STRINGS.sub("", text)):
        depth += 1 if m.group() in "[{" else -1
        deepest = max(deepest, depth)
    return deepest, depth


class _Refused(Exception):
    """What the JSON parser's hooks raise; ``parse`` says which file."""


def _no_constant(name: str):
    raise _Refused(f"{name} is not a number a strategy file may hold; give a finite number.")


def _no_repeats(pairs):
    out = dict(pairs)
    if len(out) < len(pairs):
        seen = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _Refused(f"a JSON object names {given(twice)} twice; keep one.")
    return out


# -- the document -------------------------------------------------------------------------------
def _v1_to_v2(data: dict) -> dict:
    return {**data, "format": FORMAT, "version": 2}


def _v2_to_v3(data: dict) -> dict:
    # a version-2 Imported names no whole: it reads as the tiles alone, as it was written
    return {**data, "version": 3}


def _v3_to_v4(data: dict) -> dict:
    # version 4 adds Place, which a version-3 file never names: the rest reads as it was
    return {**data, "version": 4}


MIGRATIONS = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4}  # version -> makes it the next version


def migrate(data, source: str = "strategy file") -> dict:
    """``data`` at ``VERSION``: older versions migrated step by step; newer ones refused."""
    if not isinstance(data, dict) or data.get("format") not in _FORMATS:
        raise FileFormatError(
            f"{source} is not a workbench strategy: its {_what(data)}; expected a JSON "
            f'object with "format": "{FORMAT}" (as Session.save writes).'
        )
    version = data.get("version", _FORMATS[data["format"]] or 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise FileFormatError(
            f'{source}: "version" is {given(version)}; it is a whole number from 1 to {VERSION}.'
        )
    if version > VERSION:
        raise FileFormatError(
            f"{source} is version {version}, written by a newer workbench; this one reads "
            f"versions 1 to {VERSION}: upgrade workbench, or save the strategy again with it."
        )
    while version < VERSION:
        data, version = MIGRATIONS[version](data), version + 1
    return data


def _what(data) -> str:
    if not isinstance(data, dict):
        return f"top level is a JSON {_json_kind(data)}"
    if "format" not in data:
        return '"format" field is missing'
    return f'"format" is {given(data["format"])}'


def _json_kind(value) -> str:
    kinds = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return kinds.get(type(value), "number")


def tactics_from_data(data: dict, source: str = "strategy file") -> tuple[Mesh, list]:
    """The mesh and tactics a document at ``VERSION`` describes, checked field by field."""
    extra = sorted(set(data) - {"format", "version", "program", "mesh", "schedule"})
    if extra:
        raise FileFormatError(
            f"{source} has field {given(extra[0])}; a strategy holds format, version, "
            "program, mesh and schedule."
        )
    if not isinstance(data.get("program", ""), str):
        raise FileFormatError(f'{source}: "program" is {given(data["program"])}; give a name.')
    for key in ("mesh", "schedule"):
        if key not in data:
            raise FileFormatError(
                f'{source} has no "{key}" field; a strategy names its mesh and its schedule '
                '(e.g. "mesh": {"batch": 2}, "schedule": []).'
            )
    mesh = _mesh(data["mesh"], source)
    schedule = data["schedule"]
    if not isinstance(schedule, list):
        raise FileFormatError(
            f'{source}: "schedule" is {given(schedule)}; it is a list of tactics, '
            'e.g. [{"tactic": "BP", "axis": "batch"}].'
        )
    if len(schedule) > MAX_TACTICS:
        raise FileLimitError(
            f"{source}: its schedule holds {len(schedule)} tactics; at most {MAX_TACTICS}."
        )
    classes = tactic_classes()
    tactics = [_tactic(e, f"{source}: schedule[{i}]", classes) for i, e in enumerate(schedule)]
    for i, tactic in enumerate(tactics):  # a Place names the mesh's axes and their sizes
        if hasattr(tactic, "check_mesh"):
            try:
                tactic.check_mesh(mesh)
            except InputError as err:
                raise FileFormatError(f"{source}: schedule[{i}].factors: {err}") from err
    return mesh, tactics


def _mesh(axes, source: str) -> Mesh:
    example = 'e.g. "mesh": {"batch": 2, "model": 4}'
    if not isinstance(axes, dict) or not axes:
        raise FileFormatError(
            f'{source}: "mesh" is {given(axes)}; it maps axis names to sizes, {example}.'
        )
    for name, size in axes.items():
        if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_DEVICES:
            raise FileFormatError(
                f'{source}: "mesh" gives axis {given(name)} size {given(size)}; sizes are '
                f"whole numbers from 1 to {MAX_DEVICES}, {example}."
            )
    if math.prod(axes.values()) > MAX_DEVICES:
        raise FileLimitError(
            f'{source}: "mesh" {given(axes)} spans {math.prod(axes.values())} devices; '
            f"at most {MAX_DEVICES}."
        )
    try:
        return Mesh(axes)
    except MeshError as err:
        raise FileFormatError(f"{source}: {err}") from err


#: Tactic fields that hold objects, not data: never read from a file.
NOT_DATA = frozenset({"callback", "hardware"})


def data_fields(cls) -> dict:
    """The fields of tactic class ``cls`` a file may set, by name."""
    return {
        f.name: f
        for f in fields(cls)
        if f.init and not f.name.startswith("_") and f.name not in NOT_DATA
    }


def _tactic(entry, where: str, classes: dict):
    name = entry.get("tactic") if isinstance(entry, dict) else None
    if not isinstance(name, str) or name not in classes:
        shown = given(name) if isinstance(entry, dict) else given(entry)
        raise FileFormatError(f"{where} names tactic {shown}; known tactics are {sorted(classes)}.")
    cls = classes[name]
    allowed = data_fields(cls)
    kwargs = {}
    for key, value in entry.items():
        if key == "tactic":
            continue
        if key not in allowed:
            raise FileFormatError(
                f"{where} ({name}) has field {given(key)}; it takes {sorted(allowed)}."
            )
        kwargs[key] = plain(value, f"{where}.{key}")
        check_field(cls, allowed[key], kwargs[key], f"{where}.{key}")
    needed = [k for k, f in allowed.items() if f.default is MISSING]
    missing = [k for k in needed if k not in kwargs]
    if missing:
        raise FileFormatError(
            f"{where} ({name}) lacks {', '.join(map(repr, missing))}; {name} needs "
            f"{', '.join(needed)}, e.g. {_example(name, needed)}."
        )
    try:  # the class checks its own fields: Auto its budget and seconds, before any search
        return cls(**kwargs)
    except LimitError as err:
        raise FileLimitError(f"{where} ({name}): {err}") from err
    except Exception as err:  # a field the class refuses: the file is wrong, not the code
        raise FileFormatError(f"{where} ({name}): {err}") from err


def _example(name: str, needed: list[str]) -> str:
    samples = {"selector": "params/**", "dim": 0, "axis": "batch", "axes": "batch"}
    entry = {"tactic": name, **{k: samples.get(k, "...") for k in needed}}
    return json.dumps(entry)


_SCALARS = (str, int, float, bool, type(None))


def plain(value, where: str, depth: int = 0):
    """Only strings, finite numbers, booleans, null and lists of those (lists become
    tuples), nested at most ``MAX_DEPTH`` deep: a strategy is data."""
    if depth > MAX_DEPTH:
        raise FileLimitError(f"{where} nests lists more than {MAX_DEPTH} deep.")
    if isinstance(value, list | tuple):
        return tuple(plain(v, where, depth + 1) for v in value)
    if isinstance(value, float) and not math.isfinite(value):
        raise FileFormatError(f"{where} is {given(value)}; give a finite number.")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        raise FileLimitError(f"{where} is {given(value)}; integers go up to {MAX_INT}.")
    if isinstance(value, _SCALARS):
        return value
    raise FileFormatError(
        f"{where} holds a {type(value).__name__} ({given(value)}); only strings, numbers, "
        "booleans, null and lists of those are allowed."
    )


def _strings(v) -> bool:
    return isinstance(v, str) or (isinstance(v, tuple) and all(isinstance(x, str) for x in v))


def _triples(v) -> bool:
    return isinstance(v, tuple) and all(
        isinstance(t, tuple)
        and len(t) == 3
        and _strings(t[0])
        and isinstance(t[1], int)
        and not isinstance(t[1], bool)
        and isinstance(t[2], str | tuple)
        for t in v
    )


def _levels(v) -> bool:
    return isinstance(v, tuple) and bool(v) and all(isinstance(x, str) and x for x in v)


def _factors(v) -> bool:
    def positive(f):
        return isinstance(f, int) and not isinstance(f, bool) and f >= 1

    return (
        isinstance(v, tuple)
        and bool(v)
        and all(
            isinstance(e, tuple)
            and len(e) == 2
            and isinstance(e[0], str)
            and isinstance(e[1], tuple)
            and bool(e[1])
            and all(map(positive, e[1]))
            for e in v
        )
    )


#: Per kind of field: what a value read from a file must pass, and how to say it.
_ACCEPTS = {
    str: (_strings, "a string or a list of strings"),
    tuple: (_strings, "a list of strings"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    float: (lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number"),
    bool: (lambda v: isinstance(v, bool), "true or false"),
    "triples": (_triples, "a list of [selector, dim, axis] lists"),
    "levels": (_levels, 'a list of link names, innermost first (e.g. ["nvlink", "infiniband"])'),
    "factors": (
        _factors,
        "a list of [mesh axis, [factor per level]] pairs, each factor a positive integer "
        '(e.g. [["data", [2, 4]], ["model", [4, 1]]])',
    ),
}
#: Declared types named for a kind of their own (``imports.Triples``, ``placing.Levels``)
_NAMED_KINDS = {"Triples": "triples", "Levels": "levels", "Factors": "factors"}
_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "Selector": str}


def check_field(cls, f, value, where: str) -> None:
    """A field gets the kind of value its declaration or default says (selectors: a string
    or a list of strings; numbers: ints where floats go too; ``X | None``: null too)."""
    declared = str(f.type)
    if value is None and ("None" in declared or f.default is None):
        return
    base = declared.split("|")[0].strip()
    if f.default not in (MISSING, None):
        kind = type(f.default)
    elif base in _NAMED_KINDS:
        kind = _NAMED_KINDS[base]
    else:
        kind = tuple if base.startswith("tuple") else _TYPES.get(base)
    if kind in _ACCEPTS and not _ACCEPTS[kind][0](value):
        raise FileFormatError(
            f"{where} of {cls.__name__} must be {_ACCEPTS[kind][1]}; got {given(value)}."
        )
