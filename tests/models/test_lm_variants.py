"""The zoo LM's Llama-style variants: grouped-query attention (``n_kv_heads``) and the
SwiGLU MLP (``mlp="swiglu"``). Multi-head attention keeps its program exactly; GQA and
SwiGLU compute what hand-written references do, unrolled, scanned and rematerialised;
``n_params`` counts them; bad values teach; and BP + MP still find the textbook layout."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb
from workbench.models import ConfigError, build, lm

GQA = dict(n_kv_heads=2)
SWIGLU = dict(mlp="swiglu")
LLAMA = dict(n_kv_heads=2, mlp="swiglu")  # tiny: H=4 query heads in 2 groups, F=64


def _jaxpr(ex) -> str:
    return str(jax.make_jaxpr(ex.fn)(*ex.args))


@pytest.mark.parametrize("name", ["lm", "lm_scan"])
@pytest.mark.parametrize("remat", [False, True])
def test_n_kv_heads_equal_to_n_heads_is_the_multi_head_program(name, remat):
    default = build(name, "tiny", remat=remat)
    same = build(name, "tiny", remat=remat, n_kv_heads=4)
    assert _jaxpr(same) == _jaxpr(default)
    for a, b in zip(jax.tree.leaves(default.args), jax.tree.leaves(same.args)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# -- references -----------------------------------------------------------------------------


def _reference_loss(params: dict, batch: dict) -> jax.Array:
    """The LM written out by hand, unrolled: K/V heads repeated explicitly for GQA (as
    transformers' ``repeat_kv``), the MLP GELU or SwiGLU as its parameters say."""

    def norm(p, x):
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / jnp.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * p["scale"] + p[
            "bias"
        ]

    x = params["embed"][batch["tokens"]]
    seq = x.shape[1]
    for p in params["layers"]:
        h, a = norm(p["ln1"], x), p["attn"]
        H, G = a["wq"].shape[1], a["wk"].shape[1]
        q = jnp.einsum("bsd,dhk->bhsk", h, a["wq"])
        k = jnp.repeat(jnp.einsum("bsd,dgk->bgsk", h, a["wk"]), H // G, axis=1)
        v = jnp.repeat(jnp.einsum("bsd,dgk->bgsk", h, a["wv"]), H // G, axis=1)
        scores = q @ jnp.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
        scores = jnp.where(np.tril(np.ones((seq, seq), bool)), scores, -jnp.inf)
        o = jax.nn.softmax(scores, axis=-1) @ v  # [b, h, s, k]
        x = x + jnp.einsum("bhsk,hkd->bsd", o, a["wo"])
        h, m = norm(p["ln2"], x), p["mlp"]
        if "w_gate" in m:
            g = h @ m["w_gate"]
            x = x + ((g / (1 + jnp.exp(-g))) * (h @ m["w_up"])) @ m["w_down"]
        else:
            x = x + jax.nn.gelu(h @ m["w_in"]) @ m["w_out"]
    logits = norm(params["ln_f"], x) @ params["unembed"]
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1).mean()


def _random(ex, seed=3):
    """The example's parameters, redrawn (norms too) so no weight is special."""
    leaves, tree = jax.tree.flatten(ex.params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    redrawn = [0.3 * jax.random.normal(k, x.shape, jnp.float32) for k, x in zip(keys, leaves)]
    return jax.tree.unflatten(tree, redrawn)


@pytest.mark.parametrize(
    "fields",
    [GQA, dict(n_kv_heads=1), SWIGLU, LLAMA, {}],
    ids=["gqa", "mqa", "swiglu", "both", "mha"],
)
def test_the_loss_is_the_hand_written_one(fields):
    ex = build("lm", "tiny", **fields)
    params, batch = _random(ex), ex.args[2]
    want = float(jax.jit(_reference_loss)(params, batch))
    got = float(jax.jit(lm.loss_fn)(params, batch))
    assert got == pytest.approx(want, rel=1e-5)
    assert params["layers"][0]["attn"]["wk"].shape[1] == ex.config.kv_heads


def test_gqa_is_mha_with_each_kv_head_repeated_over_its_group():
    ex = build("lm", "tiny", **LLAMA)
    gqa, batch = _random(ex), ex.args[2]

    def repeated(params):  # wk, wv [D, G, K] -> [D, H, K]: kv head g serves heads 2g, 2g+1
        def attn(a):
            return {**a, "wk": jnp.repeat(a["wk"], 2, axis=1), "wv": jnp.repeat(a["wv"], 2, axis=1)}

        return {**params, "layers": [{**p, "attn": attn(p["attn"])} for p in params["layers"]]}

    loss_and_grad = jax.jit(jax.value_and_grad(lm.loss_fn))
    la, ga = loss_and_grad(gqa, batch)
    lb, gb = jax.jit(jax.value_and_grad(lambda p, b: lm.loss_fn(repeated(p), b)))(gqa, batch)
    assert float(la) == pytest.approx(float(lb), rel=1e-6)
    for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    assert float(loss_and_grad(repeated(gqa), batch)[0]) == pytest.approx(float(la), rel=1e-6)


def test_swiglu_mlp_is_silu_gate_times_up_then_down():
    ks = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(ks[0], (2, 5, 8))
    p = {
        "w_gate": jax.random.normal(ks[1], (8, 16)),
        "w_up": jax.random.normal(ks[2], (8, 16)),
        "w_down": jax.random.normal(ks[3], (16, 8)),
    }
    xn, g, u, d = (np.asarray(a, np.float64) for a in (x, p["w_gate"], p["w_up"], p["w_down"]))
    want = ((xn @ g) / (1 + np.exp(-(xn @ g))) * (xn @ u)) @ d
    np.testing.assert_allclose(np.asarray(lm.mlp(p, x)), want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("remat", [False, True])
def test_unrolled_and_scanned_agree(remat):
    a, b = build("lm", "tiny", remat=remat, **LLAMA), build("lm_scan", "tiny", remat=remat, **LLAMA)
    assert b.params["layers"]["attn"]["wk"].shape == (2, 32, 2, 8)
    assert b.params["layers"]["mlp"]["w_gate"].shape == (2, 32, 64)
    oa, ob = jax.jit(a.fn)(*a.args), jax.jit(b.fn)(*b.args)
    assert float(oa.loss) == pytest.approx(float(ob.loss), rel=1e-5)
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *oa.params["layers"])
    for x, y in zip(jax.tree.leaves(stacked), jax.tree.leaves(ob.params["layers"])):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


# -- parameters and validation -------------------------------------------------------------


@pytest.mark.parametrize("name", ["lm", "lm_scan"])
@pytest.mark.parametrize(
    "fields",
    [GQA, SWIGLU, LLAMA, dict(LLAMA, n_kv_heads=1), dict(LLAMA, n_experts=4, n_shared=1)],
    ids=["gqa", "swiglu", "both", "mqa", "both+experts"],
)
def test_n_params_counts_the_parameters(name, fields):
    ex = build(name, "tiny", abstract=True, **fields)
    assert ex.abstract and ex.n_params == ex.config.n_params
    assert ex.n_params == sum(math.prod(x.shape) for x in jax.tree.leaves(ex.params))
    if fields.get("n_experts"):  # the experts keep their own MLP; swiglu is the dense one's
        layer = ex.params["layers"] if name == "lm_scan" else ex.params["layers"][0]
        assert "mlp" not in layer and set(layer["moe"]["experts"]) == {"w_in", "w_out"}


def test_llama_3_8b_as_its_paper_states_it():
    """Llama 3 8B (D=4096, 32 heads, 8 KV heads, F=14336, V=128256, 32 layers): 8,030,261,248
    parameters with RMSNorm's D scales; the zoo's LayerNorms add a D bias to each of 65."""
    config = lm.Config.preset(
        "huge", d_model=4096, n_heads=32, n_kv_heads=8, d_head=128, d_ff=14336,
        vocab=128256, n_layers=32, mlp="swiglu",
    )  # fmt: skip
    assert config.n_params - (2 * 32 + 1) * 4096 == 8_030_261_248
    ex = build("lm_scan", config, abstract=True)
    assert ex.n_params == config.n_params
    assert ex.params["layers"]["attn"]["wk"].shape == (32, 4096, 8, 128)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(n_kv_heads=3), r"n_kv_heads=3: .* must divide n_heads; give one of 1, 2, 4, or None"),
        (dict(n_kv_heads=8), r"n_kv_heads=8: .* n_heads=4 query heads"),
        (dict(n_kv_heads=0), r"n_kv_heads=0"),
        (dict(n_kv_heads=-2), r"n_kv_heads=-2"),
        (dict(n_kv_heads="2"), r"n_kv_heads='2'"),
        (dict(mlp="relu"), r"mlp='relu': no such MLP; choose one of \('gelu', 'swiglu'\)"),
    ],
)
def test_bad_values_are_refused(fields, message):
    with pytest.raises(ConfigError, match=message):
        lm.Config.preset("tiny", **fields)
    with pytest.raises(ConfigError, match=message):
        build("lm", "tiny", abstract=True, **fields)


