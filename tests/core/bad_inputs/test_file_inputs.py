"""Bad strategy files, read by ``Session.load`` and by the command line, and bad save paths:
each a clear error (type, message) and nothing changed, never a traceback or a half-result."""

from __future__ import annotations

import builtins
import json
import sys

import pytest

import workbench as wb
from tests.core.bad_inputs.common import expect
from workbench.cli import main
from workbench.core.errors import FileFormatError, InputError, LimitError
from workbench.core.io import schema
from workbench.models import build

MESH = {"batch": 2, "model": 4}


@pytest.fixture(scope="module")
def session():
    ex = build("mlp", "tiny")
    return wb.Session(wb.capture(ex.fn, *ex.args), wb.Mesh(MESH), [wb.BP("batch")])


def doc(schedule=(), **fields) -> bytes:
    """A version 2 strategy file's bytes; ``fields`` replace (None: remove) its fields."""
    data = {"format": "workbench-strategy", "version": 2, "mesh": MESH, "schedule": schedule}
    data.update(fields)
    return json.dumps({k: v for k, v in data.items() if v is not None}).encode()


def auto(**fields) -> bytes:
    return doc([{"tactic": "Auto", "axes": "model", **fields}])


def tile(**fields) -> bytes:
    return doc([{"tactic": "Tile", "selector": "params/**", "dim": 0, "axis": "batch", **fields}])


def place(**fields) -> bytes:
    """A version 4 file whose schedule is one ``Place`` (``fields`` replace its own)."""
    entry = {"tactic": "Place", "levels": ["nvlink", "infiniband"], **fields}
    entry.setdefault("factors", [["batch", [2, 1]], ["model", [2, 2]]])
    return doc([entry], version=4)


