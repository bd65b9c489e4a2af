"""EP and CP composed with the other strategies (ZeRO-3, MP, SP, PP): each plan runs like the
unpartitioned step, with the conflicts it has today counted (EP with SP keeps one per MoE
layer: the dispatched tokens' gradient contracts two dims split on the model axis)."""

import pytest

import workbench as wb
from workbench.core.strategies.named import NAMED
from workbench.models import build, lm

PP = NAMED["PP"]
LAYERS = 4

CASES = {
    "EP+BP+Z3": ("moe", {"data": 2, "expert": 4}, lambda: [wb.EP("expert"), wb.BP("data"), wb.Z3("data")], 0),
    "EP+MP": ("moe", {"expert": 4, "model": 2}, lambda: [wb.EP("expert"), wb.MP("model")], 0),
    "EP+MP+SP": ("moe", {"expert": 4, "model": 2}, lambda: [wb.EP("expert"), wb.MP("model"), wb.SP("model")], LAYERS),
    "PP+EP": ("moe", {"stage": 2, "expert": 4}, lambda: [PP("stage", microbatches=2), wb.EP("expert")], 0),
    "BP+CP+Z3": ("tiny", {"data": 2, "seq": 4}, lambda: [wb.BP("data"), wb.CP("seq"), wb.Z3("data")], 0),
    "CP+MP+SP": ("tiny", {"seq": 4, "model": 2}, lambda: [wb.CP("seq"), wb.MP("model"), wb.SP("model")], 0),
    "PP+CP": ("tiny", {"stage": 2, "seq": 4}, lambda: [PP("stage", microbatches=2), wb.CP("seq")], 0),
}  # fmt: skip


@pytest.fixture(scope="module")
def programs():
    out = {}
    for preset in ("moe", "tiny"):
        ex = build("lm", lm.Config.preset(preset, n_layers=LAYERS))
        out[preset] = wb.capture(ex.fn, *ex.args)
    return out


@pytest.mark.slow  # 4-24 s each: a partitioned run beside the unpartitioned one
@pytest.mark.parametrize("case", list(CASES))
def test_ep_and_cp_compose_and_run_like_the_unpartitioned_step(programs, case):
    preset, mesh, plan, conflicts = CASES[case]
    s = wb.Session(programs[preset], wb.Mesh(mesh), plan())
    assert len(s.conflicts) == conflicts
    assert s.run(repeats=1).matches