# -- strategies -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lm", "lm_scan"])
def test_bp_and_mp_find_the_textbook_layout_and_run(name):
    mesh = wb.Mesh({"data": 2, "model": 2})
    sessions = {}
    for label, fields in (("mha", {}), ("llama", LLAMA)):
        ex = build(name, "tiny", **fields)
        program = wb.capture(ex.fn, *ex.args)
        sessions[label] = s = wb.Session(program, mesh, [wb.BP("data"), wb.MP("model")])
    s, program = sessions["llama"], sessions["llama"].program
    assert not s.conflicts and not sessions["mha"].conflicts
    prefix = "params/layers/" if name == "lm_scan" else "params/layers/0/"
    lead = 1 if name == "lm_scan" else 0  # the scan's stacked [L] dimension
    split = {"attn/wq": 1, "attn/wk": 1, "attn/wv": 1, "attn/wo": 0}
    split |= {"mlp/w_gate": 1, "mlp/w_up": 1, "mlp/w_down": 0}
    for param, dim in split.items():
        sharding = s.state.shardings[program.value(prefix + param).id]
        assert sharding.dim_of("model") == lead + dim, (param, str(sharding))
    forward = [
        c for c in s.collectives()
        if c.axes == ("model",) and c.op is not None and program.ops[c.op].phase == "forward"
    ]  # fmt: skip
    mha_forward = [
        c for c in sessions["mha"].collectives()
        if c.axes == ("model",) and c.op is not None and sessions["mha"].program.ops[c.op].phase == "forward"
    ]  # fmt: skip
    assert {c.kind for c in forward} == {"all-reduce"} and len(forward) == len(mha_forward)
    result = s.run(repeats=1, devices=jax.devices()[:4])
    assert result.matches, str(result)


