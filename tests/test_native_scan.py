"""native_scan: the compiled scanner's machine code kept in a file and run through llvmlite
alone. A fresh process loads a trace without importing numba; a damaged or foreign file, or
code that needs a symbol this process does not have, is never run; the ELF reader names an
object's undefined and defined symbols exactly. (That the machine code reads every real,
sample and random trace as numba's dispatcher and msgspec do: tests/test_loader_jit.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("numba", reason="numba is not installed: the loader uses its msgspec path only")
llvm = pytest.importorskip("llvmlite.binding")

from tokentrace.analysis.loading import jit_columns, native_scan  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the machine code is kept as ELF: Linux only")


def _object(ir: str) -> bytes:
    tm = llvm.Target.from_default_triple().create_target_machine()
    return tm.emit_object(llvm.parse_assembly(ir))


# A kernel in native_scan's block protocol: its one scalar argument is the block's first slot.
IR_EXTERNAL = """
declare i64 @{ext}(i64)
define i64 @twice_ext(ptr %block) {{
  %x = load i64, ptr %block
  %y = call i64 @{ext}(i64 %x)
  %z = add i64 %y, %y
  ret i64 %z
}}
"""


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """native_scan's files in an empty folder of their own, nothing loaded yet in this process."""
    monkeypatch.setattr(native_scan, "folders", lambda: [tmp_path])
    monkeypatch.setattr(native_scan, "_LOADED", {})
    monkeypatch.delenv("TOKENTRACE_JIT", raising=False)
    return tmp_path


def specs() -> dict[str, native_scan.Spec]:
    return jit_columns.JitDecoder().specs()


def test_elf_symbols_names_the_undefined_and_the_defined():
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    undefined, defined = native_scan.elf_symbols(_object(IR_EXTERNAL.format(ext="labs")))
    assert undefined == ["labs"] and defined == ["twice_ext"]
    assert native_scan.elf_symbols(b"MZ not an ELF object") is None
    assert native_scan.elf_symbols(b"\x7fELF\x02\x01" + b"\0" * 10) is None  # cut short


def test_a_kernel_calling_a_process_symbol_links_and_runs(folder):
    # The block protocol on a known answer: labs (libc) of -21, doubled.
    obj = _object(IR_EXTERNAL.format(ext="labs"))
    made = native_scan._link({"scan": ("twice_ext", obj, ["labs"]), "rehash": ("twice_ext", obj, ["labs"])},
                             {"scan": (("int64", 0),), "rehash": (("int64", 0),)}, {"scan": 0, "rehash": 0})
    assert made is not None and made.scan(-21) == 42


def test_code_needing_a_symbol_nobody_has_is_never_run(folder):
    # Left to LLVM, an unresolved symbol links to address 0 and the first call crashes.
    obj = _object(IR_EXTERNAL.format(ext="tokentrace_no_such_symbol"))
    kernels = {"scan": ("twice_ext", obj, ["tokentrace_no_such_symbol"]), "rehash": ("twice_ext", obj, ["tokentrace_no_such_symbol"])}
    assert native_scan._link(kernels, {"scan": (("int64", 0),), "rehash": (("int64", 0),)}, {"scan": 0, "rehash": 0}) is None
    # A file whose list of undefined symbols leaves one out is refused the same way.
    kernels = {"scan": ("twice_ext", obj, []), "rehash": ("twice_ext", obj, [])}
    assert native_scan._link(kernels, {"scan": (("int64", 0),), "rehash": (("int64", 0),)}, {"scan": 0, "rehash": 0}) is None


