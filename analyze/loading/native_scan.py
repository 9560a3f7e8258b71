"""The compiled scanner without numba's start: its kernels kept as machine code and run through
llvmlite alone.

Owns the C-callable wrappers of jit_scan's two kernels (`scan`, `rehash`), their object code
kept on disk once numba has made it, the check that such a file is whole and was made for this
source, these versions and this CPU, and the loading of it with llvmlite's MCJIT into ctypes
functions.

Why: a process that calls a numba-compiled function, even one read from numba's own cache,
first imports numba (0.23 s) and builds its typing and target contexts (0.33 s: ~85 modules,
cffi's parser, the runtime compiled again), ~110 MB of memory in all: 0.56 s of a 1.3 s load
of 200 MB. The same machine code loaded here costs llvmlite's import and one link: ~0.03 s;
the ~47 MB of llvmlite's library that opening it makes resident are dropped from the process
once the kernels are linked (release_library_pages; benchmarks/README.md).

How: numba compiles, once per machine and version, a `cfunc` per kernel that takes one int64
block (each array's address and shape, each scalar, then room for the outputs), makes arrays
over the addresses (`carray`) and calls the kernel; its object code (ELF), the name of its entry
point and the symbols it leaves undefined are written to one file. numba's wrapper refers to its
runtime's and helper library's functions only on the path taken when the kernel raises, and the
kernels never raise (no raise, no division, no bounds checks); those few are bound to abort(),
and every other undefined symbol must be one this process exports (libc, the Python C API), or
the file is not used. Anything not as expected (no numba, another platform than ELF, a damaged
file, an odd array) leaves the kernels to numba's dispatcher, as before this module.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import os
import struct
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# Bump when the wrapper's block layout or the file's layout changes.
FORMAT = 1
MAGIC = b"tokentrace-native-scan\n"
# Symbols numba's cfunc wrapper calls only when the wrapped kernel raised (which ours never do):
# its runtime's free and destructor call (inlined reference counting on arrays without memory
# of their own) and its helper library's error reporting. They are not exported by any library,
# so they are bound to abort() rather than left at address 0.
ERROR_PATH_SYMBOLS = frozenset({
    "NRT_Free", "NRT_MemInfo_call_dtor", "numba_do_raise", "numba_gil_ensure", "numba_gil_release",
    "numba_runtime_build_excinfo_struct", "numba_unpickle", "numba_fatal_error",
})

# An argument's spec: (numpy dtype name, ndim), ndim 0 for an int64 scalar.
Spec = tuple[tuple[str, int], ...]


def spec_of(args: Sequence[Any]) -> Spec:
    """The spec of a kernel's arguments as given (arrays by dtype and ndim, ints as scalars)."""
    return tuple((a.dtype.name, a.ndim) if isinstance(a, np.ndarray) else ("int64", 0) for a in args)


def _block_size(spec: Spec, outputs: int) -> int:
    return sum(1 + nd if nd else 1 for _, nd in spec) + outputs


class NativeKernel:
    """One kernel's C entry point: call with the arguments the numba kernel takes; returns its
    result (an int, or a tuple when it returns two)."""

    def __init__(self, fn: Callable[[int], int], spec: Spec, outputs: int) -> None:
        self.fn = fn
        self.spec = spec
        self.outputs = outputs
        self.size = _block_size(spec, outputs)

    def __call__(self, *args: Any) -> Any:
        if len(args) != len(self.spec):
            raise TypeError(f"native kernel takes {len(self.spec)} arguments, got {len(args)}")
        vals: list[int] = []
        for a, (dtype, ndim) in zip(args, self.spec, strict=True):
            if ndim == 0:
                vals.append(int(a))
                continue
            # The wrapper reads C-ordered memory of this dtype: anything else would be misread.
            if a.dtype.name != dtype or a.ndim != ndim or not a.flags.c_contiguous:
                raise TypeError(f"native kernel: an argument is {a.dtype}[{a.ndim}d], expected {dtype}[{ndim}d] C-ordered")
            vals.append(a.ctypes.data)
            vals.extend(a.shape)
        # A block per call: ctypes lets go of the GIL for the call, so threads (a Dask worker's)
        # may scan at once, each with its own arguments.
        blk = np.zeros(self.size, np.int64)
        blk[: len(vals)] = vals
        status = int(self.fn(blk.ctypes.data))
        if self.outputs:
            return (status, *(int(v) for v in blk[len(vals):]))
        return status


class NativeKernels:
    """`scan` and `rehash` as NativeKernels, with the engine that holds their code."""

    def __init__(self, engine: Any, scan: NativeKernel, rehash: NativeKernel) -> None:
        self._engine = engine  # the machine code lives as long as the engine
        self.scan = scan
        self.rehash = rehash
        self.native = True


