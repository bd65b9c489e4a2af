"""A small convolutional image classifier and its SGD training step.

Convolutions are ``jax.lax.conv_general_dilated`` in NHWC/HWIO layout, stride 1, "SAME"
padding, each followed by a bias and ReLU; then global average pooling over H and W, and
a dense head. Parameters ``params/convs/<i>/w`` [kh, kw, c_in, c_out],
``params/convs/<i>/b`` [c_out], ``params/head/w`` [C, classes], ``params/head/b``.
The batch is ``{"images": f32[B, H, W, C], "labels": int32[B]}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp

import workbench as wb
from workbench.models._common import (
    ConfigError,
    Presets,
    StepOutput,
    dense,
    sgd,
    softmax_cross_entropy,
)

DIMENSION_NUMBERS = ("NHWC", "HWIO", "NHWC")


@dataclass(frozen=True, slots=True)
class Config(Presets):
    """Sizes of the network and its batch. Defaults are the "tiny" preset."""

    batch: int = 8
    image_size: int = 16
    in_channels: int = 8
    channels: tuple[int, ...] = (16, 32)
    kernel_size: int = 3
    n_classes: int = 8

    PRESETS: ClassVar = {
        "tiny": {},
        "small": dict(batch=32, image_size=32, in_channels=8, channels=(32, 64, 64), n_classes=16),
        "large": dict(
            batch=64, image_size=64, in_channels=8, channels=(64, 128, 256), n_classes=64
        ),
    }

    def __post_init__(self):
        self._check_positive("batch", "image_size", "in_channels", "kernel_size", "n_classes")
        if not self.channels or any(not isinstance(c, int) or c < 1 for c in self.channels):
            raise ConfigError(
                f"cnn.Config.channels must be a non-empty tuple of positive ints; got {self.channels!r}."
            )


def init_params(config: Config, key: jax.Array) -> dict:
    k = config.kernel_size
    widths = (config.in_channels, *config.channels)
    keys = jax.random.split(key, len(config.channels) + 1)
    convs = [
        {"w": dense(kc, (k, k, c_in, c_out), k * k * c_in), "b": jnp.zeros((c_out,), jnp.float32)}
        for kc, c_in, c_out in zip(keys, widths[:-1], widths[1:])
    ]
    c, n = widths[-1], config.n_classes
    head = {"w": dense(keys[-1], (c, n), c), "b": jnp.zeros((n,), jnp.float32)}
    return {"convs": convs, "head": head}


def init_batch(config: Config, key: jax.Array) -> dict:
    ki, kl = jax.random.split(key)
    shape = (config.batch, config.image_size, config.image_size, config.in_channels)
    images = jax.random.normal(ki, shape, jnp.float32)
    labels = jax.random.randint(kl, (config.batch,), 0, config.n_classes, jnp.int32)
    return {"images": images, "labels": labels}


def init(config: Config, key: jax.Array) -> tuple[dict, dict]:
    """``(params, batch)`` for ``train_step``."""
    k_params, k_batch = jax.random.split(key)
    return init_params(config, k_params), init_batch(config, k_batch)


def conv(p: dict, x: jax.Array) -> jax.Array:
    y = jax.lax.conv_general_dilated(
        x, p["w"], window_strides=(1, 1), padding="SAME", dimension_numbers=DIMENSION_NUMBERS
    )
    return jax.nn.relu(y + p["b"])


def forward(params: dict, images: jax.Array) -> jax.Array:
    """Class logits [B, n_classes]."""
    x = images
    for i, p in enumerate(params["convs"]):
        with jax.named_scope(f"conv{i}"):
            x = conv(p, x)
    with jax.named_scope("pool"):
        x = wb.tag(jnp.mean(x, axis=(1, 2)), "features")
    with jax.named_scope("head"):
        return x @ params["head"]["w"] + params["head"]["b"]


def loss_fn(params: dict, batch: dict) -> jax.Array:
    logits = forward(params, batch["images"])
    with jax.named_scope("loss"):
        return softmax_cross_entropy(logits, batch["labels"])


def train_step(params: dict, batch: dict, *, learning_rate: float = 0.1) -> StepOutput:
    """One SGD step on softmax cross-entropy; gradients are tagged ``grads/<param path>``."""
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    grads = wb.tag(grads, "grads")
    return StepOutput(sgd(params, grads, learning_rate), loss)
