"""Checks for the course's exercises (notebooks/course_*.ipynb).

Each check rebuilds what the exercise asks for with the real engine (sessions, plans,
estimates, XLA's compiled program) and compares the reader's answer against it. On success
it prints a line starting with "✓"; on failure it raises an AssertionError whose message is
a hint. Nothing here holds a hard-coded answer.
"""

from __future__ import annotations

import math
from collections import Counter

import workbench as wb
from workbench.core.ir.selectors import select
from workbench.core.units import format_bytes, format_seconds

__all__ = [
    "auto_composes",
    "auto_fits",
    "axis_links",
    "collective_bytes",
    "data_parallel",
    "dp_allreduce_bytes",
    "fits",
    "fsdp",
    "megatron_allreduce_bytes",
    "megatron_mlp",
    "model_state_bytes",
    "mp_split_dims",
    "two_d_zero",
    "vocab_parallel_head",
    "xla_count",
    "zero_formula",
]


# -- helpers ---------------------------------------------------------------------------------
def _require(condition: bool, hint: str) -> None:
    if not condition:
        raise AssertionError(hint)


def _ok(message: str) -> None:
    print("✓ " + message)


def _close(got: float, expected: float, rel: float) -> bool:
    return math.isclose(got, expected, rel_tol=rel, abs_tol=0.5)


def _as_list(tactics) -> list:
    if isinstance(tactics, wb.Tactic):
        return [tactics]
    _require(
        isinstance(tactics, list | tuple) and all(isinstance(t, wb.Tactic) for t in tactics),
        f"expected a tactic or a list of tactics (wb.Tile, wb.BP, ...); got {tactics!r}.",
    )
    return list(tactics)


def _session(program, mesh, tactics) -> wb.Session:
    try:
        return wb.Session(program, mesh, _as_list(tactics))
    except wb.WorkbenchError as e:
        raise AssertionError(f"the engine refused your schedule: {e}") from None


def _no_conflicts(s: wb.Session, hint: str = "") -> None:
    if s.conflicts:
        raise AssertionError(
            f"propagation stopped on {len(s.conflicts)} conflict(s); the first:\n"
            f"{s.conflicts[0]}\n{hint}".rstrip()
        )


def _phase(program, c) -> str:
    """Where the op that needs collective ``c`` runs: forward, backward, optimizer or output."""
    return "output" if c.op is None else program.ops[c.op].phase


def _scope(program, value_id: int) -> tuple[str, ...]:
    producer = program.values[value_id].producer
    return () if producer is None else tuple(program.ops[producer].scope)


def _layers(program) -> list[str]:
    """The unrolled LM's layer scopes: layer0, layer1, ..."""
    n = len({name.split("/")[2] for name in program.names("params/layers/*/mlp/w_in")})
    return [f"layer{i}" for i in range(n)]


def _matrices(program, selector: str = "params/**") -> list[str]:
    return [n for n in program.names(selector) if len(program.value(n).shape) >= 2]


# -- chapter 1: data parallelism ------------------------------------------------------------
def data_parallel(program, mesh, tactic) -> None:
    """Exercise 1.1: the reader's tactic splits the batch, keeps weights whole, and leaves
    every gradient a partial sum over "batch"."""
    s = _session(program, mesh, tactic)
    _no_conflicts(s)
    for name in program.names("batch/**"):
        sh = s.sharding(name)
        _require(
            sh.dims and sh.dims[0] == ("batch",),
            f"{name} is {sh}: data parallelism splits dim 0 (the examples) of every batch "
            'input over "batch". Try wb.Tile("batch/**", 0, "batch").',
        )
    for name in program.names("params/**"):
        sh = s.sharding(name)
        _require(
            not sh.tiled_axes and not sh.partial,
            f"{name} is {sh}: in data parallelism every device holds every weight whole. "
            "Tile only the batch inputs.",
        )
    grads = program.names("grads/**")
    for name in grads:
        sh = s.sharding(name)
        _require(
            sh.reduction_of("batch") == "sum",
            f"{name} is {sh}: each device only saw its slice of the batch, so its gradient "
            "should be a pending (partial) sum over 'batch'.",
        )
    example = "grads/layers/0/mlp/w_out" if "grads/layers/0/mlp/w_out" in grads else grads[0]
    _ok(
        f"the batch is split over 'batch', all {len(program.names('params/**'))} weights stay "
        f"whole, and all {len(grads)} gradients are partial sums over 'batch' "
        f"(e.g. {example}: {s.sharding(example)})"
    )


