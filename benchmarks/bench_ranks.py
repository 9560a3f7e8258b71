"""Benchmark (not a test): `tokentrace ranks` over many traces with 1, 2 and 4 workers.

Two sets, made once under benchmarks/data/ (git-ignored):
- `ranks_small/`: N small rank traces (default 1,000), each 40 decode steps of one GEMM and one
  NCCL all-reduce with PyTorch's collective args (sequence numbers), about 1,000 events, ~250 KB;
- `ranks_large/`: 8 copies of one large trace made by make_large_trace.py (default 100 MB each).

Each configuration runs in its own subprocess, so peak memory is its own: `--workers 1` analyses
in that process (its peak RSS is the worker's); N > 1 starts the distributed.LocalCluster of N
single-threaded worker processes that `--workers N` starts and asks each worker for its peak RSS (getrusage ru_maxrss)
after the run. Wall time covers analyse + combine, without the cluster's start (reported apart).
The cache is off, except for the `cached` row: a second in-process run over the same files.

    python3 benchmarks/bench_ranks.py                     # make the sets if missing, run everything
    python3 benchmarks/bench_ranks.py --small 200 --large-mb 50 --workers 1,2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
HERE = Path(__file__).resolve().parent


def small_trace(rank: int, steps: int = 40) -> dict:
    ev: list[dict] = [{"name": "process_name", "ph": "M", "ts": 0, "pid": 1, "tid": 0, "args": {"name": "python3"}}]
    corr = 1
    for i in range(steps):
        t = 1000.0 * i + (rank % 7)  # ranks a few us apart
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"tokentrace/decode_step[{i}]", "pid": 1, "tid": 1, "ts": t, "dur": 900})
        for name, k_ts, k_dur, stream, args in (
            ("ampere_sgemm_128x64_tn", t + 20, 300.0, 7, {}),
            ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", t + 330, 200.0 + rank % 13, 20,
             {"Collective name": "allreduce", "dtype": "BFloat16", "In msg nelems": 4194304, "Out msg nelems": 4194304,
              "Group size": 8, "Process Group Name": "0", "Seq": i}),
        ):
            host = t + 10 if stream == 7 else t + 320
            if args:
                ev.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": host - 2,
                           "dur": 8, "args": dict(args)})
            else:
                ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": host - 2, "dur": 8,
                           "args": {"Input Dims": [[64, 64], [64, 64]], "Input type": ["c10::BFloat16"] * 2}})
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": host,
                       "dur": 4, "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": k_ts, "dur": k_dur,
                       "args": {"device": 0, "stream": stream, "correlation": corr, **args}})
            ev.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 1, "tid": 1, "ts": host})
            ev.append({"ph": "f", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 0, "tid": stream, "ts": k_ts, "bp": "e"})
            corr += 1
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 8},
            "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], "traceEvents": ev}


def make_sets(n_small: int, large_mb: int) -> tuple[Path, Path]:
    small, large = DATA / "ranks_small", DATA / "ranks_large"
    if not small.is_dir() or len(list(small.glob("*.json"))) != n_small:
        shutil.rmtree(small, ignore_errors=True)
        small.mkdir(parents=True)
        for r in range(n_small):
            (small / f"rank{r:04d}.pt.trace.json").write_text(json.dumps(small_trace(r)))
    if not large.is_dir() or len(list(large.glob("*.json"))) != 8:
        shutil.rmtree(large, ignore_errors=True)
        large.mkdir(parents=True)
        one = large / "rank0.pt.trace.json"
        subprocess.run([sys.executable, str(HERE / "make_large_trace.py"), "--size-mb", str(large_mb), "--out", str(one)], check=True)
        for r in range(1, 8):
            os.link(one, large / f"rank{r}.pt.trace.json")
    return small, large


def run_one(folder: str, workers: int, cached: bool) -> dict:
    from tokentrace.analysis.compare.ranks import analyze_ranks

    out: dict = {"workers": workers}
    if workers == 1:
        if cached:
            os.environ["TOKENTRACE_CACHE_DIR"] = tempfile.mkdtemp(prefix="tt-bench-cache-")
            analyze_ranks([folder], workers=1, cache=True, progress=False)
        t0 = time.perf_counter()
        res = analyze_ranks([folder], workers=1, cache=cached, progress=False)
        out["wall_s"] = time.perf_counter() - t0
        out["peak_rss_mb"] = [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024]
    else:
        from distributed import Client

        from tokentrace.analysis.compare.runner import local_cluster

        t0 = time.perf_counter()
        # The cluster `--workers N` starts (no sampling profiler), reached through its address.
        with local_cluster(workers) as cluster, Client(cluster) as client:
            out["cluster_start_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            res = analyze_ranks([folder], scheduler=cluster.scheduler_address, cache=False, progress=False)
            out["wall_s"] = time.perf_counter() - t0
            peaks = client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
            out["peak_rss_mb"] = sorted(peaks.values())
        out["client_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["ranks"] = len(res.ranks)
    out["analysed"], out["from_cache"] = res.run.analysed, res.run.from_cache
    out["matched_collectives"] = 0 if res.collectives is None else int(res.collectives.calls["valid"].sum())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", type=int, default=1000, help="number of small traces")
    ap.add_argument("--large-mb", type=int, default=100, help="size of each of the 8 large traces")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--sets", default="small,large")
    ap.add_argument("--one", nargs=3, metavar=("FOLDER", "WORKERS", "CACHED"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(run_one(a.one[0], int(a.one[1]), a.one[2] == "1")))
        return 0
    small, large = make_sets(a.small, a.large_mb)
    folders = {"small": small, "large": large}
    for name in a.sets.split(","):
        configs = [(int(w), False) for w in a.workers.split(",")] + [(1, True)]
        for w, cached in configs:
            out = subprocess.run([sys.executable, __file__, "--one", str(folders[name]), str(w), "1" if cached else "0"],
                                 capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(json.dumps({"set": name, "cached": cached, **r}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
