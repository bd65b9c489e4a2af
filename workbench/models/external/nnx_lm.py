"""A Flax NNX decoder LM written as the Flax NNX docs write one (the miniGPT tutorial).

``TransformerBlock`` is pre-norm: ``nnx.RMSNorm``, ``nnx.MultiHeadAttention`` with a causal
mask, ``nnx.LayerNorm`` and a two-``nnx.Linear`` GELU MLP; the model embeds tokens and
positions with ``nnx.Embed`` and projects to the vocabulary with an ``nnx.Linear``. It
trains with ``nnx.Optimizer(model, optax.chain(clip, adamw(warmup_cosine)), wrt=nnx.Param)``.

Two steps, both ``step(params, opt_state, batch) -> (params, opt_state, loss)``; input
paths end in ``/value`` (the leaves are ``nnx.Variable``s):
``params/blocks/0/attn/query/kernel/value``.

- ``train_step`` (``nnx_lm``): the functional NNX pattern over the ``nnx.State``s that
  ``nnx.split`` gives: ``nnx.merge`` inside, ``jax.value_and_grad`` over the parameter
  state, ``optimizer.update``, ``nnx.state`` out. It leaves its arguments untouched.
- ``train_step_nnx_jit`` (``nnx_lm_jit``): the docs' ``@nnx.jit`` step,
  ``nnx.value_and_grad`` and an in-place ``optimizer.update`` on the ``MiniGPT`` and
  ``nnx.Optimizer`` objects themselves, which are pytrees (``params`` *is* the model,
  ``opt_state`` the optimizer). The step returns them after updating them in place; it
  traces to one ``jit`` equation holding the whole step.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from workbench.models import Example
from workbench.models.external._common import (
    Size,
    clipped_adamw,
    example,
    size_of,
    token_batch,
)


class TransformerBlock(nnx.Module):
    def __init__(self, embed_dim: int, num_heads: int, ff_dim: int, *, rngs: nnx.Rngs):
        self.norm1 = nnx.RMSNorm(embed_dim, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(
            num_heads=num_heads,
            in_features=embed_dim,
            use_bias=False,
            decode=False,
            rngs=rngs,
        )
        self.norm2 = nnx.LayerNorm(embed_dim, rngs=rngs)
        self.linear1 = nnx.Linear(embed_dim, ff_dim, rngs=rngs)
        self.linear2 = nnx.Linear(ff_dim, embed_dim, rngs=rngs)

    def __call__(self, x, mask):
        x = x + self.attn(self.norm1(x), mask=mask)
        return x + self.linear2(nnx.gelu(self.linear1(self.norm2(x))))


class TokenAndPositionEmbedding(nnx.Module):
    def __init__(self, maxlen: int, vocab_size: int, embed_dim: int, *, rngs: nnx.Rngs):
        self.token_emb = nnx.Embed(num_embeddings=vocab_size, features=embed_dim, rngs=rngs)
        self.pos_emb = nnx.Embed(num_embeddings=maxlen, features=embed_dim, rngs=rngs)

    def __call__(self, x):
        positions = jnp.arange(0, x.shape[1])[None, :]
        return self.token_emb(x) + self.pos_emb(positions)


class MiniGPT(nnx.Module):
    def __init__(self, size: Size, *, rngs: nnx.Rngs):
        self.embedding = TokenAndPositionEmbedding(
            size.seq_len, size.vocab, size.d_model, rngs=rngs
        )
        self.blocks = nnx.List(
            [
                TransformerBlock(size.d_model, size.n_heads, size.d_ff, rngs=rngs)
                for _ in range(size.n_layers)
            ]
        )
        self.norm = nnx.RMSNorm(size.d_model, rngs=rngs)
        self.output_layer = nnx.Linear(size.d_model, size.vocab, use_bias=False, rngs=rngs)

    def __call__(self, inputs):
        mask = nnx.make_causal_mask(inputs)
        x = self.embedding(inputs)
        for block in self.blocks:
            x = block(x, mask)
        return self.output_layer(self.norm(x))


def loss_fn(model: MiniGPT, batch):
    logits = model(batch["inputs"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()


def create(size: Size, seed: int = 0) -> tuple[MiniGPT, nnx.Optimizer]:
    model = MiniGPT(size, rngs=nnx.Rngs(seed))
    optimizer = nnx.Optimizer(model, clipped_adamw(size), wrt=nnx.Param)
    return model, optimizer


def train_step(graphdefs, params, opt_state, batch):
    model_def, opt_def = graphdefs

    def compute_loss(params):
        return loss_fn(nnx.merge(model_def, params), batch)

    loss, grads = jax.value_and_grad(compute_loss)(params)
    # copy=True: a plain merge reuses the states' Variables, and the update below would
    # then write into the caller's params and opt_state
    model = nnx.merge(model_def, params, copy=True)
    optimizer = nnx.merge(opt_def, opt_state, copy=True)
    optimizer.update(model, grads)
    return nnx.state(model), nnx.state(optimizer), loss


@nnx.jit
def nnx_train_step(model: MiniGPT, optimizer: nnx.Optimizer, batch):
    """The docs' step: updates ``model`` and ``optimizer`` in place, returns the loss."""
    loss, grads = nnx.value_and_grad(loss_fn)(model, batch)
    optimizer.update(model, grads)
    return loss


def train_step_nnx_jit(params: MiniGPT, opt_state: nnx.Optimizer, batch):
    """The docs' step on the model and optimizer objects themselves (both are pytrees)."""
    loss = nnx_train_step(params, opt_state, batch)
    return params, opt_state, loss


def build(size: str | Size = "tiny", abstract: bool = False) -> Example:
    """The functional step over ``nnx.State``s: ``nnx.merge`` / ``jax.value_and_grad``."""
    s = size_of(size)
    # graph definitions are static: take them from a model traced for shapes only
    model, optimizer = nnx.eval_shape(lambda: create(s))
    graphdefs = (nnx.graphdef(model), nnx.graphdef(optimizer))

    def make():
        model, optimizer = create(s)
        batch = token_batch(jax.random.key(1), s, "inputs", "targets")
        return nnx.state(model), nnx.state(optimizer), batch

    return example(
        "nnx_lm",
        partial(train_step, graphdefs),
        make,
        s,
        "Flax NNX miniGPT, nnx.Optimizer (clipped AdamW, warmup-cosine), functional step",
        abstract,
    )


def build_nnx_jit(size: str | Size = "tiny", abstract: bool = False) -> Example:
    """The docs' ``@nnx.jit`` step; its arguments are the ``MiniGPT`` and ``nnx.Optimizer``."""
    s = size_of(size)
    if abstract:
        model, optimizer = nnx.eval_shape(lambda: create(s))
        batch = jax.eval_shape(lambda: token_batch(jax.random.key(1), s, "inputs", "targets"))
    else:
        model, optimizer = create(s)
        batch = token_batch(jax.random.key(1), s, "inputs", "targets")
    args = (model, optimizer, batch)
    return Example(
        "nnx_lm_jit",
        train_step_nnx_jit,
        args,
        s,
        "Flax NNX miniGPT, nnx.Optimizer (clipped AdamW, warmup-cosine), @nnx.jit step",
    )
