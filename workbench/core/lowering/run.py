"""Run a session's partitioned program on the attached devices and check it against the
unpartitioned one: outputs, errors, step time (median after warm-up) and memory. Steps run
as a training loop runs them: the inputs an output replaces are donated and the next step
reads that output, as the simulator's memory and step time assume."""

from __future__ import annotations

import dataclasses
import hashlib
import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from workbench.core import progress
from workbench.core.dtypes import impl_name, is_extended, key_data, words
from workbench.core.lowering.arguments import checked_arguments
from workbench.core.lowering.explicit import spec
from workbench.core.lowering.interpret import Interpreter
from workbench.core.lowering.rounding import reference_with_scales
from workbench.core.lowering.verdict import Check, Verdict, check, judge
from workbench.core.ops.random import sharding_notes
from workbench.core.strategies.pipeline import pipeline_of
from workbench.core.units import format_bytes, format_seconds

#: (relative tolerance, absolute floor) per output dtype, for a plain comparison of two runs
#: (``compare``; a run's verdict is ``verdict.judge``'s)
TOLERANCE = {
    "float64": (1e-9, 1e-12),
    "float32": (2e-4, 1e-5),
    "bfloat16": (2e-2, 1e-2),
    "float16": (5e-3, 1e-3),
    "key": (0.0, 0.0),  # PRNG keys: their words must be equal
}


@dataclass(frozen=True)
class RunResult:
    """What one run measured."""

    lowering: str
    device: str
    outputs: Any  # the partitioned program's outputs, as the function's pytree
    reference: Any  # the unpartitioned program's outputs
    max_abs_error: float  # partitioned against unpartitioned, for information
    max_rel_error: float
    verdict: Verdict  # both against a float64 reference: do they agree?
    step_time_s: float  # median over ``times_s``
    times_s: tuple[float, ...]
    compile_time_s: float
    memory: dict = field(default_factory=dict)  # per device, from XLA's memory_analysis
    donated: tuple[str, ...] = ()  # inputs the timed steps donated (run as a training loop)
    notes: tuple[str, ...] = ()  # what holds for this program under sharding (random bits)

    @property
    def matches(self) -> bool:
        """The verdict: the partitioned program is as accurate as the unpartitioned one."""
        return self.verdict.agree

    @property
    def differing(self) -> tuple[Check, ...]:
        """The outputs that differ, worst first."""
        return self.verdict.differing

    def __str__(self) -> str:
        mem = self.memory.get("peak_memory_in_bytes") or self.memory.get("temp_size_in_bytes", 0)
        return (
            f"{self.lowering} run on {self.device}: outputs {'agree' if self.matches else 'DIFFER'} "
            f"(against the unpartitioned: max abs error {self.max_abs_error:.3g}, max rel error "
            f"{self.max_rel_error:.3g}); "
            f"step {format_seconds(self.step_time_s)} (median of {len(self.times_s)}"
            f"{self.loop_text()}), "
            f"compile {format_seconds(self.compile_time_s)}, peak memory per device {format_bytes(mem)}"
            + ("" if self.matches else "\n" + str(self.verdict))
            + "".join(f"\nnote: {n}" for n in self.notes)
        )

    def _peak(self) -> int:
        return self.memory.get("peak_memory_in_bytes") or self.memory.get("temp_size_in_bytes", 0)

    def __repr__(self) -> str:
        from workbench.core import display as d

        head = f"RunResult: {self.lowering} run on {self.device}: outputs " + (
            "agree" if self.matches else f"DIFFER ({len(self.differing)} out of tolerance)"
        )
        body = [
            f"step {format_seconds(self.step_time_s)} (median of {len(self.times_s)}"
            f"{self.loop_text()}), compile {format_seconds(self.compile_time_s)}",
            f"peak memory per device {format_bytes(self._peak())}; against the unpartitioned: "
            f"max abs error {self.max_abs_error:.3g}, max rel error {self.max_rel_error:.3g}",
        ]
        body += [f"differs: {c}" for c in self.differing[:3]]
        if len(self.differing) > 3:
            body.append(f"... and {len(self.differing) - 3} more (result.differing)")
        if self.verdict.first:
            body.append(f"first differing value: {self.verdict.first}")
        body += [f"note: {n}" for n in self.notes]
        return d.lines(head, [d.clip(b) for b in body], hint="str(result)")

    def _repr_html_(self) -> str:
        from workbench.core import display as d

        facts = [
            ("outputs", "agree" if self.matches else "DIFFER"),
            ("step", f"{format_seconds(self.step_time_s)} (median of {len(self.times_s)})"),
            ("timed as", self.loop_text().lstrip(", ")),
            ("compile", format_seconds(self.compile_time_s)),
            ("peak memory per device", format_bytes(self._peak())),
            ("max abs / rel error", f"{self.max_abs_error:.3g} / {self.max_rel_error:.3g}"),
        ]
        if self.verdict.first:
            facts.append(("first differing value", self.verdict.first))
        facts += [("note", n) for n in self.notes]
        checks = d.table(
            ("output", "role", "agrees", "error", "allowed", "why"),
            (
                (c.name, c.role, "yes" if c.ok else "NO", f"{c.error:.2g}", f"{c.allowed:.2g}", c)
                for c in sorted(self.verdict.checks, key=lambda c: c.ok)
            ),
        )
        return d.panel(
            f"{self.lowering} run on {self.device}",
            d.facts(facts),
            d.details(f"{len(self.verdict.checks)} outputs checked against float64", checks),
            d.details(
                "memory per device (XLA)",
                d.table(
                    ("", "bytes"),
                    ((k.replace("_in_bytes", ""), format_bytes(v)) for k, v in self.memory.items()),
                ),
            ),
        )

    def loop_text(self) -> str:
        """How the timed steps ran: as a training loop (donating), or on the same inputs."""
        if not self.donated:
            return ", inputs kept"
        return f", as a training loop donating {len(self.donated)} inputs"

    def differing_text(self, top: int = 5) -> str:
        """The outputs that differ, worst first, and the first value that does (empty when
        the verdict is agree)."""
        if self.matches:
            return ""
        worst = ", ".join(
            f"{c.name} ({c.reason or f'{c.error:.2g} from float64, allowed {c.allowed:.2g}'})"
            for c in self.differing[:top]
        )
        more = f" and {len(self.differing) - top} more" if len(self.differing) > top else ""
        first = f"; first differing value: {self.verdict.first}" if self.verdict.first else ""
        return f"; out of tolerance: {worst}{more}{first}"