# ---- the file's key --------------------------------------------------------------------------

def _source_files() -> list[Path]:
    here = Path(__file__).resolve().parent
    return [here / "jit_scan.py", here / "scan_codes.py", Path(__file__).resolve()]


def _numba_version_file() -> Path | None:
    """numba's _version.py, found without importing numba (the version is part of the key)."""
    spec = importlib.util.find_spec("numba")
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / "_version.py"
    return path if path.is_file() else None


def key(specs: dict[str, Spec]) -> str | None:
    """What the machine code depends on: the scanner's source, numba's and llvmlite's versions,
    numba's code-generation settings, this CPU and the kernels' argument types. None when one
    of them cannot be read (then no file is used)."""
    import llvmlite
    import llvmlite.binding as llvm

    version = _numba_version_file()
    if version is None:
        return None
    h = hashlib.sha256(f"{FORMAT}\n{llvmlite.__version__}\n".encode())
    try:
        for path in [*_source_files(), version]:
            h.update(path.read_bytes())
    except OSError:
        return None
    h.update(f"{llvm.get_process_triple()}\n{llvm.get_host_cpu_name()}\n{llvm.get_host_cpu_features().flatten()}\n".encode())
    h.update(repr(sorted((k, v) for k, v in os.environ.items() if k.startswith("NUMBA_"))).encode())
    h.update(repr(sorted(specs.items())).encode())
    return h.hexdigest()[:32]


def folders() -> list[Path]:
    """Where the file may be: beside numba's own cache of jit_scan (the package's __pycache__),
    else, where that is not writable, the tokentrace cache folder's `compiled/`."""
    from tokentrace.analysis.loading.cache import default_root

    return [Path(__file__).resolve().parent / "__pycache__", default_root() / "compiled"]


def _path_in(folder: Path, k: str) -> Path:
    return folder / f"jit_scan.{k}.native"


# ---- the file ----------------------------------------------------------------------------------

def _pack(kernels: dict[str, tuple[str, bytes, list[str]]]) -> bytes:
    header: dict[str, Any] = {"kernels": {}}
    body = b""
    for name, (entry, obj, undefined) in kernels.items():
        header["kernels"][name] = {"entry": entry, "offset": len(body), "size": len(obj), "undefined": undefined,
                                   "sha256": hashlib.sha256(obj).hexdigest()}
        body += obj
    head = json.dumps(header, sort_keys=True).encode()
    return MAGIC + struct.pack("<Q", len(head)) + head + body


