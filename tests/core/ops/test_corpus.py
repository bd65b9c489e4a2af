"""Every primitive a corpus of programs captures has a sharding rule: the zoo, the
third-party models and short programs written as the JAX, Flax, Equinox and Optax docs
write them (``corpus.py``). Regions are walked (``Program.ops`` holds their ops too). An
explicit ``Barrier`` counts as no rule unless it is one of ``INTENTIONAL``."""

from __future__ import annotations

import warnings
from functools import cache

import pytest

import workbench as wb
from tests.core.ops.corpus import CORPUS
from tests.core.zoo import ZOO
from tests.core.zoo import program as zoo_program
from workbench.core import ops

#: Barriers on purpose, with the reason a rule would be wrong (their records say it too).
INTENTIONAL = {
    "rng_uniform": "XLA's RngUniform draws per array and backend: no local block is a slice",
    "shard_map": "a per-device program whose collectives are its own",
    "xla_pmap": "a per-device program whose collectives are its own",
    "run_state": "stateful Pallas code capture keeps whole",
}
#: Programs whose capture takes seconds.
SLOW = {"nnx_vit"}


def without_rule(primitives) -> list[str]:
    out = []
    for p in sorted(primitives):
        rec = ops.record(p)
        if rec is None or (rec.barrier is not None and p not in INTENTIONAL):
            out.append(p)
    return out


@cache
def captured(name: str) -> wb.Program:
    fn, args = CORPUS[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return wb.capture(fn, *args)


def test_an_unknown_primitive_still_warns_once_and_is_a_barrier():
    from workbench.core.ops import registry
    from workbench.core.ops.mapping import TensorType

    registry._warned.discard("no_such_primitive")
    t = TensorType((4, 8))
    with pytest.warns(UserWarning, match="no sharding rule for primitive 'no_such_primitive'"):
        m = ops.mapping_for("no_such_primitive", {}, [t], [t])
    assert m.barrier and set(m.blocked) == set(range(len(m.sizes)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ops.mapping_for("no_such_primitive", {}, [t], [t])  # once only


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[pytest.mark.slow] if n in SLOW else []) for n in CORPUS]
)
def test_every_primitive_of_the_corpus_has_a_rule(name):
    p = captured(name)
    assert p.ops, name
    assert not without_rule(p.primitives), name


def test_the_corpus_reaches_the_primitives_it_is_written_for():
    """The plain program holds the uses the coverage item names; a rewrite of JAX that
    stopped capturing them would leave this corpus testing less than it says."""
    prims = captured("plain").primitives | captured("scan_rnn").primitives
    prims |= captured("cond_while").primitives
    wanted = {
        "tile", "sort", "top_k", "argmax", "argmin", "cumsum", "cumprod", "cummax", "cummin",
        "cumlogsumexp", "scatter", "scatter-add", "scatter-mul", "scatter-min", "scatter-max",
        "gather", "dynamic_slice", "dynamic_update_slice", "reduce_precision", "clamp",
        "select_n", "iota", "erf_inv", "rng_bit_generator", "while", "scan", "cond",
    }  # fmt: skip
    assert wanted <= prims, sorted(wanted - prims)


def test_every_zoo_program_has_a_rule_for_each_primitive():
    for name in ZOO:
        assert not without_rule(zoo_program(name).primitives), name


@pytest.mark.slow
def test_every_external_model_has_a_rule_for_each_primitive():
    from workbench.models.external import EXTERNAL, build_external

    for name in EXTERNAL:
        ex = build_external(name, "tiny", abstract=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            p = wb.capture(ex.fn, *ex.args)
        assert not without_rule(p.primitives), name
