"""The named strategies per zoo model, with the selectors each model needs."""

from workbench.core.strategies.named import BP, MP, Z3

MP_FOR = {
    "mlp": MP("model", hidden="params/layers/0/w"),
    "lm": MP("model"),
    "lm_scan": MP("model"),
    "cnn": MP("model", hidden="params/convs/0/w"),
    "gnn": MP("model", hidden="params/rounds/*/*/w1"),
}


def strategies(model: str) -> dict[str, list]:
    mp = MP_FOR[model]
    return {
        "BP": [BP("batch")],
        "MP": [mp],
        "BP+MP": [BP("batch"), mp],
        "Z3": [Z3("batch")],
        "BP+MP+Z3": [BP("batch"), mp, Z3("batch")],
    }


CASES = [(m, s) for m in MP_FOR for s in strategies(m)]
