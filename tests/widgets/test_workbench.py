"""The notebook widget, driven as a user would: clicks, picks and typed values.

Buttons are clicked with ``Button.click()``; what each view shows is read back from its
widget. The engine's own answers are the reference: the widget must show them, not its own.
"""

import dataclasses
import html
import json
import re

import jax
import jax.numpy as jnp
import pytest

import workbench as wb
from tests.widgets.conftest import MESH, on_page
from workbench.core import hardware as hw
from workbench.core.errors import WorkbenchError
from workbench.core.strategies.named import suggested_axis
from workbench.models import build, lm
from workbench.viz import collective_rows
from workbench.widgets import Workbench, render
from workbench.widgets.controls import OFFERED


@pytest.fixture
def bench(program):
    return on_page(Workbench(program, mesh=MESH, hardware=hw.TPU_V5E, auto_budget=8))


def views(b):
    return dict(
        status=b.status.value,
        graph=b.graph.svg,
        summary=b.summary.value,
        export=b.export.value,
        table=b.table.value,
    )


def test_opens_on_nothing_applied(bench):
    assert bench.session.step == 0 and not bench.error.value
    assert "step 0 of 0" in bench.status.value
    assert bench.graph.svg.startswith("<svg")
    assert render.estimate(bench.session.estimate(hw.TPU_V5E)) == bench.summary.value
    assert bench.export.value == bench.session.export_code()
    assert "wb-workbench" in bench._dom_classes


def test_strategy_buttons_apply_undo_and_redo(bench):
    start = views(bench)
    bench.strategies.buttons["BP"].click()
    assert [str(t) for t in bench.session.history] == ["BP('batch')"]
    after_bp = views(bench)
    assert "step 1 of 1" in after_bp["status"] and "BP(axis='batch'" in after_bp["export"]
    assert all(after_bp[k] != start[k] for k in ("graph", "summary", "export", "table"))

    bench.strategies.buttons["MP"].click()
    after_mp = views(bench)
    assert [str(t) for t in bench.session.history] == ["BP('batch')", "MP('model')"]
    assert "MP(axis='model'" in after_mp["export"] and after_mp["graph"] != after_bp["graph"]
    assert "all-reduce" in after_mp["table"]
    assert after_mp["summary"] == render.estimate(bench.session.estimate(hw.TPU_V5E))

    bench.history.undo.click()
    assert views(bench) | {"status": ""} == after_bp | {"status": ""}
    assert "step 1 of 2" in bench.status.value
    assert [label for label, _ in bench.history.steps.options][-1].endswith("(undone)")
    bench.history.redo.click()
    assert views(bench) == after_mp
    assert len(bench.figures["schedule"].data) > 0

    bench.history.reset.click()
    assert bench.session.step == 0 and views(bench)["summary"] == start["summary"]
    bench.history.steps.value = 2  # picking a step in the list jumps there
    assert bench.session.step == 2 and views(bench) == after_mp


def test_the_graph_and_charts_follow_once_the_page_shows_the_widget(program, monkeypatch):
    from workbench.widgets import workbench as module

    shown = []
    monkeypatch.setattr(module, "_display", lambda out, fig: shown.append((out, fig)))
    bench = Workbench(program, mesh=MESH, hardware=hw.TPU_V5E, schedule=[wb.BP("batch")])
    # the page gets the schedule, the estimate and the collective table first
    assert "step 1 of 1" in bench.status.value and "all-reduce" in bench.table.value
    assert bench.summary.value == render.estimate(bench.session.estimate(hw.TPU_V5E))
    # held back: the graph (``dot``) and the charts (plotly.js) would hold the page up
    assert shown == [] and "time" not in bench.figures
    assert bench.graph.svg == "" and bench.graph_panel.picture is None
    bench.inspect_value.value = program.values[0].name  # nothing to mark yet: no error
    assert not bench.error.value and program.values[0].name in bench.inspector.value
    shown.clear()  # the inspector's grid
    on_page(bench)
    assert bench.graph.svg.startswith("<svg") and bench.graph_panel.replay_step.value == 1
    keys = ("time", "memory", "schedule")
    assert shown == [
        (bench.time_chart, bench.figures["time"]),
        (bench.memory_chart, bench.figures["memory"]),
        (bench.schedule_chart, bench.figures["schedule"]),
    ]
    shown.clear()
    svg = bench.graph.svg
    on_page(bench)  # a second view of the widget
    assert shown == [] and bench.graph.svg == svg  # drawn once
    bench.strategies.buttons["BP"].click()
    assert [fig for _, fig in shown[:3]] == [bench.figures[k] for k in keys]  # then each step


