"""The third-party model matrix: every external step builds, trains one step and captures."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

import workbench as wb
from tests.models.programs import program, tiny
from workbench.models import ConfigError
from workbench.models.external import EXTERNAL, SIZES, Size, build_external

# trains third-party models: in the full suite (CI), not the fast lane
pytestmark = pytest.mark.slow

NAMES = [
    "hf_gpt2",
    "hf_llama",
    "hf_bert",
    "hf_opt",
    "hf_mistral",
    "hf_gemma",
    "hf_gpt_neo",
    "nnx_lm",
    "nnx_lm_jit",
    "nnx_vit",
    "linen_lm",
    "eqx_lm",
    "haiku_lm",
]


@functools.cache
def stepped(name: str):
    ex = tiny(name)
    return jax.jit(ex.fn)(*ex.args)


def shapes(tree) -> list:
    """Every leaf's path, shape and dtype (NNX modules are pytrees but compare by identity;
    the ViT's dropout streams hold PRNG keys, whose dtype numpy cannot read)."""
    return [
        (jax.tree_util.keystr(path), tuple(x.shape), str(x.dtype))
        for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]
    ]


def param(name: str, path: str):
    """The input value ``params/<path>`` of a model's captured program."""
    return program(name).value(f"params/{path}")


def test_registry_lists_the_models():
    assert list(EXTERNAL) == NAMES
    assert set(SIZES) == {"tiny", "large"}


@pytest.mark.parametrize("name", NAMES)
def test_one_step_trains_and_keeps_the_parameter_tree(name):
    ex = tiny(name)
    assert ex.name == name and not ex.abstract and ex.n_params > 0
    params, opt_state, loss = stepped(name)
    assert loss.shape == () and np.isfinite(float(loss))
    # the loss of a random model is near log(vocab)
    assert abs(float(loss) - np.log(SIZES["tiny"].vocab)) < 1.0
    assert jax.tree.structure(params) == jax.tree.structure(ex.args[0])
    assert shapes(params) == shapes(ex.args[0])
    assert jax.tree.structure(opt_state) == jax.tree.structure(ex.args[1])
    assert shapes(opt_state) == shapes(ex.args[1])


@pytest.mark.parametrize("name", NAMES)
def test_step_captures_with_its_phases(name):
    prog = program(name)
    assert {"forward", "backward"} <= {op.phase for op in prog.ops}
    # the loss (``out/result/2`` when capture also lists arguments updated in place)
    assert {"out/2", "out/result/2"} & set(prog.output_names)
    # the ViT embeds patches with a convolution, not a table lookup
    looks_up = "conv_general_dilated" if name == "nnx_vit" else "gather"
    assert {"dot_general", looks_up} <= prog.primitives
    assert all(v.name.startswith(("params/", "opt_state/", "batch/")) for v in prog.input_values)


#: weights with a dimension that does not split 4 ways, and why
ODD_WEIGHTS = {
    "hf_opt": {(18, 64)},  # learned positions offset by 2: seq_len + 2 rows
    "nnx_vit": {(4, 4, 3, 64), (1, 17, 64)},  # RGB patches; 16 patches and the cls token
}


@pytest.mark.parametrize("name", NAMES)
def test_tiny_batch_and_weights_split_on_a_2x4_mesh(name):
    ex = tiny(name)
    if name == "nnx_vit":
        image, label = ex.args[2]["image"], ex.args[2]["label"]
        assert image.shape == (8, 16, 16, 3) and (label.dtype, label.shape) == (np.int32, (8,))
    else:
        for leaf in jax.tree.leaves(ex.args[2]):
            assert leaf.dtype == np.int32 and leaf.shape == (8, 16)
    odd = {leaf.shape for leaf in jax.tree.leaves(ex.params) if leaf.ndim} - ODD_WEIGHTS.get(
        name, set()
    )
    for shape in odd:
        # (BERT's two token types: [2, 64])
        assert all(d % 4 == 0 for d in shape if d > 2), shape


def test_foreign_parameter_layouts():
    f32 = np.dtype("float32")
    gpt2 = param("hf_gpt2", "transformer/h/0/attn/c_attn/kernel").type
    assert (gpt2.shape, gpt2.dtype) == ((192, 64), f32)  # fused q, k, v, stored [out, in]
    assert param("hf_llama", "model/layers/0/self_attn/k_proj/kernel").type.shape == (64, 32)
    assert param("hf_llama", "model/layers/0/self_attn/q_proj/kernel").type.shape == (64, 64)
    assert param("hf_bert", "bert/encoder/layer/0/attention/self/query/kernel").type.shape == (
        64,
        64,
    )
    assert param("nnx_lm", "blocks/0/attn/query/kernel/value").type.shape == (64, 4, 16)
    linen_out = "decoderblock_0/MultiHeadDotProductAttention_0/out/kernel"
    assert param("linen_lm", linen_out).type.shape == (4, 16, 64)
    eqx_mlp = "layers/0/ff_block/mlp/weight"
    assert param("eqx_lm", eqx_mlp).type.shape == (256, 64)  # [out, in]
    assert param("haiku_lm", "transformer/multi_head_attention/query/w").type.shape == (64, 64)
    opt = "model/decoder/embed_positions/embedding"
    assert param("hf_opt", opt).type.shape == (18, 64)  # 16 positions offset by 2
    mistral_k = "model/layers/0/self_attn/k_proj/kernel"
    assert param("hf_mistral", mistral_k).type.shape == (64, 32)  # 2 KV heads
    assert param("hf_gemma", "model/layers/0/self_attn/k_proj/kernel").type.shape == (64, 64)
    neo_local = "transformer/h/1/attn/attention/q_proj/kernel"
    assert param("hf_gpt_neo", neo_local).type.shape == (64, 64)
    vit = "encoder/layers/0/attn/query/kernel/value"
    assert param("nnx_vit", vit).type.shape == (64, 4, 16)
    assert param("nnx_vit", "patch_embeddings/kernel/value").type.shape == (4, 4, 3, 64)


def test_nnx_functional_and_nnx_jit_steps_agree():
    # nnx_lm takes nnx.State pytrees, nnx_lm_jit the model and optimizer objects
    assert type(tiny("nnx_lm_jit").params).__name__ == "MiniGPT"
    a, b = stepped("nnx_lm"), stepped("nnx_lm_jit")
    np.testing.assert_allclose(a[2], b[2], rtol=1e-6)
    for x, y in zip(jax.tree.leaves(a[0]), jax.tree.leaves(b[0])):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_large_builds_from_shapes_only(name):
    ex = build_external(name, "large", abstract=True)
    assert ex.abstract
    assert ex.n_params > 20 * tiny(name).n_params
    # (the ViT's images: 256 patches of 4 x 4 pixels)
    batch = {"nnx_vit": (16, 64, 64, 3)}.get(name, (16, 256))
    assert jax.tree.leaves(ex.args[2])[0].shape == batch


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hf_llama", "nnx_lm", "eqx_lm"])
def test_large_captures_from_shapes(name):
    ex = build_external(name, "large", abstract=True)
    prog = wb.capture(ex.fn, *ex.args)
    assert {"forward", "backward"} <= {op.phase for op in prog.ops}


def test_custom_size_and_unknown_names():
    ex = build_external("linen_lm", Size(n_layers=1, vocab=128), abstract=True)
    assert ex.config.n_layers == 1
    assert ex.params["logits"]["kernel"].shape == (64, 128)
    with pytest.raises(ConfigError, match="no external model"):
        build_external("gpt5")
    with pytest.raises(ConfigError, match="no size"):
        build_external("linen_lm", "huge")
