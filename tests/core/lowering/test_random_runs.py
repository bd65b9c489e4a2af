"""Random tactic sequences on the zoo's models and the third-party ones (Hugging Face Flax,
Flax NNX and Linen, Equinox, Haiku), lowered explicitly and run on 8 virtual devices over
meshes of one, two and three axes (one of size 1), compute what the unpartitioned programs
compute: 200 generated zoo cases a run, and one random case for each third-party model
(drawn from a seed the failure names, since Hypothesis favours a list's first entries and
would leave models at its end undrawn). The tactics applied are counted, so the tests
cannot pass by having every tactic rejected."""

import random
import warnings
from collections import Counter
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import workbench as wb
from tests.models import programs as external
from workbench.core.strategies.named import BP, MP, Z2, Z3
from workbench.models import build, lm
from workbench.models.external import EXTERNAL

MESHES = [
    wb.Mesh({"batch": 2, "model": 4}),
    wb.Mesh({"batch": 4, "model": 2}),
    wb.Mesh({"x": 8}),
    wb.Mesh({"a": 2, "b": 2, "c": 2}),
    wb.Mesh({"x": 1, "y": 8}),
]
#: Zoo models weighted by how cheap they are to compile, so 200 cases stay within minutes.
ZOO = ["mlp"] * 8 + ["gnn"] * 5 + ["cnn"] * 4 + ["lm"] * 2 + ["lm_scan"]
CASES = 200
CONFIGS = {
    "lm": lm.Config.preset("tiny", n_layers=1),
    "lm_scan": lm.Config.preset("tiny", n_layers=2),
}
KINDS = ["tile"] * 6 + ["replicate", "atomic", "named"]
#: at least this share of the drawn tactics must apply (close to 90% do)
MIN_APPLIED = 0.5


@cache
def program(name: str) -> wb.Program:
    if name in EXTERNAL:
        return external.program(name)
    ex = build(name, CONFIGS.get(name, "tiny"))
    return wb.capture(ex.fn, *ex.args)


def tactic(pick, p, mesh, zoo: bool = True):
    """A drawn tactic and its kind; `pick` chooses one entry of a list."""
    kind = pick(KINDS)
    axis = pick(mesh.names)
    if kind == "named":
        mp = MP(axis, hidden="params/**/w*") if zoo else MP(axis)  # the zoo's MLP needs one
        return kind, pick([BP(axis), Z3(axis), Z2(axis), mp])
    candidates = [
        v
        for v in p.values
        if v.shape and (v.kind == "input" or v.name.startswith(("grads/", "out/")))
    ]
    v = pick(candidates)
    if kind == "tile":
        return kind, wb.Tile(v.name, pick(range(len(v.shape))), axis)
    return kind, (wb.Replicate if kind == "replicate" else wb.Atomic)(v.name, axis)


def schedule(pick, name, mesh, tally: Counter, least: int = 0) -> wb.Session:
    """A session with 1-4 drawn tactics applied (those a session rejects are skipped), and
    at least `least` applied when eight more draws allow."""
    s = wb.Session(program(name), mesh)
    wanted = pick(range(1, 5))
    for drawn in range(wanted + 8):
        if drawn >= wanted and tally["applied"] >= least:
            break
        kind, t = tactic(pick, s.program, mesh, name not in EXTERNAL)
        tally["drawn"] += 1
        try:
            s.apply(t)
        except wb.WorkbenchError:
            continue
        tally["applied"] += 1
        tally[kind] += 1
        tally[str(mesh)] += 1
    return s


def check_tally(tally: Counter) -> None:
    assert tally["applied"] >= MIN_APPLIED * tally["drawn"], f"too few tactics applied: {tally}"
    missing = [k for k in {*KINDS, *map(str, MESHES)} if not tally[k]]
    assert not missing, f"no tactic applied of {missing}: {tally}"


@pytest.mark.slow
def test_random_schedules_run_and_match():
    tally = Counter()

    @settings(
        max_examples=CASES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        derandomize=False,
    )
    @given(st.sampled_from(ZOO), st.sampled_from(MESHES), st.data())
    def case(name, mesh, data):
        s = schedule(lambda xs: data.draw(st.sampled_from(xs)), name, mesh, tally)
        assert_matches(s)

    case()
    check_tally(tally)


def assert_matches(s: wb.Session, why: str = "") -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # third-party libraries' deprecation notes
        result = s.run(repeats=1)
    assert result.matches, f"{why}{s}\n{result}"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXTERNAL))
def test_a_random_schedule_on_a_third_party_model_runs_and_matches(name):
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    tally = Counter()
    s = schedule(rng.choice, name, rng.choice(MESHES), tally, least=1)
    assert tally["applied"], f"no drawn tactic applied (seed {seed}): {tally}"
    assert_matches(s, f"seed {seed}: ")


def test_the_tally_fails_a_run_that_applied_too_little():
    applied = Counter({"drawn": 10, "applied": 1, **dict.fromkeys(KINDS, 1)})
    applied.update(dict.fromkeys(map(str, MESHES), 1))
    with pytest.raises(AssertionError, match="too few tactics applied"):
        check_tally(applied)
    applied["applied"] = 6
    check_tally(applied)
    del applied[str(MESHES[-1])]
    with pytest.raises(AssertionError, match="no tactic applied"):
        check_tally(applied)
