"""Short programs written the way the JAX, Flax, Equinox and Optax docs write them, for the
primitive-coverage test: name -> a function giving ``(fn, args)`` (args abstract)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

f32, i32 = jnp.float32, jnp.int32


def a(*shape, dtype=f32):
    return jax.ShapeDtypeStruct(shape, dtype)


def abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def _sgd_loss_step(loss, tx):
    """``step(params, opt_state, *batch)``: a gradient step through ``tx`` (Optax's pattern)."""
    import optax

    def step(params, opt_state, *batch):
        value, grads = jax.value_and_grad(loss)(params, *batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return step


# -- Flax NNX ViT (the Flax NNX ViT tutorial: conv patches, a tiled cls token) ------------------
def nnx_vit():
    import optax
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, d, heads, rngs):
            self.norm1 = nnx.LayerNorm(d, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(
                num_heads=heads, in_features=d, decode=False, rngs=rngs
            )
            self.norm2 = nnx.LayerNorm(d, rngs=rngs)
            self.fc1 = nnx.Linear(d, 2 * d, rngs=rngs)
            self.fc2 = nnx.Linear(2 * d, d, rngs=rngs)
            self.drop = nnx.Dropout(0.1, rngs=rngs)

        def __call__(self, x):
            x = x + self.attn(self.norm1(x))
            return x + self.drop(self.fc2(nnx.gelu(self.fc1(self.norm2(x)))))

    class ViT(nnx.Module):
        def __init__(self, rngs, d=32, patch=4, image=16, classes=10):
            n = (image // patch) ** 2
            self.patches = nnx.Conv(3, d, (patch, patch), strides=(patch, patch), rngs=rngs)
            self.cls_token = nnx.Param(jnp.zeros((1, 1, d)))
            self.pos = nnx.Param(
                nnx.initializers.truncated_normal(0.02)(rngs.params(), (1, n + 1, d))
            )
            self.blocks = nnx.List([Block(d, 4, rngs) for _ in range(2)])
            self.norm = nnx.LayerNorm(d, rngs=rngs)
            self.head = nnx.Linear(d, classes, rngs=rngs)

        def __call__(self, x):
            x = self.patches(x)
            b, h, w, c = x.shape
            x = x.reshape(b, h * w, c)
            cls = jnp.tile(self.cls_token[...], [b, 1, 1])
            x = jnp.concatenate([cls, x], axis=1) + self.pos[...]
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x)[:, 0])

    model = nnx.eval_shape(lambda: ViT(nnx.Rngs(0, dropout=1)))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optax.adamw(1e-3)

    def step(params, rest, opt_state, x, y):
        model = nnx.merge(graphdef, params, rest)
        value, grads = nnx.value_and_grad(
            lambda m: optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean()
        )(model)
        updates, opt_state = tx.update(grads, opt_state, params)
        rest = nnx.state(model, nnx.Not(nnx.Param))
        return optax.apply_updates(params, updates), rest, opt_state, value

    args = (params, rest, jax.eval_shape(tx.init, params), a(4, 16, 16, 3), a(4, dtype=i32))
    return step, abstract(args)


# -- a Flax Linen CNN (the Flax quick start), trained with Lion -----------------------------------
def linen_cnn():
    import optax
    from flax import linen as nn

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Conv(features=8, kernel_size=(3, 3))(x))
            x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
            x = nn.relu(nn.Conv(features=16, kernel_size=(3, 3))(x))
            x = nn.max_pool(x, window_shape=(2, 2), strides=(2, 2))
            x = x.reshape((x.shape[0], -1))
            return nn.Dense(features=10)(nn.relu(nn.Dense(features=32)(x)))

    model = CNN()
    params = jax.eval_shape(model.init, jax.random.key(0), a(1, 8, 8, 1))["params"]
    tx = optax.lion(1e-4)

    def loss(params, x, y):
        logits = model.apply({"params": params}, x)
        return optax.softmax_cross_entropy(logits, jax.nn.one_hot(y, 10)).mean()

    args = (params, jax.eval_shape(tx.init, params), a(4, 8, 8, 1), a(4, dtype=i32))
    return _sgd_loss_step(loss, tx), abstract(args)


