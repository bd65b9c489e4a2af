"""What `Auto` takes: each argument checked when the tactic is made, before any search, so a
bad one is an error that says what would work and a search always ends within its bounds."""

from __future__ import annotations

import math
import numbers

from workbench.core.errors import InputError, LimitError, TacticError, given
from workbench.core.hardware.names import resolve

#: The most simulator evaluations one search may spend (each costs a propagation and an
#: estimate of the whole program: from milliseconds to seconds).
MAX_BUDGET = 100_000
#: The longest a search may run, in seconds (a day).
MAX_SECONDS = 86_400.0
GOALS = ("time", "memory")


class AutoInputError(TacticError, InputError):
    """An argument of `Auto` that it cannot use (also a `TacticError` and a ``ValueError``)."""


class AutoLimitError(AutoInputError, LimitError):
    """A budget, a duration or a memory limit of `Auto` outside its bounds."""


def _real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def check_axes(axes) -> tuple[str, ...]:
    """``axes`` as a tuple of axis names: one name or a list of them."""
    if isinstance(axes, str):
        axes = (axes,)
    elif isinstance(axes, list | tuple):
        axes = tuple(axes)
    if not (isinstance(axes, tuple) and axes and all(isinstance(a, str) and a for a in axes)):
        raise AutoInputError(
            f"Auto needs a mesh axis name or a list of them, e.g. Auto('model'); "
            f"got axes={given(axes)}."
        )
    return axes


def check_auto(auto) -> None:
    """Every argument of ``auto`` but its axes, in the order a reader finds them."""
    if auto.goal not in GOALS:
        raise AutoInputError(
            f"Auto({', '.join(map(repr, auto.axes))}): goal must be 'time' or 'memory'; "
            f"got goal={given(auto.goal)}."
        )
    limit = auto.memory_limit
    if limit is not None and not (_real(limit) and math.isfinite(limit) and limit > 0):
        raise AutoLimitError(
            f"Auto's memory_limit={given(limit)} is not a positive, finite number of bytes per "
            "device; give one (e.g. 16 * 2**30 for 16 GiB), or None for no limit."
        )
    budget = auto.budget
    if not _int(budget):
        raise AutoInputError(
            f"Auto's budget={given(budget)} is not a whole number of simulator evaluations; "
            f"give an integer from 1 to {MAX_BUDGET:,} (e.g. budget=300), and seconds= to "
            "bound the time."
        )
    if not 1 <= budget <= MAX_BUDGET:
        raise AutoLimitError(
            f"Auto's budget={budget:,} evaluations is outside 1 to {MAX_BUDGET:,}; give one "
            "in that range (each evaluation prices a whole plan; 300 is the default)."
        )
    seconds = auto.seconds
    if seconds is not None and not (_real(seconds) and 0 < seconds <= MAX_SECONDS):
        raise AutoLimitError(
            f"Auto's seconds={given(seconds)} is not a duration from above 0 to "
            f"{MAX_SECONDS:,.0f} seconds (a day); give one (e.g. seconds=60), or None to "
            "bound the search by its budget alone."
        )
    if not _int(auto.seed):
        raise AutoInputError(f"Auto's seed={given(auto.seed)} is not an integer; give one, e.g. 0.")
    if not isinstance(auto.inputs, str):
        raise AutoInputError(
            f"Auto's inputs={given(auto.inputs)} is not a selector; give a glob of the inputs "
            "the search may decide, e.g. 'params/**' ('**' for all)."
        )
    if not (_real(auto.exploration) and math.isfinite(auto.exploration) and auto.exploration >= 0):
        raise AutoInputError(
            f"Auto's exploration={given(auto.exploration)} is not a finite number of at least "
            "0; give one (0.5 is the default; more explores more)."
        )
    if auto.callback is not None and not callable(auto.callback):
        raise AutoInputError(
            f"Auto's callback={given(auto.callback)} is not callable; give a function of one "
            "Progress, or None."
        )
    if auto.hardware is not None:
        try:
            resolve(auto.hardware)
        except InputError as err:
            raise AutoInputError(f"Auto's {err}") from None


def hardware_of(auto):
    """The `Hardware` ``auto`` prices plans on (default: the H100 preset)."""
    return resolve("h100" if auto.hardware is None else auto.hardware)
