"""CP(kind="ring", balance=True): causal load balancing. The sequence is held in the zigzag
order (device i: chunks i and 2C - 1 - i); the ring skips the pairs of chunks its mask
hides, about half of every step on every device under a causal mask; the runs agree with
the unpartitioned step, on the zoo and on transformers the project did not write; a row
that sees no key runs every pair; a plan the order cannot follow keeps it, saying why;
the simulator prices the blocks a mask shows, read from the program."""

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb
from tests.core.strategies.roundtrip import round_trip
from tests.models import programs as external
from workbench.core.anatomy.attention import region
from workbench.core.anatomy.masks import hidden_blocks
from workbench.core.errors import InputError
from workbench.core.lowering import ring_pairs
from workbench.models import build, lm

LAYERS = 2
MESH = {"data": 2, "seq": 4}


@pytest.fixture(scope="module")
def program():
    ex = build("lm", lm.Config.preset("tiny", n_layers=LAYERS))
    return wb.capture(ex.fn, *ex.args)


def balanced(program, mesh=None, before=()):
    mesh = wb.Mesh(mesh or MESH)
    return wb.Session(program, mesh, [*before, wb.CP("seq", kind="ring", balance=True)])


def transfers(s: wb.Session) -> Counter:
    ops = s.program.ops
    return Counter(
        (c.kind, ops[c.op].phase if c.op is not None else "out", "balanc" in c.why)
        for c in s.collectives()
        if "seq" in c.axes
        for _ in range(c.count)
    )


def test_a_balanced_ring_holds_the_sequence_in_zigzag_order(program):
    s = balanced(program)
    plan = s.plan()
    assert not s.conflicts and not plan.notes
    z = plan.zigzag
    assert (z.axis, z.size, z.lengths) == ("seq", 4, frozenset({16}))
    assert list(z.order(16)) == [0, 1, 14, 15, 2, 3, 12, 13, 4, 5, 10, 11, 6, 7, 8, 9]
    seen = transfers(s)
    # the ring's own transfers are the textbook ones, as unbalanced
    assert seen[("collective-permute", "forward", False)] == LAYERS * 2 * 3
    assert seen[("collective-permute", "backward", False)] == LAYERS * (2 * 3 + 2 * 4)
    # each data input with a sequence enters the balanced order by two half-block transfers
    moves = [c for c in s.collectives() if "load balancing" in c.why]
    inputs = {c.value for c in moves}
    assert len(moves) == 2 * len(inputs) and inputs <= set(program.inputs)
    for c in moves:
        assert c.bytes * 2 == c.src.local_nbytes(s.mesh) and "into the balanced order" in c.why
    # per attention the ring agrees on a bound of its scores (each pass) and on whether
    # to run every pair (forward): one float each
    agreed = [c for c in s.collectives() if "agrees on" in c.why]
    assert len(agreed) == 3 * LAYERS and {(c.kind, c.bytes) for c in agreed} == {("all-reduce", 4)}
    # the rerun of every pair is compiled, not priced
    assert len(plan.fallback) == LAYERS * (2 * 3 + 2 * 3 + 2 * 4)


@pytest.mark.slow  # about 9 s: a run of the step partitioned and whole
def test_a_balanced_ring_runs_like_the_unpartitioned_step(program):
    assert balanced(program, before=[wb.BP("data")]).run(repeats=1).matches


@pytest.mark.slow  # about 10 s a case: a run of the step partitioned and whole
@pytest.mark.parametrize("before", [(), ("MP",), ("remat",)])
def test_balanced_rings_compose(program, before):
    if "remat" in before:
        ex = build("lm", lm.Config.preset("tiny", n_layers=LAYERS, remat=True))
        program = wb.capture(ex.fn, *ex.args)
    mesh = {"seq": 4, "model": 2} if "MP" in before else MESH
    tactics = [wb.MP("model")] if "MP" in before else []
    s = balanced(program, mesh, tactics)
    assert s.plan().zigzag is not None
    assert s.run(repeats=1).matches


