"""Which model a capture runs and how it is built: preset, local folder or hub id.

`resolve_source` only reads configs (cheap, and the context length is needed to validate prompt
lengths before anything is written); `load_model` builds the weights. Presets are built with
seeded random weights directly on the target device and dtype, so a 1B-parameter preset is ready in
about a second on a GPU and needs no download. Hub access happens only for `--model <hub id>`,
and its failure is reported in one line that points at the offline alternatives.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokentrace.errors import TokentraceError

from .presets import PRESETS, Preset, build_config, get_preset

if TYPE_CHECKING:
    import torch

# "gpt2" or "org/name": what a hub id looks like. Anything else that does not exist is a missing path.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")

ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2")


@dataclass
class ModelSource:
    """A model to capture, resolved to a config (no weights yet)."""

    preset: Preset | None
    model: str | None  # hub id or local path, as the user gave it
    config: Any  # transformers PretrainedConfig
    local_files_only: bool = False

    @property
    def label(self) -> str:
        """Folder-name prefix for runs: the preset name, or the model's last path component."""
        if self.preset is not None:
            return self.preset.name
        tail = Path(str(self.model).rstrip("/\\")).name or "model"
        return re.sub(r"[^\w.\-]+", "_", tail)

    @property
    def context_length(self) -> int | None:
        return config_summary(self.config)["max_position_embeddings"]


def _one_line(exc: BaseException, limit: int = 200) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def resolve_source(preset: str | None, model: str | None, local_files_only: bool = False) -> ModelSource:
    """Check the model choice and read its config; TokentraceError on any bad input."""
    if (preset is None) == (model is None):
        raise TokentraceError("give exactly one of --preset NAME or --model ID_OR_PATH")
    if preset is not None:
        p = get_preset(preset)
        return ModelSource(preset=p, model=None, config=build_config(p))
    assert model is not None  # exactly one of preset and model, checked above

    from transformers import AutoConfig

    path = Path(model).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise TokentraceError(f"{model}: not a transformers model folder (no config.json)")
        try:
            config = AutoConfig.from_pretrained(str(path))
        except Exception as exc:  # any parse failure of a user's folder is bad input
            raise TokentraceError(f"{model}: could not read config.json ({_one_line(exc)})") from None
        return ModelSource(preset=None, model=model, config=config, local_files_only=True)

    if not _HUB_ID.match(model):
        raise TokentraceError(f"model path '{model}' does not exist")
    try:
        config = AutoConfig.from_pretrained(model, local_files_only=local_files_only)
    except Exception as exc:  # network, auth, 404, offline: all reported the same way
        raise TokentraceError(
            f"could not load '{model}' from the Hugging Face hub ({_one_line(exc)}); "
            f"pass a local model folder to --model, or use --preset ({', '.join(PRESETS)})"
        ) from None
    return ModelSource(preset=None, model=model, config=config, local_files_only=local_files_only)


def check_attn_implementation(name: str, device: torch.device) -> None:
    """Refuse attention backends that cannot run here before spending time building the model."""
    if name == "flash_attention_2":
        if importlib.util.find_spec("flash_attn") is None:
            raise TokentraceError("attn implementation 'flash_attention_2' needs the flash-attn package, which is not installed")
        if device.type != "cuda":
            raise TokentraceError("attn implementation 'flash_attention_2' runs only on CUDA")


def _dtype_kwarg() -> str:
    """transformers >= 4.56 calls the load dtype `dtype`; older versions only know `torch_dtype`."""
    import transformers

    major, minor = (int(x) for x in re.findall(r"\d+", transformers.__version__)[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def load_model(source: ModelSource, device: torch.device, dtype: torch.dtype, attn_implementation: str, seed: int = 0) -> Any:
    """Build (preset) or load (path/hub) the model on `device` in `dtype`, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    check_attn_implementation(attn_implementation, device)
    kwargs = {_dtype_kwarg(): dtype, "attn_implementation": attn_implementation}
    try:
        if source.preset is not None:
            torch.manual_seed(seed)  # the same preset and seed give the same weights
            # Creating parameters on the target device skips a slow CPU init and a copy.
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(source.config, **kwargs)
        else:
            assert source.model is not None  # a ModelSource holds a preset or a model
            model = AutoModelForCausalLM.from_pretrained(source.model, local_files_only=source.local_files_only, **kwargs)
    except (ValueError, ImportError, OSError) as exc:  # e.g. an attention backend this model lacks
        raise TokentraceError(f"could not build {source.label} with attn implementation '{attn_implementation}': {_one_line(exc)}") from None
    return model.to(device).eval()


def load_tokenizer(source: ModelSource) -> Any | None:
    """The model's tokenizer, or None (presets, or folders without one: prompts are random ids then)."""
    if source.preset is not None:
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(source.model, local_files_only=source.local_files_only)
    except Exception:  # a model without a tokenizer is still capturable with random token ids
        return None


def config_summary(config: Any) -> dict[str, Any]:
    """The shape facts the analyzer needs (attention FLOPs, KV-cache bytes), whatever the model family."""
    c = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(c, "num_attention_heads", None)
    hidden = getattr(c, "hidden_size", None)
    head_dim = getattr(c, "head_dim", None) or (hidden // heads if hidden and heads else None)
    context = getattr(c, "max_position_embeddings", None) or getattr(c, "n_positions", None)
    return {
        "model_type": getattr(c, "model_type", None),
        "num_layers": getattr(c, "num_hidden_layers", None),
        "num_heads": heads,
        "num_kv_heads": getattr(c, "num_key_value_heads", None) or heads,
        "hidden_size": hidden,
        "head_dim": head_dim,
        "vocab_size": getattr(c, "vocab_size", None),
        "max_position_embeddings": context,
    }
