"""Hugging Face transformers' Flax models, trained the way transformers' Flax examples train them.

The steps follow ``examples/flax/language-modeling/run_clm_flax.py`` (GPT-2, Llama) and
``run_mlm_flax.py`` (BERT): ``model(**batch, params=params, train=True)``, a one-hot
``optax.softmax_cross_entropy`` loss, ``jax.value_and_grad``, and ``optax.adamw`` with the
examples' linear warmup/decay schedule and weight-decay mask (no decay on biases and
LayerNorm scales). The Llama step uses the usual Llama recipe instead: a warmup-cosine
schedule and global-norm clipping. Weights are random (``Config`` + ``seed=0``), nothing is
downloaded, and PyTorch is not needed.

The examples keep a dropout key in their ``TrainState``; these steps take no key, so the
configs set every dropout probability to 0 (``train=True`` then needs no ``dropout_rng``).

``abstract=True`` builds the model with ``_do_init=False`` and traces ``init_weights`` under
``jax.eval_shape``: no weights are allocated.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import traverse_util
from flax.training.common_utils import onehot
from transformers import (
    BertConfig,
    FlaxBertForMaskedLM,
    FlaxGPT2LMHeadModel,
    FlaxLlamaForCausalLM,
    GPT2Config,
    LlamaConfig,
)

from workbench.models import Example
from workbench.models.external._common import (
    Size,
    example,
    size_of,
    token_batch,
    warmup_cosine,
)

MASK_TOKEN_ID = 3  # the [MASK] token of the BERT batch (ids 0-3 are special tokens here)
PAD_TOKEN_ID = 0


# -- the examples' optimizer --------------------------------------------------------------


def create_learning_rate_fn(num_train_steps: int, num_warmup_steps: int, learning_rate: float):
    """Linear warmup then linear decay to zero, as in run_clm_flax.py."""
    warmup_fn = optax.linear_schedule(
        init_value=0.0, end_value=learning_rate, transition_steps=num_warmup_steps
    )
    decay_fn = optax.linear_schedule(
        init_value=learning_rate, end_value=0, transition_steps=num_train_steps - num_warmup_steps
    )
    return optax.join_schedules(schedules=[warmup_fn, decay_fn], boundaries=[num_warmup_steps])


def decay_mask_fn(params):
    """True for the parameters AdamW decays: not biases, not LayerNorm scales (run_clm_flax.py)."""
    flat_params = traverse_util.flatten_dict(params)
    layer_norm_candidates = ["layernorm", "layer_norm", "ln"]
    layer_norm_named_params = {
        layer[-2:]
        for layer_norm_name in layer_norm_candidates
        for layer in flat_params
        if layer_norm_name in "".join(layer).lower()
    }
    flat_mask = {
        path: (path[-1] != "bias" and path[-2:] not in layer_norm_named_params)
        for path in flat_params
    }
    return traverse_util.unflatten_dict(flat_mask)


def examples_adamw(size: Size) -> optax.GradientTransformation:
    schedule = create_learning_rate_fn(size.total_steps, size.warmup_steps, size.learning_rate)
    return optax.adamw(
        learning_rate=schedule,
        b1=0.9,
        b2=0.999,
        eps=1e-8,
        weight_decay=size.weight_decay,
        mask=decay_mask_fn,
    )


def llama_adamw(size: Size) -> optax.GradientTransformation:
    schedule = warmup_cosine(size, end_value=size.learning_rate / 10)
    return optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(learning_rate=schedule, b1=0.9, b2=0.95, weight_decay=0.1, mask=decay_mask_fn),
    )


# -- the examples' losses and step --------------------------------------------------------


def causal_lm_loss(logits, labels):
    """Next-token cross-entropy: logits at position t predict the label at t + 1."""
    shift_logits = logits[..., :-1, :]
    shift_labels = labels[..., 1:]
    loss = optax.softmax_cross_entropy(shift_logits, onehot(shift_labels, shift_logits.shape[-1]))
    return loss.mean()


def masked_lm_loss(logits, labels):
    """Cross-entropy over the masked positions only (labels -100 elsewhere), run_mlm_flax.py."""
    label_mask = jnp.where(labels > 0, 1.0, 0.0)
    loss = optax.softmax_cross_entropy(logits, onehot(labels, logits.shape[-1])) * label_mask
    return loss.sum() / label_mask.sum()


def make_train_step(model, tx: optax.GradientTransformation, loss_fn, mode=None):
    """``train_step(params, opt_state, batch) -> (params, opt_state, loss)``; ``mode``: the
    model's training keyword (``{"train": True}``; OPT's is ``{"deterministic": False}``)."""
    mode = {"train": True} if mode is None else mode

    def train_step(params, opt_state, batch):
        def compute_loss(params):
            inputs = dict(batch)
            labels = inputs.pop("labels")
            logits = model(**inputs, params=params, **mode)[0]
            return loss_fn(logits, labels)

        loss, grads = jax.value_and_grad(compute_loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, loss

    return train_step


# -- builders -----------------------------------------------------------------------------


def _build(
    name, model_cls, config, size, tx, loss_fn, make_batch, description, abstract, mode=None
):
    if abstract:
        model = model_cls(config, seed=0, _do_init=False)
    else:
        model = model_cls(config, seed=0)

    def make():
        if abstract:
            params = model.init_weights(jax.random.PRNGKey(0), (size.batch, size.seq_len))
        else:
            params = model.params
        return params, tx.init(params), make_batch(jax.random.key(1), size)

    step = make_train_step(model, tx, loss_fn, mode)
    return example(name, step, make, config, description, abstract)


def _causal_batch(key, size: Size):
    batch = token_batch(key, size, "input_ids")
    return {"input_ids": batch["input_ids"], "labels": batch["input_ids"]}


def _mlm_batch(key, size: Size):
    """What transformers' FlaxDataCollatorForLanguageModeling gives: 15% of tokens masked."""
    k_tokens, k_mask = jax.random.split(key)
    shape = (size.batch, size.seq_len)
    tokens = jax.random.randint(k_tokens, shape, 4, size.vocab, "int32")
    # every other sequence is padded over its last quarter
    padded = (jnp.arange(size.batch)[:, None] % 2 == 1) & (
        jnp.arange(size.seq_len)[None, :] >= size.seq_len - size.seq_len // 4
    )
    attention_mask = jnp.where(padded, 0, 1).astype("int32")
    tokens = jnp.where(padded, PAD_TOKEN_ID, tokens)
    masked = jax.random.bernoulli(k_mask, 0.15, shape) & ~padded
    masked = masked.at[:, 0].set(True)  # at least one label a row
    return {
        "input_ids": jnp.where(masked, MASK_TOKEN_ID, tokens).astype("int32"),
        "attention_mask": attention_mask,
        "token_type_ids": jnp.zeros(shape, "int32"),
        "labels": jnp.where(masked, tokens, -100).astype("int32"),
    }


