"""The loader's large-file path on small files: a copy-on-write map decoded in place chunk by
chunk (brackets written over separators and restored) and column buffers that grow."""

from __future__ import annotations

import json

import pandas as pd
from tracebuilder import TraceBuilder

import tokentrace
from tokentrace.analysis.loading import files, loader


def _trace() -> TraceBuilder:
    b = TraceBuilder()
    for i in range(120):
        b.cpu_op("aten::relu", 1000 + 10 * i, 5, input_dims=[[i, 4]])
        b.launch("relu_kernel", 1001 + 10 * i, 2000 + 10 * i, 3)
    return b


def test_mapped_in_place_decode_matches_and_leaves_the_file_alone(tmp_path, monkeypatch):
    b = _trace()
    # Text that looks like an event boundary inside a string sends the rest of the file down the
    # exact path after some chunks were decoded in place: every bracket must have been restored.
    b.cpu_op('weird"}, {"ph": "X"', 5000, 1)
    b.events.insert(len(b.events) // 3, b.events.pop())  # mid-file, where the cuts are
    p = b.write(tmp_path / "t.json")
    before = p.read_bytes()
    ref = tokentrace.load(b.write(tmp_path / "t.json.gz"), cache=False)  # gzip: never mapped
    monkeypatch.setattr(files, "MMAP_BYTES", 0)
    for release in (1 << 30, 1):  # 1: decoded pages are handed back after every chunk
        monkeypatch.setattr(loader, "RELEASE_BYTES", release)
        for chunk in (200, 300, 410, 760, 2000, 1 << 20):  # 200, 410, 760 cut inside the string
            monkeypatch.setattr(loader, "CHUNK_BYTES", chunk)
            t = tokentrace.load(p, cache=False)
            pd.testing.assert_frame_equal(t.events, ref.events)
            assert p.read_bytes() == before
    assert 'weird"}, {"ph": "X"' in set(ref.events["name"].astype(str))


def test_exact_epoch_times_from_in_place_chunks(tmp_path, monkeypatch):
    b = TraceBuilder()
    for i in range(200):
        b.cpu_op(f"op{i}", 1000 + i, 1)
    text = json.dumps(b.to_dict(), indent=1)
    for i in range(200):
        text = text.replace(f'"ts": {1000 + i},', f'"ts": 1712195495{i:06d}.{i % 1000:03d},', 1)
    p = tmp_path / "t.json"
    p.write_text(text)
    monkeypatch.setattr(files, "MMAP_BYTES", 0)
    monkeypatch.setattr(loader, "CHUNK_BYTES", 1500)
    ops = tokentrace.load(p).cpu_ops.sort_values("ts")
    assert ops["ts"].tolist() == [int(f"1712195495{i:06d}{i % 1000:03d}") for i in range(200)]


def test_column_buffers_grow_past_the_reservation(tmp_path, monkeypatch):
    p = _trace().write(tmp_path / "t.json")
    ref = tokentrace.load(p)
    # Reserve almost nothing: the dense column buffers double many times along the chunks.
    monkeypatch.setattr(loader, "BYTES_PER_ROW_RESERVED", 1 << 30)
    monkeypatch.setattr(loader, "CHUNK_BYTES", 400)
    pd.testing.assert_frame_equal(tokentrace.load(p).events, ref.events)
