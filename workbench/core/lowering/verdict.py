"""The verdict on a run: does the partitioned program compute what the unpartitioned one does?

Both runs are measured against the program computed in float64 on the same inputs, which
also gives each element its *rounding scale* (``rounding``): the error an evaluation in the
program's own dtypes may make there, from the magnitudes of the terms that make it and how
the ops after them amplify their errors (an optimizer's division by a near-zero gradient's
size included). A floating element *agrees* when the partitioned result is within ``SCALES``
rounding scales of float64, or within ``FACTOR`` times the unpartitioned run's largest error
over that output (or ``ULPS`` epsilons of its largest magnitude): partitioning may sum in
another order, but it must not be less accurate than the program it partitions.

Non-numbers agree when the partitioned run has them where the unpartitioned run or float64
has the same (NaN, +inf or -inf); complex values are compared by their distance in the
plane; integers, booleans and PRNG keys must equal the unpartitioned run's or float64's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.core.dtypes import epsilon, is_extended, key_data

SCALES = 8.0  # a partitioned element may be this many rounding scales from float64
FACTOR = 16.0  # ... or this many times the unpartitioned run's largest error on the output
ULPS = 8  # ... or this many epsilons of the output's largest magnitude


@dataclass(frozen=True, slots=True)
class Check:
    """One output (or probed value) judged against float64; its worst element, relative to
    what it was allowed."""

    name: str
    role: str  # "parameter", "optimizer state", "output" or "value"
    ok: bool
    error: float = 0.0  # |partitioned - float64| at the worst element
    allowed: float = 0.0  # ... and what that element was allowed
    scale: float = 0.0  # ... its rounding scale
    baseline: float = 0.0  # the unpartitioned run's largest error on this output
    where: tuple = ()  # the worst element's index
    bad: int = 0  # elements out of tolerance
    size: int = 0
    reason: str = ""  # for a failure that is not a distance: a NaN, an integer

    @property
    def margin(self) -> float:
        """The worst element's error over its allowance (above 1: out of tolerance)."""
        if self.reason:
            return np.inf
        return self.error / self.allowed if self.allowed > 0 else (np.inf if self.error else 0.0)

    def __str__(self) -> str:
        where = f"[{', '.join(map(str, self.where))}]" if self.where else ""
        if self.reason:
            return f"{self.name} ({self.role}): {self.reason}"
        head = f"{self.name} ({self.role}): "
        if not self.ok:
            head += f"{self.bad} of {self.size} elements out of tolerance; "
        why = (
            f"{SCALES:g} rounding scales of {self.scale:.2g}"
            if self.allowed == SCALES * self.scale
            else f"{FACTOR:g}x the unpartitioned run's largest error {self.baseline:.2g}"
            if self.allowed == FACTOR * self.baseline
            else f"{ULPS} epsilons of the output's largest magnitude"
        )
        return (
            f"{head}largest error {self.error:.2g}{' at ' + where if where else ''} from "
            f"float64, allowed {self.allowed:.2g} ({why})"
        )