def build_gpt2(size: str | Size = "tiny", abstract: bool = False) -> Example:
    """``FlaxGPT2LMHeadModel``: tied embeddings, fused ``c_attn`` Conv1D (kernel [3D, D])."""
    s = size_of(size)
    config = GPT2Config(
        n_layer=s.n_layers,
        n_embd=s.d_model,
        n_head=s.n_heads,
        n_inner=s.d_ff,
        vocab_size=s.vocab,
        n_positions=s.seq_len,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return _build(
        "hf_gpt2",
        FlaxGPT2LMHeadModel,
        config,
        s,
        examples_adamw(s),
        causal_lm_loss,
        _causal_batch,
        "transformers FlaxGPT2LMHeadModel, causal LM loss, AdamW with a linear schedule",
        abstract,
    )


def build_llama(size: str | Size = "tiny", abstract: bool = False) -> Example:
    """``FlaxLlamaForCausalLM`` with grouped-query attention, RMSNorm, SwiGLU and RoPE."""
    s = size_of(size)
    config = LlamaConfig(
        vocab_size=s.vocab,
        hidden_size=s.d_model,
        intermediate_size=s.d_ff,
        num_hidden_layers=s.n_layers,
        num_attention_heads=s.n_heads,
        num_key_value_heads=s.n_kv_heads,
        # create_sinusoidal_positions cuts its table's last dimension (2 * head_dim) to
        # max_position_embeddings, so fewer positions than 2 * head_dim break RoPE
        max_position_embeddings=max(s.seq_len, 2 * s.d_head),
        tie_word_embeddings=False,
    )
    return _build(
        "hf_llama",
        FlaxLlamaForCausalLM,
        config,
        s,
        llama_adamw(s),
        causal_lm_loss,
        _causal_batch,
        "transformers FlaxLlamaForCausalLM (GQA), causal LM loss, clipped AdamW, cosine schedule",
        abstract,
    )


def build_bert(size: str | Size = "tiny", abstract: bool = False) -> Example:
    """``FlaxBertForMaskedLM``: padded batch with ``attention_mask``, 15% masked tokens."""
    s = size_of(size)
    config = BertConfig(
        vocab_size=s.vocab,
        hidden_size=s.d_model,
        num_hidden_layers=s.n_layers,
        num_attention_heads=s.n_heads,
        intermediate_size=s.d_ff,
        max_position_embeddings=s.seq_len,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=PAD_TOKEN_ID,
    )
    return _build(
        "hf_bert",
        FlaxBertForMaskedLM,
        config,
        s,
        examples_adamw(s),
        masked_lm_loss,
        _mlm_batch,
        "transformers FlaxBertForMaskedLM, masked LM loss, AdamW with a linear schedule",
        abstract,
    )
