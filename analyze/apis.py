"""Names from the profiler's vocabulary: event categories and runtime/driver API names.

One declared list per concept, in one place. Detectors and the loader import these; nothing else
spells an API name. Kineto has renamed categories over time (2021 traces say `Kernel`, `Runtime`,
`Operator`; current ones `kernel`, `cuda_runtime`, `cpu_op`), and ROCm traces reuse the CUDA
category names with hip* API names, so every list covers all of them.
"""

from __future__ import annotations

import re

# Normalised kind of each event, from its Chrome-trace category. Unknown categories keep kind
# "other" but are never dropped.
CATEGORY_KIND: dict[str, str] = {
    "cpu_op": "cpu_op",
    "Operator": "cpu_op",
    "operator": "cpu_op",
    "user_annotation": "user_annotation",
    "User Annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation",
    "python_function": "python_function",
    "Python": "python_function",
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "gpu_memcpy",
    "Memcpy": "gpu_memcpy",
    "gpu_memset": "gpu_memset",
    "Memset": "gpu_memset",
    "cuda_runtime": "runtime",
    "Runtime": "runtime",
    "hip_runtime": "runtime",
    "cuda_driver": "driver",
    "Driver": "driver",
    "hip_driver": "driver",
    "cuda_sync": "cuda_sync",
    "cpu_instant_event": "cpu_instant_event",
    "Trace": "trace_span",
    "ac2g": "flow",
    "async_cpu_to_gpu": "flow",
    "async": "flow",
    "fwdbwd": "flow",
    "overhead": "overhead",
    "Overhead": "overhead",
}

# GPU activity: what occupies a stream. cuda_sync events sit on GPU rows too but are not work.
GPU_KINDS: tuple[str, ...] = ("kernel", "gpu_memcpy", "gpu_memset")
# Host-side calls into the runtime or driver.
HOST_API_KINDS: tuple[str, ...] = ("runtime", "driver")
# Flow categories that link a launch to the GPU activity it started.
LAUNCH_FLOW_CATS: tuple[str, ...] = ("ac2g", "async_cpu_to_gpu", "async")

# Calls that start GPU work. Graph launches own many kernels (one correlation id for all of them).
KERNEL_LAUNCH_APIS: tuple[str, ...] = (
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cudaLaunchCooperativeKernel",
    "cudaLaunchCooperativeKernelMultiDevice",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cuLaunchCooperativeKernel",
    "hipLaunchKernel",
    "hipExtLaunchKernel",
    "hipExtModuleLaunchKernel",
    "hipModuleLaunchKernel",
    "hipLaunchCooperativeKernel",
)
GRAPH_LAUNCH_APIS: tuple[str, ...] = ("cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch")
# Calls that open and close a stream capture: the launches between them on the capturing thread
# record a graph's nodes instead of running them (a graph map reads its kernels and ops there).
GRAPH_CAPTURE_BEGIN_APIS: tuple[str, ...] = (
    "cudaStreamBeginCapture", "cudaStreamBeginCapture_v2", "cudaStreamBeginCaptureToGraph",
    "cuStreamBeginCapture", "cuStreamBeginCapture_v2", "cuStreamBeginCaptureToGraph",
    "hipStreamBeginCapture", "hipStreamBeginCaptureToGraph",
)
GRAPH_CAPTURE_END_APIS: tuple[str, ...] = ("cudaStreamEndCapture", "cuStreamEndCapture", "hipStreamEndCapture")
MEMCPY_APIS: tuple[str, ...] = (
    "cudaMemcpy",
    "cudaMemcpyAsync",
    "cudaMemcpy2D",
    "cudaMemcpy2DAsync",
    "cudaMemcpyPeer",
    "cudaMemcpyPeerAsync",
    "cudaMemcpyToSymbol",
    "cudaMemcpyFromSymbol",
    "cuMemcpy",
    "cuMemcpyAsync",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "hipMemcpy",
    "hipMemcpyAsync",
    "hipMemcpyWithStream",
    "hipMemcpyDtoH",
    "hipMemcpyHtoD",
    "hipMemcpyDtoHAsync",
    "hipMemcpyHtoDAsync",
    "hipMemcpy2D",
    "hipMemcpy2DAsync",
)
MEMSET_APIS: tuple[str, ...] = (
    "cudaMemset",
    "cudaMemsetAsync",
    "cudaMemset2D",
    "cudaMemset2DAsync",
    "cuMemsetD8_v2",
    "cuMemsetD32_v2",
    "cuMemsetD8Async",
    "cuMemsetD32Async",
    "hipMemset",
    "hipMemsetAsync",
    "hipMemsetD8",
    "hipMemsetD32",
    "hipMemsetD8Async",
    "hipMemsetD32Async",
)
LAUNCH_APIS: frozenset[str] = frozenset(
    KERNEL_LAUNCH_APIS + GRAPH_LAUNCH_APIS + MEMCPY_APIS + MEMSET_APIS
)

