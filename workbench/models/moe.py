"""A top-k routed mixture-of-experts MLP for the zoo LM, its dispatch written three ways.

``moe(p, x, config) -> (y, aux)`` replaces the LM's dense MLP when ``config.n_experts > 0``.
A router ([D, E], softmax in float32) picks ``top_k`` experts per token; their gates are
renormalised over the top k. Each sequence is a group (GShard): an expert takes at most
``C = ceil(top_k * T * capacity_factor / E)`` tokens of a group of ``T``, placed by a cumsum
within the group, every token's first choice before any second choice; tokens over capacity
are dropped (they pass through the residual only). ``config.dispatch`` picks how tokens
reach their experts and come back:

- ``"einsum"``: a one-hot dispatch tensor [G, T, E, C] and its gated twin, the combine
  tensor, contracted with einsums (GShard, Switch, Mesh-TensorFlow);
- ``"gather"``: each expert slot's token index, scattered from the choices, then gathers
  of the tokens into the slots and of the slots back to the tokens;
- ``"ragged"``: dropless; the token-choice pairs sorted by expert, the experts run as
  ``jax.lax.ragged_dot`` over the groups of rows, the rows unsorted and gated.

"einsum" and "gather" drop the same tokens and give the same outputs; "ragged" agrees with
them when nothing is dropped. ``n_shared`` shared experts (DeepSeekMoE) see every token, as
one dense MLP of their summed width. ``aux`` is the load-balancing loss of Switch/GShard,
``E * sum_e f_e * P_e`` per group (``f_e``: the fraction of its tokens whose first choice is
``e``; ``P_e``: their mean router probability), averaged over the groups.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

import workbench as wb
from workbench.models._common import dense

DISPATCHES = ("einsum", "gather", "ragged")


def d_expert(config: Any) -> int:
    """One expert's hidden width: ``config.d_expert``, else ``config.d_ff``."""
    return config.d_expert or config.d_ff


def init_moe(config: Any, key: jax.Array) -> dict:
    """``router`` [D, E], ``experts/w_in`` [E, D, F_e], ``experts/w_out`` [E, F_e, D], and with
    ``n_shared``, ``shared/w_in`` [D, S], ``shared/w_out`` [S, D] (S = n_shared * F_e)."""
    D, E, F, dt = config.d_model, config.n_experts, d_expert(config), config.dtype
    kr, ki, ko, ks, kt = jax.random.split(key, 5)
    p = {
        "router": dense(kr, (D, E), D, dt),
        "experts": {"w_in": dense(ki, (E, D, F), D, dt), "w_out": dense(ko, (E, F, D), F, dt)},
    }
    if config.n_shared:
        S = config.n_shared * F
        p["shared"] = {"w_in": dense(ks, (D, S), D, dt), "w_out": dense(kt, (S, D), S, dt)}
    return p


def capacity(config: Any, tokens: int) -> int:
    """Slots per expert in a group of ``tokens``: ``ceil(top_k * tokens * factor / E)``."""
    return max(1, math.ceil(config.top_k * tokens * config.capacity_factor / config.n_experts))


def route(router: jax.Array, x: jax.Array, top_k: int):
    """``(gates, experts, aux)``: renormalised gates and expert ids [G, T, k], the aux loss."""
    logits = jnp.einsum("gtd,de->gte", x.astype(jnp.float32), router.astype(jnp.float32))
    probs = jax.nn.softmax(logits, axis=-1)
    gates, experts = jax.lax.top_k(probs, top_k)
    gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
    E = router.shape[-1]
    first = jax.nn.one_hot(experts[..., 0], E, dtype=jnp.float32)
    per_group = jnp.sum(jnp.mean(first, axis=1) * jnp.mean(probs, axis=1), axis=-1)
    return gates, experts, E * jnp.mean(per_group)


def positions(experts: jax.Array, n_experts: int, capacity_: int):
    """``(slot, keep)`` [G, T, k]: each choice's place in its expert's queue, counted within
    the group with all first choices ahead of second ones, and whether it is under capacity."""
    G, T, k = experts.shape
    chosen = jax.nn.one_hot(experts, n_experts, dtype=jnp.int32)  # [G, T, k, E]
    queue = chosen.transpose(0, 2, 1, 3).reshape(G, k * T, n_experts)
    before = jnp.cumsum(queue, axis=1) - 1
    slot = jnp.sum(before.reshape(G, k, T, n_experts).transpose(0, 2, 1, 3) * chosen, axis=-1)
    return slot, slot < capacity_


