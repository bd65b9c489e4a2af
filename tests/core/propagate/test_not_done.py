"""What a tactic could not do: notes of the values it targets left whole, strict sessions and
tactics, and the error of a named strategy that tiles nothing.

Sizes come from the program (the zoo LM's batch, heads and hidden dims), never written in.
"""

import math

import pytest

import workbench as wb
from tests.core.zoo import program
from workbench.core.errors import LeftWhole, NothingTiled, TacticError
from workbench.core.io.export import export_code


@pytest.fixture(scope="module")
def lm():
    return program("lm")


def batch_of(p) -> int:
    sizes = {p.values[v].shape[d] for v, d in p.anatomy().data if d is not None}
    assert len(sizes) == 1, sizes
    return sizes.pop()


def split_sizes(pairs, p) -> set[int]:
    return {p.values[v].shape[d] for v, d in pairs if d is not None}


def heads_only_axis(p) -> int:
    """An axis size that divides every MLP hidden dim but no heads dim (so MP must leave
    the attention projections whole and still tile the MLP)."""
    view = p.anatomy()
    heads, hidden = split_sizes(view.heads_splits(), p), split_sizes(view.hidden_splits(), p)
    for n in range(2, 1 + max(hidden)):
        if all(h % n == 0 for h in hidden) and all(h % n for h in heads):
            return n
    pytest.fail(f"no axis size splits hidden {hidden} but not heads {heads}")


def test_bp_that_tiles_nothing_is_an_error_saying_what_would_work(lm):
    batch = batch_of(lm)
    n = 2 * batch
    s = wb.Session(lm, {"data": n})
    before = s.state
    with pytest.raises(NothingTiled) as err:
        s.apply(wb.BP("data"))
    text = str(err.value)
    assert isinstance(err.value, TacticError)
    assert text.startswith("BP('data') tiles nothing")
    assert f"{n}-way axis 'data' does not divide the batch dimension ({batch})" in text
    fits = [k for k in range(1, batch + 1) if batch % k == 0]
    assert ", ".join(map(str, fits[:-1])) + f" or {fits[-1]}" in text
    assert f"a batch dimension that is a multiple of {n}" in text and "another dimension" in text
    assert s.step == 0 and s.state is before and not s.state.notes


def test_strategy_that_already_did_its_work_is_no_error_and_says_nothing(lm):
    s = wb.Session(lm, {"data": 2}, [wb.BP("data"), wb.BP("data")])
    assert s.notes(1) == () and s.notes(2) == ()


def test_mp_notes_each_heads_projection_left_whole_with_sizes(lm):
    n = heads_only_axis(lm)
    s = wb.Session(lm, {"model": n}, [wb.MP("model")])
    view = lm.anatomy()
    heads = {v: lm.values[v].shape[d] for v, d in view.heads_splits() if d is not None}
    whole = {v for v in heads if not s.state.shardings[v].uses("model")}
    assert whole and {note.value for note in s.state.notes} == whole
    texts = s.notes()
    assert len(texts) == len(whole)
    for v in whole:
        line = next(t for t in texts if t.startswith(f"{lm.values[v].name} stays whole"))
        assert (
            f"(heads) has size {heads[v]}, which the {n}-way axis 'model' does not divide" in line
        )
    # the MLP was tiled: the strategy did something, so no error
    assert any(s.state.shardings[v].uses("model") for v, _ in view.hidden_splits())
    name = lm.values[min(whole)].name
    why = str(s.why(name))
    assert "model left whole by tactic #0 MP('model'): dim" in why and f"{n}-way" in why
    assert "left whole: " + texts[0] in repr(s)
    s.undo()
    assert s.notes() == () and "left whole" not in repr(s)
    assert s.notes(1) == texts  # the redo stack keeps them


def test_strict_session_turns_a_note_into_an_error_and_changes_nothing(lm):
    n = heads_only_axis(lm)
    s = wb.Session(lm, {"data": 2, "model": n}, [wb.BP("data")], strict=True)
    before, history = s.state, s.history
    with pytest.raises(LeftWhole, match=r"MP\('model'\) left \d+ value\(s\) it targets whole"):
        s.apply(wb.MP("model"))
    assert s.state is before and s.history == history and s.step == 1
    with pytest.raises(LeftWhole, match=f"{n}-way axis 'model' does not divide"):
        wb.Session(lm, {"model": n}, [wb.MP("model")], strict=True)
    # a strict session takes a schedule that leaves nothing whole
    assert wb.Session(lm, {"data": 2}, [wb.BP("data")], strict=True).step == 1