def _watch(monkeypatch):
    """Record, per pair of chunks the ring meets, whether it skipped it, and whether the
    devices agreed to run every pair."""
    skipped, stuck = Counter(), []
    hidden, agree = ring_pairs._Pairs.hidden, ring_pairs._Pairs.agree

    def watched_hidden(self, *args):
        h = hidden(self, *args)
        jax.debug.callback(lambda x: skipped.update([bool(x)]), h)
        return h

    def watched_agree(self, tops):
        a = agree(self, tops)
        jax.debug.callback(lambda x: stuck.append(bool(x)), a)
        return a

    monkeypatch.setattr(ring_pairs._Pairs, "hidden", watched_hidden)
    monkeypatch.setattr(ring_pairs._Pairs, "agree", watched_agree)
    return skipped, stuck


def test_the_ring_skips_what_a_causal_mask_hides_on_every_device(program, monkeypatch):
    skipped, stuck = _watch(monkeypatch)
    assert balanced(program).run(repeats=1).matches
    # per pass and device: at step 0 one pair of four (its early queries, late keys), at
    # each later step two: 7 of the 16 pairs of C = 4 steps
    assert skipped[True] * 16 == (skipped[True] + skipped[False]) * 7
    assert stuck and not any(stuck)


@pytest.mark.slow  # about 15 s: the run, and the search for where it parts
def test_a_wrong_order_is_caught_by_the_verdict(program, monkeypatch):
    # the verdict must be able to fail: positions counted as if the sequence were in order
    from workbench.core.ops import shape
    from workbench.core.ops.local import shard_index

    def in_order(layout, d, mesh):
        n = layout.shape[d] // layout.shards(d, mesh)
        return n * shard_index(layout.dims[d], mesh) + jnp.arange(n)

    monkeypatch.setattr(shape, "positions", in_order)
    assert not balanced(program).run(repeats=1).matches


