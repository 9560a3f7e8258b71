"""Prompt token ids for a run: seeded random ids (presets), or a tokenized synthetic text.

With random weights the content of a prompt does not matter, only its length, so presets use
random ids and have no tokenize stage. A model with a tokenizer tokenizes a synthetic English text
cut to exactly `prompt_len` tokens, so tokenization can be timed (and annotated) realistically.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_FILLER = "The quick brown fox jumps over the lazy dog while the profiler watches every kernel. "


@dataclass
class Prompt:
    input_ids: torch.Tensor  # (batch, prompt_len) int64 on the CPU
    # Re-runs the tokenization this prompt stands for (result discarded); None without a tokenizer.
    tokenize: Callable[[], Any] | None = None

    def timed_tokenize(self) -> float | None:
        """Microseconds to tokenize the batch of prompt texts on the CPU, or None."""
        if self.tokenize is None:
            return None
        t0 = time.perf_counter()
        self.tokenize()
        return (time.perf_counter() - t0) * 1e6


def make_prompt(batch: int, prompt_len: int, vocab_size: int, tokenizer: Any | None = None, seed: int = 0) -> Prompt:
    import torch

    if tokenizer is None:
        g = torch.Generator().manual_seed(seed)
        return Prompt(torch.randint(0, vocab_size, (batch, prompt_len), generator=g, dtype=torch.long))

    # Tokenize enough filler, cut to prompt_len tokens, and keep that text for timed re-tokenization.
    reps = max(1, prompt_len // 8)
    while True:
        ids = tokenizer(_FILLER * reps, add_special_tokens=False)["input_ids"]
        if len(ids) >= prompt_len:
            break
        reps *= 2
    ids = ids[:prompt_len]
    text = tokenizer.decode(ids)
    texts = [text] * batch
    input_ids = torch.tensor([ids] * batch, dtype=torch.long)
    return Prompt(input_ids, tokenize=lambda: tokenizer(texts, add_special_tokens=False, return_tensors="pt"))
