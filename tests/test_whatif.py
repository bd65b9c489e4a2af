"""What-if sweeps: prices a model over chip kinds, counts, mesh shapes and its own shapes,
recapturing only where shapes change; answers the smallest cluster that fits, the best MFU
per chip count, what doubling a shape costs, and the Pareto front, each checked against
the points themselves; a point that cannot be planned says why; the shell prints it."""

import json

import pytest

import workbench as wb
from workbench.cli import main
from workbench.core.errors import InputError
from workbench.core.whatif import meshes, plans, sweep
from workbench.models import build, lm
from workbench.viz.whatif import answer_rows, pareto_chart

CAPTURES = []


def model(batch, seq_len):
    CAPTURES.append((batch, seq_len))
    config = lm.Config.preset("small", n_layers=2, batch=batch, seq_len=seq_len)
    ex = build("lm_scan", config, abstract=True)
    return (ex.fn, *ex.args)


@pytest.fixture(scope="module")
def result():
    CAPTURES.clear()
    return sweep(
        model,
        hardware=["H100", "A100"],
        chips=[8, 32],
        shapes={"batch": [16, 32], "seq_len": [1024, 2048]},
        stages=(1, 2),
        microbatches=(4,),
    )


def test_the_grid_is_every_mesh_plan_and_shape(result):
    # per chip count: model axis 1..8 (inside a node of 8), stages 1 or 2, the rest data
    assert meshes(16, 8, (1, 2))[0] == {"data": 16}
    assert {"stage": 2, "data": 4, "model": 2} in meshes(16, 8, (1, 2))
    per_shape = sum(len(plans(m, (4,))) for n in (8, 32) for m in meshes(n, 8, (1, 2)))
    assert len(result.points) == 2 * 4 * per_shape  # two chip kinds, four shape pairs
    # each shape captured once, whatever the chips, meshes and chip kinds
    assert sorted(CAPTURES) == sorted({(b, s) for b in (16, 32) for s in (1024, 2048)})


def test_points_that_cannot_be_planned_say_why(result):
    bad = [p for p in result.points if not p.priced]
    assert bad and all(p.error for p in bad)
    assert any("does not divide the batch" in p.error for p in bad)  # 32 data ways, batch 16


def test_the_answers_are_the_points_best(result):
    fitting = [p for p in result.points if p.priced and p.fits]
    small = result.smallest_fitting()
    assert small.chips == min(p.chips for p in fitting)
    assert small.step_s == min(p.step_s for p in fitting if p.chips == small.chips)
    best = result.best_mfu()
    for (kind, chips), p in best.items():
        same = [q for q in fitting if q.hardware == kind and q.chips == chips]
        assert p.mfu == max(q.mfu for q in same)
    assert {k[1] for k in best} == {8, 32}
    # twice the sequence: every pair differs only there, and costs more
    pairs = result.scaled("seq_len")
    assert pairs and all(b.step_s > a.step_s for a, b, _ in pairs)
    for a, b, _ in pairs:
        assert (a.hardware, a.chips, a.mesh, a.plan) == (b.hardware, b.chips, b.mesh, b.plan)
        assert dict(b.shapes)["seq_len"] == 2 * dict(a.shapes)["seq_len"]
    median, low, high, n = result.scaling("seq_len")
    assert low <= median <= high and n == len(pairs) and low > 1


def test_the_pareto_front_is_not_beaten(result):
    front = result.pareto()
    assert front
    for p in front:
        rivals = [q for q in result.fitting() if q.shapes == p.shapes and q is not p]
        assert not any(q.step_s < p.step_s and q.chip_seconds < p.chip_seconds for q in rivals)
    # and every fitting point off the front is beaten by one on it
    off = [p for p in result.fitting() if p not in front]
    for p in off[:20]:
        assert any(
            q.shapes == p.shapes and q.step_s <= p.step_s and q.chip_seconds <= p.chip_seconds
            for q in front
        )


def test_the_picture_and_the_rows():
    result = sweep(
        model, hardware=["H100"], chips=[8], shapes={"batch": [16], "seq_len": [1024, 2048]}
    )
    fig = pareto_chart(result)
    names = [t.name for t in fig.data]
    assert "Pareto front" in names and any(n.startswith("H100") for n in names)
    rows = answer_rows(result, "seq_len")
    assert rows[0]["question"] == "smallest cluster that fits"
    assert rows[-1]["question"] == "twice the seq_len" and "x (median of" in rows[-1]["answer"]
    assert json.dumps(result.rows())


def test_a_program_sweeps_chips_alone():
    ex = build("lm", "tiny")
    program = wb.capture(ex.fn, *ex.args)
    result = sweep(program, hardware=["H100"], chips=[2])
    assert result.points and all(p.shapes == () for p in result.points)
    with pytest.raises(InputError, match="a Program has its shapes"):
        sweep(program, hardware=["H100"], chips=[2], shapes={"batch": [2]})


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"chips": [0]}, "a chip count is a positive integer; got 0"),
        ({"chips": []}, "at least one chips"),
        ({"hardware": ["H9000"]}, "H9000"),
    ],
)
def test_bad_grids_are_refused_saying_what_works(kw, match):
    args = {"hardware": ["H100"], "chips": [8], **kw}
    with pytest.raises(InputError, match=match):
        sweep(model, shapes={"batch": [16], "seq_len": [1024]}, **args)


def test_the_shell_prints_the_answers_and_the_front(capsys):
    argv = ["sweep", "--model", "lm_scan:small", "--hardware", "H100", "--chips", "8"]
    argv += ["--shape", "seq_len=256,512", "--double", "seq_len"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "smallest cluster that fits: " in out and "best MFU on 8 x H100 SXM" in out
    assert "twice the seq_len: the step takes" in out and "Pareto front" in out
    assert main([*argv, "--json"]) == 0
    points = json.loads(capsys.readouterr().out)["points"]
    assert points and {"chips", "mesh", "seq_len", "step_s", "mfu", "fits"} <= set(points[0])
    assert main([*argv[:-2], "--double", "batch"]) == 2
    assert "--double 'batch'" in capsys.readouterr().err
