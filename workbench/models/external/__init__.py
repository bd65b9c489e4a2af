"""Third-party models: training steps written as their libraries' own docs and examples write them.

    ex = build_external("hf_gpt2")                          # real arrays, "tiny"
    ex = build_external("hf_llama", "large", abstract=True)  # ShapeDtypeStructs only
    program = wb.capture(ex.fn, *ex.args)

Every step is ``step(params, opt_state, batch) -> (params, opt_state, loss)`` and uses
nothing from the workbench. A library is imported only when one of its models is built.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from workbench.models import Example
from workbench.models._common import ConfigError
from workbench.models.external._common import SIZES, Size


def _lazy(module: str, builder: str, doc: str) -> Callable[..., Example]:
    def build(size: str | Size = "tiny", abstract: bool = False) -> Example:
        mod = importlib.import_module(f"workbench.models.external.{module}")
        return getattr(mod, builder)(size, abstract)

    build.__name__ = build.__qualname__ = f"{module}.{builder}"
    build.__doc__ = doc
    return build


#: name -> ``builder(size="tiny", abstract=False) -> Example``
EXTERNAL: dict[str, Callable[..., Example]] = {
    "hf_gpt2": _lazy("hf", "build_gpt2", "transformers FlaxGPT2LMHeadModel"),
    "hf_llama": _lazy("hf", "build_llama", "transformers FlaxLlamaForCausalLM (GQA)"),
    "hf_bert": _lazy("hf", "build_bert", "transformers FlaxBertForMaskedLM"),
    "hf_opt": _lazy("hf_more", "build_opt", "transformers FlaxOPTForCausalLM"),
    "hf_mistral": _lazy("hf_more", "build_mistral", "transformers FlaxMistralForCausalLM (GQA)"),
    "hf_gemma": _lazy("hf_more", "build_gemma", "transformers FlaxGemmaForCausalLM"),
    "hf_gpt_neo": _lazy("hf_more", "build_gpt_neo", "transformers FlaxGPTNeoForCausalLM"),
    "nnx_lm": _lazy("nnx_lm", "build", "Flax NNX decoder LM, functional split/merge step"),
    "nnx_lm_jit": _lazy("nnx_lm", "build_nnx_jit", "Flax NNX decoder LM, @nnx.jit step"),
    "nnx_vit": _lazy("vit", "build", "Flax NNX ViT (the NNX tutorial's), @nnx.jit step"),
    "linen_lm": _lazy("linen_lm", "build", "Flax Linen decoder LM"),
    "eqx_lm": _lazy("eqx_lm", "build", "Equinox decoder LM, partition/combine step"),
    "haiku_lm": _lazy("haiku_lm", "build", "Haiku decoder LM (hk.transform)"),
}


def build_external(name: str, size: str | Size = "tiny", abstract: bool = False) -> Example:
    """Model ``name`` at a size ("tiny", "large" or a ``Size``); ``abstract`` gives shapes only."""
    if name not in EXTERNAL:
        raise ConfigError(
            f"no external model {name!r}; choose one of {', '.join(map(repr, EXTERNAL))}."
        )
    return EXTERNAL[name](size, abstract)


__all__ = ["EXTERNAL", "SIZES", "Size", "build_external"]
