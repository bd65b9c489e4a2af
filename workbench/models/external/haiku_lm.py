"""A Haiku decoder LM, after Haiku's own ``examples/transformer`` (model.py and train.py).

``hk.Module``s under ``hk.transform``: ``hk.Embed`` plus a learned positional
``hk.get_parameter``, pre-``hk.LayerNorm`` blocks of ``hk.MultiHeadAttention`` (query/key/
value ``w`` [D, H*K]) under a causal-and-padding mask and an ``hk.Sequential`` GELU MLP of
two ``hk.Linear``, and an ``hk.Linear`` head. The loss masks pad tokens (id 0) as the
example does; the optimizer is the example's clip-then-Adam chain with AdamW and a
warmup-cosine schedule. Parameters are Haiku's flat dict keyed by module path
(``"transformer/multi_head_attention/query"``; layer 1's is ``multi_head_attention_1``).
No dropout: the step takes no RNG key, so it is ``hk.without_apply_rng``.
"""

from __future__ import annotations

import dataclasses

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax

from workbench.models import Example
from workbench.models.external._common import (
    Size,
    example,
    size_of,
    token_batch,
    warmup_cosine,
)


def layer_norm(x: jax.Array) -> jax.Array:
    return hk.LayerNorm(axis=-1, create_scale=True, create_offset=True)(x)


@dataclasses.dataclass
class Transformer(hk.Module):
    num_heads: int
    num_layers: int
    key_size: int
    widening_factor: int = 4
    name: str | None = None

    def __call__(self, embeddings, *, mask=None):
        initializer = hk.initializers.VarianceScaling(2 / self.num_layers)
        _, seq_len, model_size = embeddings.shape
        causal_mask = np.tril(np.ones((1, 1, seq_len, seq_len)))
        mask = mask * causal_mask
        h = embeddings
        for _ in range(self.num_layers):
            attn_block = hk.MultiHeadAttention(
                num_heads=self.num_heads,
                key_size=self.key_size,
                model_size=model_size,
                w_init=initializer,
            )
            h_norm = layer_norm(h)
            h = h + attn_block(h_norm, h_norm, h_norm, mask=mask)
            dense_block = hk.Sequential(
                [
                    hk.Linear(self.widening_factor * model_size, w_init=initializer),
                    jax.nn.gelu,
                    hk.Linear(model_size, w_init=initializer),
                ]
            )
            h = h + dense_block(layer_norm(h))
        return layer_norm(h)


@dataclasses.dataclass
class LanguageModel(hk.Module):
    transformer: Transformer
    model_size: int
    vocab_size: int
    pad_token: int
    name: str | None = None

    def __call__(self, tokens):
        input_mask = jnp.greater(tokens, self.pad_token)[:, None, None, :]
        seq_len = tokens.shape[1]
        embed_init = hk.initializers.TruncatedNormal(stddev=0.02)
        token_embedding_map = hk.Embed(
            self.vocab_size, embed_dim=self.model_size, w_init=embed_init
        )
        token_embeddings = token_embedding_map(tokens)
        positional_embeddings = hk.get_parameter(
            "positional_embeddings", [seq_len, self.model_size], init=embed_init
        )
        embeddings = self.transformer(token_embeddings + positional_embeddings, mask=input_mask)
        return hk.Linear(self.vocab_size)(embeddings)


def make_forward(size: Size) -> hk.Transformed:
    def forward_fn(tokens):
        lm = LanguageModel(
            transformer=Transformer(
                num_heads=size.n_heads,
                num_layers=size.n_layers,
                key_size=size.d_head,
                widening_factor=size.d_ff // size.d_model,
            ),
            model_size=size.d_model,
            vocab_size=size.vocab,
            pad_token=0,
        )
        return lm(tokens)

    return hk.without_apply_rng(hk.transform(forward_fn))


def make_train_step(forward: hk.Transformed, optimiser: optax.GradientTransformation, vocab: int):
    def loss_fn(params, data):
        logits = forward.apply(params, data["obs"])
        targets = jax.nn.one_hot(data["target"], vocab)
        mask = jnp.greater(data["obs"], 0)
        log_likelihood = jnp.sum(targets * jax.nn.log_softmax(logits), axis=-1)
        return -jnp.sum(log_likelihood * mask) / jnp.sum(mask)

    def train_step(params, opt_state, batch):
        loss, gradients = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimiser.update(gradients, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, loss

    return train_step


def build(size: str | Size = "tiny", abstract: bool = False) -> Example:
    s = size_of(size)
    forward = make_forward(s)
    schedule = warmup_cosine(s)
    optimiser = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(learning_rate=schedule, b1=0.9, b2=0.99, weight_decay=s.weight_decay),
    )

    def make():
        batch = token_batch(jax.random.key(1), s, "obs", "target")
        params = forward.init(jax.random.key(0), batch["obs"])
        return params, optimiser.init(params), batch

    return example(
        "haiku_lm",
        make_train_step(forward, optimiser, s.vocab),
        make,
        s,
        "Haiku decoder (examples/transformer), clipped AdamW with a warmup-cosine schedule",
        abstract,
    )
