"""Meeting the user's training loop: importing the plan they have (in/out shardings, jit's own,
sharding constraints in the step, Flax logical axes and rules), and exporting what they plug
in (spec trees shaped like their arguments, logical axis rules)."""

from __future__ import annotations

import warnings
from functools import cache

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import workbench as wb
from workbench.core.errors import WorkbenchError
from workbench.core.lowering.explicit import jax_mesh
from workbench.models import build
from workbench.models.external import EXTERNAL, build_external

MESH = wb.Mesh({"data": 2, "model": 4})


@cache
def example(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = build(name, "tiny") if name in ("lm", "mlp") else build_external(name, "tiny")
        return ex, wb.capture(ex.fn, *ex.args)


def is_spec(x):
    return isinstance(x, P)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, strategy",
    [
        ("hf_gpt2", "BP+MP"),
        ("nnx_lm", "BP+MP"),
        ("hf_llama", "BP+Z3"),
        ("lm", "BP+MP+Z3"),
    ],
)
def test_an_exported_plan_imports_back_to_the_same_state(name, strategy):
    ex, program = example(name)
    parts = {"BP": wb.BP("data"), "MP": wb.MP("model"), "Z3": wb.Z3("data")}
    s = wb.Session(program, MESH, [parts[k] for k in strategy.split("+")])
    specs = s.specs()
    # the specs mirror each argument's own tree, exactly as passed
    assert len(specs) == len(ex.args)
    for spec_tree, arg in zip(specs, ex.args):
        assert jax.tree.structure(spec_tree, is_leaf=is_spec) == jax.tree.structure(arg)
    again = wb.Session.from_jax(ex.fn, *ex.args, mesh=MESH, in_shardings=specs)
    assert [str(t) for t in again.history] == [
        f"Imported('in_shardings', {len(again.history[0].tiles)} tiles)"
    ]
    # the layouts (Z3's atomic marks are its own way of getting there, not part of a spec)
    assert all(again.state.shardings[v].dims == s.state.shardings[v].dims for v in program.inputs)
    if "Z3" in strategy:
        # Z3 keeps the parameters' data axis out of the compute (atomic); specs cannot say
        # that, so propagation from them alone makes another plan, which must still compute
        # the same step
        assert again.run(repeats=1).matches
        return
    assert sorted((c.kind, c.axes, c.bytes) for c in again.collectives()) == sorted(
        (c.kind, c.axes, c.bytes) for c in s.collectives()
    )


@pytest.mark.slow
def test_the_specs_plug_into_jit_and_device_put():
    ex, program = example("hf_gpt2")
    s = wb.Session(program, MESH, [wb.BP("data"), wb.MP("model")])
    mesh = jax_mesh(MESH)
    placed = jax.device_put(ex.args, s.specs(mesh=mesh))
    step = jax.jit(
        ex.fn, in_shardings=s.specs(mesh=mesh), out_shardings=s.specs(mesh=mesh, outputs=True)
    )
    out = step(*placed)
    kernel = out[0]["transformer"]["h"]["0"]["mlp"]["c_fc"]["kernel"]
    assert kernel.sharding.spec == s.specs()[0]["transformer"]["h"]["0"]["mlp"]["c_fc"]["kernel"]
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(jax.jit(ex.fn)(*ex.args))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=1e-5)


@pytest.mark.slow  # several seconds: in the full suite, not the fast lane
def test_a_jitted_step_brings_its_own_shardings():
    ex, program = example("nnx_lm")
    s = wb.Session(program, MESH, [wb.BP("data"), wb.MP("model")])
    mesh = jax_mesh(MESH)
    jitted = jax.jit(
        ex.fn, in_shardings=s.specs(mesh=mesh), out_shardings=s.specs(mesh=mesh, outputs=True)
    )
    imported = wb.Session.from_jax(jitted, *ex.args, mesh=mesh)
    assert [t.source for t in imported.history] == ["jit in_shardings", "out_shardings"]
    assert all(imported.state.shardings[v] == s.state.shardings[v] for v in program.inputs)
    # explained like any tactic
    kernel = next(n for n in program.names("params/**") if imported.sharding(n).tiled_axes)
    assert "Imported('jit in_shardings'" in str(imported.why(kernel))


def constrained_step(params, x):
    """An MLP step whose author pinned the hidden activation with with_sharding_constraint."""

    def loss(params):
        h = jax.nn.relu(x @ params["up"])
        h = jax.lax.with_sharding_constraint(h, P("data", "model"))
        return ((h @ params["down"]) ** 2).mean()

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree.map(lambda w, g: w - 0.1 * g, params, grads), value


def test_sharding_constraints_inside_the_step_become_steps_of_the_schedule():
    rng = np.random.default_rng(0)
    params = {
        "up": rng.normal(size=(16, 64)).astype("float32"),
        "down": rng.normal(size=(64, 16)).astype("float32"),
    }
    x = rng.normal(size=(8, 16)).astype("float32")
    with jax.set_mesh(jax_mesh(MESH)):  # the constraint's spec names this mesh's axes
        s = wb.Session.from_jax(constrained_step, params, x, mesh=MESH)
    (imported,) = s.history
    # the constraint, and its transpose in the backward pass
    assert imported.source == "with_sharding_constraint" and len(imported.tiles) == 4
    # the constraint tiled the hidden activation, and propagation took it to the weights
    assert s.sharding("params/up").dim_of("model") == 1
    assert s.sharding("params/down").dim_of("model") == 0
    assert s.sharding("x").dim_of("data") == 0
    assert s.run(repeats=1, args=(params, x)).matches


