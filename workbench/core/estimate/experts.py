"""Expert load: what a user-given routing load does to a step with mixture-of-experts layers.

``expert_loads(program, given)`` checks the load of `Session.estimate(expert_load=)`: None
(balanced), a skew >= 1 (the busiest expert's token choices over the mean, the others
sharing the rest evenly) or E relative loads, one per expert. ``loaded`` prices it on top
of the balanced `Estimate`, one `ExpertLayer` per MoE layer (``program.anatomy().experts``):

- capacity forms (einsum, gather) run E x C slots per group whatever the load, so their
  compute is unchanged; the load sets the token choices dropped: per group of T tokens,
  ``sum_e max(0, load_e * top_k * T - C)``, the same fraction in every group;
- the dropless form (ragged) runs every row: a device runs the rows of its experts, so its
  grouped matmuls' FLOPs are the balanced ones times ``n x`` the share of the busiest
  device's experts (experts split over ``n`` devices in contiguous blocks; 1 when every
  device holds every expert). Bytes stay: the row buffers have static shapes, and so
  memory does not change with the load either.

Top-k, the tokens, groups and capacity are read from structure: tokens from the router's
logits, top_k from the integers its decision makes per token, the slots per expert from the
first expert matmul's activation, the groups from its dims the logits carry too. What is not
found is left None and said in the estimate's note. A pipelined step's compute is not
rescaled (its note says so).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from workbench.core.dtypes import is_extended
from workbench.core.errors import InputError, given
from workbench.core.estimate.compute import op_time
from workbench.core.estimate.overlap import overlapped
from workbench.core.ops import traits


@dataclass(frozen=True, slots=True)
class ExpertLayer:
    """One MoE layer under the given load (None: not found in the program's structure)."""

    form: str  # "einsum", "gather", "ragged", ...
    experts: int  # E
    top_k: int | None
    tokens: int | None  # T, tokens per group (dropless: the layer's tokens)
    groups: int | None  # G
    capacity: int | None  # C, slots per expert per group (capacity forms)
    devices: int  # how many ways the experts are split (1: every device holds all)
    device_load: float  # the busiest device's token choices over the balanced share
    dropped: float | None  # fraction of token choices over capacity (0 for dropless)
    ops: tuple[int, ...] = ()  # the grouped matmuls whose FLOPs the load scales (dropless)


# -- the load ------------------------------------------------------------------------------


def expert_loads(program, load):
    """``load`` checked against ``program``'s MoE layers: None, ``("skew", s)`` or
    ``("loads", shares summing to 1)`` (hashable: it keys the cached estimates)."""
    if load is None:
        return None
    layers = program.anatomy().experts
    if not layers:
        raise InputError(
            f"expert_load={given(load)}: the workbench sees no mixture-of-experts layers in "
            f"{program.name} (program.anatomy().experts is empty), so there is no load to "
            "price; leave expert_load out."
        )
    facts = layer_facts(program)
    sizes = sorted({e.size for e in layers})
    ks = [f["top_k"] for f in facts if f["top_k"]]
    k = max(ks) if ks else 1
    if isinstance(load, bool) or not isinstance(load, int | float | list | tuple | np.ndarray):
        raise InputError(
            f"expert_load={given(load)} is neither a skew nor a list of loads; give a number "
            "s >= 1 (the busiest expert's tokens over the mean), a list of "
            f"{' or '.join(map(str, sizes))} non-negative relative loads, or None (balanced)."
        )
    if isinstance(load, int | float):
        top = min(sizes) / k  # each token picks top_k distinct experts
        if not math.isfinite(load) or not 1 <= load <= top:
            raise InputError(
                f"expert_load={given(load)}: a skew is the busiest expert's token choices "
                f"over the mean, from 1 (balanced) to E / top_k = {top:g} (it takes each "
                f"token once: E = {min(sizes)} experts, top_k = {k}); give a skew in "
                f"[1, {top:g}]."
            )
        return ("skew", float(load))
    try:
        loads = np.asarray(load, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        loads = None
    if loads is None or loads.shape != (len(load),):
        raise InputError(
            f"expert_load={given(load)}: relative loads must be numbers, one per expert; "
            f"give a list of {sizes[0]} non-negative numbers."
        )
    if len(sizes) > 1 or len(loads) != sizes[0]:
        raise InputError(
            f"expert_load={given(load)} has {len(loads)} loads, but the MoE layers of "
            f"{program.name} have {' and '.join(map(str, sizes))} experts"
            + (
                "; layers of different sizes take a skew only: give a number >= 1."
                if len(sizes) > 1
                else f"; give {sizes[0]} loads, one per expert, or a skew."
            )
        )
    if not np.isfinite(loads).all() or (loads < 0).any() or loads.sum() <= 0:
        raise InputError(
            f"expert_load={given(load)}: relative loads must be finite, non-negative and not "
            "all zero (they are normalised to shares of the token choices); give, say, "
            f"[2] + [1] * {sizes[0] - 1}."
        )
    shares = loads / loads.sum()
    if shares.max() > 1 / k + 1e-12:
        raise InputError(
            f"expert_load={given(load)}: expert {int(shares.argmax())} would take "
            f"{shares.max():.0%} of the token choices, but with top_k = {k} an expert takes "
            f"each token at most once (at most 1/{k} = {1 / k:.0%}); flatten the loads."
        )
    return ("loads", tuple(float(x) for x in shares))


def shares(load, experts: int) -> np.ndarray:
    """Per expert, its share of the token choices (summing to 1) under a checked ``load``."""
    kind, value = load
    if kind == "loads":
        return np.asarray(value)
    top = value / experts
    rest = (1 - top) / (experts - 1) if experts > 1 else 0.0
    return np.array([top] + [rest] * (experts - 1))


def busiest(share: np.ndarray, devices: int) -> float:
    """The busiest device's token choices over the balanced ``1 / devices``, experts in
    contiguous blocks of ``E / devices``."""
    if devices <= 1:
        return 1.0
    return float(share.reshape(devices, -1).sum(axis=1).max() * devices)


def dropped(share: np.ndarray, top_k: int, tokens: int, capacity: int) -> float:
    """Fraction of a group's ``top_k x tokens`` choices over ``capacity`` slots per expert."""
    choices = top_k * tokens
    return float(np.maximum(share * choices - capacity, 0).sum() / choices)


# -- the layers' structure -----------------------------------------------------------------


def _integer(value) -> bool:
    dt = value.dtype
    return not is_extended(dt) and np.issubdtype(np.dtype(dt), np.integer)


def _floating(value) -> bool:
    dt = value.dtype
    return not is_extended(dt) and np.issubdtype(np.dtype(dt), np.floating)


def _size(value) -> int:
    return math.prod(value.shape)


def _top_k(program, logits: int, tokens: int, experts: int) -> int | None:
    """Integers per token that the first op making integers from the router's floats makes
    (top_k's indices, an argmax's one); None for a whole sort (E per token) or none found."""
    values, ops = program.values, program.ops
    seen, frontier = {logits}, [logits]
    while frontier and len(seen) < 2000:
        nxt = []
        for v in frontier:
            for u in program.users[v]:
                op = ops[u]
                if op.phase != "forward" or op.regions:
                    continue
                ints = [r for r in op.results if _integer(values[r])]
                if ints:
                    k, rest = divmod(_size(values[ints[0]]), tokens)
                    return k if not rest and 1 <= k < experts else None
                for r in op.results:
                    if r not in seen and _floating(values[r]):
                        seen.add(r)
                        nxt.append(r)
        frontier = nxt
    return None


#: the forms that run each expert on a fixed number of slots, dropping the tokens over them
CAPACITY = ("einsum", "gather")


def _grouped(op) -> bool:
    return "ragged_dot_dimension_numbers" in op.params


def _facts(program, layer, anatomy) -> dict:
    values, ops, classes = program.values, program.ops, anatomy.classes
    L = anatomy.layers
    E = layer.size
    out = dict(top_k=None, tokens=None, groups=None, capacity=None, rows=None, N=None)
    out.update(first=None, side=None, ops=())
    logits = next((ops[p.op].results[0] for p in L.projections if p.param == layer.router), None)
    params = {p for p, _ in layer.experts}
    reading = [
        (op, i)
        for op in ops
        for i, v in enumerate(op.operands)
        if isinstance(v, int) and L.origin.get(v) in params
    ]
    first = next(((op, i) for op, i in reading if op.phase == "forward"), None)
    if first is not None:
        out["first"], out["side"] = first[0].id, first[1]
    if logits is not None and _size(values[logits]) % E == 0:
        N = out["N"] = _size(values[logits]) // E
        out["top_k"] = _top_k(program, logits, N, E)
    if layer.form == "ragged":
        sizes = {op.operands[2] for op, _ in reading if _grouped(op)}
        out["ops"] = tuple(
            op.id for op in ops if _grouped(op) and len(op.operands) > 2 and op.operands[2] in sizes
        )
        return out
    if layer.form not in CAPACITY or first is None or logits is None or out["N"] is None:
        return out
    op, side = first
    if "dimension_numbers" not in op.params or len(op.operands) != 2:
        return out
    (lc, rc), _ = op.params["dimension_numbers"]
    act = op.operands[1 - side]
    contract = lc if side == 1 else rc
    shape = values[act].shape
    per_expert, rest = divmod(_size(values[act]), E * math.prod(shape[d] for d in contract))
    if rest:
        return out
    out["rows"] = per_expert * E  # slots over all groups: G x E x C
    shared = set(classes.dims_of(logits, len(values[logits].shape))) - set(layer.classes)
    dims = classes.dims_of(act, len(shape))
    G = math.prod(n for n, c in zip(shape, dims) if c in shared)
    if per_expert % G == 0 and out["N"] % G == 0:
        out.update(groups=G, capacity=per_expert // G, tokens=out["N"] // G)
    return out


def layer_facts(program) -> list[dict]:
    """Per MoE layer, its structure as ``loaded`` reads it (cached in ``program.cache``)."""
    anatomy = program.anatomy()
    return program.cache.get(
        "estimate.expert layers", lambda: [_facts(program, e, anatomy) for e in anatomy.experts]
    )


def _split(program, mesh, plan, op_id: int, side: int | None, dim: int | None) -> int:
    """How many ways the plan splits dim ``dim`` of operand ``side`` of op ``op_id`` (the
    result's for side None)."""
    o = plan.ops[op_id] if op_id is not None else None
    if o is None or dim is None:
        return 1
    layout = o.results[0] if side is None else o.operands[side]
    if layout is None:
        return 1
    return math.prod(mesh.axis_size(a) for a in layout.dims[dim])


def _group_split(program, mesh, plan, op_id: int) -> int:
    """How many ways the plan splits a grouped matmul's groups: the rhs's group dim, or
    the result's (a ragged contraction: a weight gradient)."""
    rdn = program.ops[op_id].params["ragged_dot_dimension_numbers"]
    (lc, _), _ = rdn.dot_dimension_numbers
    (ragged,) = rdn.lhs_ragged_dimensions
    if ragged in lc:
        return _split(program, mesh, plan, op_id, None, 0)
    groups = tuple(rdn.rhs_group_dimensions)
    return _split(program, mesh, plan, op_id, 1, groups[0]) if groups else 1


def _expert_split(program, mesh, plan, layer, fact) -> int:
    """How many ways the plan splits the experts dim of the first expert matmul's weight."""
    op_id, side = fact["first"], fact["side"]
    if op_id is None:
        return 1
    v = program.ops[op_id].operands[side]
    dims = program.anatomy().classes.dims_of(v, len(program.values[v].shape))
    dim = next((d for d, c in enumerate(dims) if c in layer.classes), None)
    return _split(program, mesh, plan, op_id, side, dim)


# -- the estimate under a load ---------------------------------------------------------------


def with_load(cache: dict, key: tuple, load, session, state, step):
    """The estimate ``cache[key]`` (``key``: ``(hardware, overlap)``) of ``session`` at
    ``step`` (``state``) under a checked ``load`` (`expert_loads`), cached beside it; the
    estimate itself for None."""
    if load is None:
        return cache[key]
    if (*key, load) not in cache:
        args = (session.program, session.mesh, state, session.plan(step), key[0])
        cache[(*key, load)] = loaded(cache[key], load, *args)
    return cache[(*key, load)]


def loaded(estimate_, load, program, mesh, state, plan, hardware):
    """``estimate_`` (the balanced one) under ``load``: its ``experts`` records, the dropless
    layers' grouped matmuls scaled to the busiest device, the note saying what was not
    found. Memory is unchanged (static buffers)."""
    layers, facts = program.anatomy().experts, layer_facts(program)
    records, notes, scale = [], [], {}
    for i, (layer, f) in enumerate(zip(layers, facts)):
        share = shares(load, layer.size)
        k, T, C = f["top_k"], f["tokens"], f["capacity"]
        if layer.form == "ragged":
            splits = {o: _group_split(program, mesh, plan, o) for o in f["ops"]}
            for o, n in splits.items():
                if n > 1:
                    scale[o] = busiest(share, n)
            forward = [n for o, n in splits.items() if program.ops[o].phase == "forward"]
            n = max(forward, default=1)
            drop, T = 0.0, f["N"]  # dropless: the layer's tokens, one pool
            if not f["ops"]:
                notes.append(f"MoE layer {i}: no grouped matmuls found, compute not scaled")
        else:
            n = _expert_split(program, mesh, plan, layer, f)
            drop = 0.0 if layer.form == "dense" else None  # dense: every expert, every token
            if layer.form not in CAPACITY:
                if drop is None:
                    notes.append(
                        f"MoE layer {i}: its dispatch is not recognised, drops not counted"
                    )
            elif k and f["rows"] is not None and f["N"]:  # groups cancel: rows = G E C
                drop = dropped(share, k, f["N"], f["rows"] // layer.size)
            else:
                what = "top_k" if not k else "the slots per expert"
                notes.append(f"MoE layer {i} ({layer.form}): {what} not found, drops not counted")
            if drop is not None and C is None:
                notes.append(f"MoE layer {i}: its groups not found (capacity shown as None)")
        records.append(
            ExpertLayer(
                layer.form, layer.size, k, T, f["groups"], C, n, busiest(share, n), drop,
                tuple(f["ops"]),
            )
        )  # fmt: skip
    e = estimate_
    if scale and e.pipeline is not None:
        notes.append("the load does not rescale a pipelined step's compute")
        scale = {}
    ops, delta, flops = list(e.ops), 0.0, 0.0
    for j, o in enumerate(ops):
        factor = scale.get(o.op)
        if factor is None or factor == 1.0:
            continue
        cost = dataclasses.replace(o.cost, flops=o.cost.flops * factor)
        dtype = program.values[program.ops[o.op].results[0]].dtype
        t = traits(program.ops[o.op].primitive)
        matmul = t.contraction or t.convolution
        seconds = op_time(cost, hardware, dtype, matmul) + (
            hardware.op_overhead if o.kernel else 0.0
        )
        ops[j] = dataclasses.replace(o, cost=cost, seconds=seconds)
        delta += (seconds - o.seconds) * o.count
        flops += (cost.flops - o.cost.flops) * o.count
    compute_s = e.compute_s + delta
    hidden = sum(c.total_s for c in e.collectives if c.hidden) if e.overlap == "prefetch" else 0.0
    note = "; ".join(x for x in (e.note, *notes) if x)
    return dataclasses.replace(
        e,
        compute_s=compute_s,
        step_s=overlapped(compute_s, e.communication_s, e.overlap, hidden) if delta else e.step_s,
        flops=e.flops + flops,
        ops=tuple(ops),
        experts=tuple(records),
        expert_load=load,
        note=note,
    )


def summary(records, load) -> str:
    """One line: "MoE: 2 layers, capacity 8 per expert; at skew 2.0, 31% of token choices
    dropped" (dropless: the busiest device's load)."""
    if not records:
        return ""
    skew = float(np.max(shares(load, records[0].experts)) * records[0].experts)
    parts = []
    capped = [r for r in records if r.form in CAPACITY]
    if capped:
        caps = sorted({r.capacity for r in capped if r.capacity is not None})
        cap = f", capacity {'/'.join(map(str, caps))} per expert" if caps else ""
        drops = [r.dropped for r in capped if r.dropped is not None]
        told = f"{max(drops):.0%} of token choices dropped" if drops else "drops unknown"
        parts.append(f"{len(capped)} layer{'s' * (len(capped) > 1)}{cap}; {told}")
    free = [r for r in records if r.form == "ragged"]
    if free:
        n = max(r.devices for r in free)
        load_ = max(r.device_load for r in free)
        where = f"experts split {n} ways" if n > 1 else "every expert on every device"
        parts.append(
            f"{len(free)} dropless layer{'s' * (len(free) > 1)}, {where}: the busiest device "
            f"runs {load_:.2f}x the balanced rows"
        )
    others = [r for r in records if r.form not in CAPACITY and r.form != "ragged"]
    if others:
        parts.append(f"{len(others)} {'/'.join(sorted({r.form for r in others}))} layer(s)")
    return f"MoE at skew {skew:g}: " + "; ".join(parts)
