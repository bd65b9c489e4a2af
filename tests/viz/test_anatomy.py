"""What the workbench sees in a program, as rows and as an HTML table."""

import pytest

import workbench as wb
from tests.core.zoo import program
from workbench.viz import anatomy_html, anatomy_rows
from workbench.viz.anatomy import COLUMNS, shorten

from .programs import MESH


def test_rows_follow_the_report():
    lm = program("lm")
    findings = lm.anatomy().report()
    rows = anatomy_rows(lm)
    assert len(rows) == len(findings)
    for row, f in zip(rows, findings):
        assert tuple(row) == COLUMNS
        assert (row["role"], row["count"], row["dim"]) == (f.role, len(f.values), f.dim)
        assert row["values"] == tuple(lm.values[v].name for v in f.values[:3])
        assert row["confidence"] == round(100 * f.confidence) and 0 < row["confidence"] <= 100
        assert row["evidence"] == f.evidence and not row["corrected"]
    by_role = {r["role"]: r for r in rows}
    assert {"parameter", "gradient", "data", "batch", "attention 0", "embedding"} <= set(by_role)
    assert by_role["batch"]["values"] == ("batch/targets", "batch/tokens")
    assert by_role["batch"]["dim"] == 0
    assert by_role["embedding"]["values"] == ("params/embed",)


def test_rows_take_findings_or_an_anatomy():
    lm = program("lm")
    anatomy = lm.anatomy()
    assert anatomy_rows(lm, anatomy) == anatomy_rows(lm, anatomy.report()) == anatomy_rows(lm)
    assert [r["role"] for r in anatomy_rows(lm, anatomy.report()[:2])] == [
        "parameter",
        "gradient",
    ]
    assert all(len(r["values"]) <= 1 for r in anatomy_rows(lm, first=1))
    with pytest.raises(wb.WorkbenchError, match="anatomy_rows expected findings"):
        anatomy_rows(lm, [lm])


def test_a_session_shows_its_corrections_first():
    gnn = program("gnn")
    s = wb.Session(gnn, MESH)
    assert anatomy_rows(s) == anatomy_rows(gnn)
    s.apply(wb.Role("batch/{senders,receivers}", "data", dim=0))
    first, *rest = anatomy_rows(s)
    assert first["corrected"] and (first["role"], first["dim"], first["count"]) == ("data", 0, 2)
    assert set(first["values"]) == {"batch/senders", "batch/receivers"}
    assert first["confidence"] == 100 and "Role" in first["evidence"]
    assert not any(r["corrected"] for r in rest)
    s.undo()
    assert not any(r["corrected"] for r in anatomy_rows(s))


def test_long_names_keep_their_last_parts():
    assert shorten("params/layers/0/attn/wq") == "params/layers/0/attn/wq"
    name = "params/transformer/encoder/layers/11/self_attention/query/kernel"
    short = shorten(name, 40)
    assert len(short) <= 40 and short.startswith("…/") and short.endswith("query/kernel")
    assert name.endswith(short[1:])
    one = "x" * 100
    assert len(shorten(one, 40)) == 40 and "…" in shorten(one, 40)
    rows = anatomy_rows(program("lm"), width=10)
    assert all(len(v) <= 10 for r in rows for v in r["values"])


def test_html_table_holds_the_rows():
    gnn = program("gnn")
    s = wb.Session(gnn, MESH, [wb.Role("batch/senders", "data", dim=0)])
    rows = anatomy_rows(s)
    text = anatomy_html(rows)
    assert text.startswith("<table") and text.count("<tr") == len(rows) + 1
    assert "<th>confidence</th>" in text and "95%" in text
    assert "(corrected)" in text and "background" in text
    parameter = next(r for r in rows if r["role"] == "parameter")
    assert f"… {parameter['count'] - 3} more" in text
    assert "more." not in anatomy_html(rows, limit=len(rows))
    assert f"… and {len(rows) - 2} more." in anatomy_html(rows, limit=2)
    assert "no roles" in anatomy_html([])


def test_html_escapes_names():
    row = dict(
        role="<b>x</b>",
        count=1,
        values=("<img src=x onerror=alert(1)>",),
        dim=None,
        confidence=50,
        evidence="a & b",
        corrected=False,
    )
    text = anatomy_html([row])
    assert "<img" not in text and "&lt;img" in text and "a &amp; b" in text
    assert "&lt;b&gt;x&lt;/b&gt;" in text
