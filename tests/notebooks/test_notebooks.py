"""Every notebook in notebooks/ runs top to bottom, and every primitive of the programs it
captures has a record in ``workbench.core.ops``. The course's chapters run twice: as shipped,
where every exercise check fails with a hint and nothing else fails, and with the answers
from notebooks/solutions/, where every check passes."""

import re

import pytest
from nbclient import NotebookClient

from tests.notebooks.course import COURSE, OTHERS, marked, read, solutions

#: Run before a notebook's first cell: every Program built from then on (by capture, a
#: Session.from_jax, a Workbench) adds its primitives to a set.
WATCH = """
from workbench.core.ir.program import Program as _Program
_seen_primitives, _post_init = set(), _Program.__post_init__
def _watch(self):
    _post_init(self)
    _seen_primitives.update(op.primitive for op in self.walk())
_Program.__post_init__ = _watch
"""
#: Run after its last cell: the primitives met that no record describes.
REPORT = """
from workbench.core import ops as _ops
_unknown = sorted(p for p in _seen_primitives if _ops.record(p) is None)
print(f"unregistered: {_unknown} of {len(_seen_primitives)} primitives")
"""


def _execute(nb, tmp_path, allow_errors: bool = False):
    import nbformat

    nb.cells.insert(0, nbformat.v4.new_code_cell(WATCH))
    nb.cells.append(nbformat.v4.new_code_cell(REPORT))
    client = NotebookClient(
        nb,
        timeout=900,
        kernel_name="python3",
        allow_errors=allow_errors,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    report = "".join(o.get("text", "") for o in nb.cells.pop().get("outputs", []))
    nb.cells.pop(0)
    assert re.search(r"unregistered: \[\] of [1-9]\d* primitives", report), report
    return nb


def _errors(cell) -> list:
    return [o for o in cell.get("outputs", []) if o.output_type == "error"]


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []))


@pytest.mark.slow
@pytest.mark.parametrize("path", OTHERS, ids=[p.name for p in OTHERS])
def test_notebook_runs(path, tmp_path):
    nb = _execute(read(path), tmp_path)
    assert not [e for c in nb.cells for e in _errors(c)]


@pytest.mark.slow
@pytest.mark.parametrize("path", COURSE, ids=[p.name for p in COURSE])
def test_course_as_shipped(path, tmp_path):
    """Nothing is answered: every check fails with a hint; every other cell runs."""
    nb = _execute(read(path), tmp_path, allow_errors=True)
    checks = {i: k for k, i in marked(nb, "check").items()}
    for i, cell in enumerate(nb.cells):
        errors = _errors(cell)
        if i not in checks:
            assert not errors, f"cell {i} failed: {errors[0]['ename']}: {errors[0]['evalue']}"
            continue
        assert errors, f"check {checks[i]} passed with nothing answered: {_text(cell)}"
        (e,) = errors
        assert e["ename"] == "CheckFailed" and len(e["evalue"]) > 40, (checks[i], e["evalue"])


@pytest.mark.slow
@pytest.mark.parametrize("path", COURSE, ids=[p.name for p in COURSE])
def test_course_solved(path, tmp_path):
    """With the answers from notebooks/solutions/, every check passes."""
    nb = _execute(read(path, solved=True), tmp_path)
    assert not [e for c in nb.cells for e in _errors(c)]
    for k, i in marked(nb, "check").items():
        assert _text(nb.cells[i]).startswith("✓"), (k, _text(nb.cells[i]))


@pytest.mark.parametrize("path", COURSE, ids=[p.name for p in COURSE])
def test_course_marks(path):
    """Every exercise has one check after it and an answer that differs from what ships."""
    nb = read(path)
    exercises, checks, answers = marked(nb, "exercise"), marked(nb, "check"), solutions(path)
    assert exercises, "a chapter without exercises"
    assert set(exercises) == set(checks) == set(answers)
    for k, i in exercises.items():
        assert i < checks[k]
        shipped = nb.cells[i].source
        assert "..." in shipped and shipped.strip() != answers[k].strip(), k
