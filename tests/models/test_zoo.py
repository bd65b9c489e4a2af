"""The model zoo: every model builds, captures and trains; names and shapes are as documented."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb
from workbench.models import ZOO, ConfigError, Example, build, cnn, gnn, lm, mlp, names

LM_TINY = lm.Config()  # D=32, H=4, K=8, F=64, V=64, 2 layers


@pytest.fixture(scope="module")
def examples() -> dict[str, Example]:
    return {name: build(name) for name in names()}


@pytest.fixture(scope="module")
def programs(examples) -> dict[str, wb.Program]:
    return {name: wb.capture(ex.fn, *ex.args) for name, ex in examples.items()}


def test_zoo_lists_the_models():
    assert names() == ["mlp", "lm", "lm_scan", "cnn", "gnn"]
    assert set(ZOO) == set(names())


@pytest.mark.parametrize("name", ["mlp", "lm", "lm_scan", "cnn", "gnn"])
def test_model_captures_and_runs_with_a_finite_loss(name, examples, programs):
    ex, program = examples[name], programs[name]
    assert not ex.abstract and ex.n_params > 0
    assert len(program) > 0
    assert "out/loss" in program.output_names
    assert {"forward", "backward", "optimizer"} <= {op.phase for op in program.ops}
    assert any(n.startswith("bwd/") for n in program.names())
    loss = jax.jit(ex.fn)(*ex.args).loss
    assert loss.shape == () and np.isfinite(float(loss))


@pytest.mark.parametrize(
    ("name", "primitives"),
    [
        ("lm", {"gather", "dot_general", "exp", "log"}),
        ("lm_scan", {"scan", "gather", "dot_general"}),
        ("cnn", {"conv_general_dilated", "reduce_sum"}),
        ("gnn", {"gather", "scatter-add", "concatenate"}),
        ("mlp", {"dot_general", "max"}),
    ],
)
def test_model_uses_its_characteristic_primitives(name, primitives, programs):
    assert primitives <= programs[name].primitives
    assert ("scan" in programs[name].primitives) == (name == "lm_scan")


def test_lm_parameter_names_and_shapes(programs):
    program = programs["lm"]
    D, H, K, F, V = 32, 4, 8, 64, 64
    expected = {
        "params/embed": (V, D),
        "params/layers/0/ln1/scale": (D,),
        "params/layers/0/ln1/bias": (D,),
        "params/layers/0/attn/wq": (D, H, K),
        "params/layers/1/attn/wk": (D, H, K),
        "params/layers/1/attn/wv": (D, H, K),
        "params/layers/0/attn/wo": (H, K, D),
        "params/layers/1/ln2/scale": (D,),
        "params/layers/0/mlp/w_in": (D, F),
        "params/layers/1/mlp/w_out": (F, D),
        "params/ln_f/scale": (D,),
        "params/ln_f/bias": (D,),
        "params/unembed": (D, V),
        "opt_state/m/layers/0/attn/wq": (D, H, K),
        "opt_state/v/unembed": (D, V),
        "opt_state/step": (),
        "batch/tokens": (8, 16),
        "batch/targets": (8, 16),
        "out/params/layers/0/attn/wq": (D, H, K),
        "out/opt_state/m/layers/0/attn/wq": (D, H, K),
        "out/loss": (),
    }
    assert {name: program.value(name).shape for name in expected} == expected
    per_layer = [
        "ln1/scale", "ln1/bias", "attn/wq", "attn/wk", "attn/wv", "attn/wo",
        "ln2/scale", "ln2/bias", "mlp/w_in", "mlp/w_out",
    ]  # fmt: skip
    top = ["embed", "ln_f/scale", "ln_f/bias", "unembed"]
    every = {f"params/{n}" for n in top} | {
        f"params/layers/{i}/{n}" for i in range(2) for n in per_layer
    }
    assert {n for n in program.names() if n.startswith("params/")} == every


def test_lm_scan_stacks_the_layers(programs):
    program = programs["lm_scan"]
    assert program.value("params/layers/attn/wq").shape == (2, 32, 4, 8)
    assert program.value("params/layers/attn/wo").shape == (2, 4, 8, 32)
    assert program.value("params/layers/ln1/scale").shape == (2, 32)
    assert program.value("opt_state/m/layers/mlp/w_in").shape == (2, 32, 64)
    assert not any(n.startswith("params/layers/0") for n in program.names())


def test_grads_are_tagged_with_their_parameter_paths(programs):
    lm_names = set(programs["lm"].names())
    assert {"grads/layers/0/mlp/w_in", "grads/layers/1/attn/wq", "grads/embed"} <= lm_names
    assert programs["lm_scan"].value("grads/layers/attn/wq").shape == (2, 32, 4, 8)
    assert programs["mlp"].has_value("grads/layers/0/w")
    assert programs["cnn"].has_value("grads/convs/0/w")
    assert programs["gnn"].has_value("grads/rounds/1/message/w1")


def test_lm_intermediates_are_named_by_scope(programs):
    names_ = set(programs["lm"].names())
    assert {"layer0/mlp/hidden", "layer1/attn/heads", "loss/logits"} <= names_
    optimizer = [op for op in programs["lm"].ops if op.phase == "optimizer"]
    assert optimizer and all("optimizer" in op.scope for op in optimizer)


def test_lm_and_lm_scan_give_the_same_loss(examples):
    unrolled, scanned = examples["lm"], examples["lm_scan"]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *unrolled.params["layers"])
    assert jax.tree.all(jax.tree.map(np.array_equal, stacked, scanned.params["layers"]))
    a = jax.jit(unrolled.fn)(*unrolled.args).loss
    b = jax.jit(scanned.fn)(*scanned.args).loss
    np.testing.assert_allclose(float(a), float(b), rtol=1e-5)


def test_lm_loss_goes_down(examples):
    ex = examples["lm"]
    step = jax.jit(ex.fn)
    params, opt_state, batch = ex.args
    losses = []
    for _ in range(5):
        params, opt_state, loss = step(params, opt_state, batch)
        losses.append(float(loss))
    assert int(opt_state["step"]) == 5
    assert losses[-1] < losses[0] - 0.1, losses


@pytest.mark.parametrize("name", ["mlp", "cnn", "gnn"])
def test_sgd_models_learn(name, examples):
    ex = examples[name]
    step = jax.jit(ex.fn)
    params, batch = ex.args
    first = float(step(params, batch).loss)
    for _ in range(5):
        params, loss = step(params, batch)
    assert float(loss) < first


def test_same_seed_same_arrays_and_other_seed_differs():
    a, b, c = build("mlp", seed=1), build("mlp", seed=1), build("mlp", seed=2)
    leaf = lambda ex: np.asarray(ex.params["layers"][0]["w"])  # noqa: E731
    np.testing.assert_array_equal(leaf(a), leaf(b))
    assert not np.array_equal(leaf(a), leaf(c))


def _new_live_arrays(before: list) -> list:
    ids = {id(x) for x in before}
    return [x for x in jax.live_arrays() if id(x) not in ids]


@pytest.mark.parametrize("name", ["mlp", "lm", "lm_scan", "cnn", "gnn"])
def test_abstract_build_allocates_nothing(name):
    before = jax.live_arrays()
    ex = build(name, "large", abstract=True)
    assert _new_live_arrays(before) == []
    leaves = jax.tree.leaves(ex.args)
    assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    assert ex.abstract and ex.config == ZOO[name].config_cls.preset("large")


def test_huge_lm_is_planned_from_shapes():
    before = jax.live_arrays()
    ex = build("lm_scan", "huge", abstract=True)
    assert _new_live_arrays(before) == []
    assert 10e9 < ex.n_params < 100e9
    assert ex.n_params == ex.config.n_params
    assert ex.params["layers"]["attn"]["wq"].shape == (80, 8192, 64, 128)
    assert ex.params["embed"].dtype == jnp.bfloat16
    program = wb.capture(ex.fn, *ex.args)
    assert program.example_args is None
    assert program.value("params/layers/mlp/w_in").shape == (80, 8192, 28672)
    assert program.value("out/loss").dtype == np.float32


def test_huge_lm_refuses_a_concrete_build():
    with pytest.raises(ConfigError, match=r"GiB of arguments; build it with abstract=True"):
        build("lm", "huge")


def test_layer_count_is_free(examples):
    for n_layers in (1, 3):
        config = lm.Config.preset("tiny", n_layers=n_layers)
        unrolled = build("lm", config, abstract=True)
        scanned = build("lm_scan", "tiny", abstract=True, n_layers=n_layers)
        assert len(unrolled.params["layers"]) == n_layers
        assert scanned.params["layers"]["mlp"]["w_out"].shape == (n_layers, 64, 32)
        assert unrolled.n_params == scanned.n_params == config.n_params
    assert examples["lm"].n_params == LM_TINY.n_params


def test_presets_and_overrides():
    large = lm.Config.preset("large", n_layers=24)
    assert (large.d_model, large.n_layers) == (512, 24)
    assert large.replace(n_layers=48).n_layers == 48
    assert {"tiny", "small", "large"} <= set(mlp.Config.PRESETS) & set(cnn.Config.PRESETS)
    assert "tiny" in gnn.Config.PRESETS
    assert mlp.Config.preset("tiny") == mlp.Config()


TINY_SHARDABLE_SIZES = {
    mlp.Config(): ("batch", "d_in", "d_hidden", "d_out"),
    lm.Config(): ("batch", "seq_len", "d_model", "d_head", "d_ff", "vocab"),
    cnn.Config(): ("batch", "image_size", "in_channels", "channels", "n_classes"),
    gnn.Config(): ("n_nodes", "n_edges", "d_node", "d_hidden", "d_out"),
}


@pytest.mark.parametrize("config", list(TINY_SHARDABLE_SIZES), ids=lambda c: c.__module__)
def test_tiny_sizes_shard_on_a_2x4_mesh(config):
    sizes = jax.tree.leaves([getattr(config, f) for f in TINY_SHARDABLE_SIZES[config]])
    assert sizes and all(size % 8 == 0 for size in sizes), config


def test_configs_are_frozen():
    with pytest.raises(AttributeError):
        lm.Config().n_layers = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: build("transformer"), r"no model 'transformer'; choose one of 'mlp', 'lm'"),
        (lambda: build("lm", "medium"), r"has no preset 'medium'; choose one of 'tiny'"),
        (lambda: build("lm", n_layer=3), r"has no field 'n_layer'; its fields are batch"),
        (
            lambda: build("lm", mlp.Config()),
            r"expected a preset name or a workbench.models.lm.Config",
        ),
        (lambda: lm.Config(n_layers=0), r"n_layers must be a positive int; got 0"),
        (lambda: cnn.Config(channels=()), r"channels must be a non-empty tuple"),
    ],
)
def test_errors_teach(call, message):
    with pytest.raises(ConfigError, match=message):
        call()


def test_example_is_frozen_and_counts_params(examples):
    ex = examples["mlp"]
    with pytest.raises(AttributeError):
        ex.name = "other"  # type: ignore[misc]
    assert ex.n_params == sum(math.prod(x.shape) for x in jax.tree.leaves(ex.args[0]))
    assert ex.description
