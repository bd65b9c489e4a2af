"""The one registry of named tactics: each registers itself where it is defined
(``@register``), and whatever lists them reads it here (``workbench``, the exports, the CLI,
the widgets). ``from workbench.core.strategies.named import BP`` reads the registry too.
"""

from __future__ import annotations

from workbench.core.errors import TacticError
from workbench.core.propagate.tactics import checked_init

#: Axis names each kind of strategy usually runs on, by convention.
DATA_AXES = ("batch", "data", "dp", "fsdp", "replica")
MODEL_AXES = ("model", "tensor", "tp", "mp", "heads")
STAGE_AXES = ("stage", "stages", "pipe", "pipeline", "pp")
EXPERT_AXES = ("expert", "experts", "ep", "moe")
CONTEXT_AXES = ("context", "ctx", "cp", "seq", "sequence")

#: Every named tactic by class name: the strategies and the tactics that partition nothing
#: (``Role``, ``Place``), in the order they registered.
NAMED: dict[str, type] = {}

#: The named strategies by name, in the order a user meets them.
STRATEGIES: dict[str, type] = {}

_PLACE: dict[str, int] = {}  # strategy -> its place in STRATEGIES
_AXES: dict[str, str] = {}  # strategy -> the kind of axis it runs on (see conventional_axis)
_KINDS = ("data", "model", "expert", "context")


def register(*, axes: str | None = None, place: int = 0):
    """Class decorator: enter a named tactic in the registry under its class name (a second
    registration of a name is a bug); a call with wrong arguments raises ``TacticInputError``.
    A strategy gives ``axes``, the kind of mesh axis it usually runs on (one of ``_KINDS``,
    see ``suggested_axis``), and its ``place`` among the strategies; a tactic without
    ``axes`` is no strategy (it partitions nothing, or it needs settings, as ``PP``)."""
    if axes is not None and axes not in _KINDS:
        raise ValueError(f"axes must be one of {_KINDS} or None; got {axes!r}")

    def enter(cls: type) -> type:
        cls = checked_init(cls)  # unknown or missing arguments: a TacticInputError
        name = cls.__name__
        if name in NAMED:
            raise ValueError(f"a named tactic {name!r} is registered already: {NAMED[name]}")
        NAMED[name] = cls
        if axes is not None:
            _AXES[name], _PLACE[name] = axes, place
            ordered = sorted([*STRATEGIES.items(), (name, cls)], key=lambda kv: _PLACE[kv[0]])
            STRATEGIES.clear()  # in place: readers hold this dict
            STRATEGIES.update(ordered)
        return cls

    return enter


def suggested_axis(strategy: str, mesh) -> str:
    """The mesh axis a named strategy runs on unless told otherwise: a data-like axis for
    BP, Z2 and Z3 (else the first axis), an expert-like one for EP and a context-like one
    for CP (else a data-like one, as both split tokens), a model-like one for the rest (else
    the last)."""
    if strategy not in STRATEGIES:
        raise TacticError(
            f"unknown strategy {strategy!r}; the named strategies are {list(STRATEGIES)}."
        )
    return conventional_axis(_AXES[strategy], mesh)


def conventional_axis(kind: str, mesh) -> str:
    """The mesh axis named by convention for ``kind`` (``"data"``, ``"model"``, ``"stage"``,
    ``"expert"`` or ``"context"``) work; else, for experts and context, the data axis; else
    the first axis, or the last for model."""
    conventional = {
        "data": DATA_AXES,
        "model": MODEL_AXES,
        "stage": STAGE_AXES,
        "expert": EXPERT_AXES,
        "context": CONTEXT_AXES,
    }[kind]
    for name in mesh.names:
        if name.lower() in conventional:
            return name
    if kind in ("expert", "context"):
        return conventional_axis("data", mesh)
    return mesh.names[-1] if kind == "model" else mesh.names[0]


def __getattr__(name: str):
    # a named tactic by name, as the families registered it (the package imports them all)
    if name in NAMED:
        return NAMED[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
