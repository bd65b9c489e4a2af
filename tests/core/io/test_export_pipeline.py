"""export_jax() of a pipelined step: a standalone module holding the pipeline lowering
compiled by jax.export, that checks its arguments and computes what the unpartitioned
step computes."""

import types

import jax
import numpy as np
import pytest

import workbench as wb
from workbench.core.errors import InputError
from workbench.core.hardware.placement import Placement
from workbench.core.io.export import _tactic_code, exported_tactics
from workbench.models import build, lm

MESH = wb.Mesh({"stage": 4, "data": 2})


@pytest.fixture(scope="module")
def example():
    ex = build("lm", lm.Config.preset("tiny", n_layers=4))
    return ex, wb.capture(ex.fn, *ex.args)


#: on two nodes of 4 devices, the four stages inside a node and the data pairs across the
#: nodes: not the mesh order (which puts each data pair side by side)
PLACED = Placement(("nvlink", "infiniband"), (("stage", (4, 1)), ("data", (1, 2))))


@pytest.fixture(scope="module")
def exported(example):
    """The session, placed, and its exported module (exported once: ~5 s of lowering)."""
    _, program = example
    session = wb.Session(program, MESH, [wb.PP("stage", microbatches=4), wb.BP("data")])
    session.place(PLACED)
    text = session.export_jax()
    module = types.ModuleType("exported")
    exec(compile(text, "<exported>", "exec"), module.__dict__)
    return session, text, module


@pytest.mark.slow  # ~45 s: one compile of a pipelined step
def test_the_exported_pipeline_computes_the_unpartitioned_step(example, exported):
    ex, _ = example
    _, text, module = exported
    assert "import workbench" not in text and "from workbench" not in text
    out = module.partitioned(ex.fn)(*ex.args)
    want = ex.fn(*ex.args)
    assert jax.tree.structure(out) == jax.tree.structure(want)
    for got, ref in zip(jax.tree.leaves(out), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=2e-4, atol=1e-5)
    # it ran on the exported mesh, placed as the plan says: the tokens split over "data"
    tokens = jax.tree.leaves(ex.args).__len__() - 1
    assert module.IN_SPECS[tokens] == jax.sharding.PartitionSpec("data")


@pytest.mark.slow  # the export's lowering (~5 s)
def test_the_module_writes_out_what_it_compiled(exported):
    session, _, module = exported
    assert [_tactic_code(t) for t in exported_tactics(session)] == module.SCHEDULE
    assert module.SCHEDULE[0].startswith("PP(axis='stage', microbatches=4")
    assert module.SCHEDULE[-1].startswith("Place(levels=['nvlink', 'infiniband'], factors=")
    assert module.PIPELINE["stages"] == 4 and module.PIPELINE["microbatches"] == 4
    assert [f"stage {s}: blocks {s}" for s in range(4)] == module.STAGES
    assert module.WORK[0] == "F0 F1 F2 F3 B0 B1 B2 B3"  # 1F1B: stage 0 warms up with S
    assert (module.AXES, module.SHAPE) == (("stage", "data"), (4, 2))
    # the mesh laid out as the session's placement says, as its own lowering lays it out
    ids = PLACED.device_ids(MESH)
    assert ids.tolist() == module.DEVICE_IDS and (ids.ravel() != np.arange(8)).any()
    _, jmesh = session.lower()
    assert [d.id for d in module.make_mesh().devices.flat] == [d.id for d in jmesh.devices.flat]
    assert [d.id for d in jmesh.devices.flat] == [jax.devices()[i].id for i in ids.flat]
    program = session.program
    assert len(module.ARGS) == len(program.inputs) and module.ARGS[0][0] == "0/embed"
    assert [o[0] for o in module.OUTS] == list(program.output_names)
    assert "cpu" in module.PLATFORMS
    assert f"{module.PIPELINE['schedule']} schedule" in module.__doc__


@pytest.mark.slow  # the export's lowering (~5 s)
def test_arguments_unlike_the_compiled_ones_are_refused_naming_the_first(example, exported):
    ex, _ = example
    _, _, module = exported
    step = module.partitioned(ex.fn)
    params, opt, batch = ex.args
    short = {**batch, "tokens": batch["tokens"][:4]}  # half the batch
    with pytest.raises(ValueError, match=r"leaf #\d+ is 2/tokens: int32\[4, 16\].*2/tokens: "):
        step(params, opt, short)
    cast = {**batch, "tokens": batch["tokens"].astype(np.int16)}
    with pytest.raises(ValueError, match=r"2/tokens: int16.*compiled for 2/tokens: int32"):
        step(params, opt, cast)
    with pytest.raises(ValueError, match=r"hold \d+ leaves .* compiled for \d+ in"):
        step(params, opt, batch, batch["tokens"])  # one argument too many
    with pytest.raises(ValueError, match=r"compiled for 8 devices .*; 4 are attached"):
        module.make_mesh(jax.devices()[:4])


def test_explicit_mode_of_a_pipelined_step_is_refused_saying_what_works(example):
    _, program = example
    session = wb.Session(program, MESH, [wb.PP("stage", microbatches=4), wb.BP("data")])
    with pytest.raises(InputError, match=r"mode='explicit'.*PP\(.*export_jax\(\) \(mode="):
        session.export_jax(mode="explicit")
    with pytest.raises(InputError, match=r"mode 'sharded' is not one of"):
        session.export_jax(mode="sharded")