def dp_allreduce_bytes(session, answer) -> None:
    """Exercise 1.2: the bytes data parallelism all-reduces per device per step, for the
    gradients (the collectives an op of the step needs, not the reported loss)."""
    p = session.program
    grads = [c for c in session.collectives() if c.kind == "all-reduce" and c.op is not None]
    total = sum(c.bytes * c.count for c in grads)
    weights = sum(p.value(n).nbytes for n in p.names("params/**"))
    _require(
        isinstance(answer, int | float) and _close(answer, total, 0.01),
        f"you said {answer!r} bytes; the plan all-reduces {total:,} bytes of gradients per "
        f"device per step ({len(grads)} all-reduces). Hint: every weight's gradient has the "
        "weight's shape and dtype, and each is all-reduced once.",
    )
    _ok(
        f"{len(grads)} gradient all-reduces move {format_bytes(total)} per device per step: "
        f"exactly the size of the weights ({format_bytes(weights)})"
    )


# -- chapter 2: Megatron --------------------------------------------------------------------
def megatron_mlp(program, mesh, tactics) -> None:
    """Exercise 2.1: only the MLPs split over "model": one all-reduce per layer in the
    forward pass (after w_out), one per layer in the backward pass."""
    s = _session(program, mesh, tactics)
    _no_conflicts(s)
    layers = _layers(program)
    for i in range(len(layers)):
        w_in, w_out = f"params/layers/{i}/mlp/w_in", f"params/layers/{i}/mlp/w_out"
        _require(
            s.sharding(w_in).dim_of("model") == 1,
            f"{w_in} is {s.sharding(w_in)}: Megatron splits the MLP's hidden dimension, the "
            "last dim of w_in, over 'model'.",
        )
        _require(
            s.sharding(w_out).dim_of("model") == 0,
            f"{w_out} is {s.sharding(w_out)}; expected its first (hidden) dim on 'model'. "
            "Did you tile w_in's last dim?",
        )
    for name in program.names("params/**/attn/*"):
        _require(
            not s.sharding(name).uses("model"),
            f"{name} is {s.sharding(name)}: this exercise splits the MLPs only.",
        )
    by_phase: dict[str, list] = {"forward": [], "backward": []}
    for c in s.collectives():
        if _phase(program, c) in by_phase:
            by_phase[_phase(program, c)].append(c)
    for phase, cs in by_phase.items():
        kinds = Counter((c.kind, c.axes) for c in cs)
        _require(
            kinds == Counter({("all-reduce", ("model",)): len(layers)}),
            f"the {phase} pass has {dict(kinds)}; expected exactly one all-reduce over "
            f"'model' per layer ({len(layers)}).",
        )
        where = [_scope(program, c.value)[:2] for c in cs]
        _require(
            sorted(w[0] for w in where) == layers and all("mlp" in w for w in where),
            f"the {phase} all-reduces reduce values made in {where}; expected one inside "
            "each layer's mlp scope.",
        )
    _ok(
        f"forward: exactly one all-reduce over 'model' per layer ({len(layers)}), each right "
        f"after w_out in the layer's MLP; backward: one more per layer"
    )