# Host calls that block the host until GPU work finishes (the host cannot launch meanwhile).
HOST_SYNC_APIS: tuple[str, ...] = (
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cuCtxSynchronize",
    "cuStreamSynchronize",
    "cuEventSynchronize",
    "hipDeviceSynchronize",
    "hipStreamSynchronize",
    "hipEventSynchronize",
)
# GPU-side waits: a stream waits for an event; the host is not blocked.
GPU_WAIT_APIS: tuple[str, ...] = ("cudaStreamWaitEvent", "cuStreamWaitEvent", "hipStreamWaitEvent")
# Memcpy/memset calls that are synchronous with respect to the host by API contract.
SYNC_MEMCPY_APIS: tuple[str, ...] = (
    "cudaMemcpy",
    "cudaMemcpy2D",
    "cudaMemcpyToSymbol",
    "cudaMemcpyFromSymbol",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "hipMemcpy",
    "hipMemcpyDtoH",
    "hipMemcpyHtoD",
    "hipMemcpy2D",
    "hipMemcpyWithStream",  # PyTorch's blocking copy_ on ROCm: returns after the copy completes
)
SYNC_MEMSET_APIS: tuple[str, ...] = ("cudaMemset", "cudaMemset2D", "hipMemset", "hipMemsetD8", "hipMemsetD32")
# Every host call during which the host waits for the device by API contract: its duration is time
# blocked in a sync (the latency and critical-path helpers; the sync detector's kinds split it).
BLOCKING_APIS: frozenset[str] = frozenset(HOST_SYNC_APIS + SYNC_MEMCPY_APIS + SYNC_MEMSET_APIS)
# Operators that force a device-to-host sync to produce a host value.
SYNC_CAUSING_OPS: tuple[str, ...] = (
    "aten::item",
    "aten::_local_scalar_dense",
    "aten::nonzero",
    "aten::is_nonzero",
    "aten::masked_select",
    "aten::tolist",
    "aten::unique",
    "aten::_unique2",
    "aten::equal",
)
# Operators that copy between host and device (`.cpu()`, `.to(device)`, `.tolist()`): a copy to or
# from pageable host memory waits for the device, and its memcpy and stream-sync calls are one wait.
HOST_COPY_OPS: tuple[str, ...] = ("aten::to", "aten::_to_copy", "aten::copy_", "aten::_copy_from", "aten::tolist")

# The op that opens a language model's forward pass: the token-embedding lookup, Input Dims[1] =
# (batch, tokens per sequence).
EMBEDDING_OPS: tuple[str, ...] = ("aten::embedding",)
# Ops and annotations that only a training step runs (no forward-only inference has them).
TRAINING_OP_MARKERS: tuple[str, ...] = ("autograd::engine::evaluate_function", "## backward ##", "Optimizer.step", "Optimizer.zero_grad")

# torch.compile's annotation around each call of a compiled graph (Inductor's output code); with
# mode="reduce-overhead" each such call is one CUDA-graph replay, keyed by the graph's cache key.
COMPILED_GRAPH_ANNOTATION = re.compile(r"^## Call CompiledFxGraph (\S+) ##$")
# vLLM's, SGLang's and ATOM's annotation around the capture of one batch size's graphs
# (`capture_32_DECODE`, `capture_8192_PIECEWISE`, `capture_128_decode`).
GRAPH_CAPTURE_ANNOTATION = re.compile(r"^capture_(\d+)_(\w+)$")
# Serving engines' per-step annotations that name the step's batch (tokens for vLLM's execute_<n>):
# the size a graph replay was padded from, used only to pick among graphs whose kernels are equal.
STEP_BATCH_ANNOTATIONS: tuple[re.Pattern[str], ...] = (
    re.compile(r"^execute_(\d+)_"),  # vLLM (and SGLang patched the same way): total tokens of the step
    re.compile(r"^step\[\w+ bs=(\d+)"),  # SGLang: step[DECODE bs=32]
    re.compile(r"^(?:decode|prefill)\[.*\btok=(\d+)"),  # ATOM: decode[bs=117/128 tok=117 ...]
)
# Category of the cpu-op rows tokentrace adds to a replay trace from a graph map (never in a file).
GRAPH_MAP_CATEGORY = "tokentrace_graph_map"

