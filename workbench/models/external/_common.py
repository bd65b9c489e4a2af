"""What the external builders share: sizes, random token batches, and the Example wrapper.

Nothing here is used inside a training step: the steps are the libraries' own code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import optax

from workbench.models import Example
from workbench.models._common import ConfigError


@dataclass(frozen=True, slots=True)
class Size:
    """Sizes of a model and its batch, common to every library."""

    batch: int = 8
    seq_len: int = 16
    d_model: int = 64
    n_heads: int = 4
    n_kv_heads: int = 2  # for models with grouped-query attention
    d_ff: int = 256
    vocab: int = 256
    n_layers: int = 2
    # optimizer: peak learning rate of the schedule and AdamW's weight decay
    learning_rate: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 10
    total_steps: int = 1000

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def replace(self, **fields: Any) -> Size:
        return dataclasses.replace(self, **fields)


#: "tiny" shards on a {"data": 2, "model": 4} mesh; "large" is for planning from shapes.
SIZES: dict[str, Size] = {
    "tiny": Size(),
    "large": Size(
        batch=16,
        seq_len=256,
        d_model=512,
        n_heads=8,
        n_kv_heads=4,
        d_ff=2048,
        vocab=8192,
        n_layers=8,
    ),
}


def size_of(size: str | Size) -> Size:
    """A preset name or a ``Size``."""
    if isinstance(size, Size):
        return size
    if size not in SIZES:
        raise ConfigError(
            f"external models have no size {size!r}; choose one of {', '.join(map(repr, SIZES))} "
            "or pass a workbench.models.external.Size."
        )
    return SIZES[size]


def warmup_cosine(size: Size, **kwargs) -> optax.Schedule:
    """The examples' learning rate: a linear warmup from 0, then a cosine decay."""
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=size.learning_rate,
        warmup_steps=size.warmup_steps,
        decay_steps=size.total_steps,
        **kwargs,
    )


def clipped_adamw(size: Size) -> optax.GradientTransformation:
    """AdamW on that schedule after clipping the gradients' global norm to 1 (as the Flax
    examples chain it)."""
    return optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(learning_rate=warmup_cosine(size), weight_decay=size.weight_decay),
    )


def token_batch(key: jax.Array, size: Size, *names: str) -> dict[str, jax.Array]:
    """A dict of int32 ``[batch, seq_len]`` token arrays, one random draw per name."""
    keys = jax.random.split(key, len(names))
    shape = (size.batch, size.seq_len)
    return {n: jax.random.randint(k, shape, 0, size.vocab, "int32") for n, k in zip(names, keys)}


def example(
    name: str,
    step: Callable,
    make: Callable[[], tuple],
    config: Any,
    description: str,
    abstract: bool,
) -> Example:
    """``make()`` gives the step's arguments; with ``abstract`` only their shapes are traced."""
    args = jax.eval_shape(make) if abstract else make()
    return Example(name, step, tuple(args), config, description)
