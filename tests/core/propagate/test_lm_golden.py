"""Golden tests on the LM training step: Megatron from two tiles, and batch parallelism."""

import pytest

import workbench as wb
from tests.core.zoo import program

MESH = wb.Mesh({"batch": 2, "model": 4})

# D=32, H=4, K=8, F=64, V=64: the expected layout of each weight under Megatron
MEGATRON = {
    "embed": "f32[64,32]",
    "ln1/scale": "f32[32]",
    "ln1/bias": "f32[32]",
    "attn/wq": "f32[32,4@model,8]",
    "attn/wk": "f32[32,4@model,8]",
    "attn/wv": "f32[32,4@model,8]",
    "attn/wo": "f32[4@model,8,32]",
    "ln2/scale": "f32[32]",
    "ln2/bias": "f32[32]",
    "mlp/w_in": "f32[32,64@model]",
    "mlp/w_out": "f32[64@model,32]",
    "ln_f/scale": "f32[32]",
    "ln_f/bias": "f32[32]",
    "unembed": "f32[32,64]",
}
PER_LAYER = [k for k in MEGATRON if "/" in k and not k.startswith("ln_f")]


def expected_names(scan: bool) -> dict[str, str]:
    """Every parameter, gradient, Adam moment and updated parameter, with its layout."""
    out = {}
    for leaf, layout in MEGATRON.items():
        if leaf in PER_LAYER:
            paths = ["layers/" + leaf] if scan else [f"layers/{i}/{leaf}" for i in range(2)]
            if scan:  # stacked: a leading layer dim, never tiled
                layout = layout.replace("f32[", "f32[2,")
        else:
            paths = [leaf]
        for path in paths:
            for root in (
                "params",
                "grads",
                "opt_state/m",
                "opt_state/v",
                "out/params",
                "out/opt_state/m",
                "out/opt_state/v",
            ):
                out[f"{root}/{path}"] = layout
    return out


def megatron(name: str) -> wb.Session:
    s = wb.Session(program(name), MESH)
    s.apply(wb.Tile("params/**/mlp/w_in", -1, "model"))
    s.apply(wb.Tile("params/**/attn/w{q,k,v}", -2, "model"))
    return s


@pytest.mark.parametrize("name", ["lm", "lm_scan"])
def test_megatron_from_two_tiles(name):
    s = megatron(name)
    got = {n: str(sh) for n, sh in s.shardings().items()}
    expected = expected_names(scan=name == "lm_scan")
    assert {n: got[n] for n in expected} == expected
    assert s.conflicts == []


def test_megatron_products_are_pending_sums_over_model():
    s = megatron("lm")
    for layer in range(2):
        attn_out = s.sharding(f"layer{layer}/attn/bshk,hkd->bsd/dot_general.0")
        mlp_out = s.sharding(f"layer{layer}/mlp/dot_general.1")
        assert str(attn_out) == str(mlp_out) == "f32[8,16,32]{sum: model}"


@pytest.mark.parametrize("name", ["lm", "lm_scan"])
def test_batch_parallelism_reaches_backward_and_leaves_gradients_pending(name):
    s = wb.Session(program(name), MESH)
    s.apply(wb.Tile("batch/*", 0, "batch"))
    shardings = s.shardings()
    grads = {n: sh for n, sh in shardings.items() if n.startswith("grads/")}
    assert len(grads) == (14 if name == "lm_scan" else 24)
    stacked = [n for n in grads if name == "lm_scan" and n.startswith("grads/layers/")]
    for n, sh in grads.items():
        # under scan, each step reduces the gradients it makes (as XLA does): the stack is whole
        assert sh.partial == (() if n in stacked else (("batch", "sum"),)), (n, sh)
        assert not sh.tiled_axes, (n, sh)
    in_loop = [c for c in s.collectives() if c.count > 1 and c.kind == "all-reduce"]
    assert len(in_loop) == len(stacked) and all(c.axes == ("batch",) for c in in_loop)
    p = s.program
    backward = [
        v
        for v in p.values
        if v.name.startswith("bwd/")
        and len(v.shape) >= 2
        and v.shape[0] == 8
        and p.users[v.id]
        and "/x[" not in v.name
    ]
    assert len(backward) > 50 and all(shardings[v.name].dims[0] == ("batch",) for v in backward)
    assert str(s.sharding("out/loss")) == "f32[]{sum: batch}"
    assert s.conflicts == []
