"""A placed plan run with its reductions synthesised: on 8 virtual CPU devices as 2 nodes of
4, on a model the project did not write, each sum over a group spanning both levels runs
as the program the simulator prices it as, and the step computes what the unpartitioned
one does."""

import pytest

import workbench as wb
from tests.models import programs as external
from workbench.core.errors import InputError
from workbench.core.hardware import H100
from workbench.core.lowering.run import example_inputs

NODES_OF_4 = H100.with_group_sizes({"nvlink": 4})


@pytest.fixture(scope="module")
def session():
    program = external.program("eqx_lm")
    s = wb.Session(program, wb.Mesh({"data": 4, "model": 2}), [wb.BP("data"), wb.MP("model")])
    ranked = s.placements(NODES_OF_4)
    across = next(r for r in ranked if min(r.placement.of("data")) > 1)  # 2 a node, 2 nodes
    s.place(across)
    return s


def collectives(session, hardware=None) -> dict[str, int]:
    """How many of each collective the lowered step's StableHLO holds."""
    fn, _ = session.lower("explicit", hardware=hardware)
    text = fn.lower(*example_inputs(session.program)).as_text()
    kinds = ("all_reduce", "reduce_scatter", "all_gather")
    return {k: text.count(f"stablehlo.{k}") for k in kinds}


def test_reductions_across_levels_run_as_synthesised_and_agree(session):
    r = session.run(hardware=NODES_OF_4, repeats=1)
    assert r.verdict.agree, r.verdict
    _, jmesh = session.lower("explicit", hardware=NODES_OF_4)
    assert "data@1" in jmesh.axis_names and "data@0" in jmesh.axis_names
    est = session.estimate(NODES_OF_4)
    shown = [c for c in est.collectives if c.synthesis is not None]
    assert shown and all(len(c.synthesis.program.steps) > 1 for c in shown)
    # the gradients' all-reduces over data: reduce-scatter in the node, all-reduce across,
    # all-gather back; the plain lowering has no reduce-scatter or all-gather at all
    plain, synthesised = collectives(session), collectives(session, NODES_OF_4)
    assert plain["reduce_scatter"] == plain["all_gather"] == 0
    assert synthesised["reduce_scatter"] > 0 and synthesised["all_gather"] > 0
    assert synthesised["reduce_scatter"] == synthesised["all_gather"]


def test_the_plain_lowering_keeps_one_collective_per_reduction(session):
    r = session.run(repeats=1)
    assert r.verdict.agree
    _, jmesh = session.lower("explicit")
    assert jmesh.axis_names == ("data", "model")


def test_hardware_is_for_the_explicit_lowering_only(session):
    with pytest.raises(InputError, match="explicit"):
        session.lower("constrained", hardware=NODES_OF_4)


def test_zero3s_reduce_scatters_run_as_synthesised_and_agree():
    """BP and ZeRO-3 on a data axis across both nodes: the gradients' reduce-scatters run as their
    programs (the blocks permuted where the scatters run inner level first), and the
    step still computes what the unpartitioned one does."""
    program = external.program("eqx_lm")
    s = wb.Session(program, wb.Mesh({"data": 8}), [wb.BP("data"), wb.Z3("data")])
    est = s.estimate(NODES_OF_4)
    scatters = [
        c
        for c in est.collectives
        if c.synthesis is not None and c.collective.kind == "reduce-scatter"
    ]
    assert scatters, "ZeRO-3's gradients are reduce-scattered over data, across both nodes"
    assert {c.synthesis.program.describe(["nvlink", "infiniband"]) for c in scatters} <= {
        "permute blocks, RS nvlink, RS infiniband",
        "RS infiniband, RS nvlink",
        "RS nvlink+infiniband",
    }
    r = s.run(hardware=NODES_OF_4, repeats=1)
    assert r.verdict.agree, r.verdict
    plain, synthesised = collectives(s), collectives(s, NODES_OF_4)
    assert synthesised["reduce_scatter"] > plain["reduce_scatter"] > 0