def example_inputs(program, seed: int = 0) -> list:
    """The arrays capture was given, or random ones of the captured shapes."""
    if program.example_args is not None:
        return [jnp.asarray(a) for a in program.example_args]
    rng = np.random.default_rng(seed)
    out = []
    for v in program.input_values:
        if is_extended(v.dtype):  # PRNG keys: random words
            w = words(v.shape, v.dtype)
            data = rng.integers(0, 2**32, w.shape, dtype=np.uint32)
            out.append(jax.random.wrap_key_data(data, impl=impl_name(v.dtype)))
        elif jnp.issubdtype(v.dtype, jnp.floating):
            out.append(jnp.asarray(rng.normal(0, 0.5, v.shape), dtype=v.dtype))
        elif v.dtype == np.bool_:
            out.append(jnp.asarray(rng.random(v.shape) < 0.5))
        else:
            out.append(jnp.zeros(v.shape, v.dtype))
    return out


def host_copy(a):
    """A host copy of an array (of a key array: of its words, wrapped again)."""
    if is_extended(a.dtype):
        return jax.random.wrap_key_data(np.array(key_data(a)), impl=impl_name(a.dtype))
    return np.array(a)


def reference_outputs(program, flat_args, *, cache_key=None) -> list:
    """The unpartitioned program's outputs on one device (kept per program for ``cache_key``)."""
    from jax.extend.core import jaxpr_as_fun

    cache = program.cache.get("lowering.reference outputs", dict)
    if cache_key is not None and cache_key in cache:
        return cache[cache_key]
    out = list(jax.jit(jaxpr_as_fun(program.jaxpr))(*flat_args))
    if cache_key is not None:
        cache[cache_key] = out
    return out