def test_build_writes_one_file_that_a_later_load_reads(folder):
    made = native_scan.build(specs(), jit_columns.OUTPUTS)
    assert made is not None and made.native
    files = list(folder.iterdir())
    assert len(files) == 1 and files[0].name == f"jit_scan.{native_scan.key(specs())}.native"
    kernels = native_scan._unpack(files[0].read_bytes())
    assert set(kernels) == {"scan", "rehash"}
    for entry, obj, undefined in kernels.values():
        und, defined = native_scan.elf_symbols(obj)
        assert entry in defined and sorted(und) == undefined
        # Only the process's own exports and numba's error path: nothing else to bind.
        assert all(native_scan._process_symbol(s) or s in native_scan.ERROR_PATH_SYMBOLS for s in undefined)
    native_scan._LOADED.clear()
    again = native_scan.load(specs(), jit_columns.OUTPUTS)
    assert again is not None and again is not made


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "other magic", "empty"])
def test_a_damaged_file_is_not_used_and_is_made_again(folder, damage):
    native_scan.build(specs(), jit_columns.OUTPUTS)
    (path,) = folder.iterdir()
    data = path.read_bytes()
    bad = {"truncated": data[: len(data) // 2], "flipped byte": data[:-100] + bytes([data[-100] ^ 0xFF]) + data[-99:],
           "other magic": b"x" + data[1:], "empty": b""}[damage]
    path.write_bytes(bad)
    native_scan._LOADED.clear()
    assert native_scan.load(specs(), jit_columns.OUTPUTS) is None
    # The next load large enough for numba's dispatcher makes it again.
    d = jit_columns.decoder_for(jit_columns.JIT_MIN_BYTES)
    assert d.kernels.native and native_scan._unpack(path.read_bytes()) is not None


def test_the_key_follows_the_source_and_the_argument_types(folder, monkeypatch):
    k = native_scan.key(specs())
    other = dict(specs(), rehash=(("int32", 1),))
    assert native_scan.key(other) != k
    monkeypatch.setenv("NUMBA_OPT", "0")  # numba's code generation settings
    assert native_scan.key(specs()) != k


def test_an_argument_of_another_type_is_refused_not_misread(folder):
    made = native_scan.build(specs(), jit_columns.OUTPUTS)
    d = jit_columns.JitDecoder()
    args = d._rehash_args()
    args[0] = args[0].astype(np.int64)  # tab_id is int32
    with pytest.raises(TypeError, match="expected int32"):
        made.rehash(*args)
    args = d._rehash_args()
    args[1] = np.empty((len(args[1]), 2), np.int64)[:, 0]  # not C-ordered
    with pytest.raises(TypeError):
        made.rehash(*args)


def test_a_fresh_process_loads_without_importing_numba(tmp_path):
    # The file beside numba's cache exists once any fast load ran in this tree (the tests above
    # use their own folders; this process makes the default one if it is missing).
    jit_columns.decoder_for(jit_columns.JIT_MIN_BYTES)
    trace = tmp_path / "t.json"
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{k}", "pid": 1, "tid": 1, "ts": 10 * k, "dur": 5} for k in range(50)]
    trace.write_text(json.dumps({"traceEvents": events}))
    code = ("import sys; from tokentrace.analysis.loading import loader; "
            f"t = loader.load({str(trace)!r}, cache=False, progress=False); "
            "print(t.meta['_load']['jit']['kernels'], len(t.events), 'numba' in sys.modules)")
    env = dict(os.environ, TOKENTRACE_JIT="force")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["native", "50", "False"]


def test_threads_scanning_at_once_each_get_their_own_answer(tmp_path, monkeypatch):
    # ctypes lets go of the GIL for the call (as numba's nogil dispatcher did): a Dask worker's
    # threads may load traces at once, and each load must see only its own arguments and results.
    from concurrent.futures import ThreadPoolExecutor

    import pandas as pd

    from tokentrace.analysis.loading import loader

    monkeypatch.setattr(jit_columns, "JIT_CHUNK_BYTES", 4096)  # many calls per load
    paths = []
    for k in range(8):
        events = [{"ph": "X", "cat": "cpu_op", "name": f"t{k}_op{j % (k + 2)}", "pid": 1, "tid": k, "ts": 10 * j + k,
                   "dur": 3 + k, "args": {"External id": j}} for j in range(300 + 150 * k)]
        p = tmp_path / f"t{k}.json"
        p.write_text(json.dumps({"traceEvents": events}))
        paths.append(p)
    monkeypatch.setenv("TOKENTRACE_JIT", "0")
    want = [loader.load(p, cache=False, progress=False).events for p in paths]
    monkeypatch.setenv("TOKENTRACE_JIT", "force")
    jit_columns.decoder_for(jit_columns.JIT_MIN_BYTES)  # the machine code made before the threads start
    for _ in range(3):
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda p: loader.load(p, cache=False, progress=False), paths * 2))
        for t, w in zip(got, want * 2, strict=True):
            assert t.meta["_load"]["jit"]["kernels"] == "native"
            pd.testing.assert_frame_equal(t.events, w)