def megatron_allreduce_bytes(session, answer) -> None:
    """Exercise 2.2: the bytes of each forward all-reduce under Megatron."""
    p = session.program
    fwd = [c for c in session.collectives() if _phase(p, c) == "forward" and c.kind == "all-reduce"]
    _require(fwd, "this session has no forward all-reduce; apply wb.MP('model') first.")
    sizes = sorted({c.bytes for c in fwd})
    _require(
        len(sizes) == 1,
        f"the forward all-reduces have several sizes {sizes}; this check expects MP alone.",
    )
    _require(
        isinstance(answer, int | float) and _close(answer, sizes[0], 0.0),
        f"you said {answer!r} bytes; each forward all-reduce moves {sizes[0]:,} bytes. Hint: "
        "it reduces the block's output, one activation of shape [batch, seq_len, d_model] "
        "in float32.",
    )
    weights = sum(p.value(n).nbytes for n in p.names("params/**") if "/attn/" in n or "/mlp/" in n)
    _ok(
        f"all {len(fwd)} forward all-reduces move {format_bytes(sizes[0])} each: activations, "
        f"whatever the size of the weights ({format_bytes(weights)} of attention and MLP weights)"
    )


# -- chapter 3: ZeRO and FSDP ------------------------------------------------------------------
def _zero_schedule(stage: str, axis: str) -> list:
    bp = wb.BP(axis)
    return {
        "DP": [bp],
        "ZeRO-1": [wb.Replicate("grads/**", axis), bp, wb.Z2(axis)],
        "ZeRO-2": [bp, wb.Z2(axis)],
        "ZeRO-3": [bp, wb.Z3(axis)],
    }[stage]


def zero_formula(program, n_params: int, formula, stage: str = "ZeRO-2", axis: str = "data"):
    """Exercise 3.1: ``formula(P, N)`` gives the model-state bytes per device of ``stage``
    within 5% of the engine's estimate, for N = 2, 4 and 8 devices."""
    from workbench.core import hardware as hw

    rows = []
    for n in (2, 4, 8):
        s = wb.Session(program, wb.Mesh({axis: n}), _zero_schedule(stage, axis))
        got = sum(s.estimate(hw.H100).memory.states.values())
        try:
            mine = formula(n_params, n)
        except Exception as e:
            raise AssertionError(f"your formula raised {e!r} for P={n_params}, N={n}.") from None
        rows.append((n, mine, got))
        _require(
            isinstance(mine, int | float) and _close(mine, got, 0.05),
            f"for N={n} devices your formula gives {format_bytes(mine)}, the engine "
            f"{format_bytes(got)} per device. Hint: in mixed precision a parameter costs "
            f"2 bytes of bf16 weight, 2 of bf16 gradient and 12 of fp32 optimizer state; "
            f"which of the three does {stage} divide by N?",
        )
    text = ", ".join(f"N={n}: {format_bytes(g)}" for n, _, g in rows)
    _ok(f"your {stage} formula is within 5% of the engine for every mesh size ({text})")


def fsdp(program, mesh, schedule, n_params: int, axis: str = "data") -> None:
    """Exercise 3.2: FSDP / ZeRO-3: model state 16P/N per device, every weight matrix
    all-gathered before use in the forward pass, every gradient reduce-scattered."""
    from workbench.core import hardware as hw

    s = _session(program, mesh, schedule)
    _no_conflicts(s)
    n = mesh.axis_size(axis)
    states = s.estimate(hw.H100).memory.states
    got, expected = sum(states.values()), 16 * n_params / n
    _require(
        _close(got, expected, 0.05),
        f"model state is {format_bytes(got)} per device; ZeRO-3 gives 16P/N = "
        f"{format_bytes(expected)} ({ {k: format_bytes(v) for k, v in states.items()} }). "
        "Are parameters, gradients and optimizer state all sharded, and the batch split "
        f"over {axis!r} (FSDP is data parallel)?",
    )
    p = s.program
    cs = s.collectives()
    gathered = {
        p.values[c.value].name
        for c in cs
        if c.kind == "all-gather" and axis in c.axes and _phase(p, c) == "forward"
    }
    missing = [m for m in _matrices(p) if m not in gathered]
    _require(
        not missing,
        f"{len(missing)} weight matrices are not all-gathered before use in the forward pass, "
        f"e.g. {missing[:3]}.",
    )
    grads = p.names("grads/**")
    scattered = [c for c in cs if c.kind == "reduce-scatter" and _phase(p, c) == "optimizer"]
    reduced = [c for c in cs if c.kind == "all-reduce" and c.op is not None]
    _require(
        len(scattered) >= len(grads) and not reduced,
        f"{len(scattered)} reduce-scatters into the optimizer and {len(reduced)} all-reduces "
        f"inside the step; expected every one of the {len(grads)} gradients reduce-scattered "
        "(each device keeps only its shard) and no all-reduce.",
    )
    _ok(
        f"model state {format_bytes(got)} per device = 16P/N within 5%; all "
        f"{len(_matrices(p))} weight matrices are all-gathered before use and all {len(grads)} "
        "gradients are reduce-scattered"
    )


