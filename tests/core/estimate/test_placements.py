"""Session.placements on a model the project did not write: every placement of the mesh on
the hardware's levels, priced by the simulator and ranked; the mesh order's among them."""

import pytest

import workbench as wb
from tests.models import programs as external
from workbench.core.errors import InputError
from workbench.core.hardware import H100
from workbench.core.hardware.placement import row_major


@pytest.fixture(scope="module")
def session():
    program = external.program("eqx_lm")
    return wb.Session(program, wb.Mesh({"data": 8, "model": 4}), [wb.BP("data"), wb.MP("model")])


def test_placements_are_ranked_by_the_simulated_step(session):
    ranked = session.placements("h100")
    assert ranked.total == len(ranked) == 3
    steps = [r.estimate.step_s for r in ranked]
    assert steps == sorted(steps)
    mesh_order = row_major(session.mesh, H100.links)
    assert mesh_order in [r.placement for r in ranked]
    # the estimate without a placement is the mesh order's
    by_placement = {r.placement: r.estimate.step_s for r in ranked}
    assert session.estimate("h100").step_s == pytest.approx(by_placement[mesh_order])
    # the model axis's all-reduces cost most where the model axis leaves the node
    worst = ranked[-1]
    assert worst.placement.of("model")[1] > 1
    costs = worst.by_axes()
    assert costs[("all-reduce", ("model",))] > ranked[0].by_axes()[("all-reduce", ("model",))]
    assert "nvlink" in str(ranked) and "step" in str(ranked[0])


def test_placements_cap_and_refuse_bad_limits(session):
    capped = session.placements("h100", limit=2)
    assert len(capped) == 2 and capped.total == 3 and "limit=2" in str(capped)
    for bad in (0, -1, 1.5, "all", True):
        with pytest.raises(InputError, match="positive int"):
            session.placements("h100", limit=bad)


def test_a_pipelines_sends_cross_the_level_its_placement_says():
    """The stages' sends run on NVLink where the stage axis lies inside a node, on
    InfiniBand where its consecutive stages sit in different nodes."""
    from workbench.core.hardware.placement import Placement
    from workbench.core.strategies.pipeline import PP
    from workbench.models import build, lm

    ex = build("lm", lm.Config.preset("tiny", n_layers=4, batch=16), abstract=True)
    program = wb.capture(ex.fn, *ex.args)
    mesh = wb.Mesh({"stage": 4, "data": 8})  # 4 nodes of 8
    s = wb.Session(program, mesh, [PP("stage", microbatches=2), wb.BP("data")])
    levels = ("nvlink", "infiniband")
    inside = Placement(levels, (("stage", (4, 1)), ("data", (2, 4))))
    across = Placement(levels, (("stage", (1, 4)), ("data", (8, 1))))
    halves = Placement(levels, (("stage", (2, 2)), ("data", (4, 2))))
    links = {}
    for name, p in (("inside", inside), ("across", across), ("halves", halves)):
        links[name] = s.estimate(H100.with_placement(p)).pipeline.links
    assert links == {
        "inside": ("nvlink",) * 3,
        "across": ("infiniband",) * 3,
        "halves": ("nvlink", "infiniband", "nvlink"),  # stages 0-1 and 2-3 share a node
    }
    # the mesh order: the data axis fills each node, so every stage is a node of its own
    assert s.estimate(H100).pipeline.links == links["across"]


def test_reductions_across_levels_show_the_program_they_are_priced_as(session):
    """Placed with the data axis across nodes, the gradients' all-reduces run as
    reduce-scatter inside each node, all-reduce across, all-gather back, priced so; each
    says how much faster that is than one ring over all its devices."""
    ranked = session.placements("h100")
    spread = next(
        r for r in ranked if r.placement.of("data")[0] > 1 and r.placement.of("data")[1] > 1
    )
    shown = [c for c in spread.estimate.collectives if c.synthesis is not None]
    assert shown, "a data axis across levels makes reductions across levels"
    for c in shown:
        s = c.synthesis
        assert c.collective.kind in ("all-reduce", "reduce-scatter")
        assert s.seconds <= s.default_s and s.speedup >= 1.0
        assert {name for name, _ in s.levels} == {"nvlink", "infiniband"}
    big = max(shown, key=lambda c: c.synthesis.nbytes)
    assert big.synthesis.speedup > 1.5
    assert "nvlink" in str(big.synthesis) and "x the default's" in str(big.synthesis)
    assert f"{len(shown)} reductions span levels; the costliest: " in repr(spread.estimate)
    # on one level a reduction is one collective, with nothing synthesised
    inside = next(r for r in ranked if r.placement.of("data") == (8, 1))
    alone = [c for c in inside.estimate.collectives if c.collective.axes == ("data",)]
    assert alone and all(c.synthesis is None for c in alone)
