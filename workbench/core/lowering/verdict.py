"""The verdict on a run: does the partitioned program compute what the unpartitioned one does?

Both are measured against the program computed in float64 on the same inputs
(`workbench.core.lowering.float64`). An output *agrees* when the partitioned result is no
farther from that reference than the unpartitioned result is, by at most ``FACTOR`` in the
root mean square of the error and ``MAX_FACTOR`` in its largest element (or within ``ULPS``
machine epsilons of the output's scale): partitioning may sum in another order, but it must
not be less accurate than the program it partitions. (The mean is the steady measure; the
largest element of two rounding-error fields can differ by several times by chance.)

Adam and its kin turn rounding noise in a near-zero gradient into a full learning-rate-sized
step: a gradient element whose float64 value lies within ``NOISE`` times the unpartitioned
gradient's own rounding error of zero has no meaningful sign. Those elements of an updated
parameter are held to ``UPDATE_FACTOR`` times the step's largest update (the learning rate,
in Adam's units) instead; every other element, the optimizer state (Adam's moments are
averaged gradients) and the loss are held to the strict rule. So a wrong gradient is still
caught, through the loss, the moments and the parameters' well-defined elements.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.core.dtypes import is_extended, key_data

FACTOR = 4.0  # the partitioned result's RMS error may be this many times the unpartitioned's
MAX_FACTOR = 16.0  # ... and its largest error this many times
ULPS = 8  # ... or either within this many epsilons of the output's largest magnitude
NOISE = 8.0  # a gradient element within this many rounding errors of zero has no sign
UPDATE_FACTOR = 2.0  # such an element of a parameter may move by this many largest updates


@dataclass(frozen=True, slots=True)
class Check:
    """One output (or probed value) judged: its errors against the float64 reference."""

    name: str
    role: str  # "parameter", "optimizer state", "output" or "value"
    error: float  # max |partitioned - float64| over the strictly judged elements
    baseline: float  # max |unpartitioned - float64| over the same elements
    tolerance: float
    ok: bool
    rms: float = 0.0  # root mean square of partitioned - float64 over those elements
    rms_baseline: float = 0.0  # ... and of unpartitioned - float64
    rms_tolerance: float = 0.0
    noisy: int = 0  # elements of a parameter judged by the update tolerance
    noisy_error: float = 0.0
    noisy_tolerance: float = 0.0

    def __str__(self) -> str:
        text = (
            f"{self.name} ({self.role}): from float64 {self.error:.3g} at most and {self.rms:.3g} "
            f"RMS, against the unpartitioned {self.baseline:.3g} and {self.rms_baseline:.3g} "
            f"(tolerance {self.tolerance:.3g} and {self.rms_tolerance:.3g})"
        )
        if self.noisy:
            text += (
                f"; {self.noisy} elements with a gradient lost in rounding: "
                f"{self.noisy_error:.3g} (tolerance {self.noisy_tolerance:.3g}, the update's size)"
            )
        return text + ("" if self.ok else "  <- differs")


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
        """The checks that failed, the worst (relative to its tolerance) first."""
        bad = [c for c in self.checks if not c.ok]
        return tuple(sorted(bad, key=lambda c: -c.error / max(c.tolerance, 1e-300)))

    def __str__(self) -> str:
        if self.agree:
            return (
                f"agree: all {len(self.checks)} outputs are as close to a float64 reference as "
                f"the unpartitioned program's (RMS within {FACTOR:g}x, largest error within "
                f"{MAX_FACTOR:g}x)"
            )
        lines = [f"DIFFER: {len(self.differing)} of {len(self.checks)} outputs"]
        lines += [f"  {c}" for c in self.differing[:5]]
        if self.first:
            lines.append(f"first differing value: {self.first}")
        return "\n".join(lines)


def _numbers(x) -> np.ndarray:
    return np.asarray(key_data(x), dtype=np.float64)


def epsilon(dtype) -> float:
    """Machine epsilon of a float dtype name; 0 for integers, booleans and keys."""
    try:
        return float(np.finfo(np.dtype(dtype)).eps)
    except (TypeError, ValueError):
        import ml_dtypes

        try:
            return float(ml_dtypes.finfo(dtype).eps)
        except (TypeError, ValueError):
            return 0.0


def check(name, role, part, unpart, ref, dtype, *, grad=None, grad_ref=None, before=None) -> Check:
    """Judge one array (see the module doc). ``grad``/``grad_ref``: its gradient in the
    unpartitioned run and in float64, and ``before`` the parameter's value before the step,
    for an updated parameter."""
    p, u, r = _numbers(part), _numbers(unpart), _numbers(ref)
    if r.size == 0:
        return Check(name, role, 0.0, 0.0, 0.0, True)
    exact = is_extended(getattr(ref, "dtype", None))
    floor = 0.0 if exact else ULPS * epsilon(dtype) * float(np.max(np.abs(r)))
    strict = np.ones(r.shape, dtype=bool)
    noisy_err = noisy_tol = 0.0
    if grad is not None and r.shape == np.shape(grad):
        g, gr = _numbers(grad), _numbers(grad_ref)
        noise = float(np.max(np.abs(g - gr))) if g.size else 0.0
        strict = np.abs(gr) > NOISE * noise
        if not strict.all():
            step = float(np.max(np.abs(r - _numbers(before))))
            noisy_tol = max(UPDATE_FACTOR * step, floor)
            noisy_err = float(np.max(np.abs(p - r)[~strict]))
    dp, du = np.abs(p - r)[strict], np.abs(u - r)[strict]
    err, base = float(np.max(dp, initial=0.0)), float(np.max(du, initial=0.0))
    rms = float(np.sqrt(np.mean(dp**2))) if dp.size else 0.0
    rms_base = float(np.sqrt(np.mean(du**2))) if du.size else 0.0
    tol, rms_tol = max(MAX_FACTOR * base, floor), max(FACTOR * rms_base, floor)
    ok = err <= tol and rms <= rms_tol and noisy_err <= noisy_tol
    noisy = int((~strict).sum())
    return Check(
        name, role, err, base, tol, ok, rms, rms_base, rms_tol, noisy, noisy_err, noisy_tol
    )


def judge(program, flat, partitioned, unpartitioned, reference, extras, dtypes) -> Verdict:
    """A verdict on every output. ``extras``: ``(unpartitioned, float64)`` arrays of the
    anatomy's gradients, in the order of ``gradient_probes(program)``."""
    anatomy = program.anatomy()
    updated = {out: p for p, out in anatomy.new_params.items()}
    state_outs = {out for p in anatomy.parameters for out in anatomy.updates.get(p, ())}
    grads = dict(zip(gradient_probes(program), extras))
    checks = []
    for j, v in enumerate(program.outputs):
        name = program.output_names[j]
        own = str(program.values[v].dtype) if isinstance(v, int) else "float32"
        dtype = dtypes[j] or own
        p = updated.get(v)
        if p is not None and anatomy.gradients.get(p) in grads:
            g_u, g_r = grads[anatomy.gradients[p]]
            before = flat[program.inputs.index(p)]
            c = check(
                name, "parameter", partitioned[j], unpartitioned[j], reference[j], dtype,
                grad=g_u, grad_ref=g_r, before=before,
            )  # fmt: skip
        else:
            role = (
                "parameter" if p is not None else "optimizer state" if v in state_outs else "output"
            )
            c = check(name, role, partitioned[j], unpartitioned[j], reference[j], dtype)
        checks.append(c)
    return Verdict(tuple(checks))


def gradient_probes(program) -> tuple[int, ...]:
    """The gradients of the parameters the step updates, as top-level value ids."""
    a = program.anatomy()
    out = []
    for p in a.parameters:
        g = a.gradients.get(p)
        if p in a.new_params and g is not None and program.values[g].region_of is None:
            out.append(g)
    return tuple(dict.fromkeys(out))
