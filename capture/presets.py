"""Named model presets: real architectures' configs (random weights, no download) and tiny test models.

A preset is the `config.json` of a published checkpoint, copied here so `--preset llama-3.2-1b`
builds the same layer shapes (and so the same kernels, at the same sizes and timings) with
`AutoModelForCausalLM.from_config` and seeded random weights, without network access. The dicts use
the hub's own config.json format because every transformers version knows how to read that
(`ConfigClass.from_dict`, the path `from_pretrained` takes), while constructor keywords changed
(e.g. `rope_scaling` became `rope_parameters` in transformers 5).

The tiny presets keep each architecture's structure (GQA, tied embeddings, RoPE or learned
positions) at a size where a CPU capture takes seconds: they are what the tests use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokentrace.errors import TokentraceError


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    # The hub checkpoint whose config.json this copies; recorded in metadata for provenance only.
    source: str | None
    config: dict[str, Any] = field(repr=False)


_LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "use_cache": True,
    "vocab_size": 128256,
}

_QWEN2_5_0_5B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 24,
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

_GPT2 = {
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "activation_function": "gelu_new",
    "attn_pdrop": 0.1,
    "bos_token_id": 50256,
    "embd_pdrop": 0.1,
    "eos_token_id": 50256,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "resid_pdrop": 0.1,
    "vocab_size": 50257,
}

# Tiny models: same architecture families, shrunk so that a CPU capture of a few decode steps
# takes well under a second per run. A vocab of 1024 keeps the lm_head from dominating.
_TINY_LLAMA = {
    **_LLAMA_3_2_1B,
    "head_dim": 16,
    "hidden_size": 64,
    "intermediate_size": 128,
    "max_position_embeddings": 256,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "vocab_size": 1024,
}

_TINY_GPT2 = {
    **_GPT2,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "n_ctx": 256,
    "n_embd": 64,
    "n_head": 4,
    "n_layer": 2,
    "n_positions": 256,
    "vocab_size": 1024,
}

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("gpt2", "GPT-2 small, 124M: 12 layers, 12 heads, MHA, learned positions", "openai-community/gpt2", _GPT2),
        Preset("llama-3.2-1b", "Llama 3.2 1B: 16 layers, 32 heads, 8 KV heads (GQA), RoPE", "meta-llama/Llama-3.2-1B", _LLAMA_3_2_1B),
        Preset("qwen2.5-0.5b", "Qwen2.5 0.5B: 24 layers, 14 heads, 2 KV heads (GQA), QKV bias", "Qwen/Qwen2.5-0.5B", _QWEN2_5_0_5B),
        Preset("tiny-llama", "test model: Llama structure, 2 layers, hidden 64, context 256", None, _TINY_LLAMA),
        Preset("tiny-gpt2", "test model: GPT-2 structure, 2 layers, hidden 64, context 256", None, _TINY_GPT2),
    )
}


def get_preset(name: str) -> Preset:
    """The preset called `name` (case-insensitive); TokentraceError listing the known ones otherwise."""
    preset = PRESETS.get(name.lower())
    if preset is None:
        raise TokentraceError(f"unknown preset '{name}' (known presets: {', '.join(PRESETS)})")
    return preset


def build_config(preset: Preset) -> Any:
    """A transformers config object for `preset`, read the way from_pretrained reads config.json."""
    from transformers import CONFIG_MAPPING

    config_dict = {k: v for k, v in preset.config.items() if v is not None}
    return CONFIG_MAPPING[config_dict["model_type"]].from_dict(config_dict)