@pytest.mark.slow
def test_two_kv_heads_on_a_four_way_axis_conflict_where_the_queries_regroup():
    """As transformers' Llama with 2 KV heads on 4 devices (tests/models/test_matrix.py):
    the queries' 4 heads split 4 ways cannot regroup as [2, 2]; propagation records it."""
    ex = build("lm", "tiny", **LLAMA)
    s = wb.Session(wb.capture(ex.fn, *ex.args), wb.Mesh({"data": 2, "model": 4}), [wb.MP("model")])
    assert s.conflicts and all("reshape" in c.op for c in s.conflicts)


# -- remat policies -------------------------------------------------------------------------


def test_a_remat_policy_keeps_what_it_names_and_computes_the_same_loss():
    """MaxText's "minimal" (jax.checkpoint_policies.dots_with_no_batch_dims_saveable) keeps
    the projections' outputs: the step recomputes less than full remat and keeps more."""
    sizes = dict(seq_len=64, d_model=64, n_heads=4, d_head=16, d_ff=256, n_layers=2)
    steps = {
        name: build("lm", "tiny", **sizes, **options)
        for name, options in {
            "none": {},
            "full": dict(remat=True),
            "minimal": dict(remat=True, remat_policy="dots_with_no_batch_dims_saveable"),
        }.items()
    }
    programs = {k: wb.capture(ex.fn, *ex.args) for k, ex in steps.items()}
    e = {k: wb.Session(p, wb.Mesh({"data": 2})).estimate("H100") for k, p in programs.items()}
    assert e["none"].flops < e["minimal"].flops < e["full"].flops
    assert e["full"].memory.at_peak["activations"] < e["minimal"].memory.at_peak["activations"]
    losses = {k: float(ex.fn(*ex.args).loss) for k, ex in steps.items()}
    assert losses["minimal"] == pytest.approx(losses["none"]) == losses["full"]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (dict(remat=True, remat_policy="minimal"), "dots_with_no_batch_dims_saveable"),
        (dict(remat_policy="dots_saveable"), "remat=False"),
    ],
)
def test_a_bad_remat_policy_says_what_would_work(options, says):
    with pytest.raises(ConfigError, match=says):
        lm.Config(**options)