# -- chapter 4: 2-D meshes ----------------------------------------------------------------------
def two_d_zero(program, mesh, schedule) -> None:
    """Exercise 4.1: data parallel on "batch", Megatron on "model", and each weight matrix
    of the blocks stored once over all the devices (ZeRO-3 over "batch")."""
    s = _session(program, mesh, schedule)
    _no_conflicts(s)
    tokens = s.sharding("batch/tokens")
    _require(tokens.dim_of("batch") == 0, f"batch/tokens is {tokens}: split it over 'batch'.")
    for name in _matrices(program, "params/layers/**"):
        sh = s.sharding(name)
        _require(
            sh.local_nbytes(s.mesh) * mesh.size == sh.nbytes,
            f"{name} is {sh}: each device holds {format_bytes(sh.local_nbytes(s.mesh))} of "
            f"{format_bytes(sh.nbytes)}; expected 1/{mesh.size} (split over both axes).",
        )
    layers = _layers(program)
    fwd = Counter(
        (c.kind, c.axes)
        for c in s.collectives()
        if _phase(program, c) == "forward" and "model" in c.axes
    )
    _require(
        fwd.get(("all-reduce", ("model",)), 0) == 2 * len(layers),
        f"forward collectives over 'model': {dict(fwd)}; Megatron's two all-reduces per "
        f"layer ({2 * len(layers)}) should survive. Is MP in your schedule?",
    )
    _ok(
        f"tokens split over 'batch', every block weight stored 1/{mesh.size} per device, and "
        f"Megatron's {2 * len(layers)} forward all-reduces over 'model' intact"
    )


def axis_links(program, mesh, schedule, hardware, links: dict) -> None:
    """Exercise 4.2: the reader's axis -> link mapping is valid and at least as fast as the
    other way round."""
    names = [x.name for x in hardware.links]
    _require(
        isinstance(links, dict) and set(links) == set(mesh.names),
        f"give a link for each mesh axis {list(mesh.names)}, e.g. "
        f"{dict(zip(mesh.names, names))}; got {links!r}.",
    )
    _require(
        all(v in names for v in links.values()),
        f"links are named {names}; got {links!r}.",
    )
    fast = names[0]
    inside = [a for a, v in links.items() if v == fast]
    _require(
        math.prod(mesh.axis_size(a) for a in inside) <= hardware.devices_per_node,
        f"{inside} on {fast!r} spans {math.prod(mesh.axis_size(a) for a in inside)} devices, "
        f"but a node holds {hardware.devices_per_node}: only axes that fit in a node can use it.",
    )
    s = wb.Session(program, mesh, _as_list(schedule))
    mine = s.estimate(hardware.with_axis_links(links))
    other_links = {a: (names[-1] if v == fast else fast) for a, v in links.items()}
    other_fits = (
        math.prod(mesh.axis_size(a) for a, v in other_links.items() if v == fast)
        <= hardware.devices_per_node
    )
    if other_fits:
        other = s.estimate(hardware.with_axis_links(other_links))
        _require(
            mine.step_s <= other.step_s,
            f"with {links} a step takes {format_seconds(mine.step_s)}; the other way round "
            f"({other_links}) takes {format_seconds(other.step_s)}. Which axis's collectives "
            "run most often and move the most bytes?",
        )
        _ok(
            f"{links}: {format_seconds(mine.step_s)} per step, against "
            f"{format_seconds(other.step_s)} the other way round"
        )
    else:
        _ok(f"{links}: {format_seconds(mine.step_s)} per step")