def _unpack(data: bytes) -> dict[str, tuple[str, bytes, list[str]]] | None:
    """The kernels a file holds, or None when it is not a whole file of this format."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 8:
        return None
    (n,) = struct.unpack_from("<Q", data, len(MAGIC))
    start = len(MAGIC) + 8
    try:
        header = json.loads(data[start : start + n])
        body = data[start + n :]
        out = {}
        for name, k in header["kernels"].items():
            obj = body[k["offset"] : k["offset"] + k["size"]]
            if len(obj) != k["size"] or hashlib.sha256(obj).hexdigest() != k["sha256"]:
                return None
            out[name] = (str(k["entry"]), obj, [str(s) for s in k["undefined"]])
        return out
    except (ValueError, KeyError, TypeError):
        return None


def elf_symbols(obj: bytes) -> tuple[list[str], list[str]] | None:
    """(undefined, defined global) symbol names of an ELF64 little-endian relocatable object,
    or None for anything else (the file is then not used)."""
    if obj[:4] != b"\x7fELF" or obj[4] != 2 or obj[5] != 1:
        return None
    try:
        shoff, = struct.unpack_from("<Q", obj, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize) for i in range(shnum)]
        undefined: list[str] = []
        defined: list[str] = []
        for sh in sections:
            if sh[1] != 2:  # SHT_SYMTAB
                continue
            strtab = sections[sh[6]]
            s_off, size, entsize = sh[4], sh[5], sh[9] or 24
            for at in range(s_off + entsize, s_off + size, entsize):  # entry 0 is the null symbol
                st_name, st_info, _, st_shndx, _, _ = struct.unpack_from("<IBBHQQ", obj, at)
                end = obj.index(b"\0", strtab[4] + st_name)
                name = obj[strtab[4] + st_name : end].decode()
                if not name:
                    continue
                if st_shndx == 0:
                    undefined.append(name)
                elif st_info >> 4 == 1:  # STB_GLOBAL
                    defined.append(name)
        return undefined, defined
    except (struct.error, ValueError, IndexError, UnicodeDecodeError):
        return None


# ---- loading -------------------------------------------------------------------------------

_LOADED: dict[str, NativeKernels] = {}


def _process_symbol(name: str) -> int | None:
    try:
        return ctypes.cast(getattr(ctypes.CDLL(None), name), ctypes.c_void_p).value
    except AttributeError:
        return None


def _bind(undefined: list[str]) -> bool:
    """Give LLVM an address for every symbol the code leaves undefined; False if one has none."""
    import llvmlite.binding as llvm

    abort = _process_symbol("abort")
    for name in undefined:
        if llvm.address_of_symbol(name):  # bound already (numba binds its own, for its own code)
            continue
        addr = _process_symbol(name)
        if addr is None and name in ERROR_PATH_SYMBOLS:
            addr = abort
        if not addr:
            return False
        llvm.add_symbol(name, addr)
    return True


def load(specs: dict[str, Spec], outputs: dict[str, int]) -> NativeKernels | None:
    """The kernels from their file, if one for this key is there and whole; None otherwise."""
    if not _elf_platform():
        return None
    try:
        k = key(specs)
    except Exception:  # no llvmlite, or one that cannot tell the CPU
        return None
    if k is None:
        return None
    if k in _LOADED:
        return _LOADED[k]
    for folder in folders():
        try:
            data = _path_in(folder, k).read_bytes()
        except OSError:
            continue
        kernels = _unpack(data)
        if kernels is None or set(kernels) != set(specs):
            continue
        made = _link(kernels, specs, outputs)
        if made is not None:
            _LOADED[k] = made
            release_library_pages()
            return made
    return None


# madvise(2): the pages of the range are dropped from this process's page tables; for a file
# mapping they stay in the page cache and fault back in (from memory) when next touched.
MADV_DONTNEED = 4


def release_library_pages() -> int:
    """Drop llvmlite's library pages from this process once the kernels are linked; the bytes
    dropped (0 where it cannot tell which pages are safe to drop).

    libllvmlite is ~47 MB of resident pages by the time of the link, nearly all touched by LLVM's
    static constructors when the library is opened, and not run again by a load: the kernels run
    in the engine's own memory. Only its read-only mappings without a private page are dropped
    (smaps: Anonymous and Private_Dirty 0): each page there is the file's own, so dropping it is
    invisible to the program (the next touch maps it again from the page cache) and frees the
    process's share; a page the dynamic linker wrote (RELRO) is a private copy, and a mapping that
    holds one is left alone."""
    if not _elf_platform():
        return 0
    try:
        import llvmlite.binding.ffi as ffi

        name = os.path.realpath(ffi.lib._name)
        spans = _clean_read_only_mappings(name)
        if not spans:
            return 0
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        madvise.restype = ctypes.c_int
    except Exception:  # an llvmlite without that attribute, no /proc: nothing dropped
        return 0
    dropped = 0
    for start, end, resident in spans:
        if madvise(start, end - start, MADV_DONTNEED) == 0:
            dropped += resident
    return dropped


# The per-mapping counts of smaps that tell whether a mapping holds a page of its own.
_SMAPS_FIELDS = {"Anonymous:": "anon", "Private_Dirty:": "dirty", "Rss:": "rss"}


def _clean_read_only_mappings(path: str, smaps: str = "/proc/self/smaps") -> list[tuple[int, int, int]]:
    """(start, end, resident bytes) of each private mapping of `path` that is not writable and
    holds no page of its own (from `smaps`, the kernel's per-mapping page counts)."""
    out: list[tuple[int, int, int]] = []
    current: dict[str, Any] | None = None

    def close() -> None:
        if current is not None and current["anon"] == 0 and current["dirty"] == 0 and current["rss"]:
            out.append((current["start"], current["end"], current["rss"]))

    with open(smaps) as fh:
        for line in fh:
            head, _, rest = line.partition(" ")
            if not head.endswith(":"):  # a mapping's first line: range, perms, offset, dev, inode, path
                close()
                parts = line.split(None, 5)
                perms = parts[1] if len(parts) > 1 else ""
                current = None
                if len(parts) == 6 and parts[5].rstrip("\n") == path and "w" not in perms and perms[3:4] == "p":
                    a, b = parts[0].split("-")
                    current = {"start": int(a, 16), "end": int(b, 16), "anon": -1, "dirty": -1, "rss": 0}
            elif current is not None:
                field = _SMAPS_FIELDS.get(head)
                if field:
                    current[field] = int(rest.split()[0]) * 1024
        close()
    return out


def _elf_platform() -> bool:
    return sys.platform.startswith("linux")


def _link(kernels: dict[str, tuple[str, bytes, list[str]]], specs: dict[str, Spec],
          outputs: dict[str, int]) -> NativeKernels | None:
    import llvmlite.binding as llvm

    try:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        for entry, obj, undefined in kernels.values():
            syms = elf_symbols(obj)
            # The file's list is checked against the object itself: a symbol missed would be
            # linked to address 0, so both must agree.
            if syms is None or sorted(syms[0]) != sorted(undefined) or entry not in syms[1] or not _bind(undefined):
                return None
        tm = llvm.Target.from_default_triple().create_target_machine()
        engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), tm)
        for _, obj, _ in kernels.values():
            engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        engine.finalize_object()
        fns = {}
        for name, (entry, _, _) in kernels.items():
            addr = engine.get_function_address(entry)
            if not addr:
                return None
            fns[name] = NativeKernel(ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p)(addr), specs[name], outputs[name])
        return NativeKernels(engine, fns["scan"], fns["rehash"])
    except Exception:  # an llvmlite that cannot do this here: numba's dispatcher stands
        return None


