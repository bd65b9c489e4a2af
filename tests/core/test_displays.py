"""What a user meets displays short: a repr of a few lines that says what matters, and in a
notebook an HTML table (details folded) in which every user string is escaped."""

from html.parser import HTMLParser

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb
from tests.core.zoo import program as zoo
from workbench.core.anatomy.report import Finding, Findings
from workbench.core.lowering.run import RunResult
from workbench.core.lowering.verdict import Check, Verdict
from workbench.core.plan.collective_list import Collectives
from workbench.core.search.candidates import AutoReport, Candidate, decide
from workbench.core.search.tree import Auto
from workbench.core.units import format_bytes, format_seconds

LINES, CHARS = 12, 1500
BAD = '<script>alert("x")</script>&'
ESCAPED = "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;"


class Tags(HTMLParser):
    """The start tags of a document, failing on a close tag that closes nothing open."""

    def __init__(self):
        super().__init__()
        self.open, self.seen = [], []

    def handle_starttag(self, tag, attrs):
        self.open.append(tag)
        self.seen.append(tag)

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, (tag, self.open)
        self.open.pop()


def html_of(obj) -> list[str]:
    """The start tags of ``obj``'s HTML display, which must be well formed and hold a table."""
    text = obj._repr_html_()
    parser = Tags()
    parser.feed(text)
    parser.close()
    assert not parser.open, parser.open
    assert "table" in parser.seen and "script" not in parser.seen
    return parser.seen


def short(obj) -> str:
    text = repr(obj)
    assert len(text.splitlines()) <= LINES and len(text) <= CHARS, text
    return text


@pytest.fixture(scope="module")
def lm():
    return wb.Session(
        zoo("lm"), wb.Mesh({"batch": 2, "model": 2}), [wb.BP("batch"), wb.MP("model")]
    )


def test_a_program_says_its_size_and_phases(lm):
    text = short(lm.program)
    assert text.startswith("<Program 'train_step': 75 inputs") and "backward" in text
    assert "params/" in text  # its largest inputs, by name
    assert "details" in html_of(lm.program)


def test_a_session_says_its_mesh_schedule_and_step(lm):
    text = short(lm)
    assert "Mesh(batch=2, model=2), step 2/2" in text
    assert "#0 BP('batch')" in text and "#1 MP('model')" in text
    html_of(lm)


def test_a_long_schedule_is_cut_with_a_count():
    s = wb.Session(zoo("lm"), wb.Mesh({"batch": 2}), [wb.BP("batch")] * 14)
    text = short(s)
    assert "#0 BP('batch')" in text and "more (session.history" in text


def test_collectives_are_a_list_that_sums_itself_up(lm):
    cs = lm.collectives()
    assert isinstance(cs, Collectives) and isinstance(cs, list)
    assert cs == list(lm.plan().collectives) and cs[0] is lm.plan().collectives[0]
    text = short(cs)
    assert text.startswith(f"Collectives: {len(cs)} ")
    assert "all-reduce over model: 8" in text and "all-reduce over batch" in text
    assert format_bytes(cs.bytes) in text and format_bytes(cs.largest(1)[0].bytes) in text
    assert html_of(cs).count("details") == 1
    assert "nothing" not in repr(Collectives()) and "none" in repr(Collectives())


def test_an_estimate_says_step_time_and_peak_memory(lm):
    e = lm.estimate(wb.hardware.H100)
    text = short(e)
    assert format_seconds(e.step_s) in text and format_bytes(e.memory.peak) in text
    assert "all-reduce" in text and "fits" in text
    html_of(e)


def test_the_anatomy_report_reads_as_a_table_and_stays_a_list_of_findings(lm):
    findings = lm.program.anatomy().report()
    assert isinstance(findings, Findings) and all(isinstance(f, Finding) for f in findings)
    assert findings[0].role == "parameter" and isinstance(findings[:2], list)
    text = short(findings)
    assert text.startswith(f"Anatomy report: {len(findings)} findings")
    first = text.splitlines()[1]
    assert "parameter" in first and "params/embed +23" in first and "95%" in first
    assert "inputs the model reads" in first  # its evidence, cut to fit
    html_of(findings)


def result(agree: bool, name: str = "out") -> RunResult:
    """A run's result by hand: large outputs, one check."""
    big = {"w": np.zeros((512, 512)), "loss": np.float32(1.0)}
    check = Check(name, "output", agree, error=0.5, allowed=0.01, bad=3, size=9)
    return RunResult(
        lowering="explicit",
        device="8 x cpu",
        outputs=big,
        reference=big,
        max_abs_error=0.0 if agree else 0.5,
        max_rel_error=0.0,
        verdict=Verdict((check,), None if agree else f"{name} at op dot_general.0"),
        step_time_s=0.00123,
        times_s=(0.00123,) * 5,
        compile_time_s=0.5,
        memory={"peak_memory_in_bytes": 2048},
        donated=("params/w",),
    )


def test_a_run_result_says_the_verdict_and_the_time_not_the_arrays():
    good, bad = result(True), result(False, BAD)
    text = short(good)
    assert "outputs agree" in text and "step 1.23 ms" in text and "2.0 KiB" in text
    text = short(bad)
    assert "DIFFER (1 out of tolerance)" in text and "first differing value" in text
    assert ESCAPED in bad._repr_html_() and BAD not in bad._repr_html_()
    html_of(bad)


@pytest.mark.slow  # compiles and runs the partitioned step (about 8 s)
def test_a_real_run_displays_short():
    s = wb.Session(zoo("mlp"), wb.Mesh({"batch": 8}), [wb.BP("batch")])
    r = s.run(repeats=2)
    text = short(r)
    assert "outputs agree" in text and format_seconds(r.step_time_s) in text
    html_of(r)


def test_auto_report_names_the_winner_and_the_best_candidates():
    names = [f"S{i}('model')" for i in range(9)] + [BAD]
    cands = [Candidate(n, (), 1e-3 * (i + 1), 1024, -(i + 1.0)) for i, n in enumerate(names)]
    cands.append(Candidate("X('model')", (), error="it tiles nothing"))
    report = decide(Auto("model"), cands)
    assert isinstance(report, AutoReport) and report.winner.name == "S0('model')"
    text = short(report)
    assert "chose S0('model'): step 1 ms" in text and "* S0('model')" in text
    assert "... and 5 more" in text
    tags = html_of(report)
    assert "details" in tags and ESCAPED in report._repr_html_()


def hostile_session():
    def step(params, batch):
        def loss(p):
            return jnp.mean((jnp.tanh(batch[BAD] @ p[BAD]) @ p["out"]) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        return {k: params[k] - 0.1 * grads[k] for k in params}, value

    params = {BAD: jnp.ones((16, 32)), "out": jnp.ones((32, 4))}
    program = wb.capture(step, params, {BAD: jnp.ones((8, 16))})
    schedule = [wb.BP("batch"), wb.Tile(f"params/{BAD}", dim=1, axis="batch")]
    return wb.Session(program, wb.Mesh({"batch": 8}), schedule)


def test_value_names_are_escaped_in_html():
    s = hostile_session()
    cs = s.collectives()
    assert any(BAD in cs.value_name(c) for c in cs)
    for obj in (s.program, s, cs, s.program.anatomy().report()):
        text = obj._repr_html_()
        html_of(obj)
        assert BAD not in text and ESCAPED in text, type(obj).__name__
