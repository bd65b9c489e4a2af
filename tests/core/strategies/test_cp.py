"""CP, context parallelism (all-gather kind): every activation split on its sequence dim,
keys and values made on each device's part of the sequence and gathered only by the
attention ops that read them, weight gradients reduced over the axis;
applied like any tactic (undo, why, save, load, export), composed with BP and MP, and run
like the unpartitioned (causal) step."""

from collections import Counter

import pytest

import workbench as wb
from tests.core.strategies.roundtrip import round_trip
from tests.models import programs as external
from workbench.core.errors import InputError, TacticError
from workbench.core.propagate.tactics import TacticInputError
from workbench.core.strategies.context import key_positions, keys_values, query_rows
from workbench.models import build, lm

CASES = {
    "cp": ({"data": 2, "seq": 4}, ("CP",)),
    "bp+cp": ({"data": 2, "seq": 4}, ("BP", "CP")),
    "bp+mp+cp": ({"seq": 2, "model": 2, "data": 2}, ("BP", "MP", "CP")),
}
AXES = {"BP": "data", "MP": "model", "CP": "seq"}


@pytest.fixture(scope="module")
def program():
    ex = build("lm", lm.Config.preset("tiny", n_layers=2))
    return wb.capture(ex.fn, *ex.args)


def session(program, case: str) -> wb.Session:
    mesh, names = CASES[case]
    return wb.Session(program, wb.Mesh(mesh), [getattr(wb, n)(AXES[n]) for n in names])


def over(s: wb.Session, phase: str, axis: str = "seq") -> list:
    """The collectives over ``axis`` (alone or with others) made for ops of ``phase``."""
    ops = s.program.ops
    return [
        c
        for c in s.collectives()
        if axis in c.axes and (ops[c.op].phase if c.op is not None else "out") == phase
    ]


def kinds(cs) -> Counter:
    return Counter(c.kind for c in cs for _ in range(c.count))


def test_cp_splits_the_sequence_keys_and_values_included(program):
    s = session(program, "cp")
    assert not s.conflicts
    tokens = s.sharding("batch/tokens")
    assert tokens.dim_of("seq") == 1 and not tokens.uses("data")
    for a in program.anatomy().layers.attention:
        k, v = keys_values(program, a.scores, a.context)
        # projected on each device's part of the sequence; the attention ops gather them
        assert s.state.shardings[k].uses("seq") and s.state.shardings[v].uses("seq")
        queries = [x for x in program.ops[a.scores].operands if x != k]
        assert [s.state.shardings[q].uses("seq") for q in queries] == [True]
        scores = program.ops[a.scores].results[0]
        assert s.state.shardings[scores].uses("seq")  # the scores split on their queries
    s.undo()
    assert not s.sharding("batch/tokens").uses("seq")


@pytest.mark.parametrize("case", list(CASES))
def test_cp_exchanges_keys_and_values_inside_attention_alone(program, case):
    s = session(program, case)
    assert not s.conflicts
    attention = program.anatomy().layers.attention
    n = len(attention)
    assert n == 2
    forward, backward = over(s, "forward"), over(s, "backward")
    # the forward pass gathers, per attention, its keys and values (each device projects
    # its own part of the sequence); nothing else over the axis
    assert kinds(forward) == {"all-gather": 2 * n}
    exchanged = {x for a in attention for x in keys_values(program, a.scores, a.context)}
    assert {c.value for c in forward} == exchanged
    assert all(c.axes == ("seq",) for c in forward)
    # the backward pass gathers them again where the gradients read them (the gathered
    # copies are not kept: a whole sequence's keys and values per layer) and
    # reduce-scatters the keys' and values' gradients (sums over the split queries) back
    # onto the split sequence: a reduce-scatter, since the projections' backward reads
    # them split on the sequence again
    assert kinds(backward) == {"all-gather": 2 * n, "reduce-scatter": 2 * n}
    assert {c.value for c in backward if c.kind == "all-gather"} == exchanged
    # every weight gradient is a sum over the split sequence, reduced over the axis
    gradients = program.anatomy().gradients
    assert kinds(over(s, "optimizer")) == {"all-reduce": len(gradients)}


def test_cp_applied_after_bp_reduces_weight_gradients_over_both_axes(program):
    s = session(program, "bp+cp")
    assert all(c.axes == ("data", "seq") for c in over(s, "optimizer"))
    assert s.sharding("batch/tokens").dim_of("data") == 0
    assert s.sharding("batch/tokens").dim_of("seq") == 1


def test_cp_explains_saves_loads_and_exports(program, tmp_path):
    s = session(program, "bp+cp")
    assert "CP('seq')" in str(s.why("batch/tokens"))
    assert round_trip(s, program, tmp_path)["schedule"][1]["axis"] == "seq"
    assert "CP" in wb.__all__ and "CP" in wb.core.strategies.STRATEGIES  # a button and Auto's move