def _expert_mlp(p: dict, xe: jax.Array) -> jax.Array:
    """Every expert on its own slots: [E, G, C, D] -> [E, G, C, D]."""
    h = wb.tag(jax.nn.gelu(jnp.einsum("egcd,edf->egcf", xe, p["w_in"])), "hidden")
    return jnp.einsum("egcf,efd->egcd", h, p["w_out"])


def _einsum(p, x, gates, experts, C):
    E = p["w_in"].shape[0]
    slot, keep = positions(experts, E, C)
    chosen = jax.nn.one_hot(experts, E, dtype=x.dtype)  # [G, T, k, E]
    placed = jax.nn.one_hot(jnp.where(keep, slot, C), C, dtype=x.dtype)  # over capacity: 0
    dispatch = jnp.einsum("gtke,gtkc->gtec", chosen, placed)
    combine = jnp.einsum("gtke,gtkc,gtk->gtec", chosen, placed, gates.astype(x.dtype))
    xe = jnp.einsum("gtec,gtd->egcd", dispatch, x)
    return jnp.einsum("gtec,egcd->gtd", combine, _expert_mlp(p, xe))


def _gather(p, x, gates, experts, C):
    E = p["w_in"].shape[0]
    G, T, D = x.shape
    k = experts.shape[-1]
    slot, keep = positions(experts, E, C)
    where = jnp.where(keep, experts * C + slot, E * C).reshape(G, T * k)  # E*C: dropped
    token = jnp.broadcast_to(jnp.arange(T * k, dtype=jnp.int32) // k, (G, T * k))

    def fill(w, t):  # slot -> its token (T: an empty slot, which reads a row of zeros)
        return jnp.full((E * C + 1,), T, jnp.int32).at[w].set(t)[: E * C]

    slot_token = jax.vmap(fill)(where, token)  # [G, E*C]
    zero = jnp.zeros((G, 1, D), x.dtype)
    xs = jnp.take_along_axis(jnp.concatenate([x, zero], 1), slot_token[..., None], axis=1)
    xe = xs.reshape(G, E, C, D).transpose(1, 0, 2, 3)
    ye = _expert_mlp(p, xe).transpose(1, 0, 2, 3).reshape(G, E * C, D)
    back = jnp.take_along_axis(jnp.concatenate([ye, zero], 1), where[..., None], axis=1)
    weight = jnp.where(keep, gates, 0.0).astype(x.dtype)
    return jnp.einsum("gtkd,gtk->gtd", back.reshape(G, T, k, D), weight)


def _ragged(p, x, gates, experts):
    E = p["w_in"].shape[0]
    G, T, D = x.shape
    k = experts.shape[-1]
    flat = experts.reshape(G * T * k)
    order = jnp.argsort(flat, stable=True)  # the token-choice pairs, by expert
    rows = x.reshape(G * T, D)[order // k]
    sizes = jnp.sum(jax.nn.one_hot(flat, E, dtype=jnp.int32), axis=0)
    h = wb.tag(jax.nn.gelu(jax.lax.ragged_dot(rows, p["w_in"], sizes)), "hidden")
    out = jax.lax.ragged_dot(h, p["w_out"], sizes)[jnp.argsort(order)]  # unsorted
    return jnp.einsum("gtkd,gtk->gtd", out.reshape(G, T, k, D), gates.astype(x.dtype))


def moe(p: dict, x: jax.Array, config: Any) -> tuple[jax.Array, jax.Array]:
    """The MoE MLP on ``x`` [G, T, D] (a group per sequence): ``(y, aux)``, aux a float32
    scalar. Scopes ``router``, ``experts`` and ``shared``; the experts' hidden is tagged."""
    with jax.named_scope("router"):
        gates, experts, aux = route(p["router"], x, config.top_k)
    with jax.named_scope("experts"):
        if config.dispatch == "ragged":
            y = _ragged(p["experts"], x, gates, experts)
        else:
            form = _einsum if config.dispatch == "einsum" else _gather
            y = form(p["experts"], x, gates, experts, capacity(config, x.shape[1]))
    if "shared" in p:
        with jax.named_scope("shared"):
            s = p["shared"]
            y = y + wb.tag(jax.nn.gelu(x @ s["w_in"]), "hidden") @ s["w_out"]
    return y, aux


def dropped(p: dict, x: jax.Array, config: Any) -> jax.Array:
    """How many token choices the capacity drops in ``x`` (0 for the dropless "ragged")."""
    if config.dispatch == "ragged":
        return jnp.zeros((), jnp.int32)
    _, experts, _ = route(p["router"], x, config.top_k)
    _, keep = positions(experts, config.n_experts, capacity(config, x.shape[1]))
    return jnp.sum(~keep)
