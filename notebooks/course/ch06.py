"""Checks for chapter 6, memory (notebooks/course_06_*.ipynb)."""

from __future__ import annotations

import workbench as wb
from workbench.core.units import format_bytes

from .common import call, close, ok, require, unanswered
from .common import fits as fits  # the memory exercises' check

#: The sizes 6.2 is tried on besides the notebook's config: (tiny LM overrides, t).
SIZES = (
    ({}, 2),
    ({}, 4),
    (dict(d_model=64, n_heads=8, d_ff=128, n_layers=3), 8),
)


def engine_state_bytes(cfg, t: int) -> int:
    """Parameters + gradients + optimizer state per device the engine holds for the LM of
    ``cfg`` under BP + MP with ``t`` devices on the tensor-parallel axis (8 in all)."""
    from workbench.core import hardware as hw
    from workbench.models import build

    e = build("lm", cfg, abstract=True)
    mesh = wb.Mesh({"batch": 8 // t, "model": t})
    s = wb.Session(wb.capture(e.fn, *e.args), mesh, [wb.BP("batch"), wb.MP("model")])
    return sum(s.estimate(hw.H100).memory.states.values())


def model_state(fn, cfg) -> None:
    """Exercise 6.2: ``fn(cfg, t)`` gives the model state per device under BP + MP over
    ``t`` devices, within 5%, on the notebook's config and on other sizes and degrees."""
    from workbench.models import lm

    unanswered(None if fn is ... else fn, "a function of the config and t")
    require(callable(fn), f"expected a function model_state_bytes(cfg, t); got {fn!r}.")
    mixed = dict(dtype=cfg.dtype, master_weights=cfg.master_weights)
    cases = [(cfg, 4)] + [(lm.Config.preset("tiny", **mixed, **o), t) for o, t in SIZES]
    for c, t in cases:
        got = call(fn, c, t, what=f"model_state_bytes(cfg, {t})")
        want = engine_state_bytes(c, t)
        require(
            close(got, want, 0.05),
            f"with d_model={c.d_model}, n_heads={c.n_heads}, d_ff={c.d_ff}, "
            f"n_layers={c.n_layers}, vocab={c.vocab} and t={t}, your function gives "
            f"{format_bytes(got)}, {'more' if got > want else 'less'} than the engine holds "
            "(more than 5% off). Which parameters does MP split t ways, which stay whole on "
            "every device, and how many bytes does each parameter cost in mixed precision?",
        )
    ok(f"your function is within 5% of the engine on {len(cases)} configs and degrees")
