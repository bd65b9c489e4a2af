"""Strategy files: what ``save`` writes is what ``read`` takes back, older versions migrate,
every file shipped in the repository reads, and the guards ahead of the JSON parser."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import workbench as wb
from workbench.core.errors import InputError
from workbench.core.io import schema
from workbench.core.io.export import read, to_json
from workbench.models import build

ROOT = Path(__file__).resolve().parents[3]
MESH = wb.Mesh({"batch": 2, "model": 4})


@pytest.fixture(scope="module")
def program():
    ex = build("mlp", "tiny")
    return wb.capture(ex.fn, *ex.args)


def test_save_writes_the_current_version_and_reads_back(program, tmp_path):
    s = wb.Session(program, MESH, [wb.BP("batch"), wb.Tile("params/**/w", -1, "model")])
    path = s.save(tmp_path / "s.json")
    data = json.loads(path.read_text())
    assert (data["format"], data["version"]) == (schema.FORMAT, schema.VERSION)
    assert data["program"] == program.name and data["mesh"] == {"batch": 2, "model": 4}
    mesh, tactics = read(path)
    assert mesh == MESH and tuple(tactics) == s.history
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]  # no temporary left behind
    s.save(path)  # overwriting is allowed
    assert json.loads(path.read_text()) == data


def test_a_version_1_file_migrates_to_the_current_version(program, tmp_path):
    s = wb.Session(program, MESH, [wb.BP("batch")])
    current = to_json(s)
    old = {k: v for k, v in current.items() if k != "version"}
    old["format"] = "workbench-strategy/1"  # what workbench wrote before versions
    assert schema.migrate(old) == current
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    assert read(path) == read(s.save(tmp_path / "new.json"))


def test_a_version_2_file_reads_an_import_as_its_tiles(program, tmp_path):
    """Version 2 knew no ``whole`` on ``Imported``: such a file migrates and reads back
    as the tiles it names, holding nothing whole, as it did when it was written."""
    tiles = [["params/**/w", -1, "model"]]
    old = {
        "format": schema.FORMAT,
        "version": 2,
        "program": program.name,
        "mesh": {"batch": 2, "model": 4},
        "schedule": [
            {"tactic": "BP", "axis": "batch"},
            {"tactic": "Imported", "source": "in_shardings", "tiles": tiles},
        ],
    }
    assert schema.migrate(old) == {**old, "version": schema.VERSION}
    path = tmp_path / "v2.json"
    path.write_text(json.dumps(old))
    mesh, tactics = read(path)
    assert mesh == MESH and tactics[1] == wb.Imported(
        "in_shardings", (("params/**/w", -1, "model"),)
    )
    assert tactics[1].whole is None
    s = wb.Session(program, mesh, tactics)  # it applies, and saves at the current version
    assert read(s.save(tmp_path / "again.json")) == (mesh, list(tactics))


def test_a_placement_saves_and_reads_back(program, tmp_path):
    """Version 4 adds ``Place``: the file keeps it as data, and the session read back lays
    its devices out as the one saved."""
    from workbench.core.hardware.placement import Placement

    s = wb.Session(program, MESH, [wb.BP("batch")])
    s.place(Placement(("nvlink", "infiniband"), (("batch", (2, 1)), ("model", (2, 2)))))
    data = json.loads(s.save(tmp_path / "placed.json").read_text())
    assert data["version"] == 4 == schema.VERSION
    assert data["schedule"][-1] == {
        "tactic": "Place",
        "levels": ["nvlink", "infiniband"],
        "factors": [["batch", [2, 1]], ["model", [2, 2]]],
    }
    again = wb.Session.load(program, tmp_path / "placed.json")
    assert again.history == s.history and again.state.placement == s.state.placement
    newer = {**data, "version": 5}
    (tmp_path / "newer.json").write_text(json.dumps(newer))
    with pytest.raises(wb.FileFormatError, match=r"is version 5, written by a newer workbench"):
        read(tmp_path / "newer.json")


def test_a_version_3_file_reads_as_it_was_written(program, tmp_path):
    s = wb.Session(program, MESH, [wb.BP("batch"), wb.Tile("params/**/w", -1, "model")])
    old = {**to_json(s), "version": 3}
    assert schema.migrate(old) == to_json(s)
    path = tmp_path / "v3.json"
    path.write_text(json.dumps(old))
    assert read(path) == (MESH, list(s.history))


def test_every_version_below_the_current_has_a_migration():
    assert set(schema.MIGRATIONS) == set(range(1, schema.VERSION))


@pytest.mark.parametrize("path", sorted((ROOT / "examples").rglob("*.json")), ids=lambda p: p.name)
def test_the_shipped_strategy_files_read(path):
    mesh, tactics = read(path)
    assert mesh.size > 1 and tactics


@pytest.mark.parametrize(
    "entry",
    [
        {"tactic": "Auto", "axes": "batch", "seconds": float("nan")},
        {"tactic": "Tile", "selector": "x", "dim": np.int64(0), "axis": "batch"},
        {"tactic": "Tile", "selector": "x", "dim": 0, "axis": "batch", "note": object()},
    ],
    ids=["NaN", "a numpy integer", "an object"],
)
def test_save_writes_only_what_reads_back(entry, program, tmp_path, monkeypatch):
    """A document the loader would refuse is not written: an error, and no file."""
    from workbench.core.io import export

    s = wb.Session(program, MESH, [wb.BP("batch")])
    document = {**to_json(s), "schedule": [entry]}
    monkeypatch.setattr(export, "to_json", lambda session: document)
    with pytest.raises(InputError, match="cannot be written as a strategy file"):
        s.save(tmp_path / "s.json")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "text, deepest",
    [
        ("{}", 1),
        ('{"a": [1, [2]], "b": {}}', 3),
        ('{"a": "[[[[{{{{"}', 1),  # brackets inside strings do not count
        ('{"a": "\\"[[[["}', 1),  # nor after an escaped quote
        ("[" * 50 + "]" * 50, 50),
    ],
)
def test_nesting_is_read_without_parsing(text, deepest):
    assert schema.nesting(text) == deepest


def test_files_of_exactly_the_limits_read(tmp_path):
    """The limits refuse what is beyond them, not what is at them."""
    data = {"format": schema.FORMAT, "version": schema.VERSION, "mesh": {"b": 2}}
    data["schedule"] = [{"tactic": "BP", "axis": "b"}] * schema.MAX_TACTICS
    text = json.dumps(data)
    text += " " * (schema.MAX_BYTES - len(text.encode()))
    path = tmp_path / "big.json"
    path.write_text(text)
    mesh, tactics = read(path)
    assert len(tactics) == schema.MAX_TACTICS and mesh.size == 2