def test_a_step_before_the_page_shows_the_widget_draws_the_graph(program):
    bench = Workbench(program, mesh=MESH, hardware=hw.TPU_V5E)
    bench.strategies.buttons["BP"].click()
    assert bench.graph.svg.startswith("<svg") and not bench.graph_panel.held
    svg = bench.graph.svg
    on_page(bench)
    assert bench.graph.svg == svg and not bench.error.value


def test_strategy_axis_override(bench):
    bench.strategies.axis.value = "model"
    bench.strategies.buttons["BP"].click()
    assert str(bench.session.history[-1]) == "BP('model')"


def test_tactic_builder_tiles_a_value(bench, program):
    b = bench.builder
    b.value.value = "params/layers/0/mlp/w_in"
    assert [d for _, d in b.dim.options] == [0, 1]
    b.dim.value, b.axis.value = 1, "model"
    b.apply_button.click()
    assert not bench.error.value
    assert str(bench.session.sharding("params/layers/0/mlp/w_in")).count("@model") == 1
    assert "Tile(" in bench.export.value
    b.kind.value = "Replicate"
    b.value.value, b.axis.value = "batch/**", "batch"
    b.apply_button.click()
    assert "Replicate(" in bench.export.value and bench.session.step == 2


@pytest.mark.parametrize(
    "selector, dim, axis, words",
    [
        ("params/nothing", 0, "model", ["matches no value", "Close names"]),
        ("params/layers/0/mlp/w_in", 7, "model", ["dim", "7"]),
        ("params/**/[", 0, "model", ["["]),
    ],
)
def test_bad_input_shows_and_changes_nothing(bench, selector, dim, axis, words):
    bench.strategies.buttons["BP"].click()
    before = (bench.session.state, bench.session.step, views(bench))
    b = bench.builder
    b.value.value = selector
    b.dim.options = [(str(d), d) for d in range(8)]
    b.dim.value, b.axis.value = dim, axis
    b.apply_button.click()
    assert isinstance(bench.last_error, WorkbenchError)
    assert all(word in bench.error.value for word in words), bench.error.value
    assert "traceback" not in bench.error.value  # the user's mistake: just the message
    assert (bench.session.state, bench.session.step, views(bench)) == before
    bench.history.undo.click()  # the next action clears the error line
    assert not bench.error.value


def test_undo_at_the_start_says_why(bench):
    bench.history.undo.click()
    assert "nothing to undo" in bench.error.value and bench.session.step == 0


def test_unexpected_errors_show_with_a_traceback(bench, monkeypatch):
    def broken(tactic):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(bench.session, "apply", broken)
    bench.strategies.buttons["BP"].click()
    assert "RuntimeError: disk on fire" in bench.error.value
    assert "traceback" in bench.error.value and bench.session.step == 0
    assert "wb-busy" not in bench._dom_classes


