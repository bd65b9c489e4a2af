"""A Flax Linen decoder LM written as the Linen docs and the lm1b example write one.

``@nn.compact`` modules: ``nn.Embed`` for tokens, a learned ``pos_embedding`` parameter,
pre-LayerNorm ``DecoderBlock``s of ``nn.MultiHeadDotProductAttention`` (``DenseGeneral``
projections: query/key/value kernels [D, H, K], out [H, K, D]) under
``nn.make_causal_mask`` and an ``MlpBlock`` of two ``nn.Dense``, and an ``nn.Dense``
``logits`` head. Trained with ``model.apply({"params": params}, ...)``,
``jax.value_and_grad`` and ``optax.chain(clip_by_global_norm, adamw(warmup_cosine))``.
With ``scan_layers`` the blocks run under ``nn.scan`` as the Flax docs scan layers
(``variable_axes={"params": 0}``, the mask broadcast): one block's parameters stacked.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from workbench.models import Example
from workbench.models.external._common import (
    Size,
    clipped_adamw,
    example,
    size_of,
    token_batch,
)


class MlpBlock(nn.Module):
    mlp_dim: int

    @nn.compact
    def __call__(self, inputs):
        x = nn.Dense(self.mlp_dim)(inputs)
        x = nn.gelu(x)
        return nn.Dense(inputs.shape[-1])(x)


class DecoderBlock(nn.Module):
    num_heads: int
    mlp_dim: int

    @nn.compact
    def __call__(self, inputs, decoder_mask):
        x = nn.LayerNorm()(inputs)
        x = nn.MultiHeadDotProductAttention(num_heads=self.num_heads, use_bias=False)(
            x, mask=decoder_mask
        )
        x = x + inputs
        y = nn.LayerNorm()(x)
        y = MlpBlock(self.mlp_dim)(y)
        return x + y


class ScannedDecoderBlock(DecoderBlock):
    """A ``DecoderBlock`` with the ``(carry, output)`` signature ``nn.scan`` wants."""

    @nn.compact
    def __call__(self, inputs, decoder_mask):
        return super().__call__(inputs, decoder_mask), None


class TransformerLM(nn.Module):
    vocab_size: int
    emb_dim: int
    num_heads: int
    num_layers: int
    mlp_dim: int
    max_len: int
    scan_layers: bool = False

    @nn.compact
    def __call__(self, inputs):
        x = nn.Embed(self.vocab_size, self.emb_dim, name="embed")(inputs)
        pos_embedding = self.param(
            "pos_embedding", nn.initializers.normal(stddev=0.02), (1, self.max_len, self.emb_dim)
        )
        x = x + pos_embedding[:, : inputs.shape[1]]
        decoder_mask = nn.make_causal_mask(inputs)
        if self.scan_layers:
            blocks = nn.scan(
                ScannedDecoderBlock,
                variable_axes={"params": 0},
                split_rngs={"params": True},
                in_axes=nn.broadcast,
                length=self.num_layers,
            )
            x, _ = blocks(self.num_heads, self.mlp_dim, name="decoderblocks")(x, decoder_mask)
        for lyr in range(0 if self.scan_layers else self.num_layers):
            x = DecoderBlock(self.num_heads, self.mlp_dim, name=f"decoderblock_{lyr}")(
                x, decoder_mask
            )
        x = nn.LayerNorm(name="decoder_norm")(x)
        return nn.Dense(self.vocab_size, name="logits")(x)


def create_model(size: Size, scan_layers: bool = False) -> TransformerLM:
    return TransformerLM(
        vocab_size=size.vocab,
        emb_dim=size.d_model,
        num_heads=size.n_heads,
        num_layers=size.n_layers,
        mlp_dim=size.d_ff,
        max_len=size.seq_len,
        scan_layers=scan_layers,
    )


def make_train_step(model: TransformerLM, tx: optax.GradientTransformation):
    def train_step(params, opt_state, batch):
        def loss_fn(params):
            logits = model.apply({"params": params}, batch["inputs"])
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
            return loss.mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, loss

    return train_step


def build(size: str | Size = "tiny", abstract: bool = False, scan_layers: bool = False) -> Example:
    s = size_of(size)
    model, tx = create_model(s, scan_layers), clipped_adamw(s)

    def make():
        dummy = jnp.ones((1, s.seq_len), jnp.int32)
        params = model.init(jax.random.key(0), dummy)["params"]
        batch = token_batch(jax.random.key(1), s, "inputs", "targets")
        return params, tx.init(params), batch

    return example(
        "linen_lm_scan" if scan_layers else "linen_lm",
        make_train_step(model, tx),
        make,
        s,
        "Flax Linen decoder (lm1b style"
        + (", blocks under nn.scan" if scan_layers else "")
        + "), clipped AdamW with a warmup-cosine schedule",
        abstract,
    )
