"""``Place`` and ``Session.place``: a placement fixed as a step of the history. It moves no
sharding; the estimate prices under it where the hardware's levels take it (and says so
where they do not); the lowerings lay the devices out by it."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import workbench as wb
from tests.core.bad_inputs.common import expect
from workbench.core.errors import InputError, TacticError
from workbench.core.hardware import H100
from workbench.core.hardware.placement import Placement, row_major
from workbench.core.propagate.tactics import TacticInputError
from workbench.core.strategies.placing import Place
from workbench.models import build

MESH = wb.Mesh({"batch": 2, "model": 4})
#: H100 in nodes of 4: the mesh's 8 devices fill two nodes
NODES_OF_4 = H100.with_group_sizes({"nvlink": 4})
LEVELS = ("nvlink", "infiniband")
#: batch inside a node, model across both nodes: not the mesh order
ACROSS = Placement(LEVELS, (("batch", (2, 1)), ("model", (2, 2))))
IN_ORDER = row_major(MESH, NODES_OF_4.links)  # model inside a node, batch across


@pytest.fixture(scope="module")
def program():
    ex = build("mlp", "tiny")
    return wb.capture(ex.fn, *ex.args)


def plan():
    return [wb.BP("batch"), wb.Tile("params/**/w", -1, "model")]


@pytest.fixture
def session(program):
    return wb.Session(program, MESH, plan())


def test_place_is_data_and_reads_as_its_placement():
    p = Place.of(ACROSS)
    assert p == Place(list(LEVELS), [["batch", [2, 1]], ["model", [2, 2]]])  # lists frozen
    assert p.levels == LEVELS and p.factors == (("batch", (2, 1)), ("model", (2, 2)))
    assert p.placement == ACROSS and hash(p) == hash(Place.of(ACROSS))
    assert str(p) == "Place(batch: nvlink 2; model: nvlink 2 x infiniband 2)"
    assert str(Place.of(IN_ORDER)) == "Place(batch: infiniband 2; model: nvlink 4)"
    assert Place(LEVELS, (("batch", (np.int64(2), 1)),)).factors == (("batch", (2, 1)),)
    assert "Place" in wb.__all__ and wb.Place is Place


@pytest.mark.parametrize(
    "levels, factors, fragment",
    [
        ("nvlink", (("batch", (2,)),), r"levels must be the hardware's link names"),
        ((), (("batch", ()),), r"levels must be"),
        (("nvlink", "nvlink"), (("batch", (2, 1)),), r"each once"),
        (("nvlink", 3), (("batch", (2, 1)),), r"levels must be"),
        (LEVELS, (), r"factors must list each mesh axis"),
        (LEVELS, "batch", r"factors must list each mesh axis"),
        (LEVELS, (("batch", (2, 0)),), r"factors \(2, 0\), and a factor .* at least 1"),
        (LEVELS, (("batch", (-2, -1)),), r"at least 1"),
        (LEVELS, (("batch", (True, 2)),), r"give one int per level \(nvlink, infiniband\)"),
        (LEVELS, (("batch", (2.0, 1)),), r"give one int per level"),
        (LEVELS, (("batch", (2,)),), r"has factors \(2,\); give one int per level"),
        (LEVELS, ((3, (2, 1)),), r"each entry of factors is \(mesh axis name, factors\)"),
        (LEVELS, (("batch", (2, 1), 3),), r"each entry of factors"),
        (LEVELS, (("batch", (2, 1)), ("batch", (1, 1))), r"axis 'batch' is placed twice"),
    ],
)
def test_a_bad_place_says_what_would_work(levels, factors, fragment):
    err = expect(lambda: Place(levels, factors), TacticInputError, fragment)
    assert isinstance(err, InputError)


def test_place_of_takes_a_placement_or_a_ranked_one(session):
    ranked = session.placements(NODES_OF_4)
    assert {Place.of(r).placement for r in ranked} == {ACROSS, IN_ORDER}
    for bad in ("nvlink", None, ACROSS.factors, session):
        expect(lambda bad=bad: Place.of(bad), TacticInputError, r"a Placement, or one of")


def test_placing_moves_nothing_and_is_a_step_of_the_history(session):
    before = session.state
    assert before.placement is None
    session.place(ACROSS)
    after = session.state
    assert session.history == (*before.schedule, Place.of(ACROSS))
    assert after.placement == ACROSS
    assert dict(after.shardings) == dict(before.shardings)
    assert dict(after.provenance) == dict(before.provenance)
    assert (after.conflicts, after.notes, after.fences) == (
        before.conflicts,
        before.notes,
        before.fences,
    )
    assert after.changed == frozenset() and after.events == () and session.changed == []
    assert session.notes() == () and len(session.diff()) == 0
    assert "#2 Place(batch: nvlink 2; model: nvlink 2 x infiniband 2)" in repr(session)
    # the last Place wins; undo, redo, jump and reset move along it like any step
    session.place(session.placements(NODES_OF_4)[0])
    assert session.state.placement == session.history[-1].placement
    session.undo()
    assert session.state.placement == ACROSS
    session.jump(2)
    assert session.state.placement is None
    session.redo().redo()
    assert session.state.placement != ACROSS and session.step == 4
    session.reset()
    assert session.state.placement is None and session.state_at(3).placement == ACROSS


def test_a_placement_that_does_not_place_the_mesh_is_refused_and_nothing_changes(session):
    swapped = Placement(LEVELS, (("model", (2, 2)), ("batch", (2, 1))))
    expect(
        lambda: session.place(swapped),
        TacticInputError,
        r"places axes \['model', 'batch'\], but the mesh is .*place its axes \['batch', 'model'\]",
        session,
    )
    wrong_size = Placement(LEVELS, (("batch", (2, 2)), ("model", (2, 1))))
    expect(
        lambda: session.place(wrong_size),
        TacticInputError,
        r"splits axis 'batch' into \(2, 2\), whose product is 4, but the mesh gives it size 2",
        session,
    )
    other_axes = Placement(LEVELS, (("data", (2, 1)), ("model", (2, 2))))
    err = expect(lambda: session.place(other_axes), TacticError, r"places axes", session)
    assert isinstance(err, InputError)
    for bad in ("batch inside", 3, [ACROSS], Place):
        expect(lambda bad=bad: session.place(bad), InputError, r"a Placement, or one of", session)


def test_the_estimate_prices_under_the_sessions_placement(session):
    by = {r.placement: r.estimate.step_s for r in session.placements(NODES_OF_4)}
    assert by[ACROSS] != by[IN_ORDER]
    unplaced = session.estimate(NODES_OF_4)
    assert unplaced.step_s == pytest.approx(by[IN_ORDER]) and unplaced.note == ""
    session.place(ACROSS)
    placed = session.estimate(NODES_OF_4)
    assert placed.step_s == pytest.approx(by[ACROSS]) and placed.note == ""
    assert placed.compute_s == unplaced.compute_s and placed.memory == unplaced.memory
    # a hardware given with a placement of its own keeps it, and the estimate says so
    own = session.estimate(NODES_OF_4.with_placement(IN_ORDER))
    assert own.step_s == pytest.approx(by[IN_ORDER])
    assert (
        "priced under H100 SXM's own placement (batch: infiniband 2; model: nvlink 4)" in own.note
    )
    assert session.estimate(NODES_OF_4.with_placement(ACROSS)).note == ""
    session.undo()
    assert session.estimate(NODES_OF_4).step_s == pytest.approx(by[IN_ORDER])


def test_a_placement_the_hardware_cannot_take_is_priced_in_mesh_order_and_said(session):
    in_order_h100 = session.estimate("h100")
    session.place(ACROSS)
    e = session.estimate("h100")  # nodes of 8: the mesh's 8 devices in one node
    assert e.step_s == pytest.approx(in_order_h100.step_s)
    assert e.note.startswith(
        "the session's placement (batch: nvlink 2; model: nvlink 2 x infiniband 2; levels "
        "nvlink, infiniband) does not apply to H100 SXM, whose groups it does not fit ("
    )
    assert e.note.endswith("; priced in mesh order") and "8 of the mesh's 8 devices" in e.note
    cpu = session.estimate("cpu")
    assert "does not apply to CPU (placeholder), whose levels are host" in cpu.note
    for shown in (str(e), repr(e), e._repr_html_()):
        assert "does not apply to H100 SXM" in shown
    assert "NOTE" not in repr(session.estimate(NODES_OF_4)) + str(in_order_h100)


def test_a_placed_session_runs_on_its_devices_in_the_placements_order(session):
    session.place(ACROSS)
    devices = jax.devices()
    want = [devices[i].id for i in ACROSS.device_ids(MESH).ravel()]
    assert want != [d.id for d in devices[: MESH.size]]  # not the mesh order
    for lowering in ("explicit", "constrained"):
        _, jmesh = session.lower(lowering)
        assert [d.id for d in jmesh.devices.flat] == want
    given = devices[::-1]  # a list given: its positions, as the placement says
    _, jmesh = session.lower(devices=given)
    assert [d.id for d in jmesh.devices.flat] == [
        given[i].id for i in ACROSS.device_ids(MESH).ravel()
    ]
    result = session.run(repeats=1)
    assert result.matches, result
    session.undo()
    _, jmesh = session.lower()
    assert [d.id for d in jmesh.devices.flat] == [d.id for d in devices[: MESH.size]]


@pytest.mark.slow  # seconds: the pipeline lowering traces every stage
def test_a_placed_pipeline_lays_its_stages_out_by_the_placement():
    from workbench.models import lm

    ex = build("lm", lm.Config.preset("tiny", n_layers=2))
    program = wb.capture(ex.fn, *ex.args)
    mesh = wb.Mesh({"stage": 2, "data": 4})
    stages_inside = Placement(LEVELS, (("stage", (2, 1)), ("data", (2, 2))))
    s = wb.Session(program, mesh, [wb.PP("stage", microbatches=2), wb.BP("data")])
    s.place(stages_inside)
    _, jmesh = s.lower()
    want = [jax.devices()[i].id for i in stages_inside.device_ids(mesh).ravel()]
    assert [d.id for d in jmesh.devices.flat] == want
    assert s.estimate(NODES_OF_4).pipeline.links == ("nvlink",)  # the stages share a node
    assert s.run(repeats=1).matches


def test_xla_reads_the_same_collectives_over_the_same_axes_once_placed(session):
    """The compiled program's replica groups name mesh positions, not devices: the
    crosscheck reads a placed step's collectives as the plan's, as it does unplaced."""
    from collections import Counter

    from workbench.core.xla.crosscheck import compiled_collectives, crosscheck

    def read():
        return Counter((c.kind, c.axes, c.bytes) for c in compiled_collectives(session))

    unplaced = read()
    session.place(ACROSS)
    assert read() == unplaced and sum(unplaced.values()) > 0
    assert crosscheck(session).identical


def test_auto_after_a_place_prices_under_it(session):
    from workbench.core.search.tree import Search

    session.place(ACROSS)
    auto = wb.Auto("model", hardware=NODES_OF_4, budget=2)
    search = Search(session.program, MESH, session.state, auto)
    assert search.hardware == NODES_OF_4.with_placement(ACROSS)
    h100 = Search(session.program, MESH, session.state, wb.Auto("model", budget=2))
    assert h100.hardware == H100  # nodes of 8: it does not apply, the mesh order is priced