def test_auto_reports_progress_and_lands_in_the_schedule(bench):
    bench.strategies.buttons["BP"].click()
    seen = []
    bench.auto.progress.observe(lambda c: seen.append(c["new"]), "value")
    bench.auto.budget.value = 6
    bench.auto.run_button.click()
    assert not bench.error.value, bench.error.value
    assert str(bench.session.history[-1]) == "Auto('model')"
    assert seen and max(seen) <= 6 and bench.auto.progress.value == max(seen)
    assert "evaluations" in bench.auto.label.value
    # the export writes what the search decided: plain tactics, no search
    code = [x.strip() for x in bench.export.value.splitlines()]
    assert not [x for x in code if "Auto(" in x and not x.startswith("# Auto('model') decided")]
    assert bench.export.value == bench.session.export_code()


def test_inspector_shows_the_engine_answers(bench):
    bench.strategies.buttons["MP"].click()
    name = "params/layers/0/attn/wo"
    bench.inspect_value.value = name
    s = bench.session
    assert render.esc(s.sharding(name)) in bench.inspector.value
    assert render.esc(str(s.why(name)).splitlines()[1].strip()) in bench.inspector.value
    assert bench.figures["grid"].data
    # the field's value follows each keystroke: a name not (yet) a value is a note, no error
    bench.inspect_value.value = "params/nope"
    assert "params/nope" in bench.inspector.value and not bench.error.value


def test_name_fields_offer_the_names_that_contain_what_is_typed(bench):
    names = bench.session.program.names()
    fields = (bench.builder.value, bench.inspect_value, bench.anatomy.selector)
    for field in fields:
        assert list(field.options) == names[:OFFERED]  # inputs first
        field.value = "attn/wo"
        assert list(field.options) == [n for n in names if "attn/wo" in n][:OFFERED]
        assert 0 < len(field.options) <= OFFERED
        field.value = ""
        assert list(field.options) == names[:OFFERED]
    bench.builder.value.value = "params/layers/0/attn/wo"  # then apply with no Enter
    bench.builder.axis.value = "model"
    bench.builder.apply_button.click()
    assert str(bench.session.history[-1]).startswith("Tile('params/layers/0/attn/wo'")


def test_export_kinds(bench):
    bench.strategies.buttons["BP"].click()
    bench.export_kind.value = "plain JAX"
    assert (
        bench.export.value == bench.session.export_jax() and "PartitionSpec" in bench.export.value
    )
    bench.export_kind.value = "JSON"
    data = json.loads(bench.export.value)
    assert data["mesh"] == MESH and data["schedule"][0]["tactic"] == "BP"


def test_save_writes_a_strategy_file_that_loads(bench, program, tmp_path):
    bench.strategies.buttons["BP"].click()
    bench.save_path.value = str(tmp_path / "s.json")
    bench.save_button.click()
    loaded = wb.Session.load(program, tmp_path / "s.json")
    assert loaded.state.shardings == bench.session.state.shardings
    assert "saved" in bench.saved.value


def test_hardware_and_overlap_choices(bench):
    bench.spec.value = hw.H100.name
    assert bench.hardware is hw.H100 and hw.H100.name in bench.summary.value
    bench.overlap_choice.value = "full"
    assert bench.summary.value == render.estimate(bench.session.estimate(hw.H100, overlap="full"))


def test_graph_controls(bench):
    full = bench.graph.svg
    bench.phases["backward"].value = False
    bench.phases["optimizer"].value = False
    assert bench.graph.svg != full and "optimizer" not in bench.graph.svg
    folded = bench.graph.svg
    bench.collapse.value = None  # every op of the forward phase
    assert bench.graph.svg.count('class="node') > folded.count('class="node')


@pytest.mark.slow
def test_run_on_the_devices(program):
    ex = build("mlp", "tiny")
    b = Workbench(ex.fn, *ex.args, mesh={"batch": 2, "model": 4}, schedule=[wb.BP("batch")])
    assert b.session.step == 1
    b.run_button.click()
    assert not b.error.value, b.error.value
    assert "outputs agree" in b.run_result.value and "measured step" in b.run_result.value
    assert b.last_run.matches and "predicted" in b.run_result.value
    b.history.undo.click()
    assert "Not run at this step" in b.run_result.value


