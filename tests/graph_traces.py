"""Built capture and replay traces for the graph-map tests, with known answers.

A capture trace records a graph the way Kineto writes it: launch calls between a
hipStreamBeginCapture and a hipStreamEndCapture (ROCm names each kernel in the call's `kernel`
arg), inside cpu ops with input shapes and Python frames (nn.Module ones among them), under a
`capture_<bs>_<MODE>` annotation. A replay trace holds graph launches, each owning its kernels by
correlation, inside SGLang step annotations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tracebuilder import TraceBuilder

# The decode graph of the tests: (op, its parent op or None, input dims, module, kernel as the
# capture names it). The replay spells the first GEMM with other template arguments.
GEMM = "gemm_kernel<64, true>(float const*, float*)"
GEMM_REPLAYED = "gemm_kernel<128, true>(float const*, float*)"
ATTN = "void attn_decode<16>(float*, float const*)"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float> >(int, at::native::AddFunctor<float>)"
NODES: list[dict[str, Any]] = [
    {"op": "aten::mm", "parent": "aten::linear", "dims": [[4, 64], [64, 192]], "module": "Attention_0", "kernel": GEMM},
    {"op": "my::paged_attention", "parent": None, "dims": [[4, 8, 1, 16], [100, 8, 16]], "module": "Attention_0", "kernel": ATTN},
    {"op": "aten::add_", "parent": None, "dims": [[4, 64], [4, 64], []], "module": "MLP_0", "kernel": ADD},
    {"op": "aten::mm", "parent": None, "dims": [[4, 64], [64, 64]], "module": "MLP_0", "kernel": GEMM},
]
KERNEL_US = (10.0, 20.0, 5.0, 10.0)


def add_kernel_arg(b: TraceBuilder, name: str) -> None:
    """ROCm's launch calls carry the kernel they launch (also during capture, when it does not run)."""
    b.events[-1]["args"]["kernel"] = name


def capture_trace(b: TraceBuilder, *, batch: int = 4, mode: str = "DECODE", t0: float = 0.0,
                  dims_scale: int = 1, modules: tuple[str, str] = ("Attention_0", "MLP_0"), kernels: list[str] | None = None,
                  annotate: bool = True) -> None:
    """One captured graph (NODES) at t0: 1000 us of capture, one node per 100 us."""
    if annotate:
        b.annotation(f"capture_{batch}_{mode}", t0, 1000)
    b.runtime("hipStreamBeginCapture", t0 + 10, 2)
    b.python("cuda_graph_runner.py(10): capture", t0 + 5, 990, pyid=1)
    b.python("nn.Module: Model_0", t0 + 15, 900, pyid=2, parent=1)
    b.python(f"nn.Module: {modules[0]}", t0 + 20, 280, pyid=3, parent=2)
    b.python(f"nn.Module: {modules[1]}", t0 + 300, 500, pyid=4, parent=2)
    names = kernels or [n["kernel"] for n in NODES]
    for i, (node, kname) in enumerate(zip(NODES, names, strict=True)):
        t = t0 + 20 + 100 * i if i < 2 else t0 + 320 + 100 * (i - 2)
        dims = [[d * dims_scale if j == 0 and k == 0 else d for k, d in enumerate(dl)] for j, dl in enumerate(node["dims"])]
        if node["parent"]:
            b.cpu_op(node["parent"], t, 80, input_dims=[dims[0], [192, 64], []])
            b.cpu_op(node["op"], t + 10, 60, input_dims=dims)
        else:
            b.cpu_op(node["op"], t, 80, input_dims=dims)
        api = "hipExtModuleLaunchKernel" if kname.startswith("gemm") else "hipLaunchKernel"
        b.runtime(api, t + 20, 5, cat="cuda_runtime")
        add_kernel_arg(b, kname)
    b.runtime("hipStreamEndCapture", t0 + 900, 5)


@dataclass
class Replay:
    launch_ts: float
    kernels: list[tuple[str, float]]


def replay_trace(b: TraceBuilder, replays: list[Replay], *, step: str | None = "step[DECODE bs=4]", gap: float = 2.0,
                 host_op: str | None = "sglang::forward") -> None:
    """Graph launches (hipGraphLaunch), each in its own step annotation and host op, kernels back
    to back with `gap` us between them, each followed by a token copy and its sync."""
    for r in replays:
        t = r.launch_ts
        if step:
            b.annotation(step, t - 10, 400)
        if host_op:
            b.cpu_op(host_op, t - 5, 30)
        b.graph_launch(t, t + 20, r.kernels, gap=gap, api="hipGraphLaunch")
        end = t + 20 + sum(d for _, d in r.kernels) + gap * (len(r.kernels) - 1)
        b.cpu_op("aten::_to_copy", t + 100, 250)
        b.memcpy("DtoH (Device -> Pageable)", t + 101, end + 5, 2.0, api="hipMemcpyWithStream", launch_dur=240)


def full_replay(t: float) -> Replay:
    """The graph's four kernels, the first spelled with other template arguments."""
    names = [GEMM_REPLAYED, ATTN, ADD, GEMM]
    return Replay(t, list(zip(names, KERNEL_US, strict=True)))


def replay_missing_add(t: float) -> Replay:
    names = [GEMM, ATTN, GEMM]
    return Replay(t, list(zip(names, (KERNEL_US[0], KERNEL_US[1], KERNEL_US[3]), strict=True)))


def compiled_decode_pair(tmp_path, kernel_us: list[float], *, prompt: int = 60, captured_kv: int = 64):
    """tokentrace's own reduce-overhead capture, built: an eager-pass graph map of a compiled decode
    step whose SDPA was recorded with a `captured_kv`-key cache, and a trace of an eager prefill of
    `prompt` tokens and one replayed decode step per entry of kernel_us (its attention kernel's
    time; each replay also runs a 4 us GEMM). Returns (map path, replay trace path)."""
    b = TraceBuilder()
    b.annotation("tokentrace/graph_map", 0, 500)
    b.annotation("## Call CompiledFxGraph fsdpa ##", 10, 400)
    q, kv = [1, 4, 1, 16], [1, 4, captured_kv, 16]
    b.cpu_op("aten::scaled_dot_product_attention", 20, 80, input_dims=[q, kv, kv, [], [], [], [], []])
    b.cpu_op("aten::_scaled_dot_product_flash_attention", 30, 60, input_dims=[q, kv, kv, [], [], [], []])
    b.launch("flash_fwd_splitkv_kernel", 40, 50, 6)
    b.cpu_op("aten::mm", 120, 50, input_dims=[[1, 64], [64, 64]])
    b.launch("sm90_gemm", 130, 140, 4)
    cap = b.write(tmp_path / "map.json")
    r = TraceBuilder()
    r.annotation("tokentrace/prefill", 100, 300)
    r.cpu_op("aten::embedding", 110, 20, input_dims=[[1000, 64], [1, prompt], [], [], []])
    r.launch("void at::native::indexSelectLargeIndex<float>", 112, 120, 5)
    for i, us in enumerate(kernel_us):
        t0 = 1000 * (i + 1)
        r.annotation(f"tokentrace/decode_step[{i}]", t0 - 20, 200)
        r.annotation("## Call CompiledFxGraph fsdpa ##", t0 - 5, 60)
        r.graph_launch(t0, t0 + 10, [("flash_fwd_splitkv_kernel", us), ("sm90_gemm", 4.0)])
    return cap, r.write(tmp_path / "rep.json")
