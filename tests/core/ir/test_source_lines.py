"""Every op, collective and conflict names the line of the user's code it comes from, and the
library line beside it: the zoo's own step, a plain JAX step with optax, a Flax NNX model."""

from __future__ import annotations

import inspect
import os
import warnings

import jax
import jax.numpy as jnp
import pytest

import workbench as wb
from tests.core.zoo import program as zoo_program
from workbench.core.ir.source_lines import file_kind, package_dirs, short, split, where
from workbench.core.plan.rows import collective_rows
from workbench.models import lm

optax = pytest.importorskip("optax")

THIS = os.path.abspath(__file__)


def _line_of(text: str, path: str = THIS) -> int:
    """The number of the one line of ``path`` holding ``text``."""
    with open(path) as f:
        hits = [i for i, line in enumerate(f, 1) if text in line]
    assert len(hits) == 1, (text, hits)
    return hits[0]


def _lines(fn) -> range:
    source, first = inspect.getsourcelines(fn)
    return range(first, first + len(source))


def test_files_are_judged_by_their_path():
    dirs = package_dirs()
    assert file_kind(jax.numpy.__file__, dirs)[0] == "jax"
    assert file_kind(optax.__file__, dirs) == ("library", "optax")
    assert file_kind(wb.capture.__code__.co_filename, dirs) == ("library", "workbench")
    assert file_kind(lm.__file__, dirs) == ("user", "")  # the zoo is a user's code
    assert file_kind(THIS, dirs) == ("user", "")
    assert file_kind("/x/lib/python3.11/site-packages/flax/nnx/a.py", dirs) == ("library", "flax")
    assert file_kind("/x/dist-packages/jaxlib/b.py", dirs)[0] == "jax"
    assert split("/a/b c/lm.py:42 (f.<locals>.g)") == ("/a/b c/lm.py", 42, "f.<locals>.g")
    assert short("/a/lm.py:42 (mlp)") == "lm.py:42 (mlp)" and split("") is None
    optax_line = f"{optax.__file__}:7 (f)"
    assert where("/a/lm.py:42 (mlp)", optax_line) == "lm.py:42 (mlp), in optax: __init__.py:7 (f)"
    assert where("/a/lm.py:42 (mlp)", optax_line, full=True) == f"/a/lm.py:42 (mlp)\n{optax_line}"


def test_zoo_lm_gradient_all_reduce_names_the_optimizer_line():
    program = zoo_program("lm")
    s = wb.Session(program, wb.Mesh({"batch": 2, "model": 2}), [wb.BP("batch"), wb.MP("model")])
    grads = {program.value(n).id for n in program.names("grads/**")}
    reduced = [
        c
        for c in s.collectives()
        if c.kind == "all-reduce" and c.axes == ("batch",) and c.value in grads
    ]
    assert len(reduced) == len(grads)
    adam = _lines(lm.adam)
    for c in reduced:
        path, line, function = split(c.source)
        assert path == os.path.abspath(lm.__file__) and line in adam and "adam" in function
        assert c.why.endswith(f"(at {short(c.source)})")
    # the zoo's step is plain JAX: no library stands between it and JAX (tree.map is JAX's)
    assert not any(c.library for c in reduced)
    # why a gradient is sharded so: made at the step's tag line, in the workbench's tag
    why = s.why("grads/layers/0/mlp/w_in")
    assert split(why.source)[1] == _line_of('grads = wb.tag(grads, "grads")', lm.__file__)
    assert f"made at {short(why.source)}, in workbench: capture.py" in str(why)


OPTIMIZER = optax.adam(1e-3)


def mlp_loss(params, x, y):
    return jnp.mean((jnp.tanh(x @ params["w1"]) @ params["w2"] - y) ** 2)


def optax_step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(mlp_loss)(params, x, y)
    updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def test_an_optax_step_under_zero3_names_the_update_line_and_optax():
    params = {"w1": jnp.zeros((16, 64)), "w2": jnp.zeros((64, 8))}
    args = (params, OPTIMIZER.init(params), jnp.zeros((32, 16)), jnp.zeros((32, 8)))
    program = wb.capture(optax_step, *args)
    s = wb.Session(program, wb.Mesh({"data": 4}), [wb.BP("data"), wb.Z3("data")])
    update = _line_of("updates, opt_state = OPTIMIZER" + ".update(")
    optimizer = [
        c for c in s.collectives() if c.op is not None and program.ops[c.op].phase == "optimizer"
    ]
    assert optimizer
    for c in optimizer:
        assert split(c.source) == (THIS, update, "optax_step")
        assert f"{os.sep}optax{os.sep}" in split(c.library)[0]
        assert f"in optax: {os.path.basename(split(c.library)[0])}" in c.why
    forward = [
        c for c in s.collectives() if c.op is not None and program.ops[c.op].phase == "forward"
    ]
    assert forward and all(split(c.source)[2] == "mlp_loss" and not c.library for c in forward)
    rows = collective_rows([(c, None) for c in optimizer], program)
    assert all(r["code_path"] == f"{c.source}\n{c.library}" for r, c in zip(rows, optimizer))
    assert all(
        r["code"].startswith(f"test_source_lines.py:{update} (optax_step), in optax: ")
        for r in rows
    )


@pytest.mark.slow
def test_a_flax_nnx_model_names_the_users_lines_and_flax():
    from tests.models.programs import program as external
    from workbench.models.external import nnx_lm

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = external("nnx_lm")
    s = wb.Session(program, wb.Mesh({"batch": 2, "model": 2}), [wb.BP("batch"), wb.MP("model")])
    here = os.path.abspath(nnx_lm.__file__)
    cs = s.collectives()
    in_flax = [c for c in cs if c.library and f"{os.sep}flax{os.sep}" in c.library]
    assert in_flax and all(split(c.source)[0] == here for c in in_flax)
    assert {split(c.source)[2] for c in in_flax} & {"TransformerBlock.__call__", "MiniGPT.__call__"}
    step = _lines(nnx_lm.train_step)
    in_optax = [c for c in cs if c.library and f"{os.sep}optax{os.sep}" in c.library]
    assert in_optax and all(split(c.source)[1] in step for c in in_optax)


def clash(x, w):
    return jnp.tanh(x @ w)  # CLASH


def test_a_conflict_and_its_redistribution_name_the_line():
    program = wb.capture(clash, jnp.zeros((8, 16)), jnp.zeros((16, 8)))
    s = wb.Session(program, wb.Mesh({"a": 2}), [wb.Tile("x", 0, "a"), wb.Tile("w", 1, "a")])
    line = (THIS, _line_of("# " + "CLASH"), "clash")
    (report,) = s.conflicts
    assert split(report.source) == line and not report.library
    assert f"written at test_source_lines.py:{line[1]} (clash)" in str(report)
    moved = [c for c in s.collectives() if c.op == program.value("dot_general.0").producer]
    assert moved and all(split(c.source) == line for c in moved)


def test_ops_inside_jax_functions_take_the_callers_line():
    program = zoo_program("lm")
    assert all(op.source for op in program.ops)  # jnp's jitted helpers included
    gather = next(op for op in program.ops if op.primitive == "gather")
    assert split(gather.source)[2] == "loss_fn" and not gather.library
