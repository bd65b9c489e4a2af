"""The model zoo: small training steps in pure JAX, for tests, notebooks and benchmarks.

    ex = build("lm", "tiny")                    # real arrays
    ex = build("lm", "huge", abstract=True)     # ShapeDtypeStructs, nothing allocated
    ex = build("lm_scan", lm.Config.preset("large", n_layers=24), abstract=True)
    ex = build("lm", lm.Config.preset("tiny", n_experts=4, top_k=2, dispatch="gather"))
    program = wb.capture(ex.fn, *ex.args)

Every model module has a frozen ``Config`` with presets ("tiny", "small", "large"),
``init(config, key)`` returning the step's arguments, and ``train_step``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax

from workbench.models import cnn, gnn, lm, mlp, moe
from workbench.models._common import ConfigError

#: Concrete builds larger than this raise: plan such models with ``abstract=True``.
MAX_CONCRETE_BYTES = 8 * 2**30


@dataclass(frozen=True, slots=True)
class Model:
    """A zoo entry: how to make a config, the step's arguments, and the step."""

    name: str
    config_cls: type
    init: Callable[[Any, jax.Array], tuple]
    step: Callable
    description: str

    def config(self, size: str | Any = "tiny", **overrides: Any) -> Any:
        """A preset name or a config of this model's class, with fields replaced."""
        if isinstance(size, str):
            return self.config_cls.preset(size, **overrides)
        if not isinstance(size, self.config_cls):
            expected = f"{self.config_cls.__module__}.{self.config_cls.__qualname__}"
            raise ConfigError(
                f"model {self.name!r} expected a preset name or a {expected}, "
                f"found {type(size).__module__}.{type(size).__qualname__}."
            )
        return size.replace(**overrides) if overrides else size


@dataclass(frozen=True, slots=True)
class Example:
    """A model ready to run or capture: ``fn(*args)`` is one training step."""

    name: str
    fn: Callable
    args: tuple
    config: Any
    description: str = ""

    @property
    def params(self) -> Any:
        """The parameters (the step's first argument)."""
        return self.args[0]

    @property
    def n_params(self) -> int:
        return sum(math.prod(x.shape) for x in jax.tree.leaves(self.params))

    @property
    def abstract(self) -> bool:
        return all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(self.args))


ZOO: dict[str, Model] = {
    m.name: m
    for m in (
        Model("mlp", mlp.Config, mlp.init, mlp.train_step, "MLP regressor, MSE loss, SGD"),
        Model("lm", lm.Config, lm.init, lm.train_step, "GPT-style decoder, unrolled layers, Adam"),
        Model(
            "lm_scan",
            lm.Config,
            lm.init_scan,
            lm.train_step,
            "GPT-style decoder, layers stacked under lax.scan, Adam",
        ),
        Model("cnn", cnn.Config, cnn.init, cnn.train_step, "convolutional image classifier, SGD"),
        Model("gnn", gnn.Config, gnn.init, gnn.train_step, "message-passing graph network, SGD"),
    )
}


def names() -> list[str]:
    """The zoo's model names."""
    return list(ZOO)


def _nbytes(tree: Any) -> int:
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def build(
    name: str, size: str | Any = "tiny", *, abstract: bool = False, seed: int = 0, **overrides: Any
) -> Example:
    """Model ``name`` at a preset (or config), with its step function and arguments.

    ``abstract=True`` gives ``jax.ShapeDtypeStruct``s and allocates nothing. Keyword
    ``overrides`` replace config fields: ``build("lm", "large", n_layers=24)``.
    """
    if name not in ZOO:
        raise ConfigError(
            f"the zoo has no model {name!r}; choose one of {', '.join(map(repr, ZOO))}."
        )
    model = ZOO[name]
    config = model.config(size, **overrides)

    def make():
        return tuple(model.init(config, jax.random.key(seed)))

    shapes = jax.eval_shape(make)
    if not abstract and _nbytes(shapes) > MAX_CONCRETE_BYTES:
        raise ConfigError(
            f"model {name!r} at {config!r} needs {_nbytes(shapes) / 2**30:,.1f} GiB of arguments; "
            f"build it with abstract=True to plan from shapes, or pick a smaller preset."
        )
    args = shapes if abstract else make()
    step, options = model.step, {}
    if getattr(config, "remat", False):  # the step recomputes its blocks in the backward pass
        options["remat"] = getattr(config, "remat_policy", None) or True
    if getattr(config, "n_experts", 0):  # the step routes its experts as the config says
        options["config"] = config
    if options:
        step = functools.update_wrapper(functools.partial(step, **options), step)
    return Example(name, step, args, config, model.description)


__all__ = [
    "ZOO",
    "ConfigError",
    "Example",
    "Model",
    "build",
    "cnn",
    "gnn",
    "lm",
    "mlp",
    "moe",
    "names",
]
