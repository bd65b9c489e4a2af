"""Exports: Python that rebuilds a session, plain JAX that needs no workbench, JSON strategies."""

import json
import types
from collections import Counter
from functools import cache

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb
from tests.core.lowering.strategies import strategies
from workbench.core.errors import WorkbenchError
from workbench.core.io import schema
from workbench.core.strategies.named import BP, MP, Z3
from workbench.core.xla.crosscheck import compiled_collectives
from workbench.core.xla.hlo import normalize_cpu, parse_collectives
from workbench.models import build

MESH = wb.Mesh({"batch": 2, "model": 4})


@cache
def example(model):
    ex = build(model, "tiny")
    return ex, wb.capture(ex.fn, *ex.args)


def rebuilt(code: str, program) -> wb.Session:
    namespace: dict = {}
    exec(compile(code, "<exported>", "exec"), namespace)
    return namespace["build"](program)


@pytest.mark.parametrize(
    "model, strategy",
    [
        ("lm", "BP+MP"),
        ("lm_scan", "BP+MP+Z3"),
        ("gnn", "BP+MP"),
        pytest.param("cnn", "Z3", marks=pytest.mark.slow),  # seconds: in the full suite
    ],
)
def test_exported_code_rebuilds_an_identical_state(model, strategy):
    _, program = example(model)
    s = wb.Session(program, MESH, strategies(model)[strategy])
    again = rebuilt(s.export_code(), program)
    assert dict(again.state.shardings) == dict(s.state.shardings)
    assert again.history == s.history


def test_exported_code_is_readable():
    _, program = example("lm")
    s = wb.Session(program, MESH, [BP("batch"), MP("model"), wb.Tile("params/embed", 0, "model")])
    code = s.export_code()
    assert "SCHEDULE = [\n    BP(axis='batch'),\n    MP(axis='model'),\n" in code
    assert "    Tile(selector='params/embed', dim=0, axis='model'),\n]" in code
    assert "from workbench.core.strategies.named import BP, MP" in code


def test_searches_export_as_what_they_decided():
    _, program = example("lm")
    idle = wb.Auto("batch", inputs="batch/**", budget=4)  # its inputs are decided already
    s = wb.Session(program, MESH, [BP("batch"), idle, wb.Auto("model", budget=8)])
    code = s.export_code()
    assert "    # Auto('batch') decided to leave every input as it was\n" in code
    decided = s.history[2].decisions(program, MESH, s.state_at(2))
    note = "decided:" if decided else "decided to leave every input as it was"
    assert f"    # Auto('model') {note}\n" in code
    again = rebuilt(code, program)
    assert dict(again.state.shardings) == dict(s.state.shardings)
    assert "Auto(" not in code.replace("# Auto(", "")


def test_json_strategies_round_trip(tmp_path):
    _, program = example("lm")
    s = wb.Session(
        program, MESH, [BP("batch"), Z3("batch"), wb.Tile(["params/**/mlp/w_in"], -1, "model")]
    )
    path = s.save(tmp_path / "strategy.json")
    data = json.loads(path.read_text())
    assert (data["format"], data["version"]) == ("workbench-strategy", schema.VERSION)
    assert data["mesh"] == {"batch": 2, "model": 4}
    assert data["schedule"][0] == {
        "tactic": "BP",
        "axis": "batch",
        "inputs": None,
        "dim": None,
        "strict": False,
    }
    again = wb.Session.load(program, path)
    assert dict(again.state.shardings) == dict(s.state.shardings)


@pytest.mark.parametrize(
    "schedule, message",
    [
        (
            [{"tactic": "eval", "axis": "batch"}],
            r"schedule\[0\] names tactic 'eval'; known tactics are",
        ),
        (
            [{"tactic": "Tile", "selector": "x", "dim": 0, "axis": "batch", "code": "1"}],
            r"has field 'code'",
        ),
        (
            [{"tactic": "Tile", "selector": {"$": 1}, "dim": 0, "axis": "batch"}],
            r"holds a dict .*; only strings",
        ),
        ([{"tactic": "Tile", "selector": "x"}], r"schedule\[0\] \(Tile\) lacks 'dim', 'axis'"),
        (
            [{"tactic": "Tile", "selector": "x", "dim": "0", "axis": "batch"}],
            r"schedule\[0\]\.dim of Tile must be an integer; got '0'",
        ),
        (
            [{"tactic": "Tile", "selector": [1, 2], "dim": 0, "axis": "batch"}],
            r"selector of Tile must be a string or a list of strings",
        ),
        (
            [{"tactic": "SP", "axis": "model", "stream": 3}],
            r"stream of SP must be a string or a list",
        ),
        ([{"tactic": "Auto", "axes": "model", "budget": "x"}], r"budget of Auto must be an"),
        ([{"tactic": "Auto", "axes": "model", "memory_limit": "1"}], r"must be a number"),
        ([{"tactic": "Auto", "axes": "model", "hardware": "h100"}], r"has field 'hardware'"),
        ([{"tactic": "Auto", "axes": "model", "callback": "print"}], r"has field 'callback'"),
    ],
)
def test_json_loading_takes_data_only(tmp_path, schedule, message):
    path = tmp_path / "bad.json"
    path.write_text(
        json.dumps(
            {
                "format": "workbench-strategy/1",
                "mesh": {"batch": 2, "model": 4},
                "schedule": schedule,
            }
        )
    )
    _, program = example("mlp")
    with pytest.raises(WorkbenchError, match=message):
        wb.Session.load(program, path)
    path.write_text("{not json")
    with pytest.raises(WorkbenchError, match=r"bad\.json' is not JSON"):
        wb.Session.load(program, path)
    path.write_bytes(b'{"format": "\xff\xfe"}')  # not UTF-8: the CLI's reader says so too
    with pytest.raises(WorkbenchError, match=r"bad.json' is not UTF-8"):
        wb.Session.load(program, path)


