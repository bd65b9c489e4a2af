"""Pieces the zoo's models share: config presets, initialisers, losses and optimizers."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, NamedTuple, Self

import jax
import jax.numpy as jnp

from workbench.core.errors import WorkbenchError


class ConfigError(WorkbenchError, ValueError):
    """A model name, preset or config field that the zoo does not know."""


class Presets:
    """Mixin for a frozen config dataclass: named presets, each a few field overrides.

    The dataclass defaults are the "tiny" preset; ``PRESETS`` maps a name to the fields
    that differ from it.
    """

    __slots__ = ()
    PRESETS: ClassVar[Mapping[str, Mapping[str, Any]]] = {"tiny": {}}

    @classmethod
    def preset(cls, name: str = "tiny", **overrides: Any) -> Self:
        """The preset ``name``, with any fields replaced: ``Config.preset("large", n_layers=24)``."""
        if name not in cls.PRESETS:
            raise ConfigError(
                f"{cls.__module__}.{cls.__qualname__} has no preset {name!r}; "
                f"choose one of {', '.join(map(repr, cls.PRESETS))}."
            )
        return cls.make(**{**cls.PRESETS[name], **overrides})

    @classmethod
    def make(cls, **fields: Any) -> Self:
        """``cls(**fields)``, with a teaching error for a misspelt field."""
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = [k for k in fields if k not in known]
        if unknown:
            raise ConfigError(
                f"{cls.__module__}.{cls.__qualname__} has no field {unknown[0]!r}; "
                f"its fields are {', '.join(known)}."
            )
        return cls(**fields)

    def replace(self, **changes: Any) -> Self:
        return type(self).make(**{**dataclasses.asdict(self), **changes})

    def _check_positive(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"{type(self).__qualname__}.{name} must be a positive int; got {value!r}."
                )


class StepOutput(NamedTuple):
    """What an SGD training step returns: outputs are named ``out/params/...`` and ``out/loss``."""

    params: Any
    loss: jax.Array


def dense(key: jax.Array, shape: tuple[int, ...], fan_in: int, dtype: Any = jnp.float32):
    """A weight drawn from N(0, 1/fan_in)."""
    return jax.random.normal(key, shape, dtype) * jnp.asarray(fan_in**-0.5, dtype)


def softmax_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean negative log-likelihood of integer ``labels`` under ``logits`` (last axis: classes)."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(logp, labels[..., None], axis=-1)
    return -jnp.mean(picked)


def sgd(params: Any, grads: Any, learning_rate: float) -> Any:
    """Plain SGD, under the "optimizer" scope."""
    with jax.named_scope("optimizer"):
        return jax.tree.map(lambda p, g: p - learning_rate * g, params, grads)
