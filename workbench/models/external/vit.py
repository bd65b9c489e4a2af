"""A Vision Transformer written as the Flax NNX ViT tutorial writes it.

``VisionTransformer``: a patch embedding ``nnx.Conv`` whose kernel and strides are the patch
size (``padding="VALID"``), a ``cls_token`` ``nnx.Param`` put before the patches with
``jnp.tile`` and ``jnp.concat``, a learned ``position_embeddings`` ``nnx.Param``, pre-norm
``TransformerEncoder`` blocks (``nnx.LayerNorm``, ``nnx.MultiHeadAttention``, an
``nnx.Sequential`` GELU MLP) in an ``nnx.Sequential``, a final ``nnx.LayerNorm`` and an
``nnx.Linear`` classifier on the cls token. The tutorial's step: ``@nnx.jit``,
``nnx.value_and_grad(..., has_aux=True)`` of the integer-label cross-entropy, and
``optimizer.update`` of an ``nnx.Optimizer``, here over ``optax.adamw``.

As in ``nnx_lm_jit``, ``params`` is the model and ``opt_state`` the optimizer (both are
pytrees; paths end in ``/value``: ``params/encoder/layers/0/attn/query/kernel/value``), and
the step updates them in place. The tutorial's dropout is 0 (the step takes no key).

Sizes from ``Size``: ``seq_len`` patches (a square number) of ``PATCH`` x ``PATCH`` RGB
pixels, ``d_model``, ``n_heads``, ``d_ff``, ``n_layers``, and ``vocab`` classes. The batch
is ``{"image": float32 [B, H, W, 3], "label": int32 [B]}``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from workbench.models import Example
from workbench.models._common import ConfigError
from workbench.models.external._common import Size, size_of, warmup_cosine

PATCH = 4
CHANNELS = 3


class TransformerEncoder(nnx.Module):
    def __init__(self, hidden_size, mlp_dim, num_heads, dropout_rate=0.0, *, rngs: nnx.Rngs):
        self.norm1 = nnx.LayerNorm(hidden_size, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(
            num_heads=num_heads,
            in_features=hidden_size,
            dropout_rate=dropout_rate,
            broadcast_dropout=False,
            decode=False,
            deterministic=False,
            rngs=rngs,
        )
        self.norm2 = nnx.LayerNorm(hidden_size, rngs=rngs)
        self.mlp = nnx.Sequential(
            nnx.Linear(hidden_size, mlp_dim, rngs=rngs),
            nnx.gelu,
            nnx.Dropout(dropout_rate, rngs=rngs),
            nnx.Linear(mlp_dim, hidden_size, rngs=rngs),
            nnx.Dropout(dropout_rate, rngs=rngs),
        )

    def __call__(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nnx.Module):
    def __init__(
        self,
        num_classes: int = 1000,
        in_channels: int = 3,
        img_size: int = 224,
        patch_size: int = 16,
        num_layers: int = 12,
        num_heads: int = 12,
        mlp_dim: int = 3072,
        hidden_size: int = 768,
        dropout_rate: float = 0.1,
        *,
        rngs: nnx.Rngs,
    ):
        n_patches = (img_size // patch_size) ** 2
        self.patch_embeddings = nnx.Conv(
            in_channels,
            hidden_size,
            kernel_size=(patch_size, patch_size),
            strides=(patch_size, patch_size),
            padding="VALID",
            use_bias=True,
            rngs=rngs,
        )
        initializer = jax.nn.initializers.truncated_normal(stddev=0.02)
        self.position_embeddings = nnx.Param(
            initializer(rngs.params(), (1, n_patches + 1, hidden_size), jnp.float32)
        )
        self.dropout = nnx.Dropout(dropout_rate, rngs=rngs)
        self.cls_token = nnx.Param(jnp.zeros((1, 1, hidden_size)))
        self.encoder = nnx.Sequential(
            *[
                TransformerEncoder(hidden_size, mlp_dim, num_heads, dropout_rate, rngs=rngs)
                for _ in range(num_layers)
            ]
        )
        self.final_norm = nnx.LayerNorm(hidden_size, rngs=rngs)
        self.classifier = nnx.Linear(hidden_size, num_classes, rngs=rngs)

    def __call__(self, x):
        patches = self.patch_embeddings(x)
        batch_size = patches.shape[0]
        patches = patches.reshape(batch_size, -1, patches.shape[-1])
        cls_token = jnp.tile(self.cls_token, [batch_size, 1, 1])
        x = jnp.concat([cls_token, patches], axis=1)
        embeddings = x + self.position_embeddings
        embeddings = self.dropout(embeddings)
        x = self.encoder(embeddings)
        x = self.final_norm(x)
        x = x[:, 0]  # the cls token
        return self.classifier(x)


def compute_losses_and_logits(model: VisionTransformer, images, labels):
    logits = model(images)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits=logits, labels=labels).mean()
    return loss, logits


@nnx.jit
def nnx_train_step(model: VisionTransformer, optimizer: nnx.Optimizer, batch):
    """The tutorial's step: updates ``model`` and ``optimizer`` in place, returns the loss."""
    grad_fn = nnx.value_and_grad(compute_losses_and_logits, has_aux=True)
    (loss, _logits), grads = grad_fn(model, batch["image"], batch["label"])
    optimizer.update(model, grads)
    return loss


def train_step(params: VisionTransformer, opt_state: nnx.Optimizer, batch):
    """``(params, opt_state, loss)`` after the tutorial's step on the model and optimizer."""
    loss = nnx_train_step(params, opt_state, batch)
    return params, opt_state, loss


def image_size(s: Size) -> int:
    side = math.isqrt(s.seq_len)
    if side * side != s.seq_len:
        raise ConfigError(
            f"the ViT's seq_len is its number of patches, a square; got {s.seq_len}: "
            f"use {side * side} or {(side + 1) ** 2}."
        )
    return side * PATCH


def create(s: Size, seed: int = 0) -> tuple[VisionTransformer, nnx.Optimizer]:
    model = VisionTransformer(
        num_classes=s.vocab,
        in_channels=CHANNELS,
        img_size=image_size(s),
        patch_size=PATCH,
        num_layers=s.n_layers,
        num_heads=s.n_heads,
        mlp_dim=s.d_ff,
        hidden_size=s.d_model,
        dropout_rate=0.0,
        rngs=nnx.Rngs(seed),
    )
    tx = optax.adamw(learning_rate=warmup_cosine(s), weight_decay=s.weight_decay)
    return model, nnx.Optimizer(model, tx, wrt=nnx.Param)


def image_batch(key: jax.Array, s: Size) -> dict[str, jax.Array]:
    k_image, k_label = jax.random.split(key)
    side = image_size(s)
    return {
        "image": jax.random.normal(k_image, (s.batch, side, side, CHANNELS), jnp.float32),
        "label": jax.random.randint(k_label, (s.batch,), 0, s.vocab, "int32"),
    }


def build(size: str | Size = "tiny", abstract: bool = False) -> Example:
    """The tutorial's ViT and ``@nnx.jit`` step; ``params`` is the model."""
    s = size_of(size)
    if abstract:
        model, optimizer = nnx.eval_shape(lambda: create(s))
        batch = jax.eval_shape(lambda: image_batch(jax.random.key(1), s))
    else:
        model, optimizer = create(s)
        batch = image_batch(jax.random.key(1), s)
    return Example(
        "nnx_vit",
        train_step,
        (model, optimizer, batch),
        s,
        "Flax NNX ViT (the NNX tutorial's), classification loss, AdamW, @nnx.jit step",
    )