EVIL = "w'], dim=0, axis='batch')\nimport builtins; builtins.PWNED = True\n#\"\"\"\n"


def test_value_names_cannot_inject_code_into_exports(tmp_path):
    import builtins

    def f(params, x):
        return x @ params[EVIL]

    program = wb.capture(f, {EVIL: jnp.ones((8, 4))}, jnp.ones((2, 8)))
    s = wb.Session(program, MESH, [wb.Tile("params/" + EVIL, 0, "batch")])
    again = rebuilt(s.export_code(), program)
    assert dict(again.state.shardings) == dict(s.state.shardings)
    module = types.ModuleType("exported")
    exec(compile(s.export_jax(), "<exported>", "exec"), module.__dict__)
    assert len(module.IN_SPECS) == 2
    again = wb.Session.load(program, s.save(tmp_path / "evil.json"))
    assert dict(again.state.shardings) == dict(s.state.shardings)
    assert not hasattr(builtins, "PWNED")


@pytest.mark.slow
@pytest.mark.parametrize("model, strategy", [("lm", "BP+MP"), ("lm_scan", "BP+MP"), ("gnn", "BP")])
def test_plain_jax_export_runs_and_compiles_to_the_same_collectives(model, strategy):
    ex, program = example(model)
    s = wb.Session(program, MESH, strategies(model)[strategy])
    source = s.export_jax()
    assert "workbench" not in source.split('"""', 2)[2].replace("exported by workbench", "")
    module = types.ModuleType("exported")
    exec(compile(source, "<exported>", "exec"), module.__dict__)
    out = module.partitioned(ex.fn)(*ex.args)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ex.fn(*ex.args))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    mesh = module.make_mesh()
    closed = jax.make_jaxpr(ex.fn)(*ex.args)
    jitted = jax.jit(
        lambda *xs: module._evaluate(
            closed.jaxpr,
            closed.consts,
            xs,
            mesh,
            iter(module.structural_keys(closed, module.CALLS)),
        ),
        in_shardings=[jax.sharding.NamedSharding(mesh, p) for p in module.IN_SPECS],
        out_shardings=[jax.sharding.NamedSharding(mesh, p) for p in module.OUT_SPECS],
    )
    text = jitted.lower(*jax.tree.leaves(ex.args)).compile().as_text()
    theirs = Counter(
        (c.kind, c.bytes) for c in normalize_cpu(parse_collectives(text, MESH.axes), text)
    )
    ours = Counter((c.kind, c.bytes) for c in compiled_collectives(s, "constrained"))
    assert theirs == ours


def test_the_exported_mesh_says_how_many_devices_it_needs():
    _, program = example("mlp")
    module = types.ModuleType("exported")
    exec(compile(wb.Session(program, MESH).export_jax(), "<exported>", "exec"), module.__dict__)
    with pytest.raises(
        ValueError, match=r"needs 8 devices \(\{'batch': 2, 'model': 4\}\); 1 are attached"
    ):
        module.make_mesh(jax.devices()[:1])


@pytest.mark.slow
def test_partition_returns_a_jitted_partitioned_function():
    ex, _ = example("lm")
    step = wb.partition(ex.fn, {"batch": 2, "model": 4}, [wb.BP("batch"), wb.MP("model")])
    out = step(*ex.args)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ex.fn(*ex.args))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    session = step.session(*ex.args)
    assert str(session.sharding("params/layers/0/mlp/w_out")) == "f32[64@model,32]"
    assert step.session(*ex.args) is session  # captured once per argument structure
    assert type(out).__name__ == "StepOutput"


def gated_mlp_step(edited: bool):
    """A gated-MLP training step, and the same step after edits that keep its computation:
    independent lines reordered, locals renamed, the loss moved into a jitted helper."""

    @jax.jit
    def mse(prediction, target):
        return ((prediction - target) ** 2).mean()

    def loss(params, batch):
        if edited:
            gate_in = batch["x"] @ params["gate"]
            up_in = batch["x"] @ params["up"]
            mixed = jax.nn.silu(gate_in) * up_in
            return mse(mixed @ params["down"], batch["y"])
        up = batch["x"] @ params["up"]
        gate = batch["x"] @ params["gate"]
        out = (jax.nn.silu(gate) * up) @ params["down"]
        return ((out - batch["y"]) ** 2).mean()

    def step(params, batch):
        value, grads = jax.value_and_grad(loss)(params, batch)
        return jax.tree.map(lambda w, g: w - 0.1 * g, params, grads), value

    return step