def test_names_from_user_code_are_escaped():
    evil = "<img src=x onerror=alert(1)>"

    def f(params, x):
        return jnp.tanh(x @ params[evil]).sum()

    args = ({evil: jnp.ones((8, 4))}, jnp.ones((16, 8)))
    b = Workbench(f, *args, mesh={"batch": 2, "model": 4})
    b.builder.value.value = f"params/{evil}"
    b.builder.axis.value = "model"
    b.builder.apply_button.click()
    b.inspect_value.value = f"params/{evil}"
    shown = [b.title, b.status, b.error, b.summary, b.table, b.inspector]
    assert not any("<img" in v.value for v in shown)
    assert "&lt;img" in b.inspector.value


def test_suggested_axes():
    mesh = wb.Mesh({"data": 2, "tensor": 4})
    assert suggested_axis("BP", mesh) == "data" and suggested_axis("MP", mesh) == "tensor"
    other = wb.Mesh({"x": 2, "y": 4})
    assert suggested_axis("Z3", other) == "x" and suggested_axis("SP", other) == "y"
    # EP and CP: an axis named as expert or context axes are, else the data axis (both
    # split tokens)
    for name, axis in (("EP", "ep"), ("CP", "seq")):
        assert suggested_axis(name, wb.Mesh({"data": 2, axis: 2, "model": 2})) == axis
        assert suggested_axis(name, wb.Mesh({"model": 2, "batch": 4})) == "batch"
    with pytest.raises(WorkbenchError, match="named strategies are"):
        suggested_axis("ZZ", mesh)


def test_workbench_is_public():
    assert wb.Workbench is Workbench
    assert jax.device_count() == 8


def test_collective_table_names_the_code_behind_each_row(program):
    b = Workbench(program, mesh=MESH, schedule=[wb.BP("batch"), wb.MP("model")])
    rows = collective_rows(b.session, hardware=b.hardware)
    assert rows and any(r["code"] for r in rows)
    table = b.table.value
    heads = [h for h, _ in render.COLUMNS]
    assert "code" in heads and "<th>code</th>" in table
    assert sum(float(width.rstrip("%")) for _, width in render.COLUMNS) == pytest.approx(100)
    # a narrow cell, short, with the whole lines (the user's and the library's) on hover
    cells = re.findall(r'<td class="wb-clip wb-code" title="([^"]*)"><code>([^<]*)</code>', table)
    assert len(cells) == len(rows)
    for (title, text), r in zip(cells, rows, strict=True):
        assert html.unescape(text) == r["code"] and html.unescape(title) == r["code_path"]


def test_a_pipelined_step_shows_its_timeline():
    ex = build("lm", lm.Config.preset("tiny", n_layers=4))
    mesh = {"stage": 4, "data": 2}
    b = on_page(Workbench(ex.fn, *ex.args, mesh=mesh, schedule=[wb.PP("stage"), wb.BP("data")]))
    e = b.session.estimate(b.hardware, overlap=b.overlap)
    assert e.pipeline is not None
    assert "pipeline: 4 stages x 4 microbatches, 1f1b" in b.summary.value
    assert b.summary.value == render.estimate(e)
    assert [t.name for t in b.figures["time"].data][:2] == ["F: forward", "B: backward"]
    b.history.undo.click()  # PP alone: still pipelined
    assert b.figures["time"].data[0].name == "F: forward"
    b.history.undo.click()
    assert b.figures["time"].data[0].name != "F: forward"


