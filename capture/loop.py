"""The manual generation loop: one prefill forward, then decode steps with the model's own KV cache.

This is what `model.generate` does minus its bookkeeping, written out so that each stage can be
annotated (`tokentrace/prefill`, `tokentrace/decode_step[i]`) and timed on its own. Every stage ends
with the new token copied to the host, as a server delivering tokens must; that copy is also what
makes stage boundaries exact in the trace (the host waits for the stage's last kernel).

transformers changed the forward signature over versions (`past_key_values` -> `cache`,
`cache_position` gone in 5.x, `num_logits_to_keep` -> `logits_to_keep`), so the keywords are picked
from the model's own signature rather than from a version table.

With torch.compile only the decode step runs compiled, as in transformers' generate(): prefill
shapes change with every prompt length (a recompile each, and CUDA graphs per shape), and running
prefill eagerly also lets the static cache allocate its buffers outside any graph.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .conventions import PREFILL, decode_step_name

if TYPE_CHECKING:
    import torch

    from .timing import StageTimer


@dataclass
class LoopState:
    """One generation in progress: its cache, positions and the tokens delivered to the host so far."""

    input_ids: torch.Tensor  # (batch, prompt_len) on the device
    positions: torch.Tensor  # arange(prompt_len + max_new_tokens) on the device, sliced per stage
    cache: Any
    pos: int = 0
    next_ids: torch.Tensor | None = None  # last sampled token per sequence, on the device
    host_tokens: list[list[int]] = field(default_factory=list)  # one list (over the batch) per stage


def compile_forward(model: Any, mode: str) -> Callable[..., Any]:
    """`model.forward` compiled with torch.compile in `mode` ("none" returns it unchanged)."""
    if mode == "none":
        return model.forward
    import torch

    # fullgraph=False: a graph break in some model's Python should cost speed, not the capture.
    return torch.compile(model.forward, mode=None if mode == "default" else mode, fullgraph=False)


def _filter_kwargs(fn: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    params = inspect.signature(fn).parameters
    return {k: v for k, v in kwargs.items() if k in params}


class DecodeLoop:
    """Prefill and decode for one (model, batch, prompt_len, max_new_tokens) configuration."""

    def __init__(
        self,
        model: Any,
        device: torch.device,
        *,
        forward: Callable[..., Any] | None = None,  # the (compiled) forward for decode steps
        compile_mode: str = "none",
        static_cache: bool = False,
        temperature: float = 0.0,
        seed: int = 0,
    ) -> None:
        import torch

        self.model = model
        self.device = device
        self.decode_forward = forward or model.forward
        self.static_cache = static_cache
        self.temperature = temperature
        # CUDA-graph replays overwrite their outputs; marking each step tells torch that the previous
        # step's outputs are consumed (we sample from the logits before the next call).
        self._mark_step = compile_mode == "reduce-overhead" and hasattr(torch.compiler, "cudagraph_mark_step_begin")
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._cache_position = "cache_position" in params
        # Keep only the last position's logits in prefill, as generate() does: a full
        # (batch, prompt_len, vocab) lm_head would be a large GEMM that real serving never runs.
        self._logits_kw = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)
        self._generator = torch.Generator(device=device).manual_seed(seed) if temperature > 0 else None
        self._static: Any = None
        self._static_key: tuple[int, int] | None = None

    # -- caches ---------------------------------------------------------------------------------

    def _new_cache(self, batch: int, max_len: int) -> Any:
        from transformers import DynamicCache, StaticCache

        if not self.static_cache:
            return DynamicCache(**_filter_kwargs(DynamicCache.__init__, {"config": self.model.config}))
        # Reuse one static cache (reset) across runs of the same shape: same addresses, so compiled
        # CUDA graphs recorded during warm-up stay valid for the measured and profiled runs.
        if self._static is not None and self._static_key == (batch, max_len):
            self._static.reset()
            return self._static
        dtype = next(self.model.parameters()).dtype
        kwargs = {"config": self.model.config, "max_cache_len": max_len, "max_batch_size": batch, "batch_size": batch, "device": self.device, "dtype": dtype}
        self._static = StaticCache(**_filter_kwargs(StaticCache.__init__, kwargs))
        self._static_key = (batch, max_len)
        return self._static

    def start(self, input_ids: torch.Tensor, max_new_tokens: int) -> LoopState:
        import torch

        batch, prompt_len = input_ids.shape
        total = prompt_len + max_new_tokens
        return LoopState(
            input_ids=input_ids.to(self.device),
            positions=torch.arange(total, device=self.device),
            cache=self._new_cache(batch, total),
        )

    # -- stages ---------------------------------------------------------------------------------

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, cache: Any, decode: bool) -> torch.Tensor:
        import torch

        kwargs: dict[str, Any] = {"input_ids": ids, "position_ids": positions.unsqueeze(0), self._cache_kw: cache, "use_cache": True}
        if self._cache_position:
            kwargs["cache_position"] = positions
        if self._logits_kw:
            kwargs[self._logits_kw] = 1
        if not decode:
            out = self.model.forward(**kwargs)
        else:
            if self._mark_step:
                torch.compiler.cudagraph_mark_step_begin()
            out = self.decode_forward(**kwargs)
        return out.logits[:, -1, :]

    def _sample(self, logits: torch.Tensor) -> torch.Tensor:
        import torch

        if self.temperature <= 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=self._generator).squeeze(-1)

    def _deliver(self, state: LoopState, next_ids: torch.Tensor) -> None:
        # The device-to-host copy that hands the token to the caller; it blocks until it is computed.
        state.host_tokens.append(next_ids.to("cpu").tolist())
        state.next_ids = next_ids

    def prefill(self, state: LoopState, timer: StageTimer | None = None, annotate: bool = True) -> None:
        prompt_len = state.input_ids.shape[1]
        with _annotation(PREFILL, annotate), (timer.stage(PREFILL) if timer else nullcontext()):
            logits = self._forward(state.input_ids, state.positions[:prompt_len], state.cache, decode=False)
            self._deliver(state, self._sample(logits))
        state.pos = prompt_len

    def decode_step(self, state: LoopState, i: int, timer: StageTimer | None = None, annotate: bool = True) -> None:
        name = decode_step_name(i)
        if state.next_ids is None:
            raise RuntimeError("decode_step before prefill: no sampled token to continue from")
        with _annotation(name, annotate), (timer.stage(name) if timer else nullcontext()):
            logits = self._forward(state.next_ids[:, None], state.positions[state.pos : state.pos + 1], state.cache, decode=True)
            self._deliver(state, self._sample(logits))
        state.pos += 1

    def run(self, input_ids: torch.Tensor, max_new_tokens: int, timer: StageTimer | None = None, annotate: bool = True) -> LoopState:
        """Prefill plus `max_new_tokens - 1` decode steps (the first new token comes from prefill)."""
        state = self.start(input_ids, max_new_tokens)
        self.prefill(state, timer, annotate)
        for i in range(max_new_tokens - 1):
            self.decode_step(state, i, timer, annotate)
        return state


def _annotation(name: str, enabled: bool) -> Any:
    if not enabled:
        return nullcontext()
    from torch.profiler import record_function

    return record_function(name)
