"""Checks shared by the capture tests: what every trace and run.json written by capture must satisfy.

Kept apart from the test modules so the API and CLI tests assert exactly the same contract
(the one the analyzer relies on: annotations, the "tokentrace" metadata key, timings).
"""

from __future__ import annotations

import gzip
import json
import re
from itertools import pairwise
from pathlib import Path
from typing import Any

META_FIELDS = {
    "schema", "kind", "model", "preset", "config", "dtype", "device", "gpu_name", "versions", "prompt_len",
    "batch", "max_new_tokens", "compile", "attn_implementation", "static_cache", "timings", "command",
}
CONFIG_FIELDS = {"model_type", "num_layers", "num_heads", "num_kv_heads", "hidden_size", "head_dim", "vocab_size", "max_position_embeddings"}
_STEP = re.compile(r"^tokentrace/decode_step\[(\d+)\]$")


def read_trace(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def annotations(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The CPU-side tokentrace/ user annotations, in start order."""
    evs = [e for e in trace["traceEvents"] if e.get("cat") == "user_annotation" and e.get("name", "").startswith("tokentrace/")]
    return sorted(evs, key=lambda e: e["ts"])


def check_meta(meta: dict[str, Any], *, kind: str, prompt_len: int, batch: int, max_new_tokens: int) -> None:
    assert META_FIELDS <= set(meta), META_FIELDS - set(meta)
    assert meta["schema"] == 1
    assert meta["kind"] == kind
    assert CONFIG_FIELDS <= set(meta["config"])
    assert set(meta["versions"]) >= {"torch", "transformers", "cuda", "python"}
    assert (meta["prompt_len"], meta["batch"], meta["max_new_tokens"]) == (prompt_len, batch, max_new_tokens)
    assert meta["command"].startswith("tokentrace capture ")
    check_timings(meta["timings"], steps=max_new_tokens - 1)


def check_timings(t: dict[str, Any], *, steps: int) -> None:
    assert t["ttft_us"] > 0
    assert len(t["decode_step_us"]) == steps
    assert all(x > 0 for x in t["decode_step_us"])
    tpot = t["tpot_us"]
    assert set(tpot) == {"mean", "p50", "p90", "max"}
    if steps:
        assert 0 < tpot["p50"] <= tpot["p90"] <= tpot["max"]
        assert abs(tpot["mean"] - sum(t["decode_step_us"]) / steps) < 1e-6


def check_phase_annotations(trace: dict[str, Any], *, prefill: bool, steps: int) -> None:
    """Exactly one prefill (if expected), decode steps 0..steps-1 in order, none overlapping."""
    anns = annotations(trace)
    names = [e["name"] for e in anns]
    assert names.count("tokentrace/prefill") == (1 if prefill else 0)
    step_ids = [int(m.group(1)) for n in names if (m := _STEP.match(n))]
    assert step_ids == list(range(steps))
    phase = [e for e in anns if e["name"] == "tokentrace/prefill" or _STEP.match(e["name"])]
    if prefill:
        assert phase[0]["name"] == "tokentrace/prefill"
    for a, b in pairwise(phase):
        assert a["ts"] < b["ts"]
        assert a["ts"] + a["dur"] <= b["ts"] + 1e-3  # stages are sequential: each ends before the next
    assert all(e["dur"] > 0 for e in phase)


def check_run_folder(folder: Path, *, kinds: tuple[str, ...], prompt_len: int, batch: int, max_new_tokens: int) -> None:
    steps = max_new_tokens - 1
    run = json.loads((folder / "run.json").read_text())
    assert set(run["traces"]) == set(kinds)
    for kind in kinds:
        path = folder / f"{kind}.pt.trace.json.gz"
        assert path.is_file()
        trace = read_trace(path)
        assert "traceEvents" in trace
        check_meta(trace["tokentrace"], kind=kind, prompt_len=prompt_len, batch=batch, max_new_tokens=max_new_tokens)
        if kind == "combined":
            check_phase_annotations(trace, prefill=True, steps=steps)
        elif kind == "prefill":
            check_phase_annotations(trace, prefill=True, steps=0)
        elif kind == "decode":
            check_phase_annotations(trace, prefill=False, steps=steps)
        elif kind == "generate":
            assert any(e.get("name", "").startswith("ProfilerStep#") for e in trace["traceEvents"])