DEEP = b'{"format": "workbench-strategy", "mesh": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
# name -> (the file's bytes, or a special path; the error; a fragment of its message)
CASES = {
    "missing file": ("<missing>", FileFormatError, r"missing\.json' does not exist; give"),
    "missing folder": ("<no folder>", FileFormatError, r"nor does its folder"),
    "a directory": ("<directory>", FileFormatError, r"is a directory"),
    "empty file": (b"", FileFormatError, r"is empty"),
    "only whitespace": (b"  \n\t\n", FileFormatError, r"is empty"),
    "truncated": (doc()[:40], FileFormatError, r"is not JSON: .*line 1 .*truncated\?"),
    "not JSON": (b"mesh: batch=2", FileFormatError, r"is not JSON: Expecting value at line 1"),
    "trailing garbage": (doc() + b" {}", FileFormatError, r"is not JSON: Extra data"),
    "not UTF-8": (b'{"format": "\xff\xfe"}', FileFormatError, r"not UTF-8 .*offset 12"),
    "UTF-16": (doc().decode().encode("utf-16"), FileFormatError, r"not UTF-8"),
    "too large": (b" " * (schema.MAX_BYTES + 1), LimitError, r"more than 4 MiB"),
    "nested too deep": (doc([[[[[[[[[1]]]]]]]]]), LimitError, r"nests 10 levels deep; .*at most 8"),
    "nested 100000 deep": (DEEP, LimitError, r"nests 100001 levels deep"),
    "top level a list": (b"[]", FileFormatError, r"top level is a JSON array"),
    "top level a number": (b"3", FileFormatError, r"top level is a JSON number"),
    "no format": (doc(format=None), FileFormatError, r'"format" field is missing'),
    "another format": (doc(format="xml"), FileFormatError, r"\"format\" is 'xml'"),
    "a newer version": (
        doc(version=schema.VERSION + 1),
        FileFormatError,
        rf"version {schema.VERSION + 1}, written by a newer",
    ),
    "version a string": (doc(version="2"), FileFormatError, r"\"version\" is '2'"),
    "version zero": (
        doc(version=0),
        FileFormatError,
        rf"\"version\" is 0; .*from 1 to {schema.VERSION}",
    ),
    "version true": (doc(version=True), FileFormatError, r"\"version\" is True"),
    "no mesh": (doc(mesh=None), FileFormatError, r'has no "mesh" field'),
    "no schedule": (doc(schedule=None), FileFormatError, r'has no "schedule" field'),
    "schedule an int": (doc(schedule=3), FileFormatError, r'"schedule" is 3; it is a list'),
    "schedule an object": (doc(schedule={"a": 1}), FileFormatError, r'"schedule" is \{'),
    "too many tactics": (
        doc([{"tactic": "BP", "axis": "batch"}] * (schema.MAX_TACTICS + 1)),
        LimitError,
        r"1001 tactics; at most 1000",
    ),
    "mesh a list": (doc(mesh=["batch", 2]), FileFormatError, r'"mesh" is \[.*maps axis names'),
    "mesh empty": (doc(mesh={}), FileFormatError, r'"mesh" is \{\}'),
    "mesh size zero": (doc(mesh={"batch": 0}), FileFormatError, r"axis 'batch' size 0"),
    "mesh size true": (doc(mesh={"batch": True}), FileFormatError, r"size True"),
    "mesh size a float": (doc(mesh={"batch": 2.0}), FileFormatError, r"size 2\.0"),
    "mesh too large": (doc(mesh={"a": 2**20, "b": 2}), LimitError, r"spans 2097152 devices"),
    "mesh axis not a name": (doc(mesh={"a b": 2}), FileFormatError, r"'a b'"),
    "an unknown top-level field": (doc(code="print(1)"), FileFormatError, r"field 'code'"),
    "program not a string": (doc(program=[1]), FileFormatError, r'"program" is \[1\]'),
    "a repeated key": (
        b'{"format": "workbench-strategy", "mesh": {"b": 2}, "mesh": {"b": 4}}',
        FileFormatError,
        r"names 'mesh' twice",
    ),
    "NaN seconds": (
        auto(seconds=0).replace(b"0}", b"NaN}"),
        FileFormatError,
        r"NaN is not a number",
    ),
    "Infinity memory limit": (
        auto(memory_limit=1).replace(b"1}", b"-Infinity}"),
        FileFormatError,
        r"-Infinity is not a number",
    ),
    "an overflowing number": (auto(seconds=1).replace(b"1}", b"1e999}"), FileFormatError, r"inf"),
    "a huge budget": (auto(budget=10**9), LimitError, r"\(Auto\): Auto's budget=1,000,000,000"),
    "a day and more": (auto(seconds=86_401), LimitError, r"seconds=86401"),
    "a negative budget": (auto(budget=-1), LimitError, r"budget=-1"),
    "an unknown goal": (auto(goal="speed"), FileFormatError, r"goal must be 'time' or 'memory'"),
    "an unknown tactic": (doc([{"tactic": "eval"}]), FileFormatError, r"names tactic 'eval'"),
    "a dotted name": (doc([{"tactic": "os.system"}]), FileFormatError, r"tactic 'os.system'"),
    "tactic a list": (doc([{"tactic": ["BP"]}]), FileFormatError, r"names tactic \['BP'\]"),
    "no tactic key": (doc([{"axis": "batch"}]), FileFormatError, r"names tactic None"),
    "entry a string": (doc(["BP"]), FileFormatError, r"names tactic 'BP'; known"),
    "a missing field": (
        doc([{"tactic": "Tile", "selector": "x"}]),
        FileFormatError,
        r"\(Tile\) lacks 'dim', 'axis'; Tile needs selector, dim, axis",
    ),
    "an unknown field": (tile(code="1"), FileFormatError, r"has field 'code'; it takes"),
    "an object field": (auto(callback="print"), FileFormatError, r"has field 'callback'"),
    "a selector object": (tile(selector={"$": 1}), FileFormatError, r"holds a dict"),
    "a dim string": (tile(dim="0"), FileFormatError, r"dim of Tile must be an integer"),
    "a dim boolean": (tile(dim=False), FileFormatError, r"must be an integer; got False"),
    "a dim too large": (tile(dim=2**40), LimitError, r"integers go up to"),
    "strict a string": (
        doc([{"tactic": "BP", "axis": "batch", "strict": "yes"}]),
        FileFormatError,
        r"strict of BP must be true or false",
    ),
    "malformed tiles": (
        doc([{"tactic": "Imported", "source": "x", "tiles": [["w", "0", "batch"]]}]),
        FileFormatError,
        r"tiles of Imported must be a list of \[selector, dim, axis\]",
    ),
    "place levels a string": (
        place(levels="nvlink"),
        FileFormatError,
        r"schedule\[0\]\.levels of Place must be a list of link names",
    ),
    "place levels empty": (place(levels=[]), FileFormatError, r"\.levels of Place must be"),
    "place factors a dict": (
        place(factors={"batch": [2, 1]}),
        FileFormatError,
        r"\.factors holds a dict",
    ),
    "place factors flat": (
        place(factors=["batch", 2, 1]),
        FileFormatError,
        r"\.factors of Place must be a list of \[mesh axis, \[factor per level\]\] pairs",
    ),
    "place a factor zero": (
        place(factors=[["batch", [2, 0]], ["model", [2, 2]]]),
        FileFormatError,
        r"\.factors of Place must be .*positive integer.*got \(\('batch', \(2, 0\)\)",
    ),
    "place a factor negative": (
        place(factors=[["batch", [-2, -1]], ["model", [2, 2]]]),
        FileFormatError,
        r"\.factors of Place must be",
    ),
    "place a factor boolean": (
        place(factors=[["batch", [True, 2]], ["model", [2, 2]]]),
        FileFormatError,
        r"\.factors of Place must be",
    ),
    "place a factor a float": (
        place(factors=[["batch", [2.0, 1]], ["model", [2, 2]]]),
        FileFormatError,
        r"\.factors of Place must be",
    ),
    "place factors per level": (
        place(factors=[["batch", [2]], ["model", [2, 2]]]),
        FileFormatError,
        r"\(Place\): .*axis 'batch' has factors \(2,\); give one int per level",
    ),
    "place axes not the mesh's": (
        place(factors=[["data", [2, 1]], ["model", [2, 2]]]),
        FileFormatError,
        r"schedule\[0\]\.factors: .*places axes \['data', 'model'\], but the mesh is",
    ),
    "place axes out of order": (
        place(factors=[["model", [2, 2]], ["batch", [2, 1]]]),
        FileFormatError,
        r"\.factors: .*place its axes \['batch', 'model'\], in that order",
    ),
    "place products not the sizes": (
        place(factors=[["batch", [2, 2]], ["model", [2, 1]]]),
        FileFormatError,
        r"\.factors: .*splits axis 'batch' into \(2, 2\), whose product is 4, but the mesh",
    ),
    "place in a newer version": (
        place().replace(b'"version": 4', b'"version": 5'),
        FileFormatError,
        r"is version 5, written by a newer workbench",
    ),
}