# -- chapter 5: reading collectives ---------------------------------------------------------
def collective_bytes(session, hlo, answer, layer: str = "layer0", scope: str = "attn") -> None:
    """Exercise 5.1: the bytes of the forward all-reduce of ``layer``'s ``scope`` output, in
    our plan and in XLA's compiled program."""
    p = session.program
    ours = [
        c
        for c in session.collectives()
        if c.kind == "all-reduce"
        and _phase(p, c) == "forward"
        and _scope(p, c.value)[:2] == (layer, scope)
    ]
    _require(len(ours) == 1, f"expected one forward all-reduce in {layer}/{scope}; found {ours}.")
    (c,) = ours
    _require(
        isinstance(answer, int | float) and _close(answer, c.bytes, 0.0),
        f"you said {answer!r}; the plan's all-reduce of {p.values[c.value].name} moves "
        f"{c.bytes:,} bytes per device. Hint: its local shape is "
        f"{c.src.local_shape(session.mesh)} ({c.src}), in float32.",
    )
    same = [h for h in hlo if h.kind == "all-reduce" and h.axes == c.axes and h.bytes == answer]
    _require(
        same,
        f"XLA's program has no all-reduce over {c.axes} of {answer} bytes; its all-reduces: "
        f"{Counter((h.axes, h.bytes) for h in hlo if h.kind == 'all-reduce')}.",
    )
    _ok(
        f"{p.values[c.value].name} is all-reduced over {c.axes} with {answer:,} bytes per "
        f"device, and XLA's program has {len(same)} all-reduce(s) of that size over {c.axes} "
        f"(e.g. {same[0].name}, shape {same[0].operand_shapes[0]})"
    )


def xla_count(session, hlo, answer, kind: str = "all-reduce", axes=("batch",)) -> None:
    """Exercise 5.2: how many ``kind`` collectives over ``axes`` XLA's program performs."""
    axes = tuple(axes)
    ours = sum(c.count for c in session.collectives() if c.kind == kind and c.axes == axes)
    xla = sum(h.count for h in hlo if h.kind == kind and h.axes == axes)
    _require(
        answer == xla,
        f"you said {answer!r}; XLA's compiled program runs {xla} {kind}s over {axes} "
        f"(our plan: {ours}). Hint: which values are pending sums over {axes} when the "
        "optimizer or the output needs them?",
    )
    _ok(f"XLA's program runs {xla} {kind}s over {axes}; our plan has {ours}")


# -- chapter 6: memory ------------------------------------------------------------------------
def fits(program, mesh, schedule, hardware) -> None:
    """Exercise 6.1: the reader's schedule fits the device's memory."""
    s = _session(program, mesh, schedule)
    _no_conflicts(s)
    m = s.estimate(hardware).memory
    parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in m.at_peak.items() if v)
    _require(
        m.fits,
        f"peak {format_bytes(m.peak)} per device, over the {format_bytes(m.capacity)} "
        f"available ({parts}). Which category is largest, and which tactic divides it?",
    )
    _ok(f"peak {format_bytes(m.peak)} of {format_bytes(m.capacity)} per device ({parts})")


def model_state_bytes(session, answer) -> None:
    """Exercise 6.2: parameters + gradients + optimizer state per device, within 5%."""
    from workbench.core import hardware as hw

    states = session.estimate(hw.H100).memory.states
    got = sum(states.values())
    _require(
        isinstance(answer, int | float) and _close(answer, got, 0.05),
        f"you said {format_bytes(answer) if isinstance(answer, int | float) else answer!r}; "
        f"the engine holds {format_bytes(got)} of model state per device "
        f"({ {k: format_bytes(v) for k, v in states.items()} }). Hint: which parameters does "
        "MP split, and which stay whole on every device?",
    )
    _ok(f"{format_bytes(got)} of model state per device, within 5% of your {format_bytes(answer)}")


# -- chapter 7: automatic search --------------------------------------------------------------
def _autos(session) -> list:
    autos = [t for t in session.history if isinstance(t, wb.Auto)]
    _require(autos, "put a wb.Auto(...) in your schedule: the search should find the layout.")
    return autos


