"""A GPT-style decoder language model and its Adam training step.

Two layouts of the same model, one ``train_step`` for both: ``init`` makes a Python list
of layers, run unrolled (``params/layers/0/attn/wq``); ``init_scan`` stacks them into one
dict of arrays with a leading layer dimension, run under ``jax.lax.scan``
(``params/layers/attn/wq``). Both draw the same numbers, so give the same loss.

Shapes (D=d_model, H=n_heads, G=n_kv_heads, K=d_head, F=d_ff, V=vocab): ``embed`` [V, D];
per layer ``ln1``/``ln2`` ``scale``/``bias`` [D], ``attn/wq`` [D, H, K], ``attn/wk|wv``
[D, G, K] (G = H unless grouped-query attention), ``attn/wo`` [H, K, D], ``mlp/w_in`` [D, F],
``mlp/w_out`` [F, D] (``mlp="swiglu"``: ``mlp/w_gate|w_up`` [D, F], ``mlp/w_down`` [F, D]);
``ln_f`` [D]; ``unembed`` [D, V].

With ``n_experts > 0`` every layer's MLP is a top-k routed mixture of experts
(``moe.py``): ``moe/router`` [D, E], ``moe/experts/w_in`` [E, D, F_e], ``moe/experts/w_out``
[E, F_e, D], and with ``n_shared``, ``moe/shared/w_in|w_out``; its load-balancing loss,
summed over the layers and weighted by ``aux_loss``, is added to the cross-entropy.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

import workbench as wb
from workbench.models import moe as moe_
from workbench.models._common import ConfigError, Presets, dense, softmax_cross_entropy

MLPS = ("gelu", "swiglu")


@dataclass(frozen=True, slots=True)
class Config(Presets):
    """Sizes of the model and its batch. Defaults are the "tiny" preset (shardable on a 2x4 mesh)."""

    batch: int = 8
    seq_len: int = 16
    d_model: int = 32
    n_heads: int = 4
    # grouped-query attention (Llama 2/3, Qwen3): key/value heads, each shared by
    # n_heads // n_kv_heads query heads (None: n_heads, multi-head attention)
    n_kv_heads: int | None = None
    d_head: int = 8
    d_ff: int = 64
    # the dense MLP: "gelu" (GPT) or "swiglu" (Llama, Qwen: silu(x W_gate) * x W_up, W_down)
    mlp: str = "gelu"
    vocab: int = 64
    n_layers: int = 2
    dtype: str = "float32"
    # mixed precision: parameters and gradients in ``dtype``, Adam's moments and a master
    # copy of the parameters in float32 (2 + 2 + 12 bytes a parameter in bfloat16)
    master_weights: bool = False
    # rematerialise each block in the backward pass (``jax.checkpoint``): only the blocks'
    # inputs are kept from the forward pass, as large models are trained
    remat: bool = False
    # what remat keeps (a name in ``jax.checkpoint_policies``, e.g. MaxText's "minimal",
    # "dots_with_no_batch_dims_saveable": the projections' outputs); None: only the inputs
    remat_policy: str | None = None
    # mixture of experts (0: the dense MLP): top-k routing, GShard's capacity per sequence,
    # experts of width d_expert (None: d_ff), DeepSeek's shared experts, the dispatch
    # ("einsum", "gather" or the dropless "ragged") and the load-balancing loss's weight
    n_experts: int = 0
    top_k: int = 2
    capacity_factor: float = 1.25
    d_expert: int | None = None
    n_shared: int = 0
    dispatch: str = "einsum"
    aux_loss: float = 0.01

    PRESETS: ClassVar = {
        "tiny": {},
        "moe": dict(n_experts=4, top_k=2, n_shared=1),  # tiny, with experts
        "small": dict(batch=8, seq_len=64, d_model=128, n_heads=4, d_head=32, d_ff=512, vocab=1024, n_layers=4),
        "large": dict(batch=16, seq_len=256, d_model=512, n_heads=8, d_head=64, d_ff=2048, vocab=8192, n_layers=8),
        # ~60 B parameters: plan it from shapes only (build(..., abstract=True)).
        "huge": dict(batch=64, seq_len=4096, d_model=8192, n_heads=64, d_head=128, d_ff=28672, vocab=32000, n_layers=80, dtype="bfloat16", master_weights=True),
    }  # fmt: skip

    def __post_init__(self):
        self._check_positive(
            "batch", "seq_len", "d_model", "n_heads", "d_head", "d_ff", "vocab", "n_layers"
        )
        self._check_layers()
        self._check_experts()

    def _check_layers(self) -> None:
        H, G = self.n_heads, self.n_kv_heads
        if G is not None and (not isinstance(G, int) or G < 1 or H % G):
            fits = ", ".join(str(g) for g in range(1, H + 1) if H % g == 0)
            raise ConfigError(
                f"Config.n_kv_heads={G!r}: each key/value head serves an equal group of the "
                f"n_heads={H} query heads, so it must divide n_heads; give one of {fits}, "
                f"or None for n_heads (multi-head attention)."
            )
        if self.mlp not in MLPS:
            raise ConfigError(f"Config.mlp={self.mlp!r}: no such MLP; choose one of {MLPS}.")
        policy = self.remat_policy
        if policy is not None and not callable(getattr(jax.checkpoint_policies, str(policy), 0)):
            names = sorted(n for n in dir(jax.checkpoint_policies) if n.endswith("saveable"))
            raise ConfigError(
                f"Config.remat_policy={policy!r}: not a policy in jax.checkpoint_policies; "
                f"give one of {', '.join(names)}, or None to keep only each block's input."
            )
        if policy is not None and not self.remat:
            raise ConfigError(
                f"Config.remat_policy={policy!r} says what remat keeps, but remat=False; "
                "give remat=True with it, or leave remat_policy None."
            )

    @property
    def kv_heads(self) -> int:
        """Key/value heads: ``n_kv_heads``, else ``n_heads``."""
        return self.n_kv_heads or self.n_heads

    def _check_experts(self) -> None:
        def bad(field, why, fix):
            value = getattr(self, field)
            raise ConfigError(f"Config.{field}={value!r}: {why}; {fix}.")

        if not isinstance(self.n_experts, int) or self.n_experts < 0:
            bad("n_experts", "a count of experts", "give 0 (a dense MLP) or a positive int")
        if self.dispatch not in moe_.DISPATCHES:
            bad("dispatch", "no such dispatch", f"choose one of {moe_.DISPATCHES}")
        if not self.n_experts:
            return
        if not isinstance(self.top_k, int) or not 1 <= self.top_k <= self.n_experts:
            bad("top_k", f"each token picks top_k of {self.n_experts} experts",
                f"give an int from 1 to n_experts={self.n_experts}")  # fmt: skip
        if not isinstance(self.capacity_factor, int | float) or self.capacity_factor <= 0:
            bad("capacity_factor", "scales the slots per expert", "give a positive number")
        if self.d_expert is not None and (not isinstance(self.d_expert, int) or self.d_expert < 1):
            bad("d_expert", "an expert's hidden width", "give a positive int, or None for d_ff")
        if not isinstance(self.n_shared, int) or self.n_shared < 0:
            bad("n_shared", "a count of shared experts", "give 0 or a positive int")
        if not isinstance(self.aux_loss, int | float) or self.aux_loss < 0:
            bad("aux_loss", "weighs the load-balancing loss", "give 0 or a positive number")

    @property
    def n_params(self) -> int:
        d, hk, gk = self.d_model, self.n_heads * self.d_head, self.kv_heads * self.d_head
        per_layer = 4 * d + 2 * d * hk + 2 * d * gk
        if self.n_experts:
            f = moe_.d_expert(self)
            per_layer += d * self.n_experts + 2 * d * f * (self.n_experts + self.n_shared)
        else:
            per_layer += (3 if self.mlp == "swiglu" else 2) * d * self.d_ff
        return 2 * self.vocab * d + 2 * d + self.n_layers * per_layer


class StepOutput(NamedTuple):
    """Outputs are named ``out/params/...``, ``out/opt_state/...`` and ``out/loss``."""

    params: Any
    opt_state: Any
    loss: jax.Array


# -- parameters ---------------------------------------------------------------------------


def _norm(config: Config) -> dict:
    return {
        "scale": jnp.ones((config.d_model,), config.dtype),
        "bias": jnp.zeros((config.d_model,), config.dtype),
    }


def _init_layer(config: Config, key: jax.Array) -> dict:
    D, H, K, F, dt = config.d_model, config.n_heads, config.d_head, config.d_ff, config.dtype
    G = config.kv_heads
    kq, kk, kv, ko, ki, kf = jax.random.split(key, 6)
    layer = {
        "ln1": _norm(config),
        "attn": {
            "wq": dense(kq, (D, H, K), D, dt),
            "wk": dense(kk, (D, G, K), D, dt),
            "wv": dense(kv, (D, G, K), D, dt),
            "wo": dense(ko, (H, K, D), H * K, dt),
        },
        "ln2": _norm(config),
    }
    if config.n_experts:
        layer["moe"] = moe_.init_moe(config, ki)
    elif config.mlp == "swiglu":
        kg, ku = jax.random.split(ki)
        layer["mlp"] = {
            "w_gate": dense(kg, (D, F), D, dt),
            "w_up": dense(ku, (D, F), D, dt),
            "w_down": dense(kf, (F, D), F, dt),
        }
    else:
        layer["mlp"] = {"w_in": dense(ki, (D, F), D, dt), "w_out": dense(kf, (F, D), F, dt)}
    return layer


def init_params(config: Config, key: jax.Array, *, stacked: bool = False) -> dict:
    """Parameters; ``stacked`` puts the layers in one dict of [L, ...] arrays (for scan)."""
    k_embed, k_unembed, k_layers = jax.random.split(key, 3)
    layers = [_init_layer(config, k) for k in jax.random.split(k_layers, config.n_layers)]
    if stacked:
        layers = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
    D, V = config.d_model, config.vocab
    return {
        "embed": dense(k_embed, (V, D), D, config.dtype),
        "layers": layers,
        "ln_f": _norm(config),
        "unembed": dense(k_unembed, (D, V), D, config.dtype),
    }


def init_opt_state(params: Any, *, master_weights: bool = False) -> dict:
    """Adam state: first and second moments shaped like ``params``, and a step counter; with
    ``master_weights``, the moments and a master copy of the parameters in float32."""
    if not master_weights:
        return {
            "m": jax.tree.map(jnp.zeros_like, params),
            "v": jax.tree.map(jnp.zeros_like, params),
            "step": jnp.zeros((), jnp.int32),
        }

    def f32_zeros(p):
        return jnp.zeros(p.shape, jnp.float32)

    return {
        "m": jax.tree.map(f32_zeros, params),
        "v": jax.tree.map(f32_zeros, params),
        "master": jax.tree.map(lambda p: p.astype(jnp.float32), params),
        "step": jnp.zeros((), jnp.int32),
    }


def init_batch(config: Config, key: jax.Array) -> dict:
    """Random token sequences; the targets are the tokens shifted by one."""
    seq = jax.random.randint(key, (config.batch, config.seq_len + 1), 0, config.vocab, jnp.int32)
    return {"tokens": seq[:, :-1], "targets": seq[:, 1:]}


def init(config: Config, key: jax.Array, *, stacked: bool = False) -> tuple[dict, dict, dict]:
    """``(params, opt_state, batch)`` for ``train_step`` (``stacked=True``: ``train_step_scan``)."""
    k_params, k_batch = jax.random.split(key)
    params = init_params(config, k_params, stacked=stacked)
    return (
        params,
        init_opt_state(params, master_weights=config.master_weights),
        init_batch(config, k_batch),
    )


def init_scan(config: Config, key: jax.Array) -> tuple[dict, dict, dict]:
    """``init`` with stacked layers, for ``train_step_scan``."""
    return init(config, key, stacked=True)


# -- forward ------------------------------------------------------------------------------


def layer_norm(p: dict, x: jax.Array, eps: float = 1e-5) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def attention(p: dict, x: jax.Array) -> jax.Array:
    """Causal self-attention: multi-head, or grouped-query when ``wk``/``wv`` have fewer heads
    (G) than ``wq`` (H): query head ``h`` reads key/value head ``h // (H // G)``. The queries
    are grouped [b, s, G, H/G, K] and the einsums run over the groups; K and V are never
    repeated (as MaxText and the Flax examples write it)."""
    q = jnp.einsum("bsd,dhk->bshk", x, p["wq"])
    k = jnp.einsum("bsd,dhk->bshk", x, p["wk"])
    v = jnp.einsum("bsd,dhk->bshk", x, p["wv"])
    b, seq, H, K = q.shape
    G = k.shape[2]
    if G == H:
        scores = jnp.einsum("bqhk,bshk->bhqs", q, k) * (K**-0.5)
    else:
        q = q.reshape(b, seq, G, H // G, K)
        scores = jnp.einsum("bqgrk,bsgk->bgrqs", q, k) * (K**-0.5)
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    probs = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
    if G == H:
        heads = jnp.einsum("bhqs,bshk->bqhk", probs, v)
    else:
        heads = jnp.einsum("bgrqs,bsgk->bqgrk", probs, v).reshape(b, seq, H, K)
    heads = wb.tag(heads, "heads")
    return jnp.einsum("bshk,hkd->bsd", heads, p["wo"])


def mlp(p: dict, x: jax.Array) -> jax.Array:
    """The dense MLP: GELU (``w_in``, ``w_out``) or SwiGLU (``w_gate``, ``w_up``, ``w_down``),
    as the parameters say."""
    if "w_gate" in p:
        hidden = wb.tag(jax.nn.silu(x @ p["w_gate"]) * (x @ p["w_up"]), "hidden")
        return hidden @ p["w_down"]
    hidden = wb.tag(jax.nn.gelu(x @ p["w_in"]), "hidden")
    return hidden @ p["w_out"]


def block(p: dict, x: jax.Array, config: Config | None = None) -> tuple[jax.Array, Any]:
    """One pre-LayerNorm transformer block: ``(x, aux)``, aux the MoE's load-balancing loss
    (None for a dense MLP; an MoE without ``config`` routes as ``Config()`` does). The
    residual stream and the block inputs are tagged (``resid_in``, ``attn_in``,
    ``resid_mid``, ``mlp_in``) for sequence parallelism."""
    x = wb.tag(x, "resid_in")
    with jax.named_scope("ln1"):
        h = wb.tag(layer_norm(p["ln1"], x), "attn_in")
    with jax.named_scope("attn"):
        a = attention(p["attn"], h)
    x = wb.tag(x + a, "resid_mid")
    with jax.named_scope("ln2"):
        h = wb.tag(layer_norm(p["ln2"], x), "mlp_in")
    if "moe" in p:
        with jax.named_scope("moe"):
            E = p["moe"]["router"].shape[-1]
            m, aux = moe_.moe(p["moe"], h, config or Config(n_experts=E, top_k=min(2, E)))
        return x + m, aux
    with jax.named_scope("mlp"):
        m = mlp(p["mlp"], h)
    return x + m, None


def _unrolled(layers: list, x: jax.Array, run_block) -> tuple[jax.Array, Any]:
    auxes = []
    for i, p in enumerate(layers):
        with jax.named_scope(f"layer{i}"):
            x, aux = run_block(p, x)
        auxes.append(aux)
    return x, None if auxes[0] is None else sum(auxes)


def _scanned(layers: dict, x: jax.Array, run_block) -> tuple[jax.Array, Any]:
    with jax.named_scope("layers"):
        x, auxes = jax.lax.scan(lambda h, p: run_block(p, h), x, layers)
    return x, None if auxes is None else jnp.sum(auxes)


def loss_fn(
    params: dict, batch: dict, *, remat: bool | str = False, config: Config | None = None
) -> jax.Array:
    """Next-token cross-entropy, plus ``config.aux_loss`` times the experts' load-balancing
    loss summed over the layers. Stacked layers (a dict) run under scan, a list unrolled;
    ``remat`` recomputes each block in the backward pass (a name: what the
    ``jax.checkpoint_policies`` policy of that name saves is kept instead)."""
    with jax.named_scope("embed"):
        x = params["embed"][batch["tokens"]]
    run = _unrolled if isinstance(params["layers"], list | tuple) else _scanned
    run_block = functools.partial(block, config=config)
    if remat:
        policy = getattr(jax.checkpoint_policies, remat) if isinstance(remat, str) else None
        run_block = jax.checkpoint(run_block, policy=policy)
    x, aux = run(params["layers"], x, run_block)
    with jax.named_scope("ln_f"):
        x = layer_norm(params["ln_f"], x)
    with jax.named_scope("loss"):
        logits = wb.tag(jnp.einsum("bsd,dv->bsv", x, params["unembed"]), "logits")
        loss = softmax_cross_entropy(logits, batch["targets"])
        if aux is None:
            return loss
        return loss + (config or Config()).aux_loss * aux


# -- training step ------------------------------------------------------------------------


def adam(params, grads, opt_state, *, learning_rate, b1=0.9, b2=0.999, eps=1e-8):
    """Bias-corrected Adam, under the "optimizer" scope. Returns ``(params, opt_state)``."""
    with jax.named_scope("optimizer"):
        step = opt_state["step"] + 1
        t = step.astype(jnp.float32)
        c1, c2 = 1 - b1**t, 1 - b2**t
        grads = jax.tree.map(lambda g, m: g.astype(m.dtype), grads, opt_state["m"])
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, opt_state["m"], grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), opt_state["v"], grads)

        def update(p, m, v):
            delta = learning_rate * (m / c1) / (jnp.sqrt(v / c2) + eps)
            return p - delta.astype(p.dtype)

        if "master" not in opt_state:
            params = jax.tree.map(update, params, m, v)
            return params, {"m": m, "v": v, "step": step}
        master = jax.tree.map(update, opt_state["master"], m, v)
        params = jax.tree.map(lambda w, p: w.astype(p.dtype), master, params)
        return params, {"m": m, "v": v, "master": master, "step": step}


def train_step(
    params: dict,
    opt_state: dict,
    batch: dict,
    *,
    learning_rate: float = 3e-3,
    remat: bool | str = False,
    config: Config | None = None,
) -> StepOutput:
    """One Adam step on next-token cross-entropy; gradients are tagged ``grads/<param path>``.

    Unrolled or scanned follows the parameters: a list of layers (``init``) or stacked
    layers (``init_scan``). ``remat`` recomputes each block in the backward pass
    (``Config.remat``, a name: ``Config.remat_policy``; ``build`` passes it). ``config``
    routes the experts of an MoE (``build`` passes it); the loss then includes the weighted
    load-balancing loss.
    """
    loss_of = functools.partial(loss_fn, remat=remat, config=config)
    loss, grads = jax.value_and_grad(loss_of)(params, batch)
    grads = wb.tag(grads, "grads")
    params, opt_state = adam(params, grads, opt_state, learning_rate=learning_rate)
    return StepOutput(params, opt_state, loss)