def bad_path(case: str, tmp_path):
    content = CASES[case][0]
    if content == "<missing>":
        return tmp_path / "missing.json"
    if content == "<no folder>":
        return tmp_path / "nowhere" / "strategy.json"
    if content == "<directory>":
        return tmp_path
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    return path


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_file_is_refused_by_load(case, session, tmp_path):
    _, error, fragment = CASES[case]
    path = bad_path(case, tmp_path)
    err = expect(lambda: wb.Session.load(session.program, path), error, fragment, session)
    assert isinstance(err, FileFormatError | LimitError) and isinstance(err, InputError)


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_file_is_refused_by_the_command(case, tmp_path, capsys):
    """The file is read before the model is built: each case is a message and exit 2."""
    import re

    _, _, fragment = CASES[case]
    path = bad_path(case, tmp_path)
    code = main(["plan", "--model", "mlp", "--strategy", str(path)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.startswith("workbench plan: error: --strategy ")
    assert re.search(fragment, err, re.IGNORECASE | re.DOTALL), err


@pytest.mark.parametrize(
    "where, error, fragment",
    [
        ("<no folder>", InputError, r"folder .*nowhere' .* does not exist; create it"),
        ("<directory>", InputError, r"is a folder; give a file path in it"),
        (None, InputError, r"save needs a file path .*got None"),
        ("", InputError, r"save needs a file path .*got ''"),
        (3, InputError, r"save needs a file path .*got 3"),
    ],
    ids=["a missing folder", "a directory", "None", "empty", "a number"],
)
def test_a_bad_save_path_is_refused_and_writes_nothing(where, error, fragment, session, tmp_path):
    path = {"<no folder>": tmp_path / "nowhere" / "s.json", "<directory>": tmp_path}.get(
        where, where
    )
    expect(lambda: session.save(path), error, fragment, session)
    assert list(tmp_path.iterdir()) == []


def test_loading_imports_and_runs_nothing_a_file_names(session, tmp_path, monkeypatch):
    path = tmp_path / "s.json"
    path.write_bytes(doc([{"tactic": "__import__", "name": "antigravity"}]))
    schema.tactic_classes()  # the table's own modules, imported once
    imported = []
    real = builtins.__import__

    def spy(name, *args, **kwargs):
        if name not in sys.modules:
            imported.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", spy)
    expect(lambda: wb.Session.load(session.program, path), FileFormatError, "'__import__'")
    monkeypatch.undo()
    assert imported == [] and "antigravity" not in sys.modules
