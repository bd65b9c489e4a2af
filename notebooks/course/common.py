"""What every chapter's checks share: failing with a hint, building sessions from the
learner's tactics, and the roles of a program's values read from its anatomy."""

from __future__ import annotations

import math
import numbers
import warnings

import workbench as wb
from workbench.core.units import format_bytes

__all__ = [
    "CheckFailed",
    "as_list",
    "blocks",
    "call",
    "close",
    "data_inputs",
    "fits",
    "gradients",
    "matrices",
    "no_conflicts",
    "ok",
    "own_model",
    "parameters",
    "phase",
    "primitive_only",
    "require",
    "scope",
    "session",
    "unanswered",
]


class CheckFailed(AssertionError):
    """An exercise's answer is not right yet; the message is a hint."""


def require(condition: bool, hint: str) -> None:
    __tracebackhide__ = True
    if not condition:
        raise CheckFailed(hint)


def ok(message: str) -> None:
    print("✓ " + message)


def unanswered(answer, what: str) -> None:
    """Refuse the placeholder an exercise cell ships with (``...`` or None)."""
    __tracebackhide__ = True
    if answer is ... or answer is None:
        raise CheckFailed(f"not answered yet: replace the ... in the cell above with {what}.")


def call(fn, *args, what: str = "", number: bool = True):
    """What the learner's function returns for ``args``; a hint instead of a traceback when it
    raises, returns nothing yet, or (``number``) returns something other than a number."""
    __tracebackhide__ = True
    where = f" for {what}" if what else ""
    try:
        got = fn(*args)
    except CheckFailed:
        raise
    except Exception as e:  # the learner's code: say what it raised
        raise CheckFailed(f"your function raised {type(e).__name__}: {e}{where}.") from None
    require(
        got is not None and got is not ...,
        "your function returns nothing yet: replace the ... with the code that computes it.",
    )
    if number:
        real = isinstance(got, numbers.Real) and not isinstance(got, bool)
        require(
            real and math.isfinite(got), f"your function returned {got!r}{where}; return a number."
        )
    return got


def fits(program, mesh, schedule, hardware) -> None:
    """The reader's schedule fits the device's memory (exercises 6.1, 6.3 and 10.3)."""
    s = session(program, mesh, schedule)
    no_conflicts(s)
    m = s.estimate(hardware).memory
    parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in m.at_peak.items() if v)
    require(
        m.fits,
        f"peak {format_bytes(m.peak)} per device, over the {format_bytes(m.capacity)} "
        f"available ({parts}). Which category is largest, and which tactic divides it?",
    )
    ok(f"peak {format_bytes(m.peak)} of {format_bytes(m.capacity)} per device ({parts})")


def close(got: float, expected: float, rel: float) -> bool:
    return math.isclose(got, expected, rel_tol=rel, abs_tol=0.5)


def as_list(tactics) -> list:
    if isinstance(tactics, wb.Tactic):
        return [tactics]
    require(
        isinstance(tactics, list | tuple) and all(isinstance(t, wb.Tactic) for t in tactics),
        f"expected a tactic or a list of tactics (wb.Tile, wb.BP, ...); got {tactics!r}.",
    )
    return list(tactics)


PRIMITIVES = (wb.Tile, wb.Replicate, wb.Atomic)


def primitive_only(tactics) -> list:
    """The learner's tactics, refused unless every one is a primitive (Tile, Replicate,
    Atomic): the exercise is to write a named strategy's work by hand."""
    __tracebackhide__ = True
    unanswered(tactics, "a tactic or a list of tactics")
    tactics = as_list(tactics)
    for t in tactics:
        require(
            isinstance(t, PRIMITIVES),
            f"{t} is a named strategy; this exercise asks for primitive tactics only "
            "(wb.Tile, wb.Replicate, wb.Atomic): write what the strategy does by hand.",
        )
    return tactics


def session(program, mesh, tactics) -> wb.Session:
    __tracebackhide__ = True
    unanswered(tactics, "a tactic or a list of tactics")
    try:
        return wb.Session(program, mesh, as_list(tactics))
    except wb.WorkbenchError as e:
        raise CheckFailed(f"the engine refused your schedule: {e}") from None


def no_conflicts(s: wb.Session, hint: str = "") -> None:
    __tracebackhide__ = True
    if s.conflicts:
        raise CheckFailed(
            f"propagation stopped on {len(s.conflicts)} conflict(s); the first:\n"
            f"{s.conflicts[0]}\n{hint}".rstrip()
        )


def phase(program, c) -> str:
    """Where the op that needs collective ``c`` runs: forward, backward, optimizer or output."""
    return "output" if c.op is None else program.ops[c.op].phase


def scope(program, value_id: int) -> tuple[str, ...]:
    producer = program.values[value_id].producer
    return () if producer is None else tuple(program.ops[producer].scope)


# -- roles, from the anatomy (never from names) -------------------------------------------
def parameters(program) -> list[str]:
    """The names of what the optimizer updates from a gradient."""
    return [program.values[v].name for v in program.anatomy().parameters]


def gradients(program) -> dict[str, str]:
    """Parameter name -> its gradient's name."""
    values = program.values
    return {values[p].name: values[g].name for p, g in program.anatomy().gradients.items()}


def data_inputs(program) -> list[tuple[str, int | None]]:
    """``(name, batch dim)`` of each data input (None: it has no batch dim)."""
    return [(program.values[v].name, d) for v, d in program.anatomy().data]


def blocks(program) -> list[tuple[str, ...]]:
    """The parameters of each repeated block (the layers), in order."""
    values = program.values
    return [tuple(values[v].name for v in b) for b in program.anatomy().layers.blocks]


def matrices(program, names=None) -> list[str]:
    """The parameters (or ``names``) with two dims or more: the weight matrices."""
    names = parameters(program) if names is None else names
    return [n for n in names if len(program.value(n).shape) >= 2]


def own_model(name: str = "hf_gpt2", abstract: bool = True):
    """A model the course did not write, captured: by default the tour's GPT-2 (Hugging
    Face's Flax GPT-2 and the training step its examples write), from shapes alone unless
    ``abstract=False`` (nothing is initialised: seconds instead of half a minute). Replace
    the call with ``wb.capture(your_step, *your_args)`` to bring your own."""
    from workbench.models.external import build_external

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        example = build_external(name, abstract=abstract)
        return wb.capture(example.fn, *example.args)
