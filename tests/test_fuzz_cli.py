"""End-to-end fuzzing of `tokentrace analyze` with every output on mutated real traces (issue 15).

Seeds are the small shared traces (skipped when ../shared/traces is absent) and sample traces;
hypothesis mutates them (cuts them short, flips bytes, inserts control characters, escapes and
bidi overrides, nests a value thousands deep, puts in a multi-megabyte string, NaN and infinities,
values of the wrong type) and the command runs in a subprocess with --json, --html, --markdown and
--annotated, so a traceback cannot hide. The only outcomes allowed:

- exit 0, with strict-JSON summary and annotated copy, and Markdown free of control characters;
- exit 2, with one `tokentrace: error:` line naming the file (warnings before it are fine), and
  no output written;

and never more than MEMORY_BOUND of resident memory in the child (its peak, from wait4's rusage:
the per-child form of getrusage(RUSAGE_CHILDREN), so other tests' children do not count).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unicodedata
from functools import cache
from pathlib import Path

import pytest
from conftest import SAMPLE_TRACES, SHARED_TRACES
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

# Peak resident memory allowed to one run; the seeds are at most a few MB of JSON, and the huge
# string below is 4 MB, so a run near this bound means something copies without limit.
MEMORY_BOUND = 1 << 30
# Seeds: traces up to this size compressed (a few hundred KB of JSON), so each run takes seconds.
MAX_SEED_BYTES = 150_000
# Examples per run: each is a CLI run of 3-6 s on a busy 2-core machine, so the test stays near a minute.
EXAMPLES = 10
RUN_TIMEOUT_S = 120
HUGE_CHARS = 4 << 20
DEEP = 3000  # deeper than Python's recursion limit, which msgspec and json both honour

EVIL = "\x1b]52;c;ZWNobyBvd25lZA==\x07\x1b]0;title\x07\x1b[2J\x00\u202e\u2066\r\x9b"
SENTINELS = {"__DEEP__": b"[" * DEEP + b"]" * DEEP, "__HUGE__": json.dumps("k" * HUGE_CHARS).encode()}
EVENT_KEYS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "args")
ARG_KEYS = ("correlation", "External id", "stream", "device", "Input Dims", "grid", "Call stack", "Sequence number", "name")
ODD_VALUES = (float("nan"), float("inf"), -float("inf"), 1e308, -1, 2**70, 0, None, True, "abc", "", [], {}, [1, "x"],
              {"a": [None]}, "__DEEP__", "__HUGE__", EVIL, "kernel" + EVIL)
JUNK = (b'"', b"\\", b"\x00", b"\x1b[31m", b"\n", b"}, {", b"NaN", b"-Infinity", b",", b"]", b"{", b"\xff\xfe",
        b"1e999", "\u202e".encode(), b"[" * DEEP)


def _seeds() -> list[Path]:
    found = []
    if SHARED_TRACES.is_dir():
        found += sorted(p for p in SHARED_TRACES.glob("*.json*") if p.stat().st_size <= MAX_SEED_BYTES)
    found += sorted(p for p in SAMPLE_TRACES.glob("**/*.pt.trace.json.gz")
                    if p.stat().st_size <= MAX_SEED_BYTES and p.name.startswith("prefill"))
    return found


SEEDS = _seeds()


@cache
def _events(seed: Path) -> tuple[dict, list]:
    """(the document without its events, the events) of a seed, parsed once."""
    raw = seed.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    if isinstance(doc, list):
        return {}, doc
    return {k: v for k, v in doc.items() if k != "traceEvents"}, doc["traceEvents"]


# A recipe, not the bytes: a failing example prints in a few lines and rebuilds exactly.
recipes = st.fixed_dictionaries({
    "seed": st.integers(0, max(len(SEEDS) - 1, 0)),
    "changes": st.lists(st.tuples(st.floats(0, 1), st.booleans(), st.sampled_from(EVENT_KEYS), st.sampled_from(ARG_KEYS),
                                  st.integers(0, len(ODD_VALUES) - 1)), max_size=3),
    "edits": st.lists(st.tuples(st.floats(0, 1), st.sampled_from(["insert", "flip", "cut"]), st.integers(0, len(JUNK) - 1),
                                st.integers(0, 255)), max_size=3),
    "array": st.booleans(),
    "gz": st.booleans(),
})


def build(recipe: dict) -> tuple[str, bytes]:
    """The file name and bytes a recipe stands for."""
    top, events = _events(SEEDS[recipe["seed"]])
    events = list(events)  # changed events are copied; the cached seed stays as it was
    for where, in_args, key, arg_key, value in recipe["changes"]:
        i = min(int(where * len(events)), len(events) - 1)
        ev = dict(events[i]) if isinstance(events[i], dict) else {}
        if in_args and isinstance(ev.get("args"), dict):
            ev["args"] = {**ev["args"], arg_key: ODD_VALUES[value]}
        else:
            ev[key] = ODD_VALUES[value]
        events[i] = ev
    data = json.dumps(events if recipe["array"] else {**top, "traceEvents": events}).encode()
    for name, text in SENTINELS.items():
        data = data.replace(json.dumps(name).encode(), text)
    for where, how, junk, byte in recipe["edits"]:
        i = min(int(where * len(data)), max(len(data) - 1, 0))
        if how == "insert":
            data = data[:i] + JUNK[junk] + data[i:]
        elif how == "flip":
            data = data[:i] + bytes([byte]) + data[i + 1:]
        else:
            data = data[:i]
    return ("fuzz.json.gz", gzip.compress(data, compresslevel=1)) if recipe["gz"] else ("fuzz.json", data)


def _strict_loads(text: bytes):
    def refuse(token: str):
        raise ValueError(f"not strict JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def _unsafe(text: str) -> set[str]:
    return {c for c in text if c not in "\n\t" and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")}


def _run(args: list[str], folder: Path) -> tuple[int, str, int]:
    """(exit code, stderr, peak resident bytes) of the CLI run in a child process."""
    out, err = folder / "stdout.txt", folder / "stderr.txt"
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen([sys.executable, "-m", "tokentrace", *args], stdout=o, stderr=e, cwd=folder)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.send_signal(signal.SIGKILL)
                pid, status, usage = os.wait4(proc.pid, 0)
                pytest.fail(f"tokentrace analyze ran over {RUN_TIMEOUT_S} s")
            time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, so Popen must not wait again
    peak = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)  # kilobytes on Linux
    return proc.returncode, err.read_text(errors="replace"), peak


@pytest.mark.skipif(not SEEDS, reason="no seed traces (sample_traces or ../shared/traces)")
# No shrinking: each step of it is another CLI run, and a recipe is already small to read.
@settings(max_examples=EXAMPLES, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow])
@given(recipe=recipes)
def test_analyze_with_every_output_on_mutated_traces(recipe):
    name, data = build(recipe)
    folder = Path(tempfile.mkdtemp(prefix="tokentrace-fuzz-cli-"))
    try:
        trace = folder / name
        trace.write_bytes(data)
        outs = {"--json": folder / "s.json", "--html": folder / "r.html", "--markdown": folder / "r.md",
                "--annotated": folder / "a.json"}
        code, stderr, peak = _run(["analyze", str(trace), "-q", *[str(x) for kv in outs.items() for x in kv]], folder)
        assert "Traceback" not in stderr, stderr[-3000:]
        assert peak < MEMORY_BOUND, f"peak resident memory {peak / 2**20:.0f} MiB"
        lines = stderr.strip().splitlines()
        assert all(line.startswith("tokentrace: ") for line in lines), stderr[-3000:]
        assert not _unsafe(stderr), stderr[-3000:]
        if code == 2:
            errors = [line for line in lines if line.startswith("tokentrace: error: ")]
            assert len(errors) == 1 and str(trace) in errors[0], stderr[-3000:]
            assert not any(p.exists() for p in outs.values())  # nothing written
            return
        assert code == 0, stderr[-3000:]
        summary = _strict_loads(outs["--json"].read_bytes())
        assert summary["schema_version"] >= 1
        _strict_loads(outs["--annotated"].read_bytes())
        assert not _unsafe(outs["--markdown"].read_text())
        assert outs["--html"].read_text().lstrip().lower().startswith("<!doctype html")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
