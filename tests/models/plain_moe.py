"""A small mixture-of-experts LM in plain JAX, written the way MaxText writes its MoE
(``MoeBlock``'s dense matmul path): a router kernel, ``jax.lax.top_k`` of its logits, softmax
weights scattered into a [B, S, E] combine mask, expert kernels stacked
[num_experts, emb, mlp] that every token meets ("BSM,EMH->BSEH"), and the experts' outputs
combined by the masked weights ("BSEM,BSE->BSM"). Trained with plain SGD."""

from __future__ import annotations

import jax
import jax.numpy as jnp

VOCAB, EMB, MLP, EXPERTS, TOP_K = 32, 16, 24, 4, 2
BATCH, SEQ = 2, 8


def init(key: jax.Array) -> dict:
    ks = jax.random.split(key, 6)

    def normal(k, shape, fan_in):
        return jax.random.normal(k, shape, jnp.float32) / jnp.sqrt(fan_in)

    return {
        "token_embedder": normal(ks[0], (VOCAB, EMB), 1.0),
        "moe": {
            "gate": {"kernel": normal(ks[1], (EMB, EXPERTS), EMB)},
            "wi_0": normal(ks[2], (EXPERTS, EMB, MLP), EMB),
            "wi_1": normal(ks[3], (EXPERTS, EMB, MLP), EMB),
            "wo": normal(ks[4], (EXPERTS, MLP, EMB), MLP),
        },
        "logits_dense": normal(ks[5], (EMB, VOCAB), EMB),
    }


def moe_block(p: dict, inputs: jax.Array) -> jax.Array:
    """MaxText's dense MoE: every expert on every token, the top-k weights mask the combine."""
    gate_logits = jnp.einsum("BSM,ME->BSE", inputs, p["gate"]["kernel"])
    top_k_weights, top_k_indices = jax.lax.top_k(gate_logits, TOP_K)
    top_k_weights = jax.nn.softmax(top_k_weights.astype(jnp.float32), axis=-1)
    b, s, _ = inputs.shape
    index_update = (jnp.arange(b)[:, None, None], jnp.arange(s)[None, :, None], top_k_indices)
    weights = jnp.zeros((b, s, EXPERTS), inputs.dtype).at[index_update].set(top_k_weights)
    layer_w0 = jnp.einsum("BSM,EMH->BSEH", inputs, p["wi_0"])
    layer_w1 = jnp.einsum("BSM,EMH->BSEH", inputs, p["wi_1"])
    layer_multiply = jax.nn.silu(layer_w0) * layer_w1
    intermediate_layer = jnp.einsum("BSEH,EHM->BSEM", layer_multiply, p["wo"])
    return jnp.einsum("BSEM,BSE->BSM", intermediate_layer, weights)


def loss_fn(params: dict, tokens: jax.Array, targets: jax.Array):
    """``(loss, accuracy)``: the accuracy an ``argmax`` of the logits (not a router)."""
    x = params["token_embedder"][tokens]
    x = x + moe_block(params["moe"], x)
    logits = x @ params["logits_dense"]
    logp = jax.nn.log_softmax(logits, axis=-1)
    accuracy = jnp.mean(jnp.argmax(logits, axis=-1) == targets)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1)), accuracy


def train_step(params: dict, tokens: jax.Array, targets: jax.Array):
    (loss, accuracy), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, tokens, targets)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss, accuracy


def example() -> tuple:
    """``(train_step, (params, tokens, targets))``."""
    k1, k2 = jax.random.split(jax.random.key(0))
    tokens = jax.random.randint(k1, (BATCH, SEQ), 0, VOCAB)
    targets = jax.random.randint(k2, (BATCH, SEQ), 0, VOCAB)
    return train_step, (init(jax.random.key(1)), tokens, targets)
