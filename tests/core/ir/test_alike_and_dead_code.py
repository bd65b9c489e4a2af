"""Capture drops dead code as XLA does, and the ops of repeated layers share their tables."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import workbench as wb
from workbench.core.propagate.propagation import op_index
from workbench.models import build


def test_a_value_nothing_returned_reads_is_not_captured():
    def step(x):
        unused = jnp.sin(x) * 2.0  # noqa: F841  (traced, never returned)
        return x + 1.0

    program = wb.capture(step, jnp.ones(4))
    assert {op.primitive for op in program.ops} == {"add"}


@pytest.mark.slow  # several seconds: in the full suite, not the fast lane
def test_a_loop_keeps_no_constant_its_iterations_do_not_read():
    ex = build("lm_scan", "tiny")
    program = wb.capture(ex.fn, *ex.args)
    loops = [op for op in program.ops if op.primitive == "scan"]
    assert len(loops) == 2  # the forward and the backward pass
    for op in loops:
        consts = op.regions[0].inputs[: op.params["num_consts"]]
        assert all(program.users[v] for v in consts), op.name


def test_the_ops_of_repeated_layers_share_their_mapping_and_index():
    ex = build("lm", "tiny", n_layers=3)
    program = wb.capture(ex.fn, *ex.args)
    by_name = {op.name: op.id for op in program.ops}
    first = [o for n, o in by_name.items() if n.startswith("layer0/") and "dot_general" in n]
    assert first
    index = op_index(program)
    for o in first:
        twin = by_name[program.ops[o].name.replace("layer0/", "layer2/", 1)]
        assert program.alike[o] == program.alike[twin]
        assert program.mappings[o] is program.mappings[twin]
        assert index[o].where is index[twin].where
    # ops that differ in type are not alike
    assert len(set(program.alike)) > len({op.primitive for op in program.ops})


def test_jax_is_what_capture_runs_dead_code_elimination_with():
    # the pass is JAX's own; if it moves, capture keeps dead code rather than failing
    from jax._src.interpreters.partial_eval import dce_jaxpr

    closed = jax.make_jaxpr(lambda x: (jnp.cos(x), x)[1])(1.0)
    jaxpr, _ = dce_jaxpr(closed.jaxpr, [True], instantiate=True)
    assert not jaxpr.eqns
