"""Built traces for the report tests: a small LLM generation (prefill + decode steps) with known parts.

Every name that reaches a report (kernel, op, annotation, Python frame, call stack, GPU name,
capture metadata, file name) is a parameter, so the XSS test can fill them all with markup.
Times in microseconds; each step launches a GEMV, an attention kernel whose time grows with the
KV length (16 tokens more per step, to make a scaling fit), and an elementwise kernel after a host
gap, runs one op that syncs (a DtoH copy and a stream synchronisation), and allocates memory.
Also `section`, which cuts one question's section out of a report's HTML.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tracebuilder import TraceBuilder

PREFILL_US = 400.0
STEP_US = 400.0
STEP_PITCH_US = 500.0
SYNC_BLOCK_US = 40.0


@dataclass
class Names:
    kernel: str = "ampere_bf16_gemv_kernel"
    kernel2: str = "vectorized_elementwise_kernel"
    attention_kernel: str = "flash_fwd_splitkv_kernel"
    op: str = "aten::linear"
    sync_op: str = "aten::item"
    frame: str = "model.py(42): forward"
    annotation: str = "sampling"
    gpu: str = "NVIDIA H100 80GB HBM3"
    model: str = "tiny-llama"
    file: str = "generate.pt.trace.json"


# Stage timings of a run without the profiler, as the capture module writes them (capture.timing.Timings).
UNPROFILED_TTFT_US = 200.0
UNPROFILED_STEP_US = 320.0


def capture_timings(steps: int, *, tokenize_us: float | None = 1500.0) -> dict[str, object]:
    """The `timings` of a capture's metadata: TTFT and every decode step measured with CUDA events, no profiler."""
    decode = [UNPROFILED_STEP_US] * steps
    return {"ttft_us": UNPROFILED_TTFT_US, "decode_step_us": decode, "tokenize_us": tokenize_us, "clock": "cuda_event",
            "tpot_us": {"mean": UNPROFILED_STEP_US, "p50": UNPROFILED_STEP_US, "p90": UNPROFILED_STEP_US, "max": UNPROFILED_STEP_US},
            "e2e_us": UNPROFILED_TTFT_US + sum(decode)}


def llm_trace(tmp_path: Path, *, steps: int = 4, names: Names | None = None, memory: bool = True, timings: bool = False) -> Path:
    """Write the trace and return its path; `timings` adds the capture's unprofiled stage timings to its metadata."""
    from tokentrace.profiling.conventions import TIMINGS_UNPROFILED

    n = names or Names()
    b = TraceBuilder(gpu_name=n.gpu)
    b.top["tokentrace"] = {"model": n.model, "prompt_len": 32, "batch": 1, "dtype": "bfloat16",
                           "command": ["tokentrace", "capture", "--model", n.model, "--prompt-lens", "32"]}
    if timings:
        b.top["tokentrace"].update({"timings": capture_timings(steps), "timings_source": TIMINGS_UNPROFILED})
    alloc = 1 << 30

    def forward(t: float, q_len: int, kv_len: int, kernel_us: float, label: str, dur: float) -> None:
        nonlocal alloc
        b.annotation(label, t, dur)
        b.python(n.frame, t, dur, pyid=1)
        b.annotation(n.annotation, t + 1, 5)
        b.cpu_op("aten::embedding", t + 2, 6, input_dims=[[32000, 64], [1, q_len]])
        b.cpu_op(n.op, t + 10, 40, input_dims=[[1, q_len, 64], [64, 64]], input_type=["c10::BFloat16"] * 2,
                 **{"Call stack": f"{n.frame};layers.py(7): {n.op}"})
        b.launch(n.kernel, t + 15, t + 22, kernel_us)
        # Attention whose GPU time grows with the KV length (decode reads the whole cache).
        b.cpu_op("aten::scaled_dot_product_attention", t + 60, 30, input_dims=[[1, 8, q_len, 64], [1, 8, kv_len, 64], [1, 8, kv_len, 64]],
                 input_type=["c10::BFloat16"] * 3)
        b.launch(n.attention_kernel, t + 65, t + 24 + kernel_us, 0.25 * kv_len)
        # Host work without launches: the GPU idles until the next launch (a launch-bound gap).
        b.cpu_op(n.op, t + 150, 20, input_dims=[[1, q_len, 64], [64, 64]])
        b.launch(n.kernel2, t + 155, t + 162, 20.0)
        b.cpu_op(n.sync_op, t + 250, 70, **{"Call stack": f"{n.frame};sample.py(3): {n.sync_op}"})
        b.memcpy("DtoH (Device -> Pinned)", t + 255, t + 262, 4.0)
        b.runtime("cudaStreamSynchronize", t + 262, SYNC_BLOCK_US)
        if memory:
            alloc += 2 << 20
            b.memory(t + 20, 2 << 20, allocated=alloc, reserved=2 << 30)

    forward(100.0, 32, 32, 110.0, "tokentrace/prefill", PREFILL_US)
    for i in range(steps):
        forward(600.0 + i * STEP_PITCH_US, 1, 33 + i * 16, 60.0, f"tokentrace/decode_step[{i}]", STEP_US)
    return b.write(tmp_path / n.file)


def cpu_only_trace(tmp_path: Path, name: str = "cpu.pt.trace.json") -> Path:
    """Host ops only: no GPU, no memory events, no phases."""
    b = TraceBuilder(gpu_name=None)
    for i in range(5):
        b.cpu_op("aten::add", 10.0 + i * 20, 10)
    return b.write(tmp_path / name)


def section(html: str, sid: str) -> str:
    """The HTML of one <section id=...> (up to the next section of the report)."""
    m = re.search(rf'<section id="{re.escape(sid)}"[^>]*>(.*?)(?=<section id=|<footer)', html, flags=re.S)
    assert m, f"section {sid} missing"
    return m.group(1)
