"""The collective plan as rows and as a plotly table."""

import pytest

import workbench as wb
from workbench.core import hardware as hw
from workbench.models import build
from workbench.viz import collective_rows, collective_table
from workbench.viz.table import COLUMNS

from .programs import MESH


@pytest.fixture(scope="module")
def session():
    ex = build("lm", "tiny", abstract=True)
    return wb.Session(wb.capture(ex.fn, *ex.args), MESH, [wb.BP("batch"), wb.MP("model")])


def test_rows_name_values_and_tactics(session):
    rows = collective_rows(session)
    cs = session.collectives()
    assert cs and len(rows) == len(cs)
    for i, (row, c) in enumerate(zip(rows, cs)):
        assert tuple(row) == COLUMNS
        assert row["index"] == i
        assert (row["kind"], row["axes"], row["bytes"], row["count"]) == (
            c.kind,
            c.axes,
            c.bytes,
            c.count,
        )
        assert row["value"] == session.program.values[c.value].name
        assert row["tactic"] == str(session.history[c.tactic])
        assert row["why"] == c.why and row["seconds"] is None


def test_rows_from_an_estimate_carry_times(session):
    e = session.estimate(hw.H100)
    rows = collective_rows(e, session.program)
    assert [r["seconds"] for r in rows] == [c.total_s for c in e.collectives]
    timed = collective_rows(session, hardware=hw.H100)
    assert [r["seconds"] for r in timed] == [r["seconds"] for r in rows]
    bare = collective_rows(session.collectives())  # no program: values by id
    assert bare[0]["value"] == f"#{session.collectives()[0].value}"
    assert bare[0]["tactic"].startswith("#")


def test_table_figure_holds_the_rows(session):
    fig = collective_table(session, hardware=hw.H100)
    (table,) = fig.to_plotly_json()["data"]
    assert table["type"] == "table"
    header = [h.removeprefix("<b>").removesuffix("</b>") for h in table["header"]["values"]]
    assert header[:3] == ["#", "kind", "value"]
    kinds, values = table["cells"]["values"][1], table["cells"]["values"][2]
    rows = collective_rows(session)
    assert list(kinds) == [r["kind"] for r in rows]
    assert list(values) == [r["value"] for r in rows]
    assert f"{len(rows)} collectives" in fig.layout.title.text


def test_top_keeps_the_costliest_in_plan_order(session):
    rows = collective_rows(session, hardware=hw.H100)
    assert len(rows) > 1
    fig = collective_table(session, hardware=hw.H100, top=3)
    (table,) = fig.to_plotly_json()["data"]
    kept = list(table["cells"]["values"][0])
    assert len(kept) == 3 and kept == sorted(kept)
    dropped = [r["seconds"] for r in rows if r["index"] not in kept]
    assert min(rows[i]["seconds"] for i in kept) >= max(dropped)
    assert "the 3 costliest" in fig.layout.title.text


def test_something_else_is_refused(session):
    with pytest.raises(wb.WorkbenchError, match=r"session\.collectives"):
        collective_rows([session.program])