def auto_fits(session, limit: float, hardware, baseline) -> None:
    """Exercise 7.1: the baseline schedule does not fit under ``limit``; the reader's session,
    which asks the search to respect the limit, does."""
    autos = _autos(session)
    _require(
        all(a.memory_limit is not None and a.memory_limit <= limit for a in autos),
        f"tell the search about the limit: wb.Auto(..., memory_limit={limit:.4g}).",
    )
    program, mesh = session.program, session.mesh
    base = wb.Session(program, mesh, _as_list(baseline)).estimate(hardware).memory.peak
    _require(base > limit, "the baseline already fits under the limit; nothing to search for.")
    peak = session.estimate(hardware).memory.peak
    _require(
        peak <= limit,
        f"the search's strategy peaks at {format_bytes(peak)}, over the limit "
        f"{format_bytes(limit)}. Give it more budget (budget=, seconds=) or more axes.",
    )
    _ok(
        f"the baseline peaks at {format_bytes(base)}, over the {format_bytes(limit)} limit; "
        f"the search's strategy peaks at {format_bytes(peak)}"
    )


def auto_composes(session, hardware) -> None:
    """Exercise 7.2: BP by hand on "batch", the search deciding "model": the batch split is
    kept, the search only tiles over "model", and the step is no slower than BP alone."""
    tactics = list(session.history)
    _require(
        any(isinstance(t, wb.BP) and t.axis == "batch" for t in tactics),
        "start the schedule with wb.BP('batch').",
    )
    autos = _autos(session)
    _require(
        all(a.axes == ("model",) for a in autos), "the search should decide the 'model' axis only."
    )
    program, mesh = session.program, session.mesh
    tokens = session.sharding("batch/tokens")
    _require(tokens.dim_of("batch") == 0, f"batch/tokens is {tokens}: keep BP('batch').")
    i = tactics.index(autos[0])
    decided = autos[0].decisions(program, mesh, session.state_at(i))
    _require(
        decided and all(isinstance(t, wb.Tile) and t.axis == "model" for t in decided),
        f"the search decided {decided}; expected tiles over 'model'.",
    )
    bp = wb.Session(program, mesh, [wb.BP("batch")]).estimate(hardware).step_s
    mine = session.estimate(hardware).step_s
    _require(
        mine <= bp,
        f"{format_seconds(mine)} per step, slower than BP alone ({format_seconds(bp)}).",
    )
    _ok(
        f"BP kept on 'batch'; the search made {len(decided)} tiling decisions over 'model'; "
        f"{format_seconds(mine)} per step against {format_seconds(bp)} for BP alone"
    )


# -- chapter 8: your own model ----------------------------------------------------------------
def _relative(name: str, prefix: str) -> str:
    return name[len(prefix) :] if name.startswith(prefix) else name


def mp_split_dims(session, answer, prefix: str, axis: str = "model") -> None:
    """Exercises 8.1 and 8.3: for the parameters under ``prefix`` (one block of a model), the
    dim MP splits over ``axis``: ``{name relative to prefix: dim}``, the ones kept whole left
    out (or given as None)."""
    p = session.program
    params = set(p.anatomy().parameters)
    names = [p.values[v].name for v in select(p, prefix + "**", required=False) if v in params]
    _require(names, f"no parameter of the program is named {prefix}...; check the prefix.")
    _require(
        isinstance(answer, dict),
        f"give a dict {{name: dim}} of the parameters MP splits, names relative to {prefix!r}, "
        f"e.g. {{{_relative(names[0], prefix)!r}: <dim>, ...}}; got {answer!r}.",
    )
    known = {_relative(n, prefix): n for n in names}
    unknown = [k for k in answer if k not in known]
    _require(
        not unknown,
        f"{unknown} are not parameters under {prefix!r}; they are: {sorted(known)}.",
    )
    split = {}
    for rel, name in known.items():
        v, sh = p.value(name), session.sharding(name)
        expected = sh.dim_of(axis)
        given = answer.get(rel)
        if isinstance(given, int) and not isinstance(given, bool) and v.shape:
            given %= len(v.shape)
        shape = list(v.shape)
        if expected is None:
            _require(
                given is None,
                f"{rel} {shape} stays whole under MP ({sh}). MP splits what makes attention's "
                "heads and the MLP's hidden dimension; propagation adds what reads them. Is "
                f"{rel} one of those?",
            )
            continue
        split[rel] = (expected, shape)
        _require(
            given is not None,
            f"{rel} {shape} is split over {axis!r} too. Which of its dims is the heads or the "
            "MLP's hidden dimension?",
        )
        _require(
            given == expected,
            f"you said dim {given} of {rel} {shape}; MP splits another one. Hint: find the "
            "dim of the heads or of the MLP's hidden size (not the model width) in its shape; "
            "how does the library store a kernel, [in, out] or [out, in]?",
        )
    text = ", ".join(f"{rel} {shape} on dim {d}" for rel, (d, shape) in split.items())
    _ok(
        f"MP splits {len(split)} of the block's {len(known)} parameters over {axis!r}: {text}; "
        "the rest stay whole"
    )


