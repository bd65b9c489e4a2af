"""A small mixture-of-experts LM in plain JAX, written the way MaxText writes its MoE with a
capacity (``MoeBlock.generate_masks`` and the einsums of its ``dense_matmul`` when
``capacity_factor > 0``): top-k of the router's softmax, each sequence's tokens counted
into their experts' slots by a cumulative sum, tokens past the capacity dropped, the
dispatch ("BSM,BSEC->EBCM") and combine ("EBCM,BSEC->BSM") as einsums with one-hot masks,
the experts a gated MLP stacked [num_experts, emb, mlp]. Two layers, plain SGD."""

from __future__ import annotations

import jax
import jax.numpy as jnp

VOCAB, EMB, MLP, EXPERTS, TOP_K, CAPACITY_FACTOR = 32, 16, 24, 4, 2, 1.5
BATCH, SEQ, LAYERS = 4, 8, 2


def init(key: jax.Array) -> dict:
    ks = jax.random.split(key, 2 + LAYERS)

    def normal(k, shape, fan_in):
        return jax.random.normal(k, shape, jnp.float32) / jnp.sqrt(fan_in)

    def layer(k):
        k = jax.random.split(k, 4)
        return {
            "gate": {"kernel": normal(k[0], (EMB, EXPERTS), EMB)},
            "wi_0": normal(k[1], (EXPERTS, EMB, MLP), EMB),
            "wi_1": normal(k[2], (EXPERTS, EMB, MLP), EMB),
            "wo": normal(k[3], (EXPERTS, MLP, EMB), MLP),
        }

    return {
        "token_embedder": normal(ks[0], (VOCAB, EMB), 1.0),
        "layers": [layer(k) for k in ks[2:]],
        "logits_dense": normal(ks[1], (EMB, VOCAB), EMB),
    }


def generate_masks(top_k_indices, softmax_probs):
    """MaxText's dispatch and combine masks, [B, S, E, C]: per sequence, each expert's tokens
    numbered by a cumulative sum in token order, those past the capacity dropped."""
    batch_size, seq_len, _ = top_k_indices.shape
    tokens_per_batch = seq_len * TOP_K
    capacity = int((tokens_per_batch / EXPERTS) * CAPACITY_FACTOR)
    expert_mask = jax.nn.one_hot(top_k_indices, num_classes=EXPERTS, dtype=jnp.int32)
    expert_mask_fused = jnp.reshape(expert_mask, (batch_size, seq_len * TOP_K, EXPERTS))
    expert_token_count_fused = jnp.cumsum(expert_mask_fused, axis=1)
    expert_token_count = jnp.reshape(
        expert_token_count_fused, (batch_size, seq_len, TOP_K, EXPERTS)
    )
    expert_token_position_in_capacity = expert_token_count * expert_mask
    expert_token_position_in_capacity = expert_token_position_in_capacity * (
        expert_token_position_in_capacity <= capacity
    )
    combined_expert_mask = jnp.sum(expert_mask * (expert_token_count <= capacity), axis=2)
    expert_token_position_in_capacity = jnp.sum(expert_token_position_in_capacity, axis=2)
    expert_capacity_mask = jax.nn.one_hot(
        expert_token_position_in_capacity, num_classes=capacity + 1, dtype=jnp.int32
    )[..., 1:]
    dispatch_mask = (combined_expert_mask[..., None] * expert_capacity_mask).astype(jnp.float32)
    combine_mask = jnp.einsum("BSEC,BSE->BSEC", dispatch_mask, softmax_probs)
    return dispatch_mask, combine_mask


def moe_block(p: dict, inputs: jax.Array) -> jax.Array:
    gate_logits = jnp.einsum("BSM,ME->BSE", inputs, p["gate"]["kernel"])
    softmax_probs = jax.nn.softmax(gate_logits, axis=-1)
    top_k_weights, top_k_indices = jax.lax.top_k(softmax_probs, TOP_K)
    weights = jnp.sum(jax.nn.one_hot(top_k_indices, EXPERTS) * top_k_weights[..., None], axis=2)
    dispatch_mask, combine_mask = generate_masks(top_k_indices, weights)
    dispatch = jnp.einsum("BSM,BSEC->EBCM", inputs, dispatch_mask)
    layer_w0 = jnp.einsum("EBCM,EMH->EBCH", dispatch, p["wi_0"])
    layer_w1 = jnp.einsum("EBCM,EMH->EBCH", dispatch, p["wi_1"])
    layer_multiply = jax.nn.silu(layer_w0) * layer_w1
    intermediate_layer = jnp.einsum("EBCH,EHM->EBCM", layer_multiply, p["wo"])
    return jnp.einsum("EBCM,BSEC->BSM", intermediate_layer, combine_mask)


def loss_fn(params: dict, tokens: jax.Array, targets: jax.Array) -> jax.Array:
    x = params["token_embedder"][tokens]
    for p in params["layers"]:
        x = x + moe_block(p, x)
    logp = jax.nn.log_softmax(x @ params["logits_dense"], axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def train_step(params: dict, tokens: jax.Array, targets: jax.Array):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


def example() -> tuple:
    """``(train_step, (params, tokens, targets))``."""
    k1, k2 = jax.random.split(jax.random.key(0))
    tokens = jax.random.randint(k1, (BATCH, SEQ), 0, VOCAB)
    targets = jax.random.randint(k2, (BATCH, SEQ), 0, VOCAB)
    return train_step, (init(jax.random.key(1)), tokens, targets)
