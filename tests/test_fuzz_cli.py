"""End-to-end fuzzing of `tokentrace analyze` with every output on mutated real traces (issue 15).

Seeds are the small shared traces (skipped when ../shared/traces is absent) and sample traces;
hypothesis mutates them (cuts them short, flips bytes, inserts control characters, escapes and
bidi overrides, nests a value thousands deep, puts in a multi-megabyte string, NaN and infinities,
values of the wrong type) and the command runs in a subprocess with --json, --html, --markdown and
--annotated, so a traceback cannot hide. The only outcomes allowed:

- exit 0, with strict-JSON summary and annotated copy, and Markdown free of control characters;
- exit 2, with one `tokentrace: error:` line naming the file (warnings before it are fine), and
  no output written;

and never more than MEMORY_BOUND of resident memory in the child: its own peak (VmHWM of the
program it runs, written at exit by a two-line launcher). Not wait4's ru_maxrss: Linux carries the
parent's high-water mark across fork and exec into the child's, so after other tests have grown
pytest to 650 MB every child would report that much.
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
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

# Peak resident memory allowed to one run (runs here peak at 75-165 MiB); the seeds are at most a few MB of JSON, and the huge
# string below is 4 MB, so a run near this bound means something copies without limit.
MEMORY_BOUND = 512 << 20
# Seeds: traces up to this size compressed (a few hundred KB of JSON), so each run takes seconds.
MAX_SEED_BYTES = 150_000
# Generated examples per run, besides the EXPLICIT ones: each is a CLI run of 3-6 s on a busy 2-core
# machine, so the test stays near a minute.
EXAMPLES = 6
RUN_TIMEOUT_S = 120
HUGE_CHARS = 4 << 20
DEEP = 3000  # deeper than Python's recursion limit, which msgspec and json both honour

EVIL = "\x1b]52;c;ZWNobyBvd25lZA==\x07\x1b]0;title\x07\x1b[2J\x00\u202e\u2066\r\x9b"
SENTINELS = {"__DEEP__": b"[" * DEEP + b"]" * DEEP, "__HUGE__": json.dumps("k" * HUGE_CHARS).encode()}
EVENT_KEYS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "args")
ARG_KEYS = ("correlation", "External id", "stream", "device", "Input Dims", "grid", "Call stack", "Sequence number", "name")
# Values put into events, by a label the recipe shows (DEEP and HUGE become raw JSON text later).
ODD_VALUES = {"nan": float("nan"), "inf": float("inf"), "-inf": -float("inf"), "1e308": 1e308, "-1": -1, "2**70": 2**70,
              "0": 0, "null": None, "true": True, "str": "abc", "empty": "", "[]": [], "{}": {}, "mixed": [1, "x"],
              "nested": {"a": [None]}, "deep": "__DEEP__", "huge": "__HUGE__", "escapes": EVIL, "kernel+escapes": "kernel" + EVIL}
# Bytes inserted anywhere, by label.
JUNK = {"quote": b'"', "backslash": b"\\", "nul": b"\x00", "csi": b"\x1b[31m", "newline": b"\n", "}, {": b"}, {",
        "NaN": b"NaN", "-Infinity": b"-Infinity", ",": b",", "]": b"]", "{": b"{", "not utf-8": b"\xff\xfe", "1e999": b"1e999",
        "rlo": "\u202e".encode(), "deep": b"[" * DEEP}


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
                                  st.sampled_from(list(ODD_VALUES))), max_size=3),
    "edits": st.lists(st.tuples(st.floats(0, 1), st.sampled_from(["insert", "flip", "cut"]), st.sampled_from(list(JUNK)),
                                st.integers(0, 255)), max_size=3),
    "array": st.booleans(),
    "gz": st.booleans(),
})
# Run every time, so each kind of damage is tried in every CI run whatever the random draw.
EXPLICIT = [
    # A value nested thousands deep in one event's args and a name full of escapes; valid JSON otherwise.
    {"seed": 0, "changes": [(0.5, True, "args", "Input Dims", "deep"), (0.7, False, "name", "name", "kernel+escapes")],
     "edits": [], "array": False, "gz": True},
    # NaN (which sends the loader to its repair path), a 4 MB name, a value of the wrong type, the file cut short.
    {"seed": -1, "changes": [(0.3, False, "dur", "name", "nan"), (0.4, False, "name", "name", "huge"), (0.5, False, "ts", "name", "str")],
     "edits": [(0.9, "cut", "nul", 0)], "array": False, "gz": False},
    # Bytes flipped and junk inserted: control characters, a bidi override, bytes that are not UTF-8.
    {"seed": 0, "changes": [], "edits": [(0.3, "insert", "csi", 0), (0.5, "insert", "not utf-8", 0), (0.6, "insert", "rlo", 0),
                                         (0.7, "flip", "nul", 0x22)], "array": True, "gz": False},
    # Deep nesting in a file that also needs repair (an infinity): the repair path meets the depth too.
    {"seed": 0, "changes": [(0.5, True, "args", "Input Dims", "deep"), (0.6, False, "dur", "name", "inf")],
     "edits": [], "array": False, "gz": False},
]


def build(recipe: dict) -> tuple[str, bytes]:
    """The file name and bytes a recipe stands for."""
    top, events = _events(SEEDS[recipe["seed"] % len(SEEDS)])
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


def _examples(recipes: list[dict]):
    def wrap(test):
        for r in reversed(recipes):
            test = example(recipe=r)(test)
        return test

    return wrap


def _strict_loads(text: bytes):
    def refuse(token: str):
        raise ValueError(f"not strict JSON: {token}")

    # The annotated copy keeps a deep value of the original as it was: parse it as deep as it goes.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * DEEP))
    try:
        return json.loads(text, parse_constant=refuse)
    finally:
        sys.setrecursionlimit(limit)


def _unsafe(text: str) -> set[str]:
    return {c for c in text if c not in "\n\t" and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")}


# Runs the CLI and, at exit, writes the process's own peak resident memory (VmHWM belongs to the
# address space exec made, so none of pytest's memory is in it) to the file named first.
LAUNCHER = """
import atexit, runpy, sys
def _peak(path=sys.argv.pop(1)):
    with open("/proc/self/status") as f, open(path, "w") as out:
        out.write(next(line.split()[1] for line in f if line.startswith("VmHWM:")))
