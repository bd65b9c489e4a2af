"""Names that reach generated code stay data: a program whose values (and whose function) are
named with quotes, triple quotes, backslashes, newlines, ``#``, unicode or thousands of
characters exports Python whose syntax tree is the clean program's, string for string, and
that runs to the same shardings."""

from __future__ import annotations

import ast
import builtins
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb
from workbench.core.io.export import literal
from workbench.core.ir.selectors import exact

MESH = wb.Mesh({"batch": 2, "model": 4})
EVIL = "w'], dim=0, axis='batch')\nimport builtins; builtins.PWNED = True\n#"
HOSTILE = {
    "single quote": "w'q",
    "double quote": 'w"q',
    "triple double quotes": 'w"""); builtins.PWNED = True; ("""',
    "triple single quotes": "w'''); builtins.PWNED = True; ('''",
    "backslashes": "w\\\\' \\n \\",
    "newlines": "w\nbuiltins.PWNED = True\r\nx = 1",
    "a hash": "w # builtins.PWNED = True",
    "unicode": "wé\u2028\u2029\u202e\x85\x00\U0001f600",
    "very long": "w" + "'\"\\\n#" * 2000,
    "code": EVIL,
}


def step_named(names: list[str], fn_name: str):
    """A plain-JAX step over a dict keyed by ``names``, and its arguments."""

    def step(params, x):
        return sum(jnp.tanh(x @ params[k]) for k in names)

    step.__name__ = step.__qualname__ = fn_name
    params = {k: jnp.arange(32.0).reshape(8, 4) / (i + 1) for i, k in enumerate(names)}
    return step, (params, jnp.ones((4, 8)))


def session_of(names: list[str], fn_name: str):
    step, args = step_named(names, fn_name)
    program = wb.capture(step, *args)
    schedule = [wb.Tile(exact(f"params/{names[0]}"), 0, "model"), wb.Tile("x", 0, "batch")]
    return wb.Session(program, MESH, schedule), step, args


class Strings(ast.NodeTransformer):
    """Every string constant as one placeholder: what is left is the code's structure."""

    def visit_Constant(self, node):
        return ast.Constant("S") if isinstance(node.value, str) else node


def shape(code: str) -> str:
    return ast.dump(Strings().visit(ast.parse(code)))


def clean_and_hostile(case: str, where: str):
    names, fn = ["w1", "w2"], "step"
    if where == "values":
        names = [HOSTILE[case], "w2"]
    else:
        fn = HOSTILE[case]
    return session_of(["w1", "w2"], "step"), session_of(names, fn)


@pytest.mark.parametrize("where", ["values", "function"])
@pytest.mark.parametrize("case", list(HOSTILE))
def test_export_code_holds_only_the_clean_statements(case, where):
    import builtins

    (clean, _, _), (hostile, _, _) = clean_and_hostile(case, where)
    code = hostile.export_code()
    assert code.isascii() and shape(code) == shape(clean.export_code())
    namespace: dict = {}
    exec(compile(code, "<exported>", "exec"), namespace)
    again = namespace["build"](hostile.program)
    assert again.history == hostile.history
    assert dict(again.state.shardings) == dict(hostile.state.shardings)
    assert not hasattr(builtins, "PWNED")


def jax_cases():
    for case in HOSTILE:
        yield pytest.param(case, "values", id=f"{case}-values")
        yield pytest.param(case, "function", id=f"{case}-function")


@pytest.mark.parametrize("mode", ["constrained", "explicit"])
@pytest.mark.parametrize("case, where", list(jax_cases()))
def test_export_jax_holds_only_the_clean_statements(case, where, mode):
    (clean, _, _), (hostile, _, _) = clean_and_hostile(case, where)
    code = hostile.export_jax(mode=mode)
    assert shape(code) == shape(clean.export_jax(mode=mode))
    module = types.ModuleType("exported")
    exec(compile(code, "<exported>", "exec"), module.__dict__)
    assert len(module.IN_SPECS) == len(hostile.program.inputs)
    assert not hasattr(builtins, "PWNED")


@pytest.mark.slow
def test_hostile_exports_run_and_compute_the_step():
    names = [HOSTILE["code"], HOSTILE["newlines"], HOSTILE["unicode"]]
    s, step, args = session_of(names, HOSTILE["a hash"])
    module = types.ModuleType("exported")
    exec(compile(s.export_jax(), "<exported>", "exec"), module.__dict__)
    got = module.partitioned(step, module.make_mesh(jax.devices()[: MESH.size]))(*args)
    np.testing.assert_allclose(np.asarray(got), np.asarray(step(*args)), rtol=1e-6)
    assert not hasattr(builtins, "PWNED")


@pytest.mark.parametrize("value", [*HOSTILE.values(), ("a", 1, None), ["x", 2.5], {"k'": True}])
def test_literal_is_ascii_and_reads_back_as_the_value(value):
    text = literal(value)
    assert text.isascii() and '"' not in text.replace('\\"', "") and "\n" not in text
    assert ast.literal_eval(text) == value
    # inside a docstring and a comment it stays there
    assert shape(f'"""{text}"""\nx = 1  # {text}\n') == shape('"""S"""\nx = 1\n')


@pytest.mark.parametrize("value", [float("nan"), float("inf"), object()])
def test_literal_refuses_or_spells_what_is_no_literal(value):
    if isinstance(value, float):
        assert eval(literal(value)) != 1.0  # float('inf') / float('nan'), not a bare name
    else:
        with pytest.raises(wb.WorkbenchError, match=r"cannot write .* into generated code"):
            literal(value)