def test_strict_tactic_flag_alone(lm):
    n = heads_only_axis(lm)
    s = wb.Session(lm, {"model": n})
    with pytest.raises(LeftWhole, match=r"MP\('model', strict=True\) left"):
        s.apply(wb.MP("model", strict=True))
    assert s.step == 0
    assert str(wb.MP("model")) == "MP('model')"
    assert str(wb.MP("model", strict=True)) == "MP('model', strict=True)"
    assert str(wb.BP("data", strict=True)) == "BP('data', strict=True)"
    assert len({wb.BP("data"), wb.BP("data"), wb.BP("data", strict=True)}) == 2
    ok = wb.Session(lm, {"data": 2}, [wb.BP("data", strict=True)])
    assert "strict=True" in export_code(ok)
    assert "strict" not in export_code(wb.Session(lm, {"data": 2}, [wb.BP("data")]))


def test_a_replicated_target_is_noted_as_a_conflict(lm):
    data = [lm.values[v].name for v, _ in lm.anatomy().data]
    s = wb.Session(lm, {"data": 2}, [wb.Replicate(data[0], "data"), wb.BP("data")])
    (note,) = s.state.notes
    assert lm.values[note.value].name == data[0]
    assert s.notes() == (
        f"{data[0]} stays whole on 'data': an earlier Replicate keeps it whole on 'data'",
    )
    with pytest.raises(NothingTiled, match="an earlier Replicate keeps it whole"):
        wb.Session(lm, {"data": 2}, [wb.Replicate(data, "data"), wb.BP("data")])


def test_a_strategy_selector_that_selects_nothing_is_noted(lm):
    hidden = [lm.values[v].name for v, _ in lm.anatomy().hidden_splits()]
    s = wb.Session(lm, {"model": 2})
    s.apply(wb.MP("model", heads="no/such/value*", hidden=hidden[0]))
    assert s.notes() == (f"on 'model': heads='no/such/value*' selects no value of {lm.name}",)


def test_zero3_on_an_axis_no_dim_divides_tiles_nothing(lm):
    sizes = {d for v in lm.anatomy().parameters for d in lm.values[v].shape}
    n = next(k for k in range(2, 100) if all(d % k for d in sizes))
    with pytest.raises(NothingTiled, match=r"Z3\('data'\) tiles nothing: .*no dim of its shape"):
        wb.Session(lm, {"data": n}, [wb.Z3("data")])


@pytest.mark.parametrize("mesh", [{"data": 2, "model": 2}, {"data": 2, "model": 4}])
def test_textbook_schedules_on_the_lm_say_nothing(lm, mesh):
    batch, heads = batch_of(lm), split_sizes(lm.anatomy().heads_splits(), lm)
    assert all(batch % mesh["data"] == 0 and h % mesh["model"] == 0 for h in heads)
    s = wb.Session(lm, mesh, [wb.BP("data"), wb.MP("model"), wb.Z3("data")], strict=True)
    assert s.state.notes == () and "left whole" not in repr(s)


def test_every_note_names_a_value_left_whole(lm):
    n = heads_only_axis(lm)
    s = wb.Session(lm, {"data": 2, "model": n}, [wb.BP("data"), wb.MP("model"), wb.Z3("data")])
    assert s.state.notes
    for note in s.state.notes:
        assert not s.state.shardings[note.value].uses(note.axis)
        if note.size is not None:
            assert note.size % s.mesh.axis_size(note.axis)


@pytest.mark.slow
def test_gpt2_from_hugging_face():
    from workbench.models.external import build_external

    ex = build_external("hf_gpt2", "tiny", abstract=True)
    p = wb.capture(ex.fn, *ex.args)
    s = wb.Session(p, {"data": 2, "model": 2}, [wb.BP("data"), wb.MP("model"), wb.Z3("data")])
    assert s.state.notes == ()
    n = heads_only_axis(p)
    s = wb.Session(p, {"model": n}, [wb.MP("model")])
    assert s.notes() and all(f"{n}-way axis 'model' does not divide" in t for t in s.notes())
    batch = batch_of(p)
    with pytest.raises(NothingTiled, match=f"does not divide the batch dimension \\({batch}\\)"):
        wb.Session(p, {"data": 2 * batch}, [wb.BP("data")])


def test_advice_names_a_divisor_when_the_sizes_have_many(lm):
    vocab = {lm.values[v].shape[d] for v, d in lm.anatomy().embeddings}
    g = math.gcd(*vocab)
    n = next(k for k in range(2, 100) if all(v % k for v in vocab))
    divisors = [k for k in range(1, g + 1) if g % k == 0]
    with pytest.raises(NothingTiled) as err:
        wb.Session(lm, {"model": n}, [wb.EMB("model")])
    text = str(err.value)
    assert f"the {n}-way axis 'model' does not divide the vocabulary dimension" in text
    if len(divisors) > 6:
        assert f"use an axis whose size divides {g}," in text
    else:
        assert f"or {g}, a vocabulary dimension that is a multiple of {n}" in text