def nnx_model_with_metadata():
    """A Flax NNX MLP annotated with logical axis names as Flax's docs annotate one, and an
    optax step over its parameters."""
    import optax
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, d, h, rngs):
            init = nnx.initializers.lecun_normal()
            self.up = nnx.Linear(
                d, h, kernel_init=nnx.with_partitioning(init, ("embed", "mlp")),
                bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), ("mlp",)),
                rngs=rngs,
            )  # fmt: skip
            self.down = nnx.Linear(
                h, d, kernel_init=nnx.with_partitioning(init, ("mlp", "embed")), use_bias=False,
                rngs=rngs,
            )  # fmt: skip

        def __call__(self, x):
            return self.down(jax.nn.relu(self.up(x)))

    with nnx.use_eager_sharding(False):
        model = MLP(16, 64, nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    tx = optax.adam(1e-3)

    def step(params, opt_state, batch):
        def loss(params):
            y = nnx.merge(graphdef, params)(batch["x"])
            return ((y - batch["y"]) ** 2).mean()

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    batch = {"x": jnp.ones((8, 16)), "y": jnp.zeros((8, 16))}
    return step, (params, tx.init(params), batch), nnx.get_partition_spec(params)


RULES = [("batch", "data"), ("mlp", "model"), ("embed", None)]


def test_logical_axes_and_rules_import_and_export():
    step, args, logical = nnx_model_with_metadata()
    s = wb.Session.from_jax(step, *args, mesh=MESH, logical_axes=(logical, None, None), rules=RULES)
    assert s.sharding("params/up/kernel/value").dims == ((), ("model",))
    assert s.sharding("params/down/kernel/value").dims == (("model",), ())
    # the plan said back in the model's own names
    rules = s.logical_rules((logical, None, None))
    assert rules.ok and dict(rules.rules)["mlp"] == "model" and dict(rules.rules)["embed"] is None
    # BP on top: the data's batch has no metadata, its name comes from the anatomy
    s.apply(wb.BP("data"))
    rules = s.logical_rules((logical, None, None))
    assert dict(rules.rules)["batch"] == "data"
    back = wb.Session.from_jax(
        step, *args, mesh=MESH, logical_axes=(logical, None, None), rules=rules.rules
    )
    annotated = s.program.names("params/**")  # the arguments that carry logical names
    assert all(back.sharding(n).dims == s.sharding(n).dims for n in annotated)
    assert back.run(repeats=1, args=args).matches


def test_a_plan_that_splits_a_logical_name_two_ways_is_not_said_as_rules():
    step, args, logical = nnx_model_with_metadata()
    program = wb.capture(step, *args)
    s = wb.Session(program, MESH, [wb.Tile("params/up/kernel/value", 0, "data")])
    rules = s.logical_rules((logical, None, None))
    assert not rules.ok and "embed" in rules.split
    assert "params/up/kernel/value" in str(rules) and "session.specs()" in str(rules)


def test_import_errors_say_what_would_work():
    ex, _ = example("mlp")
    with pytest.raises(WorkbenchError, match="mesh axis 'tensor'"):
        wb.Session.from_jax(ex.fn, *ex.args, mesh=MESH, in_shardings=P("tensor"))
    with pytest.raises(WorkbenchError, match="entries but the step takes"):
        wb.Session.from_jax(ex.fn, *ex.args, mesh=MESH, in_shardings=(None,) * 7)
    step, args, logical = nnx_model_with_metadata()
    with pytest.raises(WorkbenchError, match="needs the rules"):
        wb.Session.from_jax(step, *args, mesh=MESH, logical_axes=(logical, None, None))
    with pytest.raises(WorkbenchError, match="logical axes with 1 leaves for an argument with 3"):
        wb.Session.from_jax(
            step, *args, mesh=MESH, logical_axes=([P("mlp")], None, None), rules=RULES
        )


def test_an_imported_plan_exports_and_saves_as_itself(tmp_path):
    ex, program = example("mlp")
    s = wb.Session(program, MESH, [wb.BP("data"), wb.Z3("data")])
    imported = wb.Session.from_jax(ex.fn, *ex.args, mesh=MESH, in_shardings=s.specs())
    code = imported.export_code()
    assert "Imported(source='in_shardings'" in code
    namespace = {}
    exec(compile(code, "<exported>", "exec"), namespace)
    rebuilt = namespace["build"](program)
    assert dict(rebuilt.state.shardings) == dict(imported.state.shardings)
    again = wb.Session.load(program, imported.save(tmp_path / "imported.json"))
    assert dict(again.state.shardings) == dict(imported.state.shardings)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXTERNAL))
def test_each_third_party_model_imports_data_parallelism_as_its_docs_write_it(name):
    """Their examples replicate the model and shard the batch (``P()`` for params and
    optimizer state, ``P("data")`` for the batch): the same plan as BP."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = build_external(name, "tiny", abstract=True)
        s = wb.Session.from_jax(ex.fn, *ex.args, mesh=MESH, in_shardings=(P(), P(), P("data")))
        bp = wb.Session(s.program, MESH, [wb.BP("data")])
    assert all(s.state.shardings[v].dims == bp.state.shardings[v].dims for v in s.program.inputs)
    assert sorted((c.kind, c.axes, c.bytes) for c in s.collectives()) == sorted(
        (c.kind, c.axes, c.bytes) for c in bp.collectives()
    )