# -- an Equinox MLP (the Equinox docs: filter_value_and_grad, partition), with Adafactor ----------
def eqx_mlp():
    import equinox as eqx
    import optax

    model = eqx.filter_eval_shape(eqx.nn.MLP, 8, 4, 16, 2, key=jax.random.key(0))
    # eqx.is_inexact_array on the shapes eval_shape gives: the arrays' stand-ins
    params, static = eqx.partition(model, lambda x: isinstance(x, jax.ShapeDtypeStruct))
    tx = optax.adafactor(1e-3, min_dim_size_to_factor=4)

    def loss(params, x, y):
        m = eqx.combine(params, static)
        return jnp.mean((jax.vmap(m)(x) - y) ** 2)

    args = (params, jax.eval_shape(tx.init, params), a(4, 8), a(4, 4))
    return _sgd_loss_step(loss, tx), abstract(args)


# -- plain JAX, one use of a kind each ------------------------------------------------------------
@jax.custom_vjp
def clip_gradient(x):
    return x


clip_gradient.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -1.0, 1.0),))


@jax.custom_jvp
def softplus(x):
    return jnp.logaddexp(x, 0.0)


softplus.defjvp(lambda p, t: (softplus(p[0]), jax.nn.sigmoid(p[0]) * t[0]))


def plain(x, k, i, u, key):
    """A little of everything in ``jax.numpy`` and ``lax``: returns a tuple of results."""
    vals, idx = lax.top_k(x, 3)
    keys, perm = lax.sort((x, jnp.broadcast_to(jnp.arange(x.shape[-1]), x.shape)), num_keys=1)
    out = [
        vals, idx, keys, perm, jnp.sort(x, axis=0), jnp.argsort(x, axis=-1),
        jnp.argmax(x, axis=-1), jnp.argmin(x, axis=0),
        jnp.cumsum(x, axis=1), jnp.cumprod(x, axis=0), lax.cummax(x, axis=1),
        lax.cumlogsumexp(x, axis=1), lax.cummin(x, axis=0), lax.cumsum(x, axis=1, reverse=True),
        x.at[k].set(u), x.at[k].add(u), x.at[k].multiply(u), x.at[k].min(u), x.at[k].max(u),
        x[k], jnp.take_along_axis(x, jnp.argsort(x, axis=1), axis=1), jnp.take(x, k, axis=1),
        lax.dynamic_slice(x, (i, 0), (2, 16)), lax.dynamic_update_slice(x, u[:2], (i, 0)),
        jnp.tile(x, (2, 1)), jnp.tile(x[:1], (3, 2)), jnp.repeat(x, 2, axis=0),
        jnp.roll(x, 1, axis=1), jnp.flip(x, 0), jnp.pad(x, ((1, 1), (0, 0))),
        lax.reduce_precision(x, 8, 7), lax.clamp(-1.0, x, 1.0), jnp.clip(x, 0.0, 1.0),
        jnp.where(x > 0, x, 0.0), jnp.arange(16) * 2, lax.erf_inv(jnp.tanh(x)),
        clip_gradient(x), softplus(x), jax.grad(lambda z: softplus(clip_gradient(z)).sum())(x),
        jax.nn.logsumexp(x, axis=-1), jax.nn.one_hot(k, 16), jnp.linalg.norm(x, axis=-1),
        jax.random.normal(key, x.shape), jax.random.truncated_normal(key, -2.0, 2.0, x.shape),
        jax.random.bernoulli(key, 0.5, x.shape), jax.random.categorical(key, x),
        lax.rng_bit_generator(jnp.zeros((4,), jnp.uint32), (8, 16))[1],
        lax.fori_loop(0, 3, lambda j, c: c * 0.5 + 1.0, x), lax.map(jnp.sum, x),
        jnp.searchsorted(jnp.sort(x[0]), x[1]), jnp.median(x, axis=1),
        jax.ops.segment_max(x, jnp.arange(8) % 3, num_segments=3),
    ]  # fmt: skip
    return tuple(out)


PLAIN_ARGS = (
    a(8, 16),
    a(3, dtype=i32),
    a(dtype=i32),
    a(3, 16),
    jax.ShapeDtypeStruct((), jax.random.key(0).dtype),
)


CORPUS = {
    "nnx_vit": nnx_vit,
    "linen_cnn": linen_cnn,
    "eqx_mlp": eqx_mlp,
    "plain": lambda: (plain, PLAIN_ARGS),
    "scan_rnn": lambda: (
        lambda h, xs, w: lax.scan(lambda c, x: (jnp.tanh(c @ w + x),) * 2, h, xs),
        (a(4, 8), a(6, 4, 8), a(8, 8)),
    ),
    "cond_while": lambda: (
        lambda p, x: lax.cond(
            p, lambda y: lax.while_loop(lambda c: c.sum() < 10.0, lambda c: c + 1.0, y), jnp.sin, x
        ),
        (a(dtype=bool), a(4, 8)),
    ),
}
