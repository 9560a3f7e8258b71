"""Shared fixtures: the builder, and the real traces in ../shared/traces (skipped when absent)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# Summary caches (tokentrace ranks/scaling/report) go to a scratch folder, never the user's ~/.cache.
os.environ.setdefault("TOKENTRACE_CACHE_DIR", tempfile.mkdtemp(prefix="tokentrace-test-cache-"))

from tracebuilder import TraceBuilder

# Loads of large traces write the columnar cache: into a folder of this run, not the user's own.
os.environ.setdefault("TOKENTRACE_CACHE_DIR", tempfile.mkdtemp(prefix="tokentrace-test-cache-"))

# The real traces: ../shared/traces beside the checkout, or wherever TOKENTRACE_SHARED_TRACES points
# (a git worktree elsewhere, a CI cache); tests that need them skip when the folder is absent.
SHARED_TRACES = Path(os.environ.get("TOKENTRACE_SHARED_TRACES") or Path(__file__).resolve().parents[1].parent / "shared" / "traces")
REAL_TRACES = sorted(SHARED_TRACES.glob("*.json.gz")) if SHARED_TRACES.is_dir() else []
SAMPLE_TRACES = Path(__file__).resolve().parents[1] / "sample_traces"


def real_trace_params():
    """Parametrize over ../shared/traces; one skipped case with the reason when the folder is absent."""
    if not REAL_TRACES:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"real traces folder {SHARED_TRACES} is absent"))]
    return [pytest.param(p, id=p.name.split(".")[0]) for p in REAL_TRACES]


def shared_trace(name: str) -> Path:
    p = SHARED_TRACES / name
    if not p.exists():
        pytest.skip(f"real trace {p} is absent")
    return p


@pytest.fixture
def builder() -> TraceBuilder:
    return TraceBuilder()


@pytest.fixture
def cache_every_trace(monkeypatch, tmp_path):
    """The trace and results caches on for traces of any size, in a folder of this test."""
    from tokentrace.analysis.loading import cache as trace_cache

    monkeypatch.setattr(trace_cache, "MIN_JSON_BYTES", 0)
    monkeypatch.setenv("TOKENTRACE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TOKENTRACE_NO_CACHE", raising=False)
    monkeypatch.delenv("TOKENTRACE_CACHE_MIN_SIZE", raising=False)
