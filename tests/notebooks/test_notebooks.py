"""Every notebook in notebooks/ runs top to bottom without error, and every primitive of the
programs it captures has a record in ``workbench.core.ops``."""

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

# executes every notebook: in the full suite (CI), not the fast lane
pytestmark = pytest.mark.slow

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(WATCH))
    nb.cells.append(nbformat.v4.new_code_cell(REPORT))
    client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    report = "".join(o.get("text", "") for o in nb.cells[-1].get("outputs", []))
    assert re.search(r"unregistered: \[\] of [1-9]\d* primitives", report), report