def test_a_folder_keeps_the_newest_few_files(tmp_path):
    for k in range(native_scan.KEEP_FILES + 3):
        f = tmp_path / f"jit_scan.{k:032x}.native"
        f.write_bytes(b"x")
        os.utime(f, (1000 + k, 1000 + k))
    native_scan._prune(tmp_path)
    left = sorted(int(p.name.split(".")[1], 16) for p in tmp_path.iterdir())
    assert left == list(range(3, native_scan.KEEP_FILES + 3))


def _smaps(*maps: tuple[int, int, str, str, int, int]) -> str:
    """smaps text: per mapping (start, end, perms, path, Rss kB, private kB as Private_Dirty and Anonymous)."""
    return "".join(f"{a:x}-{b:x} {perms} 00000000 08:01 42 {path}\nSize: {(b - a) >> 10} kB\nRss: {rss} kB\n"
                   f"Private_Dirty: {own} kB\nAnonymous: {own} kB\n" for a, b, perms, path, rss, own in maps)


LIB, BASE = "/opt/lib/libllvmlite.so", 0x7F0000000000
SMAPS = _smaps(
    (BASE, BASE + 0x100000, "r--p", LIB, 512, 0),  # headers, symbol tables, rodata: clean
    (BASE + 0x100000, BASE + 0x300000, "r-xp", LIB, 1024, 0),  # code: clean
    (BASE + 0x300000, BASE + 0x340000, "r--p", LIB, 256, 256),  # RELRO: written by the dynamic linker
    (BASE + 0x340000, BASE + 0x350000, "rw-p", LIB, 64, 64),  # data
    (BASE + 0x400000, BASE + 0x500000, "r-xp", "/opt/lib/libother.so", 900, 0),
    (BASE + 0x600000, BASE + 0x700000, "r-xp", LIB, 0, 0),  # nothing resident
)


def test_only_clean_read_only_mappings_of_the_library_are_dropped(tmp_path):
    """The RELRO mapping the dynamic linker wrote (private pages: Anonymous > 0), the writable one,
    another library's and an empty one are left alone: dropping a private copy would lose it."""
    smaps = tmp_path / "smaps"
    smaps.write_text(SMAPS)
    spans = native_scan._clean_read_only_mappings(LIB, str(smaps))
    assert spans == [(BASE, BASE + 0x100000, 512 * 1024), (BASE + 0x100000, BASE + 0x300000, 1024 * 1024)]


def _llvmlite_rss() -> int:
    import llvmlite.binding.ffi as ffi

    name = os.path.realpath(ffi.lib._name)
    total, mine = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split(None, 1)[0]
            if not head.endswith(":"):
                mine = line.rstrip("\n").endswith(name)
            elif mine and head == "Rss:":
                total += int(line.split()[1]) * 1024
    return total


def test_the_library_pages_go_after_the_link_and_the_kernels_still_run(folder, tmp_path, monkeypatch):
    """After the link, llvmlite's clean pages are no longer this process's (the resident size of
    its mappings falls by about what release_library_pages says it dropped), and a load through
    the kernels linked, with llvmlite run again and its pages dropped again, reads the same frame
    as msgspec: a page dropped is the file's own, mapped again when touched."""
    from tokentrace.analysis.loading import loader

    native_scan.build(specs(), jit_columns.OUTPUTS)  # numba's compile touches much of llvmlite
    native_scan._LOADED.clear()
    said: list[int] = []
    real = native_scan.release_library_pages
    monkeypatch.setattr(native_scan, "release_library_pages", lambda: said.append(real()) or said[-1])
    before = _llvmlite_rss()
    assert native_scan.load(specs(), jit_columns.OUTPUTS) is not None
    after = _llvmlite_rss()
    assert len(said) == 1 and said[0] > 4 << 20 and after <= before - said[0] + (2 << 20)
    native_scan._LOADED.clear()
    trace = tmp_path / "t.json"
    events = [{"ph": "X", "cat": "kernel" if i % 2 else "cpu_op", "name": f"k{i % 3}", "pid": 0, "tid": 7,
               "ts": 1000 + 10 * i, "dur": 4, "args": {"correlation": i, "External id": i}} for i in range(400)]
    trace.write_text(json.dumps({"traceEvents": events}))
    monkeypatch.setenv("TOKENTRACE_JIT", "force")
    fast = loader.load(trace, cache=False, progress=False)
    assert fast.meta["_load"]["jit"]["kernels"] == "native"
    monkeypatch.setenv("TOKENTRACE_JIT", "0")
    plain = loader.load(trace, cache=False, progress=False)
    pd.testing.assert_frame_equal(fast.events, plain.events)