def test_the_plain_jax_export_survives_edits_that_keep_the_computation():
    rng = np.random.default_rng(0)
    params = {
        "up": rng.normal(size=(16, 64)).astype("float32"),
        "gate": rng.normal(size=(16, 64)).astype("float32"),
        "down": rng.normal(size=(64, 16)).astype("float32"),
    }
    batch = {"x": rng.normal(size=(8, 16)).astype("float32"), "y": np.zeros((8, 16), "float32")}
    original, edited = gated_mlp_step(False), gated_mlp_step(True)
    schedule = [wb.BP("batch"), wb.Tile("params/{up,gate}", 1, "model")]
    s = wb.Session(wb.capture(original, params, batch), MESH, schedule)
    module = types.ModuleType("exported")
    exec(compile(s.export_jax(), "<exported>", "exec"), module.__dict__)
    assert len(module.CONSTRAINTS) > 10
    hit = [
        {
            k
            for ks in module.structural_keys(jax.make_jaxpr(f)(params, batch), module.CALLS)
            for k in ks
        }
        & set(module.CONSTRAINTS)
        for f in (original, edited)
    ]
    assert hit[0] == hit[1] == set(module.CONSTRAINTS)
    # the edited step's equations are others, in another order: numbers would have moved
    texts = [str(jax.make_jaxpr(f)(params, batch)) for f in (original, edited)]
    assert texts[0] != texts[1]
    mesh = module.make_mesh()
    for f in (original, edited):
        out = module.partitioned(f, mesh)(params, batch)
        for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(original(params, batch))):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_exported_code_rebuilds_a_placement():
    from workbench.core.hardware.placement import Placement

    _, program = example("lm")
    s = wb.Session(program, MESH, [BP("batch"), MP("model")])
    s.place(Placement(("nvlink", "infiniband"), (("batch", (2, 1)), ("model", (2, 2)))))
    code = s.export_code()
    assert (
        "    Place(levels=['nvlink', 'infiniband'], factors=[('batch', (2, 1)), "
        "('model', (2, 2))]),\n]" in code
    )
    assert "from workbench.core.strategies.named import BP, MP, Place" in code
    again = rebuilt(code, program)
    assert again.history == s.history and again.state.placement == s.state.placement
    assert dict(again.state.shardings) == dict(s.state.shardings)


def tanh_step(p, x):
    value, g = jax.value_and_grad(lambda p: jnp.mean(jnp.tanh(x @ p["w1"]) @ p["w2"]))(p)
    return value, jax.tree.map(lambda a, b: a - 0.1 * b, p, g)


@pytest.mark.parametrize("mode", ["constrained", "explicit"])
def test_the_plain_jax_export_lays_its_mesh_out_as_placed(mode):
    """With a ``Place`` step, ``make_mesh`` puts at each mesh position the device the
    placement says (DEVICE_IDS, data), and the step computes what it computes unplaced."""
    from workbench.core.hardware.placement import Placement

    rng = np.random.default_rng(3)
    params = {
        "w1": rng.normal(size=(16, 32)).astype(np.float32),
        "w2": rng.normal(size=(32, 8)).astype(np.float32),
    }
    x = rng.normal(size=(8, 16)).astype(np.float32)
    mesh = wb.Mesh({"batch": 4, "model": 2})
    plan = [wb.BP("batch"), wb.Tile("p/w1", 1, "model"), wb.Tile("p/w2", 0, "model")]
    s = wb.Session(wb.capture(tanh_step, params, x), mesh, plan)
    unplaced = types.ModuleType("unplaced")
    exec(compile(s.export_jax(mode), "<exported>", "exec"), unplaced.__dict__)
    assert unplaced.DEVICE_IDS is None
    assert [d.id for d in unplaced.make_mesh().devices.flat] == list(range(8))
    across = Placement(("nvlink", "infiniband"), (("batch", (4, 1)), ("model", (1, 2))))
    s.place(across)
    source = s.export_jax(mode)
    assert "# the device (its index in the devices make_mesh takes) at each mesh" in source
    module = types.ModuleType("exported")
    exec(compile(source, "<exported>", "exec"), module.__dict__)
    ids = across.device_ids(mesh)
    assert ids.tolist() == module.DEVICE_IDS and (ids.ravel() != np.arange(8)).any()
    devices = jax.devices()
    assert [d.id for d in module.make_mesh().devices.flat] == [devices[i].id for i in ids.flat]
    given = devices[::-1]
    assert [d.id for d in module.make_mesh(given).devices.flat] == [given[i].id for i in ids.flat]
    _, jmesh = s.lower()
    assert [d.id for d in jmesh.devices.flat] == [d.id for d in module.make_mesh().devices.flat]
    out = module.partitioned(tanh_step)(params, x)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(jax.jit(tanh_step)(params, x))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