def test_the_pp_button_pipelines_with_its_settings_and_refuses_bad_ones():
    """PP goes on a stage-like axis with the microbatches, schedule and chunks the panel
    holds; settings the step cannot take leave the session as it was, saying why."""
    ex = build("lm", lm.Config.preset("tiny", n_layers=4))
    b = on_page(Workbench(ex.fn, *ex.args, mesh={"data": 2, "stage": 4}))
    bar = b.strategies
    bar.microbatches.value = 3  # does not divide the batch of 8
    bar.buttons["PP"].click()
    assert b.session.step == 0 and "microbatches=3" in bar.error.value
    bar.microbatches.value, bar.schedule.value = 8, "gpipe"
    bar.buttons["PP"].click()
    assert [str(t) for t in b.session.history] == ["PP('stage', microbatches=8, schedule='gpipe')"]
    assert not bar.error.value and "pipeline: 4 stages x 8 microbatches, gpipe" in b.summary.value
    bar.buttons["BP"].click()  # on data: 4 examples a device, fewer than 8 microbatches
    assert b.session.step == 1 and "microbatches" in bar.error.value
    b.history.undo.click()
    bar.microbatches.value, bar.schedule.value = 4, "1f1b"
    bar.buttons["PP"].click()
    bar.buttons["BP"].click()
    assert [str(t) for t in b.session.history] == ["PP('stage', microbatches=4)", "BP('data')"]
    assert b.session.estimate(b.hardware, overlap=b.overlap).pipeline.schedule.kind == "1f1b"


def test_the_ep_and_cp_buttons_split_experts_and_sequences_or_say_why_not():
    """EP goes on an expert-like axis and CP on a context-like one; EP on a model with no
    experts is refused in the panel and leaves the session as it was."""
    ex = build("lm", lm.Config.preset("moe"))
    b = on_page(Workbench(ex.fn, *ex.args, mesh={"data": 2, "expert": 4}))
    bar = b.strategies
    assert list(bar.buttons)[-4:] == ["EP", "CP", "CP ring", "PP"]
    bar.buttons["BP"].click()
    bar.buttons["EP"].click()
    assert [str(t) for t in b.session.history] == ["BP('data')", "EP('expert')"]
    assert "4@expert" in str(b.session.sharding("params/layers/0/moe/experts/w_in"))
    assert not bar.error.value and "EP(axis='expert'" in b.export.value

    dense = build("lm", lm.Config.preset("tiny", seq_len=32))
    b = on_page(Workbench(dense.fn, *dense.args, mesh={"data": 2, "context": 4}))
    bar = b.strategies
    bar.buttons["EP"].click()  # no experts: refused, nothing applied
    assert b.session.step == 0 and "no mixture of experts" in bar.error.value
    bar.buttons["CP"].click()
    assert [str(t) for t in b.session.history] == ["CP('context')"]
    assert not bar.error.value and not b.session.conflicts
    assert str(b.session.sharding("batch/tokens")).endswith("32@context]")


def test_the_cp_ring_button_applies_ring_attention_on_the_chosen_axis(bench):
    bench.strategies.axis.value = "model"
    bench.strategies.buttons["CP ring"].click()
    assert not bench.strategies.error.value
    # the zoo LM is causal: the ring is balanced
    assert [str(t) for t in bench.session.history] == ["CP('model', kind='ring', balance=True)"]
    assert bench.session.plan().rings and bench.session.plan().zigzag is not None
    assert "kind='ring'" in bench.export.value
    assert "collective-permute" in bench.table.value


def test_the_fused_attention_toggle_prices_the_chosen_spec_fused(bench):
    bench.spec.value = hw.H100.name
    bench.fused.value = True
    assert bench.hardware.fused_attention and bench.hardware.name == hw.H100.name
    fused = dataclasses.replace(hw.H100, fused_attention=True)
    expected = bench.session.estimate(fused, overlap=bench.overlap)
    assert bench.summary.value == render.estimate(expected)
    bench.spec.value = hw.A100.name  # another chip keeps the choice
    assert bench.hardware.fused_attention and bench.hardware.name == hw.A100.name
    bench.fused.value = False
    assert bench.hardware is hw.A100
