"""The third-party models' "tiny" examples and their captured programs, built once per test
session and shared by the test modules that train, capture and run them."""

from __future__ import annotations

import functools
import warnings

import workbench as wb
from workbench.models import Example
from workbench.models.external import build_external


@functools.cache
def tiny(name: str) -> Example:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_external(name)


@functools.cache
def program(name: str) -> wb.Program:
    ex = tiny(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return wb.capture(ex.fn, *ex.args)


@functools.cache
def dropout_attention() -> wb.Program:
    """A plain-JAX attention with a dropout between its softmax and its context dot (the
    gradient of its loss): no attention region (ring attention and fused kernels refuse)."""
    import jax
    import jax.numpy as jnp

    def attend(q, k, v, key):
        p = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k), axis=-1)
        keep = jax.random.bernoulli(key, 0.9, p.shape)
        return jnp.einsum("bhqk,bkhd->bqhd", jnp.where(keep, p / 0.9, 0.0), v)

    def loss(w, x, key):
        q, k, v = (jnp.einsum("btd,dhe->bthe", x, w[n]) for n in "qkv")
        return jnp.einsum("bthe,hed->btd", attend(q, k, v, key), w["o"]).sum()

    w = {n: jnp.ones((8, 2, 4)) / 8 for n in "qkv"} | {"o": jnp.ones((2, 4, 8)) / 8}
    return wb.capture(jax.grad(loss), w, jnp.ones((2, 16, 8)), jax.random.key(0))