#: Float dtypes, most precise first: an output is held to the tolerance of the least precise
#: one it is computed from (f32 master weights updated from bf16 compute are bf16-accurate).
PRECISION = ("float64", "float32", "float16", "bfloat16")


def tolerance_dtypes(program) -> tuple[str | None, ...]:
    """Per output, the dtype whose tolerance it is held to (None: its own)."""
    return program.cache.get("lowering.tolerance dtypes", lambda: _tolerance_dtypes(program))


def _tolerance_dtypes(program) -> tuple[str | None, ...]:
    rank = [
        PRECISION.index(str(v.dtype)) if str(v.dtype) in PRECISION else -1 for v in program.values
    ]
    changed = True
    while changed:  # to a fixed point: a loop's body feeds its own inputs
        changed = False
        for op in program.walk():
            r = max((rank[v] for v in op.linked_operands if isinstance(v, int)), default=-1)
            for v in op.linked_results:
                if r > rank[v]:
                    rank[v], changed = r, True
    out = tuple(
        PRECISION[rank[v]]
        if isinstance(v, int) and rank[v] >= 0 and not is_extended(program.values[v].dtype)
        else None
        for v in program.outputs
    )
    return out


def compare(outputs, reference, dtypes=None) -> tuple[float, float, bool]:
    """Worst absolute and relative error, and whether every output is within its tolerance
    (``dtypes``: per output, the dtype that sets it; default each reference's own)."""
    worst_abs, worst_rel, ok = 0.0, 0.0, True
    for i, (out, ref) in enumerate(zip(outputs, reference)):
        dtype = "key" if is_extended(getattr(ref, "dtype", None)) else str(np.asarray(ref).dtype)
        dtype = (dtypes[i] if dtypes is not None else None) or dtype
        out, ref = np.asarray(key_data(out)), np.asarray(key_data(ref))
        wide = np.complex128 if np.iscomplexobj(out) or np.iscomplexobj(ref) else np.float64
        out, ref = out.astype(wide), ref.astype(wide)
        same = (out == ref) | (np.isnan(out) & np.isnan(ref))  # equal, infinities and NaNs too
        diff = np.where(same, 0.0, np.abs(out - ref))
        err = float(np.max(diff)) if out.size else 0.0
        finite = np.abs(ref)[np.isfinite(ref)]
        scale = float(np.max(finite)) if finite.size else 0.0
        rel = err / scale if scale > 0 else err
        rtol, atol = TOLERANCE.get(dtype, TOLERANCE["float32"])
        ok &= err <= max(atol, rtol * scale)
        worst_abs, worst_rel = max(worst_abs, err), max(worst_rel, rel)
    return worst_abs, worst_rel, ok


def references(program, flat_args, extra=(), *, cache_key=None) -> tuple[list, list, list]:
    """The unpartitioned program's outputs then the arrays of ``extra`` value ids, on one
    device as the program computes them, in float64, and their rounding scales
    (``rounding``; kept per program for ``cache_key``)."""
    cache = program.cache.get("lowering.references", dict)
    key = (cache_key, tuple(extra))
    if cache_key is not None and key in cache:
        cache[key] = cache.pop(key)  # most recently used last
        return cache[key]
    progress.stage("unpartitioned reference")
    unpartitioned = list(jax.jit(Interpreter(program, extra))(*flat_args))
    out = (unpartitioned, *reference_with_scales(program, flat_args, extra))
    if cache_key is not None:
        cache[key] = out
        while len(cache) > KEPT_REFERENCES:  # the least recently used go
            cache.pop(next(iter(cache)))
    return out


#: references kept per program (per inputs: the example's, and the last arguments given)
KEPT_REFERENCES = 3


def fingerprint(flat) -> tuple:
    """A key for input arrays: their shapes, dtypes and a digest of their contents."""
    digest = hashlib.blake2b(digest_size=16)
    for a in flat:
        digest.update(np.ascontiguousarray(np.asarray(key_data(a))).view(np.uint8).tobytes())
    return (*((tuple(a.shape), str(a.dtype)) for a in flat), digest.hexdigest())