def _phase_counts(program, session, axis: str) -> Counter:
    return Counter(
        (_phase(program, c), c.kind, c.bytes)
        for c in session.collectives()
        if c.axes == (axis,) and c.op is not None
    )


def vocab_parallel_head(session, axis: str = "model") -> None:
    """Exercise 8.2: a ``Role`` step before MP makes MP split the output head on its
    vocabulary; every other parameter keeps MP's layout; no conflict."""
    p = session.program
    schedule = list(session.history)
    anatomy = p.anatomy()
    mps = [i for i, t in enumerate(schedule) if isinstance(t, wb.MP) and t.axis == axis]
    _require(mps, f"put wb.MP({axis!r}) in the schedule: the Role says what MP should split.")
    plain = wb.Session(p, session.mesh, [t for t in schedule if not isinstance(t, wb.Role)])
    mp_alone = wb.Session(p, session.mesh, [wb.MP(axis)])
    heads = [
        (v, d) for v, d in anatomy.layers.heads_out if not mp_alone.state.shardings[v].uses(axis)
    ]
    _require(heads, "the workbench sees no output head that MP leaves whole in this program.")
    corrected = {
        v: i
        for i, t in reversed(list(enumerate(schedule)))
        if isinstance(t, wb.Role)
        for v in select(p, t.selector, required=False)
    }
    chosen = [(v, d) for v, d in heads if v in corrected]
    _require(
        chosen,
        f"no wb.Role step in the schedule selects the output head {p.values[heads[0][0]].name}: "
        f"correct what MP sees, e.g. wb.Role({p.values[heads[0][0]].name!r}, 'hidden', "
        "dim=...), then apply MP.",
    )
    head, vocab = chosen[0]
    name, shape = p.values[head].name, list(p.values[head].shape)
    _require(
        corrected[head] < mps[-1],
        "your Role comes after MP: a correction changes what the strategies after it see, so "
        "put it first.",
    )
    sh = session.sharding(name)
    _require(
        sh.dim_of(axis) == vocab,
        f"{name} {shape} is {sh}; its vocabulary is dim {vocab} (the output head finding). "
        "Which dim did your Role give?",
    )
    _no_conflicts(session)
    for v in anatomy.parameters:
        mine, theirs = session.state.shardings[v], plain.state.shardings[v]
        _require(
            v == head or mine == theirs,
            f"{p.values[v].name} is {mine}, but MP alone makes it {theirs}: correct the output "
            "head only.",
        )
    extra = _phase_counts(p, session, axis) - _phase_counts(p, plain, axis)
    forward = [(kind, b, n) for (phase, kind, b), n in extra.items() if phase == "forward"]
    text = ", ".join(f"{n} {kind}{'s' if n > 1 else ''} of {b:,} B" for kind, b, n in forward)
    _ok(
        f"MP splits {name} on its vocabulary: {sh}; the loss now needs {text or 'nothing'} "
        "more in the forward pass (the softmax's max and sum and the target's logit over the "
        "split vocabulary), each one number per token instead of the whole logits"
    )
