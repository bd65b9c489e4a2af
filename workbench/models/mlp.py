"""A multi-layer perceptron regressor and its SGD training step.

Parameters ``params/layers/<i>/w`` [in, out] and ``params/layers/<i>/b`` [out]; ReLU
between layers, none after the last. The batch is ``{"x": [B, d_in], "y": [B, d_out]}``,
with ``y`` a fixed random function of ``x``, so the loss can fall.
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
    """Sizes of the network and its batch. Defaults are the "tiny" preset."""

    batch: int = 16
    d_in: int = 32
    d_hidden: int = 64
    d_out: int = 16
    n_layers: int = 3

    PRESETS: ClassVar = {
        "tiny": {},
        "small": dict(batch=64, d_in=256, d_hidden=1024, d_out=256, n_layers=4),
        "large": dict(batch=256, d_in=1024, d_hidden=8192, d_out=1024, n_layers=8),
    }

    def __post_init__(self):
        self._check_positive("batch", "d_in", "d_hidden", "d_out", "n_layers")

    @property
    def widths(self) -> tuple[int, ...]:
        """Feature sizes from input to output: ``n_layers + 1`` entries."""
        return (self.d_in, *[self.d_hidden] * (self.n_layers - 1), self.d_out)


def init_params(config: Config, key: jax.Array) -> dict:
    widths = config.widths
    keys = jax.random.split(key, config.n_layers)
    layers = [
        {"w": dense(k, (n_in, n_out), n_in), "b": jnp.zeros((n_out,), jnp.float32)}
        for k, n_in, n_out in zip(keys, widths[:-1], widths[1:])
    ]
    return {"layers": layers}


def init_batch(config: Config, key: jax.Array) -> dict:
    kx, kw = jax.random.split(key)
    x = jax.random.normal(kx, (config.batch, config.d_in), jnp.float32)
    y = jnp.tanh(x @ dense(kw, (config.d_in, config.d_out), config.d_in))
    return {"x": x, "y": y}


def init(config: Config, key: jax.Array) -> tuple[dict, dict]:
    """``(params, batch)`` for ``train_step``."""
    k_params, k_batch = jax.random.split(key)
    return init_params(config, k_params), init_batch(config, k_batch)


def forward(params: dict, x: jax.Array) -> jax.Array:
    layers = params["layers"]
    for i, p in enumerate(layers):
        with jax.named_scope(f"layer{i}"):
            x = x @ p["w"] + p["b"]
            if i < len(layers) - 1:
                x = jax.nn.relu(x)
    return x


def loss_fn(params: dict, batch: dict) -> jax.Array:
    """Mean squared error."""
    pred = forward(params, batch["x"])
    with jax.named_scope("loss"):
        return jnp.mean(jnp.square(pred - batch["y"]))


def train_step(params: dict, batch: dict, *, learning_rate: float = 0.05) -> StepOutput:
    """One SGD step; gradients are tagged ``grads/<param path>``."""
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    grads = wb.tag(grads, "grads")
    return StepOutput(sgd(params, grads, learning_rate), loss)