#: bytes of intermediates a failed verdict probes to find where the runs part
PROBE_BYTES = 1 << 28


def first_difference(session, flat, *, lowering, devices=None, hardware=None) -> str | None:
    """Where the partitioned program first departs from the unpartitioned one: the first
    top-level value, in program order, whose partitioned result is farther from float64
    than the verdict allows, with its op and the tactics that shaped it."""
    program, state = session.program, session.state
    if pipeline_of(program, session.mesh, state) is not None:
        return None  # the pipeline lowering returns no intermediate values to probe
    skipped = session.plan().skipped  # a ring attention's inner values are never made
    floats = (
        v
        for oid in program.body
        if oid not in skipped
        for v in program.ops[oid].results
        if not is_extended(program.values[v].dtype)
        and jnp.issubdtype(program.values[v].dtype, jnp.inexact)
    )
    candidates, total = [], 0
    for v in floats:  # in program order, up to the budget
        total += program.values[v].nbytes
        if total > PROBE_BYTES:
            break
        candidates.append(v)
    if not candidates:
        return None
    fn, jmesh = session.lower(lowering, devices=devices, probes=candidates, hardware=hardware)
    placed = [
        jax.device_put(a, NamedSharding(jmesh, spec(state.shardings[v], jmesh)))
        for a, v in zip(flat, program.inputs)
    ]
    n = len(program.outputs)
    part = fn(*placed)[n:]
    unpart, ref, scales = references(program, flat, candidates)  # not kept: probes are large
    for v, p, u, r, e in zip(candidates, part, unpart[n:], ref[n:], scales[n:]):
        value = program.values[v]
        if not check(value.name, "value", p, u, r, str(value.dtype), e).ok:
            return describe_value(session, v)
    return None


def describe_value(session, v: int) -> str:
    """A value, the op that made it, and the tactics behind its and its operands' shardings."""
    program, state = session.program, session.state
    op = program.ops[program.values[v].producer]
    shaped = sorted(
        {
            state.provenance[(w, axis)].tactic
            for w in (v, *op.operands)
            if isinstance(w, int)
            for axis in session.mesh.names
            if (w, axis) in state.provenance
        }
    )
    where = f" at {op.source}" if op.source else ""
    tactics = (
        "shaped by " + ", ".join(f"tactic #{t} {state.schedule[t]}" for t in shaped)
        if shaped
        else "no tactic shaped it or its operands"
    )
    return f"{program.values[v].name}, made by {op.name} ({op.primitive}{where}); {tactics}"


class TrainingStep:
    """A session's step compiled for the devices, with copies of its inputs placed there.

    Each call runs one step. With ``training_loop`` it runs as a training loop runs it: the
    inputs an output replaces (`workbench.core.estimate.memory.donations`) are donated, and the
    next call reads that output in their place. The arrays given are never consumed."""

    def __init__(
        self, session, flat, *, lowering="explicit", devices=None, training_loop=True, hardware=None
    ):
        from workbench.core.estimate import donations

        program, state = session.program, session.state
        carried = donations(program, state) if training_loop else {}  # output -> input index
        self.donated = tuple(sorted(set(carried.values())))
        fn, self.mesh = session.lower(
            lowering, devices=devices, donate=self.donated, hardware=hardware
        )
        self.shardings = [
            NamedSharding(self.mesh, spec(state.shardings[v], self.mesh)) for v in program.inputs
        ]
        self.inputs = [  # a donated input is a copy: the caller's arrays survive
            jax.device_put(host_copy(a) if i in self.donated else a, sh)
            for i, (a, sh) in enumerate(zip(flat, self.shardings))
        ]
        self.feed = [(j, carried[v]) for j, v in enumerate(program.outputs) if v in carried]
        with warnings.catch_warnings():  # XLA's propagation may lay an output out otherwise
            warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
            t0 = time.perf_counter()
            self.compiled = fn.lower(*self.inputs).compile()
            self.compile_time_s = time.perf_counter() - t0
        laid_out = jax.tree.leaves(self.compiled.output_shardings)
        # fed outputs XLA lays out otherwise than the input they replace (propagated lowering)
        self.relayout = {
            j
            for j, i in self.feed
            if not laid_out[j].is_equivalent_to(self.shardings[i], self.inputs[i].ndim)
        }

    def __call__(self, *, keep: bool = False) -> list:
        """One step, waited for; its outputs. The next step donates those it reads unless
        ``keep`` (it then reads copies)."""
        outputs = jax.block_until_ready(self.compiled(*self.inputs))
        for j, i in self.feed:
            out = outputs[j]
            if keep or j in self.relayout:
                out = jax.device_put(out, self.shardings[i], may_alias=False)
            self.inputs[i] = out
        return outputs


