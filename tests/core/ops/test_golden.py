"""Golden tests: the factor mapping of every rule, one case per primitive, written out."""

import pytest

from tests.core.ops.cases import CASES
from tests.core.ops.cases import mapping_text as golden_text

GOLDEN = {
    "add": "([i, j], [i, j])->([i, j]) {i=2, j=4} linear: 0+1",
    "add_any": "([i, j], [i, j])->([i, j]) {i=2, j=4} linear: 0+1",
    "sub": "([i, j], [i, j])->([i, j]) {i=2, j=4} linear: 0+1",
    "mul": "([i, j], [])->([i, j]) {i=2, j=4} linear: 0 | 1",
    "div": "([i, j], [i, j])->([i, j]) {i=2, j=4} linear: 0",
    "max": "([i, j], [i, j])->([i, j]) {i=2, j=4}",
    "exp": "([i, j])->([i, j]) {i=2, j=4}",
    "tanh": "([i, j])->([i, j]) {i=2, j=4}",
    "integer_pow": "([i, j])->([i, j]) {i=2, j=4}",
    "neg": "([i, j])->([i, j]) {i=2, j=4} linear: 0",
    "convert_element_type": "([i, j])->([i, j]) {i=2, j=4} linear: 0 structural",
    "select_n": "([i, j], [i, j], [i, j])->([i, j]) {i=2, j=4} linear: 1+2",
    "stop_gradient": "([i, j])->([i, j]) {i=2, j=4} linear: 0 structural",
    "name": "([i, j])->([i, j]) {i=2, j=4} linear: 0 structural",
    "sharding_constraint": "([i, j])->([i, j]) {i=2, j=4} linear: 0 structural",
    "gt": "([i, j], [])->([i, j]) {i=2, j=4}",
    "rsqrt": "([i, j])->([i, j]) {i=2, j=4}",
    "dot_general": "([i, j], [j, k])->([i, k]) {i=2, j=4, k=8} sum: j linear: 0 | 1",
    "dot_general/batched": "([i, j, k, l], [i, m, k, l])->([i, k, j, m]) {i=2, j=8, k=4, l=16, m=8} sum: l linear: 0 | 1",
    "conv_general_dilated": "([i, j, k, l], [m, n, l, o])->([i, p, q, o]) {i=2, j=8, k=8, l=3, m=3, n=3, o=16, p=8, q=8} sum: l blocked: j, k, m, n, p, q linear: 0 | 1",
    "conv_general_dilated/1x1": "([i, j, k, l], [_, _, l, m])->([i, j, k, m]) {i=2, j=8, k=8, l=4, m=16} sum: l linear: 0 | 1",
    "conv_general_dilated/depthwise": "([i, j, k, lm], [n, o, m, lp])->([i, q, r, lp]) {i=2, j=8, k=8, l=4, m=1, n=3, o=3, p=2, q=8, r=8} sum: m blocked: j, k, n, o, q, r linear: 0 | 1",
    "reduce_sum": "([i, j, k])->([i, k]) {i=2, j=4, k=8} sum: j linear: 0",
    "reduce_max": "([i, j])->([i]) {i=2, j=4} max: j",
    "reduce_min": "([i, j])->([j]) {i=2, j=4} min: i",
    "argmax": "([i, j])->([i]) {i=2, j=4} blocked: j",
    "cumsum": "([i, j])->([i, j]) {i=2, j=4} blocked: j linear: 0",
    "cumprod": "([i, j])->([i, j]) {i=2, j=4} blocked: i",
    "broadcast_in_dim": "([i, j])->([i, _, j]) {i=2, j=4} linear: 0 structural",
    "reshape/merge": "([i, j, k])->([ij, k]) {i=2, j=4, k=4} linear: 0 structural",
    "reshape/split": "([ij, k])->([i, j, k]) {i=2, j=4, k=4} linear: 0 structural",
    "reshape/mixed": "([i, j])->([k, l]) {i=6, j=4, k=4, l=6} blocked: i, j, k, l linear: 0 structural",
    "transpose": "([i, j, k])->([k, i, j]) {i=2, j=3, k=4} linear: 0 structural",
    "squeeze": "([i, _, j])->([i, j]) {i=2, j=4} linear: 0 structural",
    "broadcast_in_dim/expand_dims": "([i, j])->([_, i, j]) {i=2, j=4} linear: 0 structural",
    "rev": "([i, j])->([i, j]) {i=2, j=4} blocked: i linear: 0 structural",
    "concatenate": "([i, j], [i, k])->([i, l]) {i=2, j=4, k=6, l=10} blocked: j, k, l linear: 0+1 structural",
    "pad": "([i, j], [])->([i, k]) {i=2, j=4, k=7} blocked: j, k linear: 0 structural",
    "slice": "([i, j])->([i, k]) {i=2, j=4, k=2} blocked: j, k linear: 0 structural",
    "iota": "()->([i, j]) {i=4, j=8}",
    "tile": "([i, j])->([ki, j]) {i=2, j=4, k=3} linear: 0 structural",
    "tile/cls_token": "([_, _, i])->([j, _, i]) {i=8, j=4} linear: 0 structural",
    "le_to": "([i, j], [i, j])->([i, j]) {i=2, j=4}",
    "split": "([i, j])->([i, k], [i, l]) {i=2, j=4, k=2, l=2} blocked: j, k, l linear: 0 structural",
    "dynamic_slice": "([i, j], [], [])->([i, k]) {i=2, j=4, k=2} blocked: j, k linear: 0 structural",
    "dynamic_update_slice": "([i, j], [i, k], [], [])->([i, j]) {i=2, j=4, k=2} blocked: j, k linear: 0+1 structural",
    "gather/embedding": "([i, j], [k, l, m])->([k, l, j]) {i=16, j=8, k=2, l=4, m=1} sum: i blocked: m linear: 0",
    "gather/take_along_axis": "([i, j, k], [i, j, l, m])->([i, j, l]) {i=2, j=4, k=16, l=1, m=1} sum: k blocked: m linear: 0",
    "scatter-add/embedding_grad": "([i, j], [k, l, m], [k, l, j])->([i, j]) {i=16, j=8, k=2, l=4, m=1} sum: k, l blocked: m linear: 0+2",
    "scatter-add/segment_sum": "([i, j], [k, l], [k, j])->([i, j]) {i=8, j=4, k=16, l=1} sum: k blocked: l linear: 0+2",
    "scatter": "([i, j], [k, l], [k, j])->([i, j]) {i=8, j=4, k=3, l=1} blocked: k, l",
    "sort": "([i, j])->([i, j]) {i=2, j=4} blocked: j",
    "top_k": "([i, j])->([i, k], [i, l]) {i=2, j=8, k=2, l=2} blocked: j, k, l",
    "reduce_window_sum": "([i, j, k, l])->([i, m, n, l]) {i=2, j=8, k=8, l=4, m=4, n=4} blocked: j, k, m, n",
    "reduce_window_max": "([i, j, k, l])->([i, m, n, l]) {i=2, j=8, k=8, l=4, m=4, n=4} blocked: j, k, m, n",
    "scan": "([i, j], [k, l], [m, n, o], [k, l], [])->([k, l], [p], [i, j], [k, l], [n, o]) {i=4, j=4, k=2, l=4, m=5, n=2, o=4, p=5} blocked: m, p",
    "while": "([i, j], [], [k, l], [], [], [k, l])->([], [k, l], [], [k, l], [i, j], [], [k, l]) {i=4, j=4, k=2, l=4}",
    "cond": "([], [i, j], [k, l], [k, l])->([k, l], [i, j], [i, j]) {i=2, j=4, k=2, l=4}",
}


def mapping_text(key):
    return golden_text(CASES, key)


def test_every_case_has_a_golden_text():
    assert set(CASES) == set(GOLDEN)


@pytest.mark.parametrize("key", sorted(GOLDEN))
def test_rule(key):
    assert mapping_text(key) == GOLDEN[key]
