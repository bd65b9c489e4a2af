"""The course's notebooks, their exercises and their answers (notebooks/course/__init__.py
says how they are marked)."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(ROOT.glob("*.ipynb"))
COURSE = [p for p in NOTEBOOKS if p.name.startswith("course_")]
OTHERS = [p for p in NOTEBOOKS if p not in COURSE]


def solutions(path: Path) -> dict[str, str]:
    """Exercise id -> its answer, from notebooks/solutions/<notebook name>.py."""
    text = (ROOT / "solutions" / f"{path.stem}.py").read_text()
    parts = re.split(r"^# %% (\S+)[^\n]*\n", text, flags=re.M)
    return {k: v.strip() + "\n" for k, v in zip(parts[1::2], parts[2::2])}


def marked(nb, key: str) -> dict[str, int]:
    """Exercise id -> the index of the cell marked ``key`` ("exercise" or "check") for it."""
    return {c.metadata[key]: i for i, c in enumerate(nb.cells) if key in c.metadata}


def read(path: Path, solved: bool = False):
    """The notebook, as shipped or with every exercise cell replaced by its answer."""
    nb = nbformat.read(path, as_version=4)
    if solved:
        answers = solutions(path)
        for k, i in marked(nb, "exercise").items():
            nb.cells[i].source = answers[k]
    return nb