def run(
    session,
    *,
    lowering: str = "explicit",
    args=None,
    repeats: int = 5,
    devices=None,
    training_loop: bool = True,
    hardware=None,
) -> RunResult:
    """Run the session's step on the attached devices: the first step's outputs are checked
    against the unpartitioned program's, then ``repeats`` steps are timed.

    With ``training_loop`` the steps run as a training loop runs them (and as the
    simulator's memory and step time assume): the inputs an output replaces (parameters and
    optimizer state, see `workbench.core.estimate.memory.donations`) are donated, and each step
    reads the previous step's outputs in their place. The arrays given are copied, never
    consumed. Without it, every step runs on the same inputs and donates nothing. With
    ``hardware`` (explicit lowering), each sum over a group spanning its levels runs as the
    program of per-level collectives the simulator prices it as (`Session.lower`).

    Its stages show on a status line (`workbench.core.progress`); a KeyboardInterrupt
    propagates and leaves the session and the program's caches as they were."""
    program = session.program
    flat = checked_arguments(session, lowering, args, repeats, devices, training_loop)
    flat = example_inputs(program) if flat is None else flat
    with progress.Status(f"run ({lowering})"):
        progress.stage("compiling the partitioned step")
        step = TrainingStep(
            session,
            flat,
            lowering=lowering,
            devices=devices,
            training_loop=training_loop,
            hardware=hardware,
        )
        progress.stage("first step")
        outputs = step(keep=True)  # warm-up, and the outputs checked
        times = []
        for k in range(max(1, repeats)):
            progress.stage(f"timing {k + 1}/{max(1, repeats)}")
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        key = "example" if args is None else fingerprint(flat)
        reference, ref, scales = references(program, flat, cache_key=key)
        progress.stage("checking the outputs")
        abs_err, rel_err, _ = compare(outputs, reference)
        verdict = judge(program, outputs, reference, ref, scales, tolerance_dtypes(program))
        if not verdict.agree:
            progress.stage("finding where the runs part")
            first = first_difference(
                session, flat, lowering=lowering, devices=devices, hardware=hardware
            )
            verdict = dataclasses.replace(verdict, first=first)
        progress.stage("outputs agree" if verdict.agree else "outputs DIFFER")
    mem = step.compiled.memory_analysis()
    memory = {
        k: int(getattr(mem, k))
        for k in (
            "argument_size_in_bytes",
            "output_size_in_bytes",
            "temp_size_in_bytes",
            "alias_size_in_bytes",
            "peak_memory_in_bytes",
        )
        if mem is not None and hasattr(mem, k)
    }
    jmesh = step.mesh
    device = f"{jmesh.devices.size} x {jmesh.devices.flat[0].device_kind}"
    tree = program.out_tree
    return RunResult(
        lowering=lowering,
        device=device,
        outputs=jax.tree_util.tree_unflatten(tree, list(outputs)) if tree is not None else outputs,
        reference=jax.tree_util.tree_unflatten(tree, reference) if tree is not None else reference,
        max_abs_error=abs_err,
        max_rel_error=rel_err,
        verdict=verdict,
        step_time_s=statistics.median(times),
        times_s=tuple(times),
        compile_time_s=step.compile_time_s,
        memory=memory,
        donated=tuple(program.values[program.inputs[i]].name for i in step.donated),
        notes=sharding_notes(program, verdict.agree),
    )
