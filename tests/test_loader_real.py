"""The loader on the real traces in ../shared/traces, checked against naive json.load readings."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter, defaultdict
from decimal import Decimal
from functools import cache

import numpy as np
import pytest
from conftest import real_trace_params, shared_trace

import tokentrace
from tokentrace.analysis.apis import CATEGORY_KIND

GPU_CATS = {c for c, k in CATEGORY_KIND.items() if k in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_sync")}
HOST_CATS = {c for c, k in CATEGORY_KIND.items() if k in ("runtime", "driver")}
OP_CATS = {c for c, k in CATEGORY_KIND.items() if k == "cpu_op"}


@cache
def naive(path, exact: bool = True) -> tuple[dict, list[dict]]:
    """The document read with the standard library; numbers with decimals as Decimal (exact)."""
    with gzip.open(path, "rt") as fh:
        doc = json.load(fh, parse_float=Decimal if exact else float)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return (doc if isinstance(doc, dict) else {}), events


@cache
def loaded(path):
    return tokentrace.load(path)


def ns(us) -> int:
    return int((Decimal(us) * 1000).to_integral_value())


@pytest.mark.parametrize("path", real_trace_params())
def test_counts_match_a_naive_json_load(path):
    doc, events = naive(path)
    t = loaded(path)
    assert t.warnings == []
    assert len(t.events) == len(events)
    ev = t.events
    ph = ev["ph"].astype(object).where(ev["ph"].notna(), None)
    cat = ev["cat"].astype(object).where(ev["cat"].notna(), None)
    assert Counter(zip(ph, cat, strict=False)) == Counter((e.get("ph"), e.get("cat")) for e in events)
    assert t.category_counts() == dict(Counter(e.get("cat") or f"ph={e.get('ph')}" for e in events))
    assert Counter(ev["name"].astype(object)) == Counter(e.get("name") for e in events)
    plain, _ = naive(path, exact=False)
    for key in plain:
        if key != "traceEvents":
            assert t.meta[key] == plain[key]


@pytest.mark.parametrize("path", real_trace_params())
def test_links_match_a_naive_reading(path):
    """Each GPU row's launch is the host call with its correlation id; each host call's op is
    the innermost cpu op on its thread around its start (checked on a sample)."""
    _, events = naive(path)
    t = loaded(path)
    ev = t.events
    host_by_corr: dict = {}
    for e in sorted((e for e in events if e.get("cat") in HOST_CATS), key=lambda e: e["ts"]):
        host_by_corr.setdefault(e.get("args", {}).get("correlation"), e)
    want = Counter()
    for e in events:
        if e.get("cat") in GPU_CATS and e.get("ph") == "X":
            h = host_by_corr.get(e.get("args", {}).get("correlation"))
            want[(e["name"], ns(e["ts"]), h["name"] if h else None, ns(h["ts"]) if h else None)] += 1
    gpu = ev[ev["kind"].isin(["kernel", "gpu_memcpy", "gpu_memset", "cuda_sync"])]
    got = Counter()
    for name, ts, launch in zip(gpu["name"].astype(object), gpu["ts"], gpu["launch"], strict=False):
        got[(name, ts, ev.at[launch, "name"] if launch >= 0 else None, ev.at[launch, "ts"] if launch >= 0 else None)] += 1
    assert got == want

    ops = defaultdict(list)
    for e in events:
        if e.get("cat") in OP_CATS and e.get("ph") == "X":
            ops[(str(e["pid"]), str(e["tid"]))].append((ns(e["ts"]), ns(e["ts"]) + ns(e.get("dur", 0)), e["name"]))
    calls = [e for e in events if e.get("cat") in HOST_CATS][:: max(1, sum(e.get("cat") in HOST_CATS for e in events) // 200)]
    by_key = {(n, ts): op for n, ts, op in zip(ev["name"].astype(object), ev["ts"], ev["op"], strict=False) if n is not None}
    for c in calls:
        at = ns(c["ts"])
        around = [o for o in ops[(str(c["pid"]), str(c["tid"]))] if o[0] <= at < o[1] or o[0] == at == o[1]]
        inner = max(around, key=lambda o: (o[0], -o[1]), default=None)
        op = by_key[(c["name"], at)]
        assert (ev.at[op, "name"] if op >= 0 else None) == (inner[2] if inner else None), c


def test_nanosecond_timestamps_are_exact():
    """Epoch-based float microseconds with three decimals: every ts and dur equals its decimal
    text, which float64 alone cannot hold (HTA issue 317)."""
    path = shared_trace("v100_cnn_ddp_ns_resolution.pt.trace.json.gz")
    text = gzip.open(path).read()
    ts_text = re.findall(rb'"ts": (-?[0-9.]+)', text)
    dur_text = re.findall(rb'"dur": (-?[0-9.]+)', text)
    ev = loaded(path).events
    assert sorted(ev["ts"].tolist()) == sorted(int(Decimal(t.decode()) * 1000) for t in ts_text)
    assert sorted(ev.loc[ev["dur"] > 0, "dur"].tolist()) == sorted(
        d for d in (int(Decimal(t.decode()) * 1000) for t in dur_text) if d > 0)
    first = ev[ev["name"] == "autograd::engine::evaluate_function: DivBackward1"].iloc[0]
    assert (first["ts"], first["dur"]) == (1712195495519689047, 63813)
    assert float(1712195495519689047 / 1000) * 1000 != 1712195495519689047  # float would be off


def test_legacy_trace_ids_and_kinds():
    t = loaded(shared_trace("v100_resnet50_train_2021_legacy.pt.trace.json.gz"))
    k = t.kernels
    assert len(k) == 8772 and (k["tid"] == 7).all() and (k["stream"] == 7).all()
    assert (t.cpu_ops["cat"] == "Operator").all() and (t.runtime["cat"] == "Runtime").all()
    assert t.linked_share() == {"launch": 1.0, "op": 1.0}
    assert t.cpu_ops["stack"].notna().mean() > 0.5  # legacy "Call stack" arg kept


def test_graph_replay_trace():
    t = loaded(shared_trace("mi300x_sglang_qwen3_8b_decode_graph.json.gz"))
    owners = t.gpu["launch"].value_counts()
    top = int(owners.index[0])
    assert t.events.at[top, "name"] == "hipGraphLaunch" and owners.iloc[0] > 500
    assert "M" not in set(t.events["ph"].astype(str))  # cropped: no metadata events


def test_ranks_and_devices():
    assert loaded(shared_trace("cpu_only_gloo_rank34.pt.trace.json.gz")).rank == 34
    assert loaded(shared_trace("alexnet_cuda_sync_events.json.gz")).rank == 0
    assert loaded(shared_trace("a100_inference_no_kernel_events.json.gz")).linked_share() == {"launch": None, "op": None}
    assert loaded(shared_trace("h100_hf_qwen05b_forward_bs16.json.gz")).gpu_name == "NVIDIA H100 80GB HBM3"
    t = loaded(shared_trace("alexnet_cuda_sync_events.json.gz"))
    assert len(t.cuda_sync) == 41 and (t.cuda_sync["launch"] >= 0).mean() > 0.9
    assert np.array_equal(t.events["ts"].to_numpy(), np.sort(t.events["ts"].to_numpy()))