# ---- building (numba, once per key) ------------------------------------------------------------

def _wrapper_source(spec: Spec, outputs: int) -> str:
    lines = ["def wrapper(block):"]
    at = 0
    names = []
    for i, (_, ndim) in enumerate(spec):
        if ndim == 0:
            lines.append(f"    a{i} = block[{at}]")
            at += 1
        else:
            dims = ", ".join(f"block[{at + 1 + j}]" for j in range(ndim))
            lines.append(f"    a{i} = carray(p{i}(block[{at}]), ({dims},))")
            at += 1 + ndim
        names.append(f"a{i}")
    call = f"kernel({', '.join(names)})"
    if outputs:
        outs = [f"r{j}" for j in range(outputs)]
        lines.append(f"    s, {', '.join(outs)} = {call}")
        lines.extend(f"    block[{at + j}] = r{j}" for j in range(outputs))
        lines.append("    return s")
    else:
        lines.append(f"    {call}")
        lines.append("    return 0")
    return "\n".join(lines) + "\n"


def _compile(kernel: Any, spec: Spec, outputs: int) -> tuple[str, bytes, list[str]]:
    """numba's cfunc of one kernel: (entry point name, ELF object code, undefined symbols)."""
    from llvmlite import ir
    from numba import carray, cfunc, types
    from numba.extending import intrinsic

    def pointer(ty: Any) -> Any:
        @intrinsic
        def ptr(typingctx: Any, addr: Any) -> Any:
            def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
                return builder.inttoptr(args[0], ir.PointerType(context.get_value_type(ty)))
            return types.CPointer(ty)(types.int64), codegen
        return ptr

    env: dict[str, Any] = {"kernel": kernel, "carray": carray}
    for i, (dtype, ndim) in enumerate(spec):
        if ndim:
            env[f"p{i}"] = pointer(getattr(types, dtype))
    exec(compile(_wrapper_source(spec, outputs), "<tokentrace native_scan wrapper>", "exec"), env)  # noqa: S102
    compiled: Any = cfunc(types.int64(types.CPointer(types.int64)))(env["wrapper"])
    obj = compiled._library.serialize_using_object_code()[2][0]  # numba's own cache format: (name, "object", (obj, bitcode))
    syms = elf_symbols(obj)
    if syms is None:
        raise RuntimeError("the compiled scanner is not an ELF object")
    return compiled.native_name, obj, sorted(set(syms[0]))


KEEP_FILES = 4  # per folder: a folder shared by machines of a few CPU kinds keeps each one's


def _prune(folder: Path) -> None:
    """Remove all but the KEEP_FILES newest files (older sources or versions of numba)."""
    try:
        files = sorted(folder.glob("jit_scan.*.native"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in files[KEEP_FILES:]:
            old.unlink(missing_ok=True)
    except OSError:  # another process pruning at the same time
        pass


def build(specs: dict[str, Spec], outputs: dict[str, int]) -> NativeKernels | None:
    """Compile the kernels with numba, write their file where it may be written, and load it;
    None when any step fails (the caller then uses numba's dispatcher)."""
    if not _elf_platform():
        return None
    try:
        k = key(specs)
        if k is None:
            return None
        from tokentrace.analysis.loading import jit_scan

        kernels = {name: _compile(getattr(jit_scan, name), specs[name], outputs[name]) for name in specs}
    except Exception:
        return None
    data = _pack(kernels)
    for folder in folders():
        tmp = None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".jit_scan.", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)  # readable as numba's own cache files are (mkstemp makes 0600)
            os.replace(tmp, _path_in(folder, k))  # whole or absent, whoever reads it meanwhile
            _prune(folder)
            break
        except OSError:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
            continue
    made = _link(kernels, specs, outputs)
    if made is not None:
        _LOADED[k] = made
    return made