@dataclass(frozen=True)
class Verdict:
    """Every output's check, and where the partitioned program first departs (if it does)."""

    checks: tuple[Check, ...]
    first: str | None = None  # the first differing value, its op and the tactic that shaped it

    @property
    def agree(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def differing(self) -> tuple[Check, ...]:
        """The checks that failed, the worst (relative to its allowance) first."""
        return tuple(sorted((c for c in self.checks if not c.ok), key=lambda c: -c.margin))

    def closest(self) -> Check | None:
        """The agreeing check nearest its allowance."""
        ok = [c for c in self.checks if c.ok and c.size]
        return max(ok, key=lambda c: c.margin) if ok else None

    def __str__(self) -> str:
        if self.agree:
            closest = self.closest()
            near = f"; closest: {closest}" if closest is not None and closest.error else ""
            return (
                f"agree: all {len(self.checks)} outputs are within rounding of a float64 "
                f"reference (each element within {SCALES:g} of its rounding scales, or "
                f"{FACTOR:g}x the unpartitioned run's largest error){near}"
            )
        lines = [f"DIFFER: {len(self.differing)} of {len(self.checks)} outputs"]
        lines += [f"  {c}" for c in self.differing[:5]]
        if self.first:
            lines.append(f"first differing value: {self.first}")
        return "\n".join(lines)


def _numbers(x) -> np.ndarray:
    a = np.asarray(key_data(x))
    return a.astype(np.complex128 if np.iscomplexobj(a) else np.float64)


def _classes(a: np.ndarray) -> np.ndarray:
    """0 a finite number, 1 NaN, 2 +inf, 3 -inf (complex: by its worse part)."""
    parts = (a.real, a.imag) if np.iscomplexobj(a) else (a,)
    out = np.zeros(a.shape, np.int8)
    for x in parts:
        out = np.maximum(out, np.where(np.isnan(x), 1, np.where(x == np.inf, 2, 0)))
        out = np.where((out == 0) & (x == -np.inf), 3, out)
    return out


_CLASS = ("a number", "NaN", "+inf", "-inf")


def _index(flat: int, shape) -> tuple:
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


def check(name, role, part, unpart, ref, dtype, scale=None) -> Check:
    """Judge one array (see the module doc): ``scale`` is its rounding scale (``rounding``),
    ``dtype`` the one whose epsilon sets the floor."""
    exact = is_extended(getattr(ref, "dtype", None)) or not np.issubdtype(
        np.asarray(key_data(ref)).dtype, np.inexact
    )
    p, u, r = (np.asarray(key_data(a)) for a in (part, unpart, ref))
    if r.size == 0:
        return Check(name, role, True)
    if p.shape != r.shape:
        return Check(name, role, False, reason=f"shape {p.shape}, expected {r.shape}")
    if exact:
        bad = (p != u) & (p != r)
        if not bad.any():
            return Check(name, role, True, size=r.size)
        k = int(np.flatnonzero(bad)[0])
        at = _index(k, r.shape)
        return Check(
            name, role, False, where=at, bad=int(bad.sum()), size=r.size,
            reason=f"{int(bad.sum())} of {r.size} elements differ (first at {list(at)}: "
            f"{p.flat[k]}, the unpartitioned run has {u.flat[k]}); integers must be equal",
        )  # fmt: skip
    p, u, r = _numbers(p), _numbers(u), _numbers(r)
    cp, cu, cr = _classes(p), _classes(u), _classes(r)
    finite = (cp == 0) & (cu == 0) & (cr == 0)
    special = ~finite & (cp != cu) & (cp != cr)
    if special.any():
        k = int(np.flatnonzero(special)[0])
        return Check(
            name, role, False, where=_index(k, r.shape), bad=int(special.sum()), size=r.size,
            reason=f"{_CLASS[cp.flat[k]]} at {list(_index(k, r.shape))} where the unpartitioned "
            f"run has {_CLASS[cu.flat[k]]} and float64 {_CLASS[cr.flat[k]]}",
        )  # fmt: skip
    e = np.zeros(r.shape) if scale is None else np.nan_to_num(np.asarray(scale), nan=0.0)
    with np.errstate(invalid="ignore"):  # inf - inf where both are inf: not compared
        dp = np.where(finite, np.abs(p - r), 0.0)
        du = np.where(finite, np.abs(u - r), 0.0)
    base = float(dp.size and du.max())
    floor = ULPS * epsilon(dtype) * float(np.abs(np.where(finite, r, 0)).max())
    tensor = max(FACTOR * base, floor)
    allowed = np.maximum(SCALES * e, tensor)
    ratio = np.where(finite, dp / np.where(allowed > 0, allowed, np.inf), 0.0)
    ratio = np.where(finite & (allowed == 0) & (dp > 0), np.inf, ratio)
    k = int(np.argmax(ratio))
    bad = int((ratio > 1).sum())
    return Check(
        name, role, bad == 0, float(dp.flat[k]), float(allowed.flat[k]), float(e.flat[k]),
        base, _index(k, r.shape), bad, r.size,
    )  # fmt: skip


def judge(program, partitioned, unpartitioned, reference, scales, dtypes) -> Verdict:
    """A verdict on every output: ``scales`` are the rounding scales of ``reference``."""
    anatomy = program.anatomy()
    updated = {out for out in anatomy.new_params.values()}
    state_outs = {out for p in anatomy.parameters for out in anatomy.updates.get(p, ())}
    checks = []
    for j, v in enumerate(program.outputs):
        own = str(program.values[v].dtype) if isinstance(v, int) else "float32"
        role = "parameter" if v in updated else "optimizer state" if v in state_outs else "output"
        name, dtype = program.output_names[j], dtypes[j] or own
        part, unpart, ref = partitioned[j], unpartitioned[j], reference[j]
        checks.append(check(name, role, part, unpart, ref, dtype, scales[j]))
    return Verdict(tuple(checks))
