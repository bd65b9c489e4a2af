"""The zoo LM's mixture of experts: three dispatches that agree, GShard's capacity and its
drops, the load-balancing loss, training, validation, and capture and partitioned runs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb
from workbench.models import ConfigError, build, lm, moe

FORMS = moe.DISPATCHES


def _outputs(capacity_factor, seed=1):
    out = {}
    for d in FORMS:
        c = lm.Config.preset("moe", dispatch=d, capacity_factor=capacity_factor)
        p = moe.init_moe(c, jax.random.key(seed))
        x = jax.random.normal(jax.random.key(seed + 1), (c.batch, c.seq_len, c.d_model))
        y, aux, drops = jax.jit(lambda p, x, c=c: (*moe.moe(p, x, c), moe.dropped(p, x, c)))(p, x)
        out[d] = (np.asarray(y), float(aux), int(drops), p, x, c)
    return out


def test_the_three_dispatches_agree_when_nothing_is_dropped():
    out = _outputs(capacity_factor=4.0)  # C = ceil(2 * 16 * 4 / 4) = 32: room for every choice
    assert {o[2] for o in out.values()} == {0}
    for d in ("gather", "ragged"):
        np.testing.assert_allclose(out[d][0], out["einsum"][0], rtol=1e-5, atol=1e-5)
        assert out[d][1] == pytest.approx(out["einsum"][1])
    assert np.abs(out["einsum"][0]).mean() > 0.1


def test_a_small_capacity_drops_the_same_tokens_in_einsum_and_gather():
    out = _outputs(capacity_factor=0.5)  # C = 4 slots for 8 choices per expert on average
    y_e, _, drops, p, x, c = out["einsum"]
    np.testing.assert_allclose(out["gather"][0], y_e, rtol=1e-5, atol=1e-5)
    assert out["gather"][2] == drops and out["ragged"][2] == 0
    assert not np.allclose(out["ragged"][0], y_e, atol=1e-3)  # ragged is dropless
    # the drops, counted from the choices alone: what each expert gets over C, per sequence
    _, experts, _ = moe.route(p["router"], x, c.top_k)
    experts = np.asarray(experts)
    C = moe.capacity(c, c.seq_len)
    assert C == 4
    counts = np.stack([(experts == e).sum(axis=(1, 2)) for e in range(c.n_experts)], -1)
    assert drops == np.maximum(counts - C, 0).sum() > 0
    # first choices go first: an expert keeps min(first choices, C) of them
    slot, keep = map(np.asarray, moe.positions(jnp.asarray(experts), c.n_experts, C))
    for e in range(c.n_experts):
        first = experts[..., 0] == e
        kept_first = (keep[..., 0] & first).sum(axis=1)
        np.testing.assert_array_equal(kept_first, np.minimum(first.sum(axis=1), C))
    assert (slot[keep] < C).all() and (slot[~keep] >= C).all()


def test_the_aux_loss_is_e_times_sum_of_fraction_times_probability():
    E, T = 4, 6
    x = jnp.asarray(np.eye(T, E, dtype=np.float32)[None] * 3.0)  # tokens e_0..e_3, then two zeros
    router = jnp.asarray(
        np.array([[2, 0, 0, 0], [1, 2, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]], np.float32)
    )
    gates, experts, aux = moe.route(router, x, top_k=2)
    logits = np.asarray(x[0]) @ np.asarray(router)
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    first = np.eye(E)[probs.argmax(-1)]
    np.testing.assert_array_equal(np.asarray(experts)[0, :, 0], probs.argmax(-1))
    assert float(aux) == pytest.approx(E * np.sum(first.mean(0) * probs.mean(0)), rel=1e-5)
    np.testing.assert_allclose(np.asarray(gates).sum(-1), 1.0, rtol=1e-6)
    # a uniform router: f sums to 1, P_e = 1/E, so the loss is exactly 1
    _, _, uniform = moe.route(jnp.zeros((E, E)), x, top_k=2)
    assert float(uniform) == pytest.approx(1.0)


@pytest.mark.slow
@pytest.mark.parametrize("dispatch", FORMS)
def test_training_lowers_the_loss(dispatch):
    ex = build("lm", "moe", dispatch=dispatch, n_layers=1)
    step = jax.jit(ex.fn)
    params, opt_state, batch = ex.args
    losses = []
    for _ in range(6):
        params, opt_state, loss = step(params, opt_state, batch)
        losses.append(float(loss))
    assert losses[-1] < losses[0] - 0.1, losses


def test_unrolled_and_scanned_moe_agree_and_count_their_parameters():
    a, b = build("lm", "moe"), build("lm_scan", "moe")
    assert a.n_params == b.n_params == a.config.n_params
    layer = a.params["layers"][0]
    assert "mlp" not in layer and set(layer["moe"]) == {"router", "experts", "shared"}
    assert layer["moe"]["experts"]["w_in"].shape == (4, 32, 64)

    @jax.jit
    def losses(pa, pb, batch):
        def loss(params, weight):
            return lm.loss_fn(params, batch, config=a.config.replace(aux_loss=weight))

        return loss(pa, 0.01), loss(pb, 0.01), loss(pa, 0.0), loss(pa, 0.03)

    la, lb, plain, triple = map(float, losses(a.params, b.params, a.args[2]))
    assert la == pytest.approx(lb, rel=1e-5)
    # the step's loss holds the weighted aux loss, summed over 2 layers (each in (0, E])
    aux = (la - plain) / 0.01
    assert 0.5 < aux <= 8 and (triple - plain) / 0.03 == pytest.approx(aux, rel=1e-3)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(n_experts=4, top_k=5), r"top_k=5: .* 1 to n_experts=4"),
        (dict(n_experts=4, top_k=0), r"top_k=0"),
        (dict(dispatch="sparse"), r"dispatch='sparse': no such dispatch; choose one of"),
        (dict(n_experts=-1), r"n_experts=-1"),
        (dict(n_experts=4, capacity_factor=0), r"capacity_factor=0"),
        (dict(n_experts=4, d_expert=0), r"d_expert=0"),
        (dict(n_experts=4, n_shared=-2), r"n_shared=-2"),
        (dict(n_experts=4, aux_loss=-1.0), r"aux_loss=-1.0"),
    ],
)
def test_bad_expert_fields_are_refused(fields, message):
    with pytest.raises(ConfigError, match=message):
        lm.Config.preset("tiny", **fields)


def test_dense_configs_keep_their_mlp():
    ex = build("lm")
    assert "mlp" in ex.params["layers"][0] and ex.config.n_experts == 0
    assert ex.n_params == ex.config.n_params == 20_800


@pytest.mark.slow
@pytest.mark.parametrize("dispatch", FORMS)
def test_each_dispatch_captures_and_runs_data_parallel(dispatch):
    ex = build("lm", lm.Config.preset("tiny", n_experts=4, top_k=2, dispatch=dispatch, n_layers=1))
    program = wb.capture(ex.fn, *ex.args)
    assert any(n.startswith("params/layers/0/moe/experts/w_in") for n in program.names())
    session = wb.Session(program, wb.Mesh({"data": 2, "model": 4}), [wb.BP("data")])
    assert session.run(repeats=1).matches
