"""`--annotated` copies the trace from whatever buffer the loader reads (issue 15, item 3): a large
plain file is memory-mapped and a file with a BOM comes back as a view past it; neither has
bytes' methods, and both crashed the copy before."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from tracebuilder import TraceBuilder

import tokentrace
from tokentrace.analysis.loading import files
from tokentrace.analysis.loading.json_decode import deep_values
from tokentrace.reports.annotated import PROCESS_NAME, _deep_values_valid, annotated_bytes, write_annotated


def _doc() -> dict:
    b = TraceBuilder()
    b.annotation("ProfilerStep#0", 90, 400)
    b.cpu_op("aten::mm", 100, 50)
    b.launch("gemm", 110, 200, 20)
    return b.to_dict()


def _copied(out: bytes, original: dict) -> None:
    """Our process first, then every original event unchanged, and the other top-level keys kept."""
    doc = json.loads(out)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    orig = original["traceEvents"] if isinstance(original, dict) else original
    ours = [e for e in events if e.get("pid") == events[0]["pid"]]
    assert events[0]["args"] == {"name": PROCESS_NAME}
    assert events[len(ours):] == orig
    if isinstance(original, dict):
        assert {k: v for k, v in doc.items() if k != "traceEvents"} == {k: v for k, v in original.items() if k != "traceEvents"}


@pytest.mark.parametrize("top", ["object", "array"])
def test_file_with_a_bom(tmp_path, top):
    doc = _doc()
    original = doc if top == "object" else doc["traceEvents"]
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(original).encode())
    _copied(annotated_bytes(tokentrace.analyze(path)), original)


@pytest.mark.parametrize("top", ["object", "array"])
def test_memory_mapped_file(tmp_path, monkeypatch, top):
    # The mapping threshold lowered so that a file of a few KB is mapped, as one of 16 MiB is.
    doc = _doc()
    original = doc if top == "object" else doc["traceEvents"]
    path = tmp_path / "mapped.json"
    path.write_bytes(b"\n  " + json.dumps(original, indent=1).encode() + b"\n" * 5000)
    monkeypatch.setattr(files, "MMAP_BYTES", 1024)
    assert type(files.read_bytes(path, [])).__name__ == "mmap"  # the case under test
    analysis = tokentrace.analyze(path)
    _copied(annotated_bytes(analysis), original)
    write_annotated(analysis, tmp_path / "out.json.gz")
    _copied(gzip.decompress((tmp_path / "out.json.gz").read_bytes()), original)


def test_real_mapping_threshold_through_the_cli(tmp_path):
    # Once at the real size: the trace padded with whitespace to just over files.MMAP_BYTES.
    doc = _doc()
    path = tmp_path / "big.json"
    body = json.dumps(doc).encode()
    path.write_bytes(body + b" " * (files.MMAP_BYTES - len(body) + 1))
    out = tmp_path / "annotated.json"
    proc = subprocess.run([sys.executable, "-m", "tokentrace", "analyze", str(path), "-q", "--annotated", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    _copied(out.read_bytes(), doc)
    assert Path(path).stat().st_size > files.MMAP_BYTES


def test_json_nested_deeper_than_the_decoder_goes(tmp_path):
    # The loader flattens such values (with a warning); the copy must still be made. The file is
    # rewritten after the analysis so the copy meets the deep value whichever loader ran.
    doc = _doc()
    path = tmp_path / "deep.json"
    path.write_text(json.dumps(doc))
    analysis = tokentrace.analyze(path)
    deep = b"[" * 5000 + b"]" * 5000
    text = json.dumps({"meta": "__DEEP__", **doc}).encode().replace(b'"__DEEP__"', deep)
    path.write_bytes(text)
    out = annotated_bytes(analysis)
    head, _, tail = text.partition(b'"traceEvents": [')
    assert out.startswith(head + b'"traceEvents": [{"ph":"M"') and out.endswith(b"}," + tail)
    ours = out[len(head) + len(b'"traceEvents": '):len(out) - len(tail) - 1] + b"]"
    assert json.loads(ours)[0]["args"] == {"name": PROCESS_NAME}


def test_a_deep_value_that_is_not_json_is_copied_as_the_loader_read_it(tmp_path):
    """A byte inside a value nested too deep for the decoder (a NUL between its closing brackets)
    makes the file invalid there; the loader read that value as null, so the copy has null in its
    place (strict JSON, every other byte as it was), not the original bytes."""
    doc = _doc()
    path = tmp_path / "deep.json"
    path.write_text(json.dumps(doc))
    analysis = tokentrace.analyze(path)
    deep = b"[" * 3000 + b"]" * 1500 + b"\x00" + b"]" * 1500
    text = json.dumps({"meta": "__DEEP__", **doc}).encode().replace(b'"__DEEP__"', deep)
    path.write_bytes(text)
    out = annotated_bytes(analysis)
    assert b"\x00" not in out
    copy = json.loads(out)
    assert copy["meta"] == [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[None]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]
    assert copy["traceEvents"][0]["args"] == {"name": PROCESS_NAME}
    _copied(out, {**doc, "meta": copy["meta"]})


def test_deep_values_are_checked_a_slice_of_levels_at_a_time():
    """_deep_values_valid: each value deep_values cut is decoded MAX_DEPTH levels at a time (a
    valid one 3000 deep, objects and strings with brackets in them), a bad byte at any depth is
    found, and past the budget of bytes read the answer is no."""
    def check(text: bytes, budget: int = 1 << 20) -> bool:
        flat, spans, _ = deep_values(text)
        json.loads(flat)  # the shell is JSON
        return _deep_values_valid(memoryview(text), spans, budget)

    good = b'{"a": ' + b'[{"k": "]}[", "v": ' * 1000 + b"1" + b"}]" * 1000 + b', "b": ' + b"[" * 3000 + b"]" * 3000 + b"}"
    assert check(good)
    assert not check(good, budget=10_000)  # the deep part alone is ~30 KB read in ~60 passes
    for at in (0, 1500, 2900):  # at the innermost level, in the middle, near the cut
        bad = b'{"b": ' + b"[" * 3000 + b"]" * at + b"x" + b"]" * (3000 - at) + b"}"
        assert not check(bad)
    assert not check(b'{"b": ' + b"[" * 200 + b'"a\x01b"' + b"]" * 200 + b"}")  # a raw control character in a string deep down


def test_bytes_that_are_not_utf8_in_parts_the_decoder_skips(tmp_path):
    # The loader never decodes an unknown top-level key, so nothing checked its UTF-8; the copy is JSON (UTF-8) still.
    doc = _doc()
    path = tmp_path / "latin1.json"
    path.write_bytes(json.dumps({"other": "__X__", **doc}).encode().replace(b"__X__", b"caf\xe9 \xff\xfe"))
    out = annotated_bytes(tokentrace.analyze(path))
    assert json.loads(out.decode("utf-8"))["other"] == "caf\ufffd \ufffd\ufffd"
    _copied(out, {"other": "caf\ufffd \ufffd\ufffd", **doc})
