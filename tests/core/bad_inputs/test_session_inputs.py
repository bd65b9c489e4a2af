"""Bad inputs at the session's public entries: meshes, the session itself, step indices,
queries, tactics and named strategies, lowerings and exports. Each is refused with a typed
error naming what was given and what would work, and leaves the session as it was."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import workbench as wb
from tests.core.bad_inputs.common import expect
from tests.core.zoo import program as zoo_program
from workbench.core.errors import (
    HistoryError,
    InputError,
    MeshError,
    SelectorError,
    TacticError,
    UnknownValueError,
)
from workbench.core.propagate.tactics import TacticInputError
from workbench.core.session import StepError
from workbench.core.strategies import STRATEGIES

MESH = {"batch": 2, "model": 2}


@pytest.fixture(scope="module")
def p() -> wb.Program:
    return zoo_program("mlp")


@pytest.fixture(scope="module")
def s(p) -> wb.Session:
    """Steps 0..2, at step 1: a redo stack that every failure must leave in place."""
    session = wb.Session(p, MESH, [wb.BP("batch"), wb.Tile("params/layers/0/w", 1, "model")])
    return session.undo()


# -- meshes --------------------------------------------------------------------------------------
BAD_MESHES = [
    ("none", None, "mesh of None: that is not a mesh description.*dict of axis sizes"),
    ("int", 8, r'mesh of 8: a number.*for 8 devices on one axis write Mesh\(\{"batch": 8\}\)'),
    ("str", "batch", r'mesh of \'batch\': a string.*Mesh\(\{"batch": 2\}\)'),
    ("str with sizes", "batch=2", r"mesh of 'batch=2': a string is not a mesh"),
    ("float", 2.0, "mesh of 2.0: that is not a mesh description"),
    ("set", {"batch"}, r"mesh of \{'batch'\} \(a set\): that is not a mesh"),
    ("object", object(), r"\(a object\): that is not a mesh description"),
    ("empty dict", {}, r"needs at least one axis; got \{\}.*Mesh\(\{"),
    ("empty list", [], r"needs at least one axis; got \[\]"),
    ("size float", {"b": 2.0}, r"axis 'b' has size 2\.0; .*positive integer \(write 2\)"),
    ("size str", {"b": "2"}, r"axis 'b' has size '2'; .*positive integer \(write 2\)"),
    ("size bool", {"b": True}, r"axis 'b' has size True; a size must be a positive integer"),
    ("size zero", {"b": 0}, r"axis 'b' has size 0; a size must be a positive integer"),
    ("size negative", {"b": -2}, r"axis 'b' has size -2"),
    ("size none", {"b": None}, r"axis 'b' has size None"),
    ("size fraction", {"b": 2.5}, r"axis 'b' has size 2\.5; a size must be a positive integer, e"),
    ("name empty", {"": 2}, r"axis name '' is not a valid identifier; use names like 'batch'"),
    ("name spaced", {"my axis": 2}, r"axis name 'my axis' is not a valid identifier"),
    ("name int", {3: 2}, r"axis name 3 is not a valid identifier"),
    ("duplicate axis", [("b", 2), ("b", 4)], r"'b' appears twice.*its own name \(e\.g\. 'b2'\)"),
    ("triple", [("b", 2, 3)], r"must be \(name, size\) pairs; got \('b', 2, 3\)"),
    ("flat pair", ("b", 2), r"must be \(name, size\) pairs; got 'b'"),
]


@pytest.mark.parametrize(
    "given, message", [r[1:] for r in BAD_MESHES], ids=[r[0] for r in BAD_MESHES]
)
def test_a_bad_mesh_says_what_a_mesh_is(given, message):
    expect(lambda: wb.Mesh(given), MeshError, message)


# -- the session itself --------------------------------------------------------------------------
BAD_SESSIONS = [
    ("program none", lambda p: wb.Session(None, MESH), InputError, r"needs a Program.*got None"),
    ("program str", lambda p: wb.Session("mlp", MESH), InputError, r"got 'mlp'.*capture\("),
    ("program fn", lambda p: wb.Session(len, MESH), InputError, r"a builtin_function.*capture"),
    ("mesh none", lambda p: wb.Session(p, None), MeshError, r"mesh of None.*dict of axis sizes"),
    ("mesh int", lambda p: wb.Session(p, 8), MeshError, r'for 8 devices.*\{"batch": 8\}'),
    ("mesh str", lambda p: wb.Session(p, "batch"), MeshError, "a string is not a mesh"),
    ("mesh float size", lambda p: wb.Session(p, {"b": 2.0}), MeshError, r"size 2\.0.*write 2"),
    (
        "one tactic as schedule",
        lambda p: wb.Session(p, MESH, wb.BP("batch")),
        TacticInputError,
        r"schedule is a list of tactics; got BP.*\[BP\('batch'\)\]",
    ),
    ("str schedule", lambda p: wb.Session(p, MESH, "BP"), TacticInputError, "got 'BP'"),
    ("int schedule", lambda p: wb.Session(p, MESH, 3), TacticInputError, "list of tactics; got 3"),
    (
        "str in schedule",
        lambda p: wb.Session(p, MESH, ["BP"]),
        TacticInputError,
        r"got 'BP': a string is not a tactic.*BP\('batch'\)",
    ),
    (
        "class in schedule",
        lambda p: wb.Session(p, MESH, [wb.BP]),
        TacticInputError,
        r"BP is a tactic class, not a tactic; make one",
    ),
    ("strict str", lambda p: wb.Session(p, MESH, strict="yes"), InputError, "strict must be True"),
    (
        "axis not in mesh",
        lambda p: wb.Session(p, MESH, [wb.BP("data")]),
        TacticError,
        r"axis 'data' is not in Mesh\(batch=2, model=2\).*Use one of its axes",
    ),
]


@pytest.mark.parametrize(
    "make, error, message", [r[1:] for r in BAD_SESSIONS], ids=[r[0] for r in BAD_SESSIONS]
)
def test_a_bad_session_is_refused(p, make, error, message):
    expect(lambda: make(p), error, message)


# -- step indices --------------------------------------------------------------------------------
STEP_CALLS = {
    "state_at": lambda s, v: s.state_at(v),
    "jump": lambda s, v: s.jump(v),
    "events": lambda s, v: s.events(v),
    "notes": lambda s, v: s.notes(v),
    "plan": lambda s, v: s.plan(v),
    "estimate": lambda s, v: s.estimate(step=v),
    "diff before": lambda s, v: s.diff(v, 1),
    "diff after": lambda s, v: s.diff(0, v),
}
BAD_STEPS = [
    ("str", "1", r"'1' is not a step number; give a step from 0 to 2"),
    ("float", 1.0, r"1\.0 is not a step number; give a step from 0 to 2"),
    ("bool", True, "True is not a step number"),
    ("negative", -1, r"-1 is negative: steps count from 0 .*not from the end; give a step from 0"),
    ("past the end", 3, r"3 is past the end of the history; give a step from 0 to 2 \(.*step 1\)"),
]
STEP_CASES = [
    (f"{name} {what}", call, value, message)
    for name, call in STEP_CALLS.items()
    for what, value, message in BAD_STEPS
] + [
    ("state_at none", STEP_CALLS["state_at"], None, "None is not a step number"),
    ("jump none", STEP_CALLS["jump"], None, "None is not a step number"),
    ("jump list", STEP_CALLS["jump"], [1], r"\[1\] is not a step number"),
]


@pytest.mark.parametrize(
    "call, value, message", [c[1:] for c in STEP_CASES], ids=[c[0] for c in STEP_CASES]
)
def test_a_bad_step_is_refused_not_wrapped(s, call, value, message):
    err = expect(lambda: call(s, value), StepError, message, s)
    assert isinstance(err, HistoryError) and isinstance(err, InputError)


def test_diff_names_which_step_is_wrong(s):
    expect(lambda: s.diff(0, -2), StepError, "^after -2 is negative", s)
    expect(lambda: s.diff("0"), StepError, "^before '0' is not a step number", s)


# -- queries -------------------------------------------------------------------------------------
BAD_QUERIES = [
    ("sharding int", lambda s: s.sharding(3), InputError, r"sharding takes a value's name.*got 3"),
    ("sharding none", lambda s: s.sharding(None), InputError, r"got None\. .*names\(\) lists"),
    ("sharding bytes", lambda s: s.sharding(b"batch/x"), InputError, r"got b'batch/x'"),
    (
        "sharding unknown",
        lambda s: s.sharding("params/layers/0/ww"),
        UnknownValueError,
        r"no value named 'params/layers/0/ww'; did you mean 'params/layers/0/w'",
    ),
    ("sharding empty", lambda s: s.sharding(""), UnknownValueError, "no value named ''"),
    ("why int", lambda s: s.why(3), InputError, r"why takes a value's name \(a str\).*got 3"),
    ("why list", lambda s: s.why(["batch/x"]), InputError, r"got \['batch/x'\]"),
    (
        "why unknown",
        lambda s: s.why("batch/xx"),
        UnknownValueError,
        r"no value named 'batch/xx'; did you mean 'batch/x'",
    ),
    ("shardings int", lambda s: s.shardings(3), SelectorError, r"name pattern.*; got 3"),
    ("shardings empty list", lambda s: s.shardings([]), SelectorError, "an empty list"),
    ("shardings ints", lambda s: s.shardings([1, 2]), SelectorError, r"got \[1, 2\]"),
    ("shardings dict", lambda s: s.shardings({"a": 1}), SelectorError, r"got \{'a': 1\}"),
    ("shardings malformed", lambda s: s.shardings("a/***"), SelectorError, "'\\*\\*\\*' has no"),
    (
        "shardings no match",
        lambda s: s.shardings("batch/z"),
        SelectorError,
        r"'batch/z' matches no value.*Close names: .*batch/x",
    ),
]


@pytest.mark.parametrize(
    "call, error, message", [r[1:] for r in BAD_QUERIES], ids=[r[0] for r in BAD_QUERIES]
)
def test_a_bad_query_is_refused(s, call, error, message):
    expect(lambda: call(s), error, message, s)


# -- applying what is not a tactic ---------------------------------------------------------------
NOT_TACTICS = [
    ("str", "BP", r"got 'BP': a string is not a tactic; write the tactic itself, e\.g\. BP\("),
    ("empty str", "", r"got '': a string is not a tactic"),
    ("strategy class", wb.BP, r"BP is a tactic class, not a tactic; make one: BP\(<axis>"),
    ("tile class", wb.Tile, r"Tile is a tactic class"),
    ("list", [wb.BP("batch")], r"apply takes one tactic; apply several one by one"),
    ("tuple", (wb.BP("batch"), wb.MP("model")), r"Session\(program, mesh, tactics\)"),
    ("none", None, "got None: that is not a tactic"),
    ("int", 3, "got 3: that is not a tactic"),
    ("dict", {"tactic": "BP"}, r"got \{'tactic': 'BP'\}: that is not a tactic"),
    ("function", len, r"builtin_function.*that is not a tactic"),
]


@pytest.mark.parametrize(
    "thing, message", [r[1:] for r in NOT_TACTICS], ids=[r[0] for r in NOT_TACTICS]
)
def test_applying_what_is_not_a_tactic_says_what_to_write(s, thing, message):
    err = expect(lambda: s.apply(thing), TacticInputError, message, s)
    assert isinstance(err, TacticError) and isinstance(err, InputError)


# -- tactics built with bad arguments (refused as they are made) ---------------------------------
BAD_TACTICS = [
    ("tile dim str", lambda: wb.Tile("batch/x", "0", "batch"), TacticInputError, "got '0'"),
    ("tile dim float", lambda: wb.Tile("batch/x", 1.0, "batch"), TacticInputError, r"\(write 1\)"),
    ("tile dim half", lambda: wb.Tile("batch/x", 1.5, "batch"), TacticInputError, r"got 1\.5"),
    ("tile dim none", lambda: wb.Tile("batch/x", None, "batch"), TacticInputError, "got None"),
    ("tile dim bool", lambda: wb.Tile("batch/x", True, "batch"), TacticInputError, "got True"),
    ("tile axis int", lambda: wb.Tile("batch/x", 0, 3), TacticInputError, "axis 3 is not a mesh"),
    ("tile axis none", lambda: wb.Tile("x", 0, None), TacticInputError, "axis None is not a mesh"),
    ("tile axis empty", lambda: wb.Tile("x", 0, ""), TacticInputError, "axis '' is empty"),
    ("tile axis spaced", lambda: wb.Tile("x", 0, "a b"), TacticInputError, "'a b' is not a mesh"),
    ("tile name int", lambda: wb.Tile(3, 0, "batch"), SelectorError, r"pattern \(a str\).*got 3"),
    ("tile name none", lambda: wb.Tile(None, 0, "batch"), SelectorError, "got None"),
    ("tile name empty list", lambda: wb.Tile([], 0, "batch"), SelectorError, "an empty list"),
    ("tile names ints", lambda: wb.Tile([1, 2], 0, "batch"), SelectorError, r"got \[1, 2\]"),
    (
        "tile name malformed",
        lambda: wb.Tile("params/w**", 0, "batch"),
        SelectorError,
        r"^Tile\('params/w\*\*'.*must be a whole path segment",
    ),
    ("tile name brace", lambda: wb.Tile("{a", 0, "batch"), SelectorError, r"unbalanced '\{'"),
    (
        "tile missing axis",
        lambda: wb.Tile("batch/x", 0),
        TacticInputError,
        r"missing 1 required positional argument: 'axis'; write Tile\(selector, dim, axis\)",
    ),
    (
        "tile unknown keyword",
        lambda: wb.Tile("batch/x", 0, "batch", mesh=2),
        TacticInputError,
        r"unexpected keyword argument 'mesh'; write Tile\(selector, dim, axis\)",
    ),
    (
        "tile too many",
        lambda: wb.Tile("x", 0, "b", 1),
        TacticInputError,
        r"^Tile\('x', 0, 'b', 1\): takes 3 positional arguments but 4 were given",
    ),
    ("replicate axis none", lambda: wb.Replicate("x", None), TacticInputError, "axis None"),
    ("replicate name int", lambda: wb.Replicate(3, "batch"), SelectorError, "got 3"),
    ("replicate missing", lambda: wb.Replicate("x"), TacticInputError, r"Replicate\(selector, ax"),
    ("atomic axis int", lambda: wb.Atomic("x", 1), TacticInputError, "axis 1 is not a mesh axis"),
    ("bp inputs int", lambda: wb.BP("batch", inputs=3), SelectorError, "inputs must be a name"),
    ("bp dim str", lambda: wb.BP("batch", dim="0"), TacticInputError, r"dim must be an integer"),
    ("mp heads_dim half", lambda: wb.MP("model", heads_dim=1.5), TacticInputError, "heads_dim"),
    ("mp hidden list", lambda: wb.MP("model", hidden=[]), SelectorError, "hidden is an empty"),
    ("mq heads_dim none", lambda: wb.MQ("model", heads_dim=None), TacticInputError, "got None"),
    ("sp dim bool", lambda: wb.SP("model", dim=True), TacticInputError, "dim must be an integer"),
    ("emb dim int", lambda: wb.EMB("model", dim=0), TacticInputError, r"'vocab'.*or 'feature'"),
    ("emb dim typo", lambda: wb.EMB("model", dim="vocabs"), TacticInputError, "got 'vocabs'"),
    (
        "z3 params dict",
        lambda: wb.Z3("batch", params={}),
        SelectorError,
        r"params must be a name pattern.*got \{\}",
    ),
    (
        "role typo",
        lambda: wb.Role("batch/x", "dat", dim=0),
        TacticInputError,
        r"role must be one of \['data'.*got 'dat'; did you mean 'data'\?",
    ),
    ("role int", lambda: wb.Role("batch/x", 3), TacticInputError, "role must be one of.*got 3"),
    ("role selector", lambda: wb.Role(3, "data", dim=0), SelectorError, "got 3"),
    ("role dim str", lambda: wb.Role("batch/x", "data", dim="0"), TacticInputError, "got '0'"),
    ("role axis", lambda: wb.Role("x", "none", axis=3), TacticInputError, "axis must be a string"),
    ("role missing", lambda: wb.Role(), TacticInputError, r"write Role\(selector, role, dim=None"),
    ("pp axis int", lambda: wb.PP(3), TacticInputError, r"axis 3 is not a mesh axis"),
    ("pp microbatches 0", lambda: wb.PP("model", microbatches=0), TacticInputError, "whole number"),
    ("pp schedule typo", lambda: wb.PP("model", schedule="gpip"), TacticInputError, "'gpipe'"),
    ("pp stages str", lambda: wb.PP("model", stages="1"), TacticInputError, "block indices"),
    ("pp chunks 0", lambda: wb.PP("model", virtual_stages=0), TacticInputError, "whole number"),
]
# every named strategy: its axis, its flag and its keywords
for _name, _cls in STRATEGIES.items():
    BAD_TACTICS += [
        (f"{_name} axis int", lambda c=_cls: c(3), TacticInputError, r"axis 3 is not a mesh axis"),
        (f"{_name} axis none", lambda c=_cls: c(None), TacticInputError, "axis None is not"),
        (f"{_name} axis empty", lambda c=_cls: c(""), TacticInputError, r"axis '' is empty"),
        (
            f"{_name} unknown keyword",
            lambda c=_cls: c("batch", axes="batch"),
            TacticInputError,
            rf"unexpected keyword argument 'axes'; write {_name}\(axis, ",
        ),
        (f"{_name} strict str", lambda c=_cls: c("b", strict="y"), TacticInputError, "True or F"),
    ]


@pytest.mark.parametrize(
    "make, error, message", [r[1:] for r in BAD_TACTICS], ids=[r[0] for r in BAD_TACTICS]
)
def test_a_tactic_made_with_bad_arguments_is_refused(s, make, error, message):
    expect(make, error, message, s)


# -- tactics that only the mesh or the program can refuse (when applied) -------------------------
APPLY_CASES = [
    (f"{name} axis not in mesh", lambda c=cls: c("data"), r"axis 'data' is not in Mesh\(batch")
    for name, cls in STRATEGIES.items()
] + [
    ("bp axis typo", lambda: wb.BP("bach"), r"axis 'bach' is not in .*did you mean 'batch'\?"),
    ("tile axis not in mesh", lambda: wb.Tile("batch/x", 0, "data"), r"Use one of its axes"),
    ("tile dim past rank", lambda: wb.Tile("batch/x", 5, "model"), r"dim 5 is out of range"),
    ("tile dim before rank", lambda: wb.Tile("batch/x", -3, "model"), r"use a dim in \[-2, 1\]"),
    ("bp dim past rank", lambda: wb.BP("model", dim=7), r"so dim 7 is out of range; use a dim"),
    ("bp inputs dim", lambda: wb.BP("model", "batch/x", 2), r"dim 2 is out of range"),
    ("mp heads_dim", lambda: wb.MP("model", heads="params/**/w", heads_dim=4), "dim 4 is out"),
    ("role needs dim", lambda: wb.Role("batch/x", "data"), r"role 'data' needs dim=<the dim"),
    ("role dim range", lambda: wb.Role("batch/x", "data", dim=9), r"dim 9 is out of range"),
    ("pp axis not in mesh", lambda: wb.PP("stage"), r"axis 'stage' is not in Mesh\(batch"),
    ("pp tiled axis", lambda: wb.PP("batch"), r"axis 'batch' already tiles"),
    ("pp microbatches", lambda: wb.PP("model", microbatches=3), r"does not divide the batch"),
]


@pytest.mark.parametrize(
    "make, message", [r[1:] for r in APPLY_CASES], ids=[r[0] for r in APPLY_CASES]
)
def test_a_tactic_the_mesh_or_program_refuses_changes_nothing(s, make, message):
    tactic = make()  # made fine: only this mesh and program say no
    expect(lambda: s.apply(tactic), TacticError, message, s)


# -- lowerings, exports, history -----------------------------------------------------------------
BAD_CALLS = [
    ("lower kind", lambda s: s.lower(kind="fast"), InputError, r"kind='fast'.*\['explicit', "),
    ("lower typo", lambda s: s.lower("explict"), InputError, r"did you mean 'explicit'\?"),
    ("lower none", lambda s: s.lower(kind=None), InputError, r"kind=None\. Use one of"),
    ("specs mesh int", lambda s: s.specs(mesh=3), MeshError, r"takes a jax\.sharding\.Mesh; got 3"),
    ("specs mesh dict", lambda s: s.specs(mesh=MESH), MeshError, r"jax\.make_mesh\(\(2, 2\)"),
    (
        "specs mesh wrong axes",
        lambda s: s.specs(mesh=jax.make_mesh((4, 2), ("batch", "model"))),
        MeshError,
        r"the jax mesh \{'batch': 4, 'model': 2\} lacks the axes \['batch'\]",
    ),
    ("specs outputs str", lambda s: s.specs(outputs="y"), InputError, "outputs must be True or"),
    ("rules int", lambda s: s.logical_rules(3), InputError, r"one entry per argument.*got 3"),
    ("rules str", lambda s: s.logical_rules("embed"), InputError, "got 'embed'"),
    ("rules length", lambda s: s.logical_rules([None]), InputError, r"\(2 of them\).*got \[None\]"),
    ("estimate hardware", lambda s: s.estimate("tpu9"), InputError, "'tpu9'"),
    ("estimate hardware int", lambda s: s.estimate(3), InputError, "hardware=3 is not"),
    ("estimate overlap list", lambda s: s.estimate(overlap=[1]), InputError, r"overlap=\[1\]"),
]


@pytest.mark.parametrize(
    "call, error, message", [r[1:] for r in BAD_CALLS], ids=[r[0] for r in BAD_CALLS]
)
def test_a_bad_lowering_export_or_estimate_is_refused(s, call, error, message):
    expect(lambda: call(s), error, message, s)


def test_undo_and_redo_past_the_ends_say_what_would_work(p):
    fresh = wb.Session(p, MESH)
    expect(fresh.undo, HistoryError, r"nothing to undo.*step 0.*session\.apply\(tactic\)", fresh)
    fresh.apply(wb.BP("batch"))
    expect(fresh.redo, HistoryError, r"no undone tactic follows step 1.*undo\(\) first", fresh)


BAD_PARTITIONS = [
    ("fn int", lambda fn: wb.partition(3, MESH, []), InputError, "function to partition first"),
    ("mesh none", lambda fn: wb.partition(fn, None, []), MeshError, "mesh of None"),
    (
        "one tactic",
        lambda fn: wb.partition(fn, MESH, wb.BP("batch")),
        TacticInputError,
        r"schedule is a list of tactics.*\[BP\('batch'\)\]",
    ),
    ("str tactic", lambda fn: wb.partition(fn, MESH, ["BP"]), TacticInputError, "holds 'BP'"),
    ("lowering", lambda fn: wb.partition(fn, MESH, [], lowering="x"), InputError, "lowering='x'"),
]


@pytest.mark.parametrize(
    "call, error, message", [r[1:] for r in BAD_PARTITIONS], ids=[r[0] for r in BAD_PARTITIONS]
)
def test_partition_refuses_bad_arguments_before_the_first_call(call, error, message):
    expect(lambda: call(lambda x: x), error, message)


# -- good inputs still work ----------------------------------------------------------------------
def test_numpy_ints_are_steps_dims_and_sizes(p, s):
    assert s.state_at(np.int64(2)) is s.state_at(2)
    assert s.diff(np.int32(0), np.int64(1)).after == 1
    assert s.notes(np.int64(0)) == ()
    assert wb.Tile("batch/x", np.int64(0), "batch").dim == 0
    assert type(wb.Tile("batch/x", np.int64(0), "batch").dim) is int
    assert wb.Mesh({"batch": np.int64(2)}).shape == {"batch": 2}
    fresh = wb.Session(p, MESH).apply(wb.BP("batch")).jump(np.int32(0))
    assert fresh.step == 0


def test_a_jax_mesh_a_dict_and_pairs_make_the_same_session(p):
    jax_mesh = jax.make_mesh((2, 2), ("batch", "model"))
    sessions = [wb.Session(p, m) for m in (jax_mesh, MESH, list(MESH.items()), wb.Mesh(MESH))]
    assert {x.mesh for x in sessions} == {wb.Mesh(MESH)}
    assert wb.Mesh(jax_mesh) == wb.Mesh(MESH)
    specs = sessions[0].apply(wb.BP("batch")).specs(mesh=jax_mesh)
    assert all(isinstance(x, jax.sharding.NamedSharding) for x in jax.tree_util.tree_leaves(specs))


def test_a_list_selector_is_kept_hashable_and_hardware_by_name(s):
    tile = wb.Tile(["batch/x", "batch/y"], 0, "batch")
    assert tile.selector == ("batch/x", "batch/y") and hash(tile)
    assert s.estimate("H100") == s.estimate(wb.hardware.H100)
    assert s.estimate() == s.estimate("cpu")
