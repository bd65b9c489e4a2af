"""SP with MP on one axis is Megatron's sequence parallelism (Korthikanti et al. 2022): each of
MP's all-reduces becomes a reduce-scatter onto the sequence-split stream and an all-gather of
a block's input, for the same bytes and less activation memory.

Bytes are compared on the wire of a ring (``layout.redistribute.wire_bytes``): a collective's
``bytes`` is its whole array (an all-gather's output, a reduce-scatter's input, an
all-reduce's array), and a ring all-reduce of B sends what a reduce-scatter of B and an
all-gather of B send together, 2 (n-1)/n B.
"""

from __future__ import annotations

import warnings
from collections import Counter
from functools import cache

import pytest

import workbench as wb
from workbench.core import hardware as hw
from workbench.core.layout.redistribute import wire_bytes
from workbench.models import build, lm
from workbench.models.external import build_external

MP = [wb.MP("model")]
SP = [wb.MP("model"), wb.SP("model")]


@cache
def zoo(size: str) -> wb.Program:
    if size == "small":  # the "small" LM in bfloat16, as it would be trained
        cfg = lm.Config.preset(
            "small", dtype="bfloat16", master_weights=True, batch=16, seq_len=128
        )
    else:
        cfg = lm.Config.preset(size)
    ex = build("lm", cfg, abstract=True)
    return wb.capture(ex.fn, *ex.args)


@cache
def external(name: str) -> wb.Program:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = build_external(name, "tiny", abstract=True)
        return wb.capture(ex.fn, *ex.args)


@cache
def session(program, data: str, tactics: tuple) -> wb.Session:
    mesh = wb.Mesh({data: 2, "model": 4})
    return wb.Session(program, mesh, [wb.BP(data), *tactics])


def over_model(s: wb.Session, phases=("forward", "backward")):
    """The collectives over "model" alone made for ops of ``phases``."""
    ops = s.program.ops
    return [
        c
        for c in s.collectives()
        if c.axes == ("model",) and (ops[c.op].phase if c.op is not None else "out") in phases
    ]


def kinds(cs) -> Counter:
    return Counter(c.kind for c in cs for _ in range(c.count))


def wire(cs) -> float:
    return sum(wire_bytes(c.kind, c.bytes, 4) * c.count for c in cs)


def blocks(program) -> int:
    """Attention and MLP blocks, as their down projections."""
    layers = program.anatomy().layers
    return sum(
        1
        for q in layers.projections
        if q.kind == "down" and any(c in layers.hidden for c in q.contracted)
    )


def check_megatron(program, data: str) -> tuple[wb.Session, wb.Session]:
    """MP+SP against MP over "model": a reduce-scatter and an all-gather for each of MP's
    all-reduces in the forward and the backward pass, nothing else there, and no parameter
    gathered."""
    mp = session(program, data, tuple(MP))
    sp = session(program, data, tuple(SP))
    assert not sp.conflicts and not mp.conflicts
    n = blocks(program)
    params = set(program.anatomy().parameters) | set(program.anatomy().layers.origin)
    for phase in ("forward", "backward"):
        was, now = kinds(over_model(mp, (phase,))), kinds(over_model(sp, (phase,)))
        assert was == {"all-reduce": n}, (phase, was)
        assert now == {"reduce-scatter": n, "all-gather": n}, (phase, now)
    assert not [c for c in over_model(sp) if c.value in params]
    assert wire(over_model(sp)) <= wire(over_model(mp))
    return mp, sp


@pytest.mark.parametrize("size", ["tiny", "small"])
def test_sp_on_the_zoo_lm_replaces_each_mp_all_reduce_by_a_reduce_scatter_and_a_gather(size):
    program = zoo(size)
    mp, sp = check_megatron(program, "batch")
    assert blocks(program) == 2 * lm.Config.preset(size).n_layers
    # the whole step, every phase: no more over "model" than MP (the stream's parameters'
    # gradients, pending on "model" now, are reduced with the batch's reduction)
    everything = ("forward", "backward", "optimizer", "out")
    assert wire(over_model(sp, everything)) <= wire(over_model(mp, everything))
    # the stream is split on its sequence; a block's input is whole (gathered once, read by
    # every projection of the block and by their weight gradients)
    ops = program.ops
    for c in over_model(sp, ("forward",)):
        if c.kind == "all-gather":
            assert c.src.dim_of("model") == 1 and ops[c.op].phase == "forward"


# (not hf_gpt2: MP keeps its fused c_attn whole, so MP alone is not Megatron there: its
# backward all-gathers q, k and v; there is no all-reduce-only plan to compare with)
@pytest.mark.parametrize("name", ["eqx_lm", "nnx_lm", "linen_lm"])
def test_sp_on_third_party_transformers_is_megatron_too(name):
    program = external(name)
    mp, sp = check_megatron(program, "data")
    # the optimizer's: the gradients of the parameters read on the split stream (a position
    # table, the norms) are pending on "model" now; nothing more than all-reducing them
    weights = {q.param for q in program.anatomy().layers.projections}
    stream_params = [q for q in program.anatomy().parameters if q not in weights]
    bound = sum(wire_bytes("all-reduce", program.values[q].nbytes, 4) for q in stream_params)
    extra = wire(over_model(sp, ("optimizer", "out"))) - wire(over_model(mp, ("optimizer", "out")))
    assert extra <= bound


def test_sp_holds_less_at_peak_than_mp():
    program = zoo("small")
    mp = session(program, "batch", tuple(MP)).estimate(hw.H100).memory.peak
    sp = session(program, "batch", tuple(SP)).estimate(hw.H100).memory.peak
    assert sp < mp


@pytest.mark.slow
def test_sp_runs_like_the_unpartitioned_step():
    ex = build("lm", "tiny")
    program = wb.capture(ex.fn, *ex.args)
    s = wb.Session(program, wb.Mesh({"batch": 2, "model": 4}), [wb.BP("batch"), *SP])
    assert s.run(repeats=1).matches