atexit.register(_peak)
sys.argv[0] = "tokentrace"
runpy.run_module("tokentrace", run_name="__main__", alter_sys=True)
"""


def _run(args: list[str], folder: Path) -> tuple[int, str, int]:
    """(exit code, stderr, peak resident bytes) of the CLI run in a child process."""
    out, err, peak_file = folder / "stdout.txt", folder / "stderr.txt", folder / "peak.txt"
    own_peak = Path("/proc/self/status").exists()
    command = [sys.executable, "-c", LAUNCHER, str(peak_file), *args] if own_peak else [sys.executable, "-m", "tokentrace", *args]
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen(command, stdout=o, stderr=e, cwd=folder)
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
    if own_peak:
        assert peak_file.exists(), f"the launcher wrote no peak memory (exit {proc.returncode})"
        peak = int(peak_file.read_text()) * 1024  # kB
        peak_file.unlink()
    else:  # macOS has no /proc: ru_maxrss (bytes there) is the best there is
        peak = usage.ru_maxrss
    return proc.returncode, err.read_text(errors="replace"), peak


@pytest.mark.skipif(not SEEDS, reason="no seed traces (sample_traces or ../shared/traces)")
# No shrinking: each step of it is another CLI run, and a recipe is already small to read.
@settings(max_examples=EXAMPLES, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow])
@given(recipe=recipes)
@_examples(EXPLICIT)
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