_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)


def rank_from_filename(name: str) -> int | None:
    """Rank written into a file name by common launchers (`rank-3`, `rank_3`, `worker3`)."""
    m = _RANK_IN_NAME.search(name)
    return int(m.group(1)) if m else None

# ---- collective communication ------------------------------------------------------------------
# GPU kernels that carry inter-GPU communication, as regular expressions searched in the kernel
# name, each with the collective it runs ("" when the name does not say reliably) and its source.
# NCCL and RCCL name kernels ncclKernel_<Coll>_<ALGO>_<PROTO>_... (up to 2.18), ncclDevKernel_<Coll>_...
# (2.19+) and ncclDevKernel_Generic[_N] (RCCL); since NCCL 2.2 one kernel may run several grouped
# operations and the name only hints at the first (NVIDIA/nccl issues 714, 739), so the type is
# taken from the op's args or record_function name first. The engines' custom all-reduce kernels:
# vllm::/sglang::/aiter::cross_device_reduce_1stage|2stage|half_butterfly|..._naive<T, ngpus>
# (vLLM csrc/custom_all_reduce.cuh, sgl-kernel csrc/allreduce/custom_all_reduce.cuh, AITER
# csrc/include/custom_all_reduce.cuh), AITER's fused all-reduce + norm and its all-gather /
# reduce-scatter kernels, quick reduce (quickreduce::allreduce_prototype_twoshot, vLLM/SGLang on
# ROCm), TensorRT-LLM's one/two-shot kernels (sgl-kernel trt_reduce), FlashInfer's fused
# all-reduce, and torch symmetric memory's kernels (vLLM uses them for large all-reduces).
COLLECTIVE_KERNELS: tuple[tuple[str, str, str], ...] = (
    (r"^(?:void )?nccl(?:Dev)?Kernel_", "", "nccl"),
    (r"^(?:void )?mscclKernel_", "", "msccl"),
    (r"\bcross_device_reduce_\w+", "all_reduce", "custom"),
    (r"\baiter::allreduce_fusion_kernel_", "all_reduce", "custom"),
    (r"\baiter::allgather_(?:lastdim|naive|vec)\b", "all_gather", "custom"),
    (r"\baiter::reduce_scatter_", "reduce_scatter", "custom"),
    (r"\bquickreduce::allreduce_", "all_reduce", "custom"),
    (r"\b(?:one|two)ShotAllReduceKernel\b", "all_reduce", "custom"),
    (r"\btrtllm_allreduce_fusion::allreduce_fusion_kernel_", "all_reduce", "custom"),
    (r"\b(?:multimem_)?(?:one_shot_|two_shot_)?all_reduce_kernel", "all_reduce", "symm_mem"),
)
# Text that every name COLLECTIVE_KERNELS matches contains (each pattern holds one of them outside
# any optional part; a test keeps it so): a substring test rules out most kernel names at once,
# where the patterns' leading \b keeps the regex engine from looking for their text first (~20 us
# a name for the ten).
COLLECTIVE_KERNEL_TEXT: tuple[str, ...] = ("Kernel_", "educe", "allgather")
# Which template argument of a custom kernel is the number of GPUs (cross_device_reduce_1stage<T,
# ngpus>, oneShotAllReduceKernel<T, RANKS_PER_NODE, ...>, allreduce_fusion_kernel_*<Pattern, T,
# NRanks, ...>): the group size when no args say it.
COLLECTIVE_KERNEL_GROUP_ARG: tuple[tuple[str, int], ...] = (
    (r"cross_device_reduce_\w+<", 1),
    (r"(?:one|two)ShotAllReduceKernel<", 1),
    (r"trtllm_allreduce_fusion::allreduce_fusion_kernel_\w+<", 2),
)
# Host ops and record_function ranges of a collective call: c10d's ops (c10d::allreduce_,
# c10d::_allgather_base_, functional collectives), the backend's range (nccl:all_reduce,
# gloo:all_reduce, ...), PyTorch's record_param_comms (which carries the args), and the engines'
# custom ops. The collective type is read from the part after the prefix.
HOST_COLLECTIVE_PREFIXES: tuple[str, ...] = (
    "nccl:", "gloo:", "mpi:", "ucc:", "xccl:", "c10d::", "_c10d_functional::", "c10d_functional::", "_C_custom_ar::",
    "vllm::all_reduce", "vllm::all_gather", "vllm::reduce_scatter", "vllm::outplace_all_reduce", "vllm::inplace_all_reduce",
)
RECORD_PARAM_COMMS = "record_param_comms"