def test_unknown_kinds_are_refused_saying_what_works():
    with pytest.raises(InputError, match=r"kind must be 'all-gather' or 'ring'.*got 'gather'"):
        wb.CP("seq", kind="gather")
    assert str(wb.CP("seq", dim=1)) == "CP('seq', dim=1)"


def test_cp_without_attention_says_what_would_work():
    ex = build("mlp", "tiny")
    program = wb.capture(ex.fn, *ex.args)
    with pytest.raises(TacticError, match=r"no attention.*BP\("):
        wb.Session(program, wb.Mesh({"seq": 2}), [wb.CP("seq")])


def test_cp_on_an_axis_the_mesh_lacks_is_refused(program):
    with pytest.raises(TacticError, match=r"axis 'sequence' is not in"):
        wb.Session(program, wb.Mesh({"data": 2, "seq": 4}), [wb.CP("sequence")])


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_cp_runs_like_the_unpartitioned_causal_step(program, case):
    # the zoo LM is causal: its mask, built from positions of the whole sequence in the
    # global program, must stay right with the queries split
    assert session(program, case).run(repeats=1).matches


@pytest.mark.slow  # 15-20 s each: a third-party step, partitioned and whole
@pytest.mark.parametrize("name", ["eqx_lm", "linen_lm", "nnx_lm", "hf_gpt2"])
def test_cp_runs_a_third_party_transformer_like_the_unpartitioned_step(name):
    # the keys' gradient, a sum over the split queries whose consumer was tiled first, is
    # reduce-scattered onto it; Flax's masks compare query and key positions, both of the
    # split sequence: the key positions stay whole with the keys, the mask is split on its
    # queries only. No conflict on any of them.
    program = external.program(name)
    s = wb.Session(program, wb.Mesh({"data": 2, "seq": 4}), [wb.BP("data"), wb.CP("seq")])
    assert not s.conflicts
    assert s.run(repeats=1).matches


def test_the_key_positions_of_a_mask_are_found_small_and_whole():
    program = external.program("linen_lm")
    s = wb.Session(program, wb.Mesh({"data": 2, "seq": 4}), [wb.BP("data"), wb.CP("seq")])
    (a, *_) = program.anatomy().layers.attention
    found = key_positions(program, a.scores, a.context)
    scores = program.values[program.ops[a.scores].results[0]]
    assert found and all(program.values[v].size < scores.size for v in found)
    assert all(s.state.shardings[v].dim_of("seq") is None for v in found)  # whole: atomic
    probs, dim = query_rows(program, a.scores, a.context)
    assert f"{program.values[probs].shape[dim]}@seq" in str(s.state.shardings[probs])


@pytest.mark.slow  # about 15 s: a run of four rematerialised layers
def test_cp_gathers_the_recomputed_keys_and_values_under_remat():
    ex = build("lm", lm.Config.preset("tiny", n_layers=4, remat=True))
    program = wb.capture(ex.fn, *ex.args)
    s = wb.Session(program, wb.Mesh({"seq": 4, "model": 2}), [wb.CP("seq")])
    assert not s.conflicts
    # per layer: the keys and values gathered for the attention, and again for its
    # recomputation (which the gradients then read); their gradients reduce-scattered back
    assert kinds(over(s, "forward")) == {"all-gather": 2 * 4}
    assert kinds(over(s, "backward")) == {"all-gather": 2 * 4, "reduce-scatter": 2 * 4}
    assert s.run(repeats=1).matches


@pytest.mark.parametrize(
    "make", [lambda: wb.CP("seq", strict="yes"), lambda: wb.EP("e", strict="yes")]
)
def test_a_bad_strict_is_shown_as_given(make):
    with pytest.raises(
        TacticInputError, match=r"strict='yes'\): strict must be True or False; got 'yes'"
    ):
        make()


def test_one_sequence_a_step_is_split_by_cp_and_not_read_as_a_batch():
    # long-context training holds one sequence a step: its length is no batch dimension
    ex = build("lm", lm.Config.preset("tiny", batch=1, seq_len=64), abstract=True)
    p = wb.capture(ex.fn, *ex.args)
    anatomy = p.anatomy()
    assert anatomy.batch_class is None and anatomy.sequence_class is not None
    s = wb.Session(p, wb.Mesh({"seq": 4}), [wb.CP("seq")])
    assert str(s.sharding("batch/tokens")) == "i32[1,64@seq]" and not s.conflicts
    with pytest.raises(TacticError, match=r"no data input with a batch dimension.*CP\(axis\)"):
        wb.Session(p, wb.Mesh({"seq": 4}), [wb.BP("seq")])
