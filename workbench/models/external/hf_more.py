"""More of transformers' Flax causal LMs: OPT, Mistral, Gemma and GPT-Neo.

Each trains as ``hf.py``'s GPT-2 and Llama do (``run_clm_flax.py``'s step and one-hot
cross-entropy): OPT and GPT-Neo with the example's AdamW (linear warmup/decay, no decay on
biases and LayerNorm scales), Mistral and Gemma with the Llama recipe (global-norm clipping,
AdamW, warmup-cosine). Weights are random, nothing is downloaded, dropout is 0.

What each brings to the matrix:

- OPT: learned positions offset by 2 (a ``[seq_len + 2, D]`` table), ReLU MLP ``fc1``/``fc2``.
- Mistral: grouped-query attention (4 heads, 2 KV heads) under a sliding-window causal mask
  (``sliding_window = seq_len // 2``), RMSNorm, SwiGLU, RoPE.
- Gemma: embeddings scaled by ``sqrt(D)`` and tied to the head, ``(1 + w)`` RMSNorm, GeGLU,
  RoPE; one KV head per query head (as Gemma-7B).
- GPT-Neo: layers alternating global and local attention (``window_size = seq_len // 2``),
  learned positions, tied embeddings, unscaled attention scores.
"""

from __future__ import annotations

from transformers import (
    FlaxGemmaForCausalLM,
    FlaxGPTNeoForCausalLM,
    FlaxMistralForCausalLM,
    FlaxOPTForCausalLM,
    GemmaConfig,
    GPTNeoConfig,
    MistralConfig,
    OPTConfig,
)

from workbench.models import Example
from workbench.models.external._common import Size, size_of
from workbench.models.external.hf import (
    _build,
    _causal_batch,
    causal_lm_loss,
    examples_adamw,
    llama_adamw,
)


def _rope_positions(s: Size) -> int:
    # create_sinusoidal_positions cuts its table's last dimension (2 * head_dim) to
    # max_position_embeddings: fewer positions than 2 * head_dim break RoPE (as in hf.py)
    return max(s.seq_len, 2 * s.d_head)


def build_opt(size: str | Size = "tiny", abstract: bool = False) -> Example:
    """``FlaxOPTForCausalLM``: pre-LayerNorm decoder, learned positions offset by 2."""
    s = size_of(size)
    config = OPTConfig(
        vocab_size=s.vocab,
        hidden_size=s.d_model,
        word_embed_proj_dim=s.d_model,
        num_hidden_layers=s.n_layers,
        num_attention_heads=s.n_heads,
        ffn_dim=s.d_ff,
        max_position_embeddings=s.seq_len,
        dropout=0.0,
        attention_dropout=0.0,
        layerdrop=0.0,
    )
    return _build(
        "hf_opt",
        FlaxOPTForCausalLM,
        config,
        s,
        examples_adamw(s),
        causal_lm_loss,
        _causal_batch,
        "transformers FlaxOPTForCausalLM, causal LM loss, AdamW with a linear schedule",
        abstract,
        mode={"deterministic": False},  # OPT's training switch (no ``train`` keyword)
    )


def build_mistral(size: str | Size = "tiny", abstract: bool = False) -> Example:
    """``FlaxMistralForCausalLM``: GQA under a sliding-window causal mask."""
    s = size_of(size)
    config = MistralConfig(
        vocab_size=s.vocab,
        hidden_size=s.d_model,
        intermediate_size=s.d_ff,
        num_hidden_layers=s.n_layers,
        num_attention_heads=s.n_heads,
        num_key_value_heads=s.n_kv_heads,
        max_position_embeddings=_rope_positions(s),
        sliding_window=s.seq_len // 2,
        attention_dropout=0.0,
        tie_word_embeddings=False,
    )
    return _build(
        "hf_mistral",
        FlaxMistralForCausalLM,
        config,
        s,
        llama_adamw(s),
        causal_lm_loss,
        _causal_batch,
        "transformers FlaxMistralForCausalLM (GQA, sliding window), causal LM loss, "
        "clipped AdamW, cosine schedule",
        abstract,
    )


def build_gemma(size: str | Size = "tiny", abstract: bool = False) -> Example:
    """``FlaxGemmaForCausalLM``: scaled, tied embeddings, GeGLU, one KV head per head."""
    s = size_of(size)
    config = GemmaConfig(
        vocab_size=s.vocab,
        hidden_size=s.d_model,
        intermediate_size=s.d_ff,
        num_hidden_layers=s.n_layers,
        num_attention_heads=s.n_heads,
        num_key_value_heads=s.n_heads,
        head_dim=s.d_head,
        hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=_rope_positions(s),
        attention_dropout=0.0,
        tie_word_embeddings=True,
    )
    return _build(
        "hf_gemma",
        FlaxGemmaForCausalLM,
        config,
        s,
        llama_adamw(s),
        causal_lm_loss,
        _causal_batch,
        "transformers FlaxGemmaForCausalLM, causal LM loss, clipped AdamW, cosine schedule",
        abstract,
    )


def build_gpt_neo(size: str | Size = "tiny", abstract: bool = False) -> Example:
    """``FlaxGPTNeoForCausalLM``: alternating global and local (windowed) attention."""
    s = size_of(size)
    config = GPTNeoConfig(
        vocab_size=s.vocab,
        max_position_embeddings=s.seq_len,
        hidden_size=s.d_model,
        num_layers=s.n_layers,
        attention_types=[[["global", "local"], s.n_layers // 2]],
        num_heads=s.n_heads,
        intermediate_size=s.d_ff,
        window_size=s.seq_len // 2,
        resid_dropout=0.0,
        embed_dropout=0.0,
        attention_dropout=0.0,
    )
    return _build(
        "hf_gpt_neo",
        FlaxGPTNeoForCausalLM,
        config,
        s,
        examples_adamw(s),
        causal_lm_loss,
        _causal_batch,
        "transformers FlaxGPTNeoForCausalLM (global and local attention), causal LM loss, "
        "AdamW with a linear schedule",
        abstract,
    )
