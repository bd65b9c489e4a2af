"""A small dropless mixture-of-experts LM in plain JAX, written the way MaxText writes its
sparse-matmul ("megablox") MoE path: the router's top-k, the token-expert pairs sorted by
expert (``jnp.argsort``) and the tokens taken in that order, group sizes from
``jnp.bincount``, the experts as grouped matmuls (``jax.lax.ragged_dot``, a SwiGLU:
``silu(wi_0) * wi_1`` then ``wo``), the rows unsorted and weighted by the softmaxed top-k
logits ("BKE,BK->BE"). No capacity: no token is dropped. Trained with plain SGD."""

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


def permute(inputs: jax.Array, gate_logits: jax.Array):
    """MaxText's ``permute``: the tokens sorted by their chosen expert, with what unsorts them."""
    weights, selected_experts = jax.lax.top_k(gate_logits, TOP_K)
    weights = jax.nn.softmax(weights.astype(jnp.float32), axis=-1)
    inputs_2d = inputs.reshape(-1, inputs.shape[-1])
    flatten_selected_experts = jnp.ravel(selected_experts)
    sorted_selected_experts = jnp.argsort(flatten_selected_experts)
    sorted_indices = sorted_selected_experts // TOP_K
    sorted_inputs = jnp.take(inputs_2d, indices=sorted_indices, axis=0)
    group_size = jnp.bincount(flatten_selected_experts, length=EXPERTS)
    return sorted_inputs, sorted_selected_experts, weights, group_size


def unpermute(intermediate: jax.Array, sorted_selected_experts, weights, shape):
    """MaxText's ``unpermute``: the rows back in token order, summed with the gates."""
    unsort = jnp.take(intermediate, indices=jnp.argsort(sorted_selected_experts), axis=0)
    reshaped_weights = weights.reshape(-1, TOP_K).astype(intermediate.dtype)
    reshaped_intermediate = unsort.reshape(-1, TOP_K, shape[-1])
    output = jnp.einsum("BKE,BK->BE", reshaped_intermediate, reshaped_weights)
    return output.reshape(shape)


def moe_block(p: dict, inputs: jax.Array) -> jax.Array:
    """MaxText's ``sparse_matmul`` without a capacity: grouped matmuls over sorted rows."""
    gate_logits = jnp.einsum("BSM,ME->BSE", inputs, p["gate"]["kernel"])
    x, sorted_selected_experts, weights, group_sizes = permute(inputs, gate_logits)
    layer_w0 = jax.lax.ragged_dot(x, p["wi_0"], group_sizes)
    layer_w1 = jax.lax.ragged_dot(x, p["wi_1"], group_sizes)
    intermediate = jax.nn.silu(layer_w0) * layer_w1
    out = jax.lax.ragged_dot(intermediate, p["wo"], group_sizes)
    return unpermute(out, sorted_selected_experts, weights, inputs.shape)


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
