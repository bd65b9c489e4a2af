"""A message-passing graph network (node regression) and its SGD training step.

Each round: messages are an MLP of ``concat(h[senders], h[receivers])`` (two gathers),
summed per receiving node with ``jax.ops.segment_sum`` (a scatter-add), and each node is
updated by an MLP of ``concat(h, aggregated)`` with a residual connection.

Parameters: ``params/encoder/w|b``, ``params/rounds/<i>/message/w1|b1|w2|b2``,
``params/rounds/<i>/update/w1|b1|w2|b2``, ``params/decoder/w|b``. The batch is
``{"nodes": f32[N, d_node], "senders": int32[E], "receivers": int32[E], "targets": f32[N, d_out]}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp

import workbench as wb
from workbench.models._common import Presets, StepOutput, dense, sgd


@dataclass(frozen=True, slots=True)
class Config(Presets):
    """Sizes of the graph and network. Defaults are the "tiny" preset."""

    n_nodes: int = 32
    n_edges: int = 64
    d_node: int = 8
    d_hidden: int = 32
    d_out: int = 8
    n_rounds: int = 2

    PRESETS: ClassVar = {
        "tiny": {},
        "small": dict(n_nodes=1024, n_edges=8192, d_node=16, d_hidden=128, d_out=16, n_rounds=3),
        "large": dict(n_nodes=16384, n_edges=131072, d_node=64, d_hidden=512, d_out=64, n_rounds=4),
    }

    def __post_init__(self):
        self._check_positive("n_nodes", "n_edges", "d_node", "d_hidden", "d_out", "n_rounds")


def _linear(key: jax.Array, n_in: int, n_out: int) -> dict:
    return {"w": dense(key, (n_in, n_out), n_in), "b": jnp.zeros((n_out,), jnp.float32)}


def _mlp_params(key: jax.Array, n_in: int, n_hidden: int) -> dict:
    k1, k2 = jax.random.split(key)
    first, second = _linear(k1, n_in, n_hidden), _linear(k2, n_hidden, n_hidden)
    return {"w1": first["w"], "b1": first["b"], "w2": second["w"], "b2": second["b"]}


def init_params(config: Config, key: jax.Array) -> dict:
    H = config.d_hidden
    k_enc, k_dec, k_rounds = jax.random.split(key, 3)
    rounds = []
    for k in jax.random.split(k_rounds, config.n_rounds):
        k_msg, k_upd = jax.random.split(k)
        rounds.append(
            {"message": _mlp_params(k_msg, 2 * H, H), "update": _mlp_params(k_upd, 2 * H, H)}
        )
    return {
        "encoder": _linear(k_enc, config.d_node, H),
        "rounds": rounds,
        "decoder": _linear(k_dec, H, config.d_out),
    }


def init_batch(config: Config, key: jax.Array) -> dict:
    """A random directed graph with random node features and targets."""
    kn, ks, kr, kt = jax.random.split(key, 4)
    N, E = config.n_nodes, config.n_edges
    return {
        "nodes": jax.random.normal(kn, (N, config.d_node), jnp.float32),
        "senders": jax.random.randint(ks, (E,), 0, N, jnp.int32),
        "receivers": jax.random.randint(kr, (E,), 0, N, jnp.int32),
        "targets": jax.random.normal(kt, (N, config.d_out), jnp.float32),
    }


def init(config: Config, key: jax.Array) -> tuple[dict, dict]:
    """``(params, batch)`` for ``train_step``."""
    k_params, k_batch = jax.random.split(key)
    return init_params(config, k_params), init_batch(config, k_batch)


def mlp(p: dict, x: jax.Array) -> jax.Array:
    return jax.nn.relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def message_passing(p: dict, h: jax.Array, senders: jax.Array, receivers: jax.Array) -> jax.Array:
    """One round: message, aggregate, update."""
    with jax.named_scope("message"):
        messages = mlp(p["message"], jnp.concatenate([h[senders], h[receivers]], axis=-1))
    with jax.named_scope("aggregate"):
        incoming = jax.ops.segment_sum(messages, receivers, num_segments=h.shape[0])
        incoming = wb.tag(incoming, "incoming")
    with jax.named_scope("update"):
        return h + mlp(p["update"], jnp.concatenate([h, incoming], axis=-1))


def forward(params: dict, batch: dict) -> jax.Array:
    """Per-node predictions [N, d_out]."""
    with jax.named_scope("encoder"):
        h = batch["nodes"] @ params["encoder"]["w"] + params["encoder"]["b"]
    for i, p in enumerate(params["rounds"]):
        with jax.named_scope(f"round{i}"):
            h = message_passing(p, h, batch["senders"], batch["receivers"])
    with jax.named_scope("decoder"):
        return h @ params["decoder"]["w"] + params["decoder"]["b"]


def loss_fn(params: dict, batch: dict) -> jax.Array:
    """Mean squared error over nodes."""
    pred = forward(params, batch)
    with jax.named_scope("loss"):
        return jnp.mean(jnp.square(pred - batch["targets"]))


def train_step(params: dict, batch: dict, *, learning_rate: float = 0.01) -> StepOutput:
    """One SGD step; gradients are tagged ``grads/<param path>``."""
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    grads = wb.tag(grads, "grads")
    return StepOutput(sgd(params, grads, learning_rate), loss)
