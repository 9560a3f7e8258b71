"""A small builder of Kineto-format Chrome traces with known answers, for tests.

Owns the one way tests make traces: it writes what torch.profiler writes (current category names,
correlation ids in args, ac2g flows, process/thread metadata, deviceProperties), so detectors are
tested on the same shapes of data they meet in real files. Times are given in microseconds, the
unit of the file format. `legacy=True` writes the 2021 category names instead.
"""

from __future__ import annotations

import contextlib
import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST_PID = 4242
HOST_TID = 4242
GPU_PID = 0  # Kineto uses the device index as the GPU rows' pid


@dataclass
class TraceBuilder:
    gpu_name: str | None = "NVIDIA H100 80GB HBM3"
    legacy: bool = False
    events: list[dict[str, Any]] = field(default_factory=list)
    top: dict[str, Any] = field(default_factory=dict)
    _corr: int = 1000
    _ext: int = 1

    def _cat(self, current: str) -> str:
        if not self.legacy:
            return current
        return {"cpu_op": "Operator", "cuda_runtime": "Runtime", "kernel": "Kernel", "gpu_memcpy": "Memcpy", "gpu_memset": "Memset"}.get(current, current)

    def next_corr(self) -> int:
        self._corr += 1
        return self._corr

    # ---- host side -------------------------------------------------------------------
    def cpu_op(self, name: str, ts: float, dur: float, *, tid: int = HOST_TID, input_dims: list | None = None,
               input_type: list | None = None, concrete: list | None = None, **args: Any) -> dict[str, Any]:
        a: dict[str, Any] = {"External id": self._ext, **args}
        self._ext += 1
        if input_dims is not None:
            a["Input Dims"] = input_dims
            a["Input type"] = input_type or ["float"] * len(input_dims)
        if concrete is not None:
            a["Concrete Inputs"] = concrete
        ev = {"ph": "X", "cat": self._cat("cpu_op"), "name": name, "pid": HOST_PID, "tid": tid, "ts": ts, "dur": dur, "args": a}
        self.events.append(ev)
        return ev

    def annotation(self, name: str, ts: float, dur: float, *, tid: int = HOST_TID) -> dict[str, Any]:
        ev = {"ph": "X", "cat": "user_annotation", "name": name, "pid": HOST_PID, "tid": tid, "ts": ts, "dur": dur,
              "args": {"External id": self._ext}}
        self._ext += 1
        self.events.append(ev)
        return ev

    def python(self, name: str, ts: float, dur: float, *, tid: int = HOST_TID, pyid: int = 0, parent: int | None = None) -> None:
        self.events.append({"ph": "X", "cat": "python_function", "name": name, "pid": HOST_PID, "tid": tid, "ts": ts,
                            "dur": dur, "args": {"Python id": pyid, "Python parent id": parent}})

    def runtime(self, name: str, ts: float, dur: float, *, corr: int | None = None, tid: int = HOST_TID,
                cat: str = "cuda_runtime") -> int:
        corr = self.next_corr() if corr is None else corr
        self.events.append({"ph": "X", "cat": self._cat(cat), "name": name, "pid": HOST_PID, "tid": tid, "ts": ts,
                            "dur": dur, "args": {"cbid": 211, "correlation": corr}})
        return corr

    # ---- GPU side ---------------------------------------------------------------------
    def gpu(self, name: str, ts: float, dur: float, *, corr: int, stream: int = 7, device: int = 0,
            cat: str = "kernel", **args: Any) -> dict[str, Any]:
        a = {"device": device, "context": 1, "stream": stream, "correlation": corr, **args}
        if cat == "kernel":
            a.setdefault("grid", [128, 1, 1])
            a.setdefault("block", [256, 1, 1])
        ev = {"ph": "X", "cat": self._cat(cat), "name": name, "pid": device, "tid": stream, "ts": ts, "dur": dur, "args": a}
        self.events.append(ev)
        return ev

    def flow(self, corr: int, launch_ts: float, gpu_ts: float, *, stream: int = 7, device: int = 0, tid: int = HOST_TID) -> None:
        cat = "async" if self.legacy else "ac2g"
        self.events.append({"ph": "s", "id": corr, "pid": HOST_PID, "tid": tid, "ts": launch_ts, "cat": cat, "name": cat})
        self.events.append({"ph": "f", "id": corr, "pid": device, "tid": stream, "ts": gpu_ts, "cat": cat, "name": cat, "bp": "e"})

    def launch(self, kernel: str, launch_ts: float, kernel_ts: float, kernel_dur: float, *, launch_dur: float = 5.0,
               api: str = "cudaLaunchKernel", stream: int = 7, device: int = 0, tid: int = HOST_TID,
               cat: str = "kernel", **args: Any) -> int:
        """A launch call on the host and the GPU activity it started, linked by correlation and a flow."""
        corr = self.runtime(api, launch_ts, launch_dur, tid=tid, cat="cuda_driver" if api.startswith("cu") and not api.startswith("cuda") else "cuda_runtime")
        self.gpu(kernel, kernel_ts, kernel_dur, corr=corr, stream=stream, device=device, cat=cat, **args)
        self.flow(corr, launch_ts, kernel_ts, stream=stream, device=device, tid=tid)
        return corr

    def memcpy(self, kind: str, launch_ts: float, copy_ts: float, copy_dur: float, *, nbytes: int = 4,
               api: str = "cudaMemcpyAsync", launch_dur: float = 5.0, stream: int = 7) -> int:
        """kind like 'DtoH (Device -> Pageable)' or 'HtoD (Pinned -> Device)'."""
        return self.launch(f"Memcpy {kind}", launch_ts, copy_ts, copy_dur, launch_dur=launch_dur, api=api, stream=stream,
                           cat="gpu_memcpy", bytes=nbytes)

    def graph_launch(self, launch_ts: float, first_kernel_ts: float, kernels: list[tuple[str, float]], *,
                     gap: float = 0.0, launch_dur: float = 10.0, api: str = "cudaGraphLaunch", stream: int = 7) -> int:
        """One graph launch owning many kernels (same correlation), back to back with `gap` between them."""
        corr = self.runtime(api, launch_ts, launch_dur)
        t = first_kernel_ts
        for name, dur in kernels:
            self.gpu(name, t, dur, corr=corr, stream=stream)
            t += dur + gap
        self.flow(corr, launch_ts, first_kernel_ts, stream=stream)
        return corr

    def cuda_sync(self, kind: str, ts: float, dur: float, *, corr: int, stream: int = 7) -> None:
        self.events.append({"ph": "X", "cat": "cuda_sync", "name": kind, "pid": GPU_PID, "tid": stream, "ts": ts, "dur": dur,
                            "args": {"cuda_sync_kind": kind, "stream": stream, "correlation": corr, "device": 0, "context": 1}})

    def sync_call(self, api: str, ts: float, dur: float, *, kineto: str | None = None, stream: int = 7,
                  tid: int = HOST_TID) -> int:
        """A blocking runtime call (cudaStreamSynchronize, hipDeviceSynchronize, ...) and, when
        `kineto` names one ('Stream Sync', 'Context Sync', ...), the cuda_sync activity Kineto
        records for it (same correlation, same time range)."""
        corr = self.runtime(api, ts, dur, tid=tid)
        if kineto is not None:
            self.cuda_sync(kineto, ts, dur, corr=corr, stream=stream)
        return corr

    def memory(self, ts: float, nbytes: int, *, allocated: int, reserved: int, addr: int = 1 << 40, device: int = 0,
               device_type: int = 1) -> None:
        self.events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": HOST_PID,
                            "tid": HOST_TID, "ts": ts, "args": {"Total Reserved": reserved, "Total Allocated": allocated,
                                                              "Bytes": nbytes, "Addr": addr, "Device Id": device,
                                                              "Device Type": device_type}})

    # ---- LLM inference ---------------------------------------------------------------
    def llm_step(self, t0: float, *, q_len: int, kv_len: int | None = None, batch: int = 1, layers: int = 2,
                 cpu_per_op: float = 10.0, kernel_us: float = 5.0, attn_kernel_us: float | None = None,
                 launch_us: float = 1.0, launch_latency: float = 2.0, copy_us: float = 2.0, sync_return: float = 1.0,
                 tail_us: float = 2.0, gpu_free_at: float = 0.0, annotation: str | None = None, stream: int = 7,
                 heads: int = 4, head_dim: int = 16, vocab: int = 1000, hidden: int = 64) -> dict[str, float]:
        """One generation step of a decoder LLM, the way eager PyTorch records it: a forward pass
        (aten::embedding of (batch, q_len) tokens, then per layer aten::linear,
        aten::scaled_dot_product_attention with a (batch, heads, q_len, head_dim) query over kv_len
        keys, aten::linear), aten::argmax, and the token's copy to the host (aten::_to_copy holding
        cudaMemcpyAsync DtoH + cudaStreamSynchronize), then `tail_us` of host work (aten::select).

        Host: op i occupies [t0 + i*cpu_per_op, +cpu_per_op) and launches its kernel at its start
        (launch call `launch_us` long). GPU: a kernel starts at max(launch + launch_latency, the
        previous kernel's end, gpu_free_at) and runs kernel_us (attention: attn_kernel_us). The sync
        returns sync_return after the copy ends. `annotation` wraps the whole step (None: none).

        Returns the step's known answers (us): start, host_end, token_ready (the sync's end),
        gpu_first, gpu_end (copy end), gpu_busy, kernels, launches, sync_blocked.
        """
        kv_len = q_len if kv_len is None else kv_len
        attn_kernel_us = kernel_us if attn_kernel_us is None else attn_kernel_us
        assert launch_us < cpu_per_op, "a launch call must fit inside its op"
        q = [batch, heads, q_len, head_dim]
        kv = [batch, heads, kv_len, head_dim]
        ops: list[tuple[str, list, float, str]] = [("aten::embedding", [[vocab, hidden], [batch, q_len], [], [], []], kernel_us,
                                                    "void at::native::indexSelectLargeIndex<float>")]
        for _ in range(layers):
            ops.append(("aten::linear", [[batch, q_len, hidden], [3 * hidden, hidden], []], kernel_us, "ampere_sgemm_64x32_tn"))
            ops.append(("aten::scaled_dot_product_attention", [q, kv, kv, [], [], [], [], []], attn_kernel_us,
                        "flash_fwd_kernel"))
            ops.append(("aten::linear", [[batch, q_len, hidden], [hidden, hidden], []], kernel_us, "ampere_sgemm_64x32_tn"))
        ops.append(("aten::argmax", [[batch, vocab], [], []], kernel_us, "void at::native::reduce_kernel<512, 1>"))
        gpu_free = gpu_free_at
        gpu_first = None
        busy = 0.0
        h = t0
        for name, dims, dur, kernel in ops:
            self.cpu_op(name, h, cpu_per_op, input_dims=dims)
            k_ts = max(h + launch_latency, gpu_free)
            self.launch(kernel, h, k_ts, dur, launch_dur=launch_us, stream=stream)
            gpu_first = k_ts if gpu_first is None else gpu_first
            gpu_free = k_ts + dur
            busy += dur
            h += cpu_per_op
        copy_ts = max(h + launch_latency, gpu_free)
        copy_end = copy_ts + copy_us
        sync_ts = h + launch_us
        sync_end = max(sync_ts + 1.0, copy_end + sync_return)
        self.cpu_op("aten::_to_copy", h, sync_end - h, input_dims=[[batch], [], [], [], [], [], []])
        self.memcpy("DtoH (Device -> Pageable)", h, copy_ts, copy_us, nbytes=8 * batch, launch_dur=launch_us, stream=stream)
        self.runtime("cudaStreamSynchronize", sync_ts, sync_end - sync_ts)
        self.cpu_op("aten::select", sync_end, tail_us, input_dims=[[batch], [], []])
        host_end = sync_end + tail_us
        if annotation is not None:
            self.annotation(annotation, t0, host_end - t0)
        return {
            "start": t0, "host_end": host_end, "token_ready": sync_end, "gpu_first": gpu_first, "gpu_end": copy_end,
            "gpu_busy": busy + copy_us, "kernels": len(ops), "launches": len(ops) + 1, "sync_blocked": sync_end - sync_ts,
        }

    # ---- collectives (multi-GPU) -------------------------------------------------------
    # kind -> (c10d op, PyTorch's collective name, nccl: range, NCCL >= 2.19 kernel name)
    COLLECTIVES = {
        "all_reduce": ("c10d::allreduce_", "allreduce", "nccl:all_reduce", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"),
        "all_gather": ("c10d::_allgather_base_", "_allgather_base", "nccl:_all_gather_base", "ncclDevKernel_AllGather_RING_LL"),
        "reduce_scatter": ("c10d::_reduce_scatter_base_", "_reduce_scatter_base", "nccl:_reduce_scatter_base",
                           "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL"),
        "all_to_all": ("c10d::alltoall_base_", "all_to_allv", "nccl:all_to_all", "ncclDevKernel_SendRecv"),
        "broadcast": ("c10d::broadcast_", "broadcast", "nccl:broadcast", "ncclDevKernel_Broadcast_RING_LL"),
    }

    def collective(self, kind: str, launch_ts: float, kernel_ts: float, kernel_dur: float, *, in_nelems: int | None = None,
                   out_nelems: int | None = None, dtype: str = "BFloat16", group_size: int | None = None, pg: str | None = "0",
                   seq: int | None = None, in_split: list[int] | None = None, out_split: list[int] | None = None,
                   input_dims: list | None = None, input_type: list | None = None, host_dur: float = 20.0,
                   stream: int = 20, tid: int = HOST_TID) -> dict[str, Any]:
        """One c10d collective call as PyTorch records it: c10d::<op> > record_param_comms (with the
        collective args when in_nelems is given) > nccl:<op> range, whose launch call starts the NCCL
        kernel on the communication stream; Kineto copies the args onto the kernel. Without args,
        `input_dims`/`input_type` go on the nccl: range (older PyTorch). Returns the kernel event."""
        op, coll, rng, kernel = self.COLLECTIVES[kind]
        args: dict[str, Any] = {}
        if in_nelems is not None:
            args = {"Collective name": coll, "dtype": dtype, "In msg nelems": in_nelems,
                    "Out msg nelems": in_nelems if out_nelems is None else out_nelems,
                    "In split size": json.dumps(in_split or []), "Out split size": json.dumps(out_split or [])}
            if group_size is not None:
                args["Group size"] = group_size
            if pg is not None:
                args["Process Group Name"] = pg
                args["Process Group Ranks"] = json.dumps(list(range(group_size or 0)))
            if seq is not None:
                args["Seq"] = seq
        self.cpu_op(op, launch_ts - 3, host_dur)
        self.cpu_op("record_param_comms", launch_ts - 2, host_dur - 2, **args)
        ann = self.annotation(rng, launch_ts - 1, host_dur - 4, tid=tid)
        if input_dims is not None:
            ann["args"]["Input Dims"] = input_dims
            ann["args"]["Input type"] = input_type or ["c10::BFloat16"] * len(input_dims)
        self.launch(f"{kernel}(ncclDevKernelArgsStorage<4096ul>)", launch_ts, kernel_ts, kernel_dur, launch_dur=2.0,
                    stream=stream, tid=tid, **args)
        return self.events[-3]

    @contextlib.contextmanager
    def span(self, name: str, ts: float, dur: float, **kw: Any) -> Iterator[dict[str, Any]]:
        yield self.annotation(name, ts, dur, **kw)

    # ---- output -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        meta = [
            {"name": "process_name", "ph": "M", "ts": 0, "pid": HOST_PID, "tid": 0, "args": {"name": "python3"}},
            {"name": "thread_name", "ph": "M", "ts": 0, "pid": HOST_PID, "tid": HOST_TID, "args": {"name": "thread 4242 (python3)"}},
            {"name": "process_name", "ph": "M", "ts": 0, "pid": GPU_PID, "tid": 0, "args": {"name": "python3"}},
        ]
        out: dict[str, Any] = {"schemaVersion": 1}
        if self.gpu_name:
            out["deviceProperties"] = [{"id": 0, "name": self.gpu_name, "totalGlobalMem": 85_000_000_000, "computeMajor": 9,
                                        "computeMinor": 0, "numSms": 132}]
        out.update(self.top)
        out["traceEvents"] = meta + self.events
        out["traceName"] = "built-by-tests"
        return out

    def write(self, path: str | Path, *, gz: bool | None = None) -> Path:
        path = Path(path)
        data = json.dumps(self.to_dict()).encode()
        if gz if gz is not None else path.name.endswith(".gz"):
            data = gzip.compress(data)
        path.write_bytes(data)
        return path

    def load(self, tmp_path: Path, name: str = "built.pt.trace.json"):
        import tokentrace

        return tokentrace.load(self.write(tmp_path / name))


def gap_trace(second_gap_us: float = 5.0) -> TraceBuilder:
    """Two GPU idle gaps with known sizes: 500 us and `second_gap_us` (the caches' tests)."""
    b = TraceBuilder()
    b.cpu_op("aten::relu", 90, 20)
    b.launch("k_a", 95, 100, 100)  # busy [100, 200)
    b.cpu_op("aten::mm", 150, 560)
    b.launch("k_b", 695, 700, 50)  # idle 500 us, busy [700, 750)
    b.cpu_op("aten::add", 740, 30)
    b.launch("k_c", 745, 750 + second_gap_us, 40)
    return b
