"""An Equinox decoder LM written as the Equinox docs write models (the BERT example's style).

``eqx.Module``s that act on one sequence (``jax.vmap`` over the batch and over tokens):
``eqx.nn.Embedding`` for tokens and positions, pre-``eqx.nn.LayerNorm`` blocks of
``eqx.nn.MultiheadAttention`` under a causal mask and an MLP of two ``eqx.nn.Linear``, and
a linear head. Linear weights are PyTorch-style ``[out, in]``.

The step is a function of array pytrees: the model is split once with
``eqx.partition(model, eqx.is_array)``; the step recombines it with ``eqx.combine``, takes
``eqx.filter_value_and_grad``, updates with ``optax.adamw`` (warmup-cosine schedule) and
``eqx.apply_updates``, and splits again. ``params`` mirrors the model, with ``None`` where
the model holds static fields.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from workbench.models import Example
from workbench.models.external._common import (
    Size,
    example,
    size_of,
    token_batch,
    warmup_cosine,
)


class AttentionBlock(eqx.Module):
    layernorm: eqx.nn.LayerNorm
    attention: eqx.nn.MultiheadAttention

    def __init__(self, hidden_size: int, num_heads: int, key: jax.Array):
        self.layernorm = eqx.nn.LayerNorm(shape=hidden_size)
        self.attention = eqx.nn.MultiheadAttention(
            num_heads=num_heads, query_size=hidden_size, key=key
        )

    def __call__(self, inputs, mask):
        x = jax.vmap(self.layernorm)(inputs)
        return inputs + self.attention(query=x, key_=x, value=x, mask=mask)


class FeedForwardBlock(eqx.Module):
    layernorm: eqx.nn.LayerNorm
    mlp: eqx.nn.Linear
    output: eqx.nn.Linear

    def __init__(self, hidden_size: int, intermediate_size: int, key: jax.Array):
        mlp_key, output_key = jax.random.split(key)
        self.layernorm = eqx.nn.LayerNorm(shape=hidden_size)
        self.mlp = eqx.nn.Linear(hidden_size, intermediate_size, key=mlp_key)
        self.output = eqx.nn.Linear(intermediate_size, hidden_size, key=output_key)

    def __call__(self, inputs):
        hidden = jax.vmap(self.layernorm)(inputs)
        hidden = jax.nn.gelu(jax.vmap(self.mlp)(hidden))
        return inputs + jax.vmap(self.output)(hidden)


class TransformerLayer(eqx.Module):
    attention_block: AttentionBlock
    ff_block: FeedForwardBlock

    def __init__(self, size: Size, key: jax.Array):
        attention_key, ff_key = jax.random.split(key)
        self.attention_block = AttentionBlock(size.d_model, size.n_heads, attention_key)
        self.ff_block = FeedForwardBlock(size.d_model, size.d_ff, ff_key)

    def __call__(self, inputs, mask):
        return self.ff_block(self.attention_block(inputs, mask))


class TransformerLM(eqx.Module):
    token_embedder: eqx.nn.Embedding
    position_embedder: eqx.nn.Embedding
    layers: list[TransformerLayer]
    layernorm: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, size: Size, key: jax.Array):
        token_key, position_key, head_key, *layer_keys = jax.random.split(key, 3 + size.n_layers)
        self.token_embedder = eqx.nn.Embedding(size.vocab, size.d_model, key=token_key)
        self.position_embedder = eqx.nn.Embedding(size.seq_len, size.d_model, key=position_key)
        self.layers = [TransformerLayer(size, k) for k in layer_keys]
        self.layernorm = eqx.nn.LayerNorm(shape=size.d_model)
        self.head = eqx.nn.Linear(size.d_model, size.vocab, use_bias=False, key=head_key)

    def __call__(self, token_ids):
        seq_len = token_ids.shape[0]
        x = jax.vmap(self.token_embedder)(token_ids)
        x = x + jax.vmap(self.position_embedder)(jnp.arange(seq_len))
        mask = jnp.tril(jnp.ones((seq_len, seq_len), dtype=bool))
        for layer in self.layers:
            x = layer(x, mask)
        return jax.vmap(self.head)(jax.vmap(self.layernorm)(x))


@eqx.filter_value_and_grad
def compute_loss(model: TransformerLM, inputs, targets):
    logits = jax.vmap(model)(inputs)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def make_train_step(static, optim: optax.GradientTransformation):
    def train_step(params, opt_state, batch):
        model = eqx.combine(params, static)
        loss, grads = compute_loss(model, batch["inputs"], batch["targets"])
        updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        model = eqx.apply_updates(model, updates)
        params, _ = eqx.partition(model, eqx.is_array)
        return params, opt_state, loss

    return train_step


def create_optimizer(size: Size) -> optax.GradientTransformation:
    schedule = warmup_cosine(size)
    return optax.adamw(learning_rate=schedule, weight_decay=size.weight_decay)


def build(size: str | Size = "tiny", abstract: bool = False) -> Example:
    s = size_of(size)
    optim = create_optimizer(s)
    # the static half of the model, from a model traced for shapes only
    shapes = eqx.filter_eval_shape(TransformerLM, s, jax.random.key(0))
    _, static = eqx.partition(shapes, lambda x: isinstance(x, jax.ShapeDtypeStruct))

    def make():
        model = TransformerLM(s, jax.random.key(0))
        params, _ = eqx.partition(model, eqx.is_array)
        batch = token_batch(jax.random.key(1), s, "inputs", "targets")
        return params, optim.init(params), batch

    return example(
        "eqx_lm",
        make_train_step(static, optim),
        make,
        s,
        "Equinox decoder (eqx.nn layers), AdamW with a warmup-cosine schedule",
        abstract,
    )