def _padded():
    """A plain-JAX attention step whose padding mask (an input) hides every key of the
    first rows of one sequence: left padding."""
    n, d, b = 32, 16, 2

    def loss(params, x, valid):
        q, k, v = ((x @ params[w]).reshape(b, n, 2, d // 2) for w in "qkv")  # two heads
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / 4.0
        pos = jnp.arange(n)
        mask = (pos[:, None] >= pos[None, :])[None, None] & valid[:, None, None, :]
        p = jax.nn.softmax(jnp.where(mask, s, -1e9), axis=-1)
        return jnp.mean(jnp.einsum("bhqk,bkhd->bqhd", p, v) ** 2)

    r = np.random.default_rng(0)
    params = {w: jnp.asarray(r.normal(size=(d, d)) / 4, jnp.float32) for w in "qkv"}
    x = jnp.asarray(r.normal(size=(b, n, d)), jnp.float32)
    valid = jnp.asarray(np.arange(n)[None, :] >= np.array([[5], [0]]))
    return wb.capture(jax.value_and_grad(loss), params, x, valid)


@pytest.mark.slow  # about 5 s: a run of the step partitioned and whole
def test_a_row_that_sees_no_key_runs_every_pair(monkeypatch):
    program = _padded()
    _skipped, stuck = _watch(monkeypatch)
    s = balanced(program)
    assert s.plan().zigzag is not None
    assert s.run(repeats=1).matches
    assert stuck and all(stuck)
    # the mask reads an input: the simulator cannot read it, and prices every block
    assert "priced computing every block" in s.estimate("H100").note


def test_a_plan_the_order_cannot_follow_keeps_it_and_says_why():
    ex = build("lm", lm.Config.preset("tiny", n_layers=1, seq_len=12))
    program = wb.capture(ex.fn, *ex.args)
    s = balanced(program)
    (note,) = s.plan().notes
    assert s.plan().zigzag is None and s.plan().rings
    assert "stays in order" in note and "not a multiple of 2 x 4" in note
    assert note in s.estimate("H100").note


def test_balance_asks_for_a_ring_and_a_flag():
    with pytest.raises(InputError, match=r"balance=True balances a ring.*kind='ring'"):
        wb.CP("seq", balance=True)
    with pytest.raises(InputError, match=r"balance must be True or False; got 'yes'"):
        wb.CP("seq", kind="ring", balance="yes")
    assert str(wb.CP("seq", kind="ring", balance=True)) == "CP('seq', kind='ring', balance=True)"


def test_balance_saves_loads_and_exports(program, tmp_path):
    s = balanced(program, before=[wb.BP("data")])
    assert round_trip(s, program, tmp_path)["schedule"][1]["balance"] is True
    assert "balance=True" in s.export_code()
    assert s.state.balanced == ("seq",)


@pytest.mark.slow  # 15-20 s each: a third-party step, partitioned and whole
@pytest.mark.parametrize("name", ["eqx_lm", "linen_lm", "nnx_lm", "hf_gpt2"])
def test_a_balanced_ring_runs_a_third_party_transformer(name, monkeypatch):
    program = external.program(name)
    skipped, stuck = _watch(monkeypatch)
    s = balanced(program, before=[wb.BP("data")])
    assert not s.conflicts and not s.plan().notes and s.plan().zigzag is not None
    assert s.run(repeats=1).matches
    assert skipped[True] and stuck and not any(stuck)


@pytest.mark.slow  # about 10 s: compiled for 8 devices
def test_the_balanced_transfers_are_the_ones_xla_compiles(program):
    from workbench.core.xla.crosscheck import crosscheck

    assert crosscheck(balanced(program, before=[wb.BP("data")])).identical


@pytest.mark.parametrize("name", ["zoo", "eqx_lm", "linen_lm", "nnx_lm", "hf_gpt2"])
def test_the_mask_is_read_from_the_program(name, program):
    p = program if name == "zoo" else external.program(name)
    a = p.anatomy().layers.attention[0]
    f = region(p, a.scores, a.context).forward
    shape = p.values[f.logits].shape
    (rows,) = [d for d in range(len(shape) - 2, len(shape)) if d != f.key_dim]
    hidden = hidden_blocks(p, f, rows, 8)
    # causal: a query chunk sees the key chunks up to its own
    assert (hidden == np.triu(np.ones((8, 8), bool), 1)).all()


def test_a_mask_from_the_inputs_is_not_read():
    p = _padded()
    a = p.anatomy().layers.attention[0]
    f = region(p, a.scores, a.context).forward
    assert hidden_blocks(p, f, 2, 8) is None


def test_the_balanced_ring_is_priced_at_the_blocks_its_mask_shows():
    config = lm.Config.preset("small", n_layers=2, batch=1, seq_len=16384, dtype="bfloat16")
    program = wb.capture(*(lambda ex: (ex.fn, *ex.args))(build("lm", config, abstract=True)))
    mesh = wb.Mesh({"seq": 8})
    plain = wb.Session(program, mesh, [wb.CP("seq", kind="ring")]).estimate("H100")
    e = wb.Session(program, mesh, [wb.CP("seq", kind="ring", balance=True)]).estimate("H100")
    # per step the busiest device computes 3 of 4 pairs at step 0 and 2 at the 7 others
    assert "each step costs 53% of a block" in e.note
    assert e.compute_s < 0.7 * plain.compute_s
    assert e.memory.peak == pytest.approx(plain.memory.peak, rel=0.01)
    ring_permutes = [
        c for c in e.collectives
        if c.collective.kind == "collective-permute" and "balanc" not in c.collective.why
    ]  # fmt: skip
    assert sum(c.total_s for c in ring_permutes) < sum(c.seconds for c in ring_permutes)
