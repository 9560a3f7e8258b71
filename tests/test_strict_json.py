"""Every JSON output is strict JSON, and trace-borne strings in it are capped (issue 15, items 5 and 9).

The smallest trace that showed item 5: one kernel of duration 0, whose stream's utilization is
0/0 (`"utilization": NaN` before). Item 9: a kernel name longer than the cap, which the summary
repeats in several tables.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import SAMPLE_TRACES
from tracebuilder import TraceBuilder

from tokentrace.cli import main
from tokentrace.jsonout import MAX_DEPTH, MAX_STRING_CHARS, cap_string, dumps, strict

GPT2_PREFILL = SAMPLE_TRACES / "gpu_gpt2_full" / "gpt2_p128_b1" / "prefill.pt.trace.json.gz"


def strict_loads(text: str | bytes):
    """json.loads that rejects NaN, Infinity and -Infinity, as strict parsers (jq, JavaScript) do."""

    def refuse(token: str):
        raise ValueError(f"not strict JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def _dur0_trace(folder: Path) -> Path:
    b = TraceBuilder()
    b.cpu_op("aten::add", 100, 50)
    b.launch("k0", 110, 200, 0)
    return b.write(folder / "dur0.json")


def _cli(*args: object) -> str:
    res = CliRunner().invoke(main, [str(a) for a in args])
    assert res.exit_code in (0, 1), (res.exit_code, res.output, res.exception)  # check exits 1 when a threshold fails
    return res.stdout


def _every_json_output(trace: Path, tmp_path: Path) -> dict[str, str]:
    outs = {
        "analyze": _cli("analyze", trace, "--json", "-"),
        "report": _cli("report", trace, "-o", "-", "--format", "json"),
        "report of two": _cli("report", trace, trace, "-o", "-", "--format", "json"),
        "diff": _cli("diff", trace, trace, "--json", "-"),
        "check": _cli("check", trace, "--max-idle-share-decode", "0.5", "--max-tpot-us", "1", "--json", "-"),
        "ranks": _cli("ranks", trace, "--workers", "1", "--json", "-"),
        "scaling": _cli("scaling", trace, "--json", "-"),
    }
    _cli("analyze", trace, "-q", "--annotated", tmp_path / "annotated.json.gz")
    outs["annotated"] = gzip.decompress((tmp_path / "annotated.json.gz").read_bytes()).decode()
    return outs


def test_every_json_output_is_strict_on_the_smallest_trace(tmp_path):
    outs = _every_json_output(_dur0_trace(tmp_path), tmp_path)
    for name, text in outs.items():
        assert text.strip(), name
        strict_loads(text)  # raises on NaN / Infinity
    doc = strict_loads(outs["analyze"])
    assert doc["gpu"]["streams"][0]["utilization"] is None  # undefined (0/0): null, not NaN


def test_every_json_output_is_strict_on_the_shipped_gpt2_sample(tmp_path):
    assert GPT2_PREFILL.exists(), "the shipped sample is part of the repository"
    for name, text in _every_json_output(GPT2_PREFILL, tmp_path).items():
        assert text.strip(), name
        strict_loads(text)


def test_strict_converts_what_json_cannot_hold():
    value = {"a": float("nan"), "b": [np.float32("inf"), -math.inf, np.int64(7), np.bool_(True)], 3: (1, 2),
             "arr": np.array([1.5, np.nan]), "d": Decimal("1.250"), "dn": Decimal("NaN")}
    out = strict(value)
    assert out == {"a": None, "b": [None, None, 7, True], "3": [1, 2], "arr": [1.5, None], "d": Decimal("1.250"), "dn": None}
    assert type(out["b"][2]) is int and type(out["b"][3]) is bool
    deep: list = []
    for _ in range(MAX_DEPTH + 500):  # deeper than Python's recursion limit allows json.dumps
        deep = [deep]
    text = dumps({"deep": deep})
    assert "nested deeper than" in text and strict_loads(text)


def test_long_strings_keep_a_prefix_their_length_and_hash():
    name = "void kernel<" + "x" * (3 * MAX_STRING_CHARS) + "\ud800>"  # a lone surrogate, as a JSON escape can give
    capped = cap_string(name)
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    assert capped.startswith(name[:MAX_STRING_CHARS - 100]) and f"{len(name)} characters" in capped and digest in capped
    assert len(capped) == MAX_STRING_CHARS and cap_string(capped) == capped  # capping twice changes nothing
    assert cap_string("k" * MAX_STRING_CHARS) == "k" * MAX_STRING_CHARS  # at the cap: kept whole


def _strings(value):
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str):
        yield value


@pytest.mark.parametrize("command", ["analyze", "report"])
def test_huge_kernel_name_is_capped_in_the_summary(tmp_path, command):
    name = "void huge_kernel<" + "T" * (20 * MAX_STRING_CHARS) + ">"
    b = TraceBuilder()
    b.annotation("ProfilerStep#0", 90, 1000)
    for i in range(3):
        b.cpu_op("aten::mm", 100 + 300 * i, 50)
        b.launch(name, 110 + 300 * i, 200 + 300 * i, 20)  # gaps between the kernels: prev/next name it again
    trace = b.write(tmp_path / "huge.json")
    text = _cli("analyze", trace, "--json", "-") if command == "analyze" else _cli("report", trace, "-o", "-", "--format", "json")
    doc = strict_loads(text)
    strings = list(_strings(doc))
    capped = [s for s in strings if s.startswith("void huge_kernel<")]
    assert len(capped) >= 2  # the name is in the summary more than once ...
    assert all(len(s) <= MAX_STRING_CHARS and f"{len(name)} characters" in s for s in capped)  # ... each capped
    assert len(text) < 10 * MAX_STRING_CHARS + 200_000  # uncapped it held the name at least twice: > 40 cap lengths
    md = tmp_path / "r.md"
    _cli("analyze", trace, "-q", "--markdown", md, "--html", tmp_path / "r.html")
    assert md.stat().st_size < 4 * MAX_STRING_CHARS and (tmp_path / "r.html").stat().st_size < 2_000_000
