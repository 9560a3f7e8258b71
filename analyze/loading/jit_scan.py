"""The compiled scanner of the fast load path: a JSON events array's bytes in, column values out.

Owns the numba kernels (no Python object per event): one pass over a chunk that validates the
JSON as strictly as msgspec does, reads the fields analysis needs straight into integer arrays,
and interns every kept string and raw JSON value in a table that lives for the whole load (so
each distinct text is turned into a Python object once per load, not once per event).

It reads only what msgspec's typed structs (json_decode.py) accept without coercion. Anything
else in a chunk (an unknown `ph`, a float where an int belongs, a duplicate key, a key written
with escapes, a surrogate escape, nesting deeper than MAX_DEPTH, a number it cannot read
exactly) makes the whole chunk ODD, and the caller decodes that chunk with msgspec instead, so
every odd case keeps the one behaviour json_decode.py defines. jit_columns.py turns the arrays
into the Columns the msgspec path fills, and the tests hold the two paths to identical frames on
every real and sample trace.

Numbers: `ts` and `dur` become int64 nanoseconds from the digits (at most 3 decimals, no
exponent, below 9e15 us; a decimal `dur` also below FLOAT_SAFE_US), which is what the msgspec
path's float and exact-text readings give for such texts; ints are at most 18 digits.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from tokentrace.analysis.loading import json_decode as dec

# The codes shared with jit_columns (status, slot kinds, top fields, fixed slots, layouts): numba
# compiles them in as constants (see scan_codes.py on changing them).
from tokentrace.analysis.loading.scan_codes import (  # noqa: F401
    FULL_INTERN,
    FULL_ROWS,
    K_INT,
    K_INT_OR_NULL,
    K_INT_OR_STR,
    K_RAW,
    K_STR,
    L_COMPLETE,
    L_COUNTER,
    L_FLOW,
    L_INSTANT,
    L_META,
    MAX_DEPTH,
    ODD,
    OK,
    S_BP,
    S_FLOW_ID,
    S_PID,
    S_TID,
    T_ARGS,
    T_BP,
    T_CAT,
    T_DUR,
    T_ID,
    T_NAME,
    T_PH,
    T_PID,
    T_TID,
    T_TS,
)

NO_TS = dec.NO_TS
FLOAT_SAFE_US_INT = int(dec.FLOAT_SAFE_US)  # a decimal dur from here on is left to msgspec's float
MAX_US = 9_000_000_000_000_000  # 9e15 us: the msgspec path reads exactly below this
FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)


# ---- raw memory access --------------------------------------------------------------------
# The helpers take buffers as addresses (from `array.ctypes.data`, taken in `scan`, whose array
# arguments keep them alive), not as arrays: numba increments and decrements an array's
# reference count, atomically, around every call that passes one, which made each helper call
# cost ~50 cycles (a whitespace skip ran at 64 MB/s instead of 1.3 GB/s). Every index is
# checked against its buffer's length by the code before it is read or written.


def _loader(ty, bits):
    @intrinsic
    def load(typingctx, addr, i):
        def codegen(context, builder, signature, args):
            ptr = builder.inttoptr(args[0], ir.IntType(bits).as_pointer())
            return builder.load(builder.gep(ptr, [args[1]]))
        return ty(types.intp, types.intp), codegen
    return load


def _storer(ty, bits):
    @intrinsic
    def store(typingctx, addr, i, v):
        def codegen(context, builder, signature, args):
            ptr = builder.inttoptr(args[0], ir.IntType(bits).as_pointer())
            builder.store(args[2], builder.gep(ptr, [args[1]]))
            return context.get_dummy_value()
        return types.void(types.intp, types.intp, ty), codegen
    return store


@intrinsic
def word(typingctx, addr, at):
    """The 8 bytes at byte offset `at` as one little-endian uint64 (any alignment)."""
    def codegen(context, builder, signature, args):
        ptr = builder.inttoptr(builder.add(args[0], args[1]), ir.IntType(64).as_pointer())
        return builder.load(ptr, align=1)
    return types.uint64(types.intp, types.intp), codegen


@intrinsic
def ctz(typingctx, x):
    """Trailing zero bits of a nonzero uint64."""
    def codegen(context, builder, signature, args):
        return builder.cttz(args[0], ir.Constant(ir.IntType(1), 1))
    return types.uint64(types.uint64), codegen


u8, i8, i16, i32, i64 = (_loader(types.uint8, 8), _loader(types.int8, 8), _loader(types.int16, 16),
                         _loader(types.int32, 32), _loader(types.int64, 64))
put_u8, put_i8, put_i32, put_i64 = (_storer(types.uint8, 8), _storer(types.int8, 8), _storer(types.int32, 32),
                                   _storer(types.int64, 64))


# Eight-byte patterns of the SWAR tests (a byte's worth repeated), and the hash's length mix.
ONES = np.uint64(0x0101010101010101)
HIGHS = np.uint64(0x8080808080808080)
QUOTES = np.uint64(0x2222222222222222)
SLASHES = np.uint64(0x5C5C5C5C5C5C5C5C)
SPACES = np.uint64(0x2020202020202020)
MIX = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, nogil=True)
def text_hash(b, lo, hi):  # pragma: no cover - compiled
    """A hash of the bytes b[lo:hi], eight at a time (the intern table compares the bytes on
    every hit, so the hash only has to spread texts, not tell them apart)."""
    size = hi - lo
    h = np.uint64(size) * MIX
    j = lo
    while j + 8 <= hi:
        h = (h ^ word(b, j)) * FNV_PRIME
        h ^= h >> np.uint64(29)
        j += 8
    if j < hi:
        if size >= 8:  # the last eight bytes (overlapping the ones already taken)
            h = (h ^ word(b, hi - 8)) * FNV_PRIME
        else:
            for k in range(j, hi):
                h = (h ^ np.uint64(u8(b, k))) * FNV_PRIME
    return h ^ (h >> np.uint64(32))


@njit(cache=True, nogil=True)
def same_bytes(a, at, b, bt, size):  # pragma: no cover - compiled
    """Whether a[at:at+size] == b[bt:bt+size], eight bytes at a time."""
    j = 0
    while j + 8 <= size:
        if word(a, at + j) != word(b, bt + j):
            return False
        j += 8
    while j < size:
        if u8(a, at + j) != u8(b, bt + j):
            return False
        j += 1
    return True


@njit(cache=True, nogil=True)
def _ws(b, i, n):  # pragma: no cover - compiled
    while i < n:
        c = u8(b, i)
        if c == 32 or c == 10 or c == 13 or c == 9:
            i += 1
        else:
            break
    return i


@njit(cache=True, nogil=True)
def _hex(c):  # pragma: no cover - compiled
    if 48 <= c <= 57:
        return c - 48
    if 97 <= c <= 102:
        return c - 87
    if 65 <= c <= 70:
        return c - 55
    return -1


@njit(cache=True, nogil=True)
def _string_end(b, i, n):  # pragma: no cover - compiled
    """i at the opening quote; the index of the closing quote, or -1 (invalid or a surrogate
    escape, which is left to msgspec)."""
    i += 1
    while i < n:
        # Eight bytes at a time to the first quote, backslash or control byte (the lowest byte
        # these tests flag is always a true one).
        while i + 8 <= n:
            w = word(b, i)
            q = w ^ QUOTES
            s = w ^ SLASHES
            t = (((q - ONES) & ~q) | ((s - ONES) & ~s) | ((w - SPACES) & ~w)) & HIGHS
            if t:
                i += np.int64(ctz(t) >> np.uint64(3))
                break
            i += 8
        if i >= n:
            return -1
        c = u8(b, i)
        if c == 34:
            return i
        if c == 92:
            if i + 1 >= n:
                return -1
            e = u8(b, i + 1)
            if e == 117:
                if i + 5 >= n:
                    return -1
                v = 0
                for k in range(2, 6):
                    h = _hex(u8(b, i + k))
                    if h < 0:
                        return -1
                    v = v * 16 + h
                if 0xD800 <= v <= 0xDFFF:
                    return -1
                i += 6
            elif e == 34 or e == 92 or e == 47 or e == 98 or e == 102 or e == 110 or e == 114 or e == 116:
                i += 2
            else:
                return -1
        elif c < 32:
            return -1
        else:
            i += 1
    return -1


@njit(cache=True, nogil=True)
def _number_end(b, i, n):  # pragma: no cover - compiled
    """The end of a JSON number starting at i (strict grammar), or -1."""
    if i < n and u8(b, i) == 45:
        i += 1
    if i >= n:
        return -1
    c = u8(b, i)
    if c == 48:
        i += 1
    elif 49 <= c <= 57:
        while i < n and 48 <= u8(b, i) <= 57:
            i += 1
    else:
        return -1
    if i < n and u8(b, i) == 46:
        i += 1
        s = i
        while i < n and 48 <= u8(b, i) <= 57:
            i += 1
        if i == s:
            return -1
    if i < n and (u8(b, i) == 101 or u8(b, i) == 69):
        i += 1
        if i < n and (u8(b, i) == 43 or u8(b, i) == 45):
            i += 1
        s = i
        while i < n and 48 <= u8(b, i) <= 57:
            i += 1
        if i == s:
            return -1
    return i


@njit(cache=True, nogil=True)
def _literal_end(b, i, n):  # pragma: no cover - compiled
    c = u8(b, i)
    if c == 116:  # true
        if i + 4 <= n and u8(b, i + 1) == 114 and u8(b, i + 2) == 117 and u8(b, i + 3) == 101:
            return i + 4
    elif c == 102:  # false
        if i + 5 <= n and u8(b, i + 1) == 97 and u8(b, i + 2) == 108 and u8(b, i + 3) == 115 and u8(b, i + 4) == 101:
            return i + 5
    elif c == 110:  # null
        if i + 4 <= n and u8(b, i + 1) == 117 and u8(b, i + 2) == 108 and u8(b, i + 3) == 108:
            return i + 4
    return -1


@njit(cache=True, nogil=True)
def _value_end(b, i, n, depth0):  # pragma: no cover - compiled
    """The end of the JSON value starting at i (after whitespace), validated; -1 if invalid or
    nested past MAX_DEPTH counting the depth0 levels it sits in."""
    c = u8(b, i)
    if c == 34:
        e = _string_end(b, i, n)
        return -1 if e < 0 else e + 1
    if c == 45 or 48 <= c <= 57:
        return _number_end(b, i, n)
    if c != 123 and c != 91:
        return _literal_end(b, i, n)
    depth = 0
    objects = np.uint64(0)  # bit d set: the container at depth d is an object
    # Modes: 0 a value is expected at i; 1 just opened (close or first item); 2 after an item.
    mode = 0
    while True:
        if mode == 0:
            i = _ws(b, i, n)
            if i >= n:
                return -1
            c = u8(b, i)
            if c == 123 or c == 91:
                if depth0 + depth + 1 > MAX_DEPTH:
                    return -1
                bit = np.uint64(1) << np.uint64(depth)
                objects = (objects | bit) if c == 123 else (objects & ~bit)
                depth += 1
                i += 1
                mode = 1
                continue
            if c == 34:
                e = _string_end(b, i, n)
                if e < 0:
                    return -1
                i = e + 1
            elif c == 45 or 48 <= c <= 57:
                i = _number_end(b, i, n)
            else:
                i = _literal_end(b, i, n)
            if i < 0:
                return -1
            mode = 2
            continue
        i = _ws(b, i, n)
        if i >= n:
            return -1
        c = u8(b, i)
        is_object = (objects >> np.uint64(depth - 1)) & np.uint64(1)
        if (is_object and c == 125) or (not is_object and c == 93):
            depth -= 1
            i += 1
            if depth == 0:
                return i
            mode = 2
            continue
        if mode == 2:
            if c != 44:
                return -1
            i = _ws(b, i + 1, n)
            if i >= n:
                return -1
            c = u8(b, i)
        if is_object:
            if c != 34:
                return -1
            e = _string_end(b, i, n)
            if e < 0:
                return -1
            i = _ws(b, e + 1, n)
            if i >= n or u8(b, i) != 58:
                return -1
            i += 1
        mode = 0


@njit(cache=True, nogil=True)
def _intern(b, lo, hi, h, tab, mask, arena, arena_cap, off, ln, id_cap, state):  # pragma: no cover - compiled
    """The id of the text b[lo:hi] (hash h) in the load's intern table (addresses: tab int32
    slots, arena bytes, off/ln int64 per id, state int64 [ids, arena bytes used]), added if new;
    -1 when the table or its arena is full (the caller grows them and scans the chunk again)."""
    slot = np.int64(h & np.uint64(mask))
    size = hi - lo
    while True:
        k = i32(tab, slot)
        if k < 0:
            break
        if i64(ln, k) == size and same_bytes(arena, i64(off, k), b, lo, size):
            return k
        slot = (slot + 1) & mask
    nid = i64(state, 0)
    used = i64(state, 1)
    if nid >= id_cap or used + size > arena_cap or 2 * (nid + 1) > mask + 1:
        return -1
    for j in range(size):
        put_u8(arena, used + j, u8(b, lo + j))
    put_i64(off, nid, used)
    put_i64(ln, nid, size)
    put_i32(tab, slot, np.int32(nid))
    put_i64(state, 0, nid + 1)
    put_i64(state, 1, used + size)
    return nid


@njit(cache=True, nogil=True)
def rehash(tab_id, id_off, id_len, arena, n_ids):  # pragma: no cover - compiled
    """Fill a fresh (all -1) table with the first n_ids interned texts."""
    mask = len(tab_id) - 1
    a = arena.ctypes.data
    for k in range(n_ids):
        at = id_off[k]
        slot = np.int64(text_hash(a, at, at + id_len[k]) & np.uint64(mask))
        while tab_id[slot] >= 0:
            slot = (slot + 1) & mask
        tab_id[slot] = k


@njit(cache=True, nogil=True)
def _whole(b, i, n, most):  # pragma: no cover - compiled
    """(end, magnitude, negative) of a JSON number's sign and integer digits at i; end -1 if
    there are no digits or more than `most`. A leading zero with digits after it ends at the
    zero, and the byte after it then fails the caller's check for what may follow a value."""
    neg = False
    if u8(b, i) == 45:
        neg = True
        i += 1
    if i >= n:
        return -1, 0, neg
    c = u8(b, i)
    v = 0
    if c == 48:
        i += 1
    elif 49 <= c <= 57:
        s = i
        while i < n and 48 <= u8(b, i) <= 57:
            if i - s == most:
                return -1, 0, neg
            v = v * 10 + (u8(b, i) - 48)
            i += 1
    else:
        return -1, 0, neg
    return i, v, neg


@njit(cache=True, nogil=True)
def _int_value(b, i, n):  # pragma: no cover - compiled
    """(end, value) of a JSON integer of at most 18 digits at i; end -1 if it is not one (a
    float, an exponent, more digits)."""
    i, v, neg = _whole(b, i, n, 18)
    if i < 0 or (i < n and (u8(b, i) == 46 or u8(b, i) == 101 or u8(b, i) == 69)):
        return -1, 0
    return i, -v if neg else v


@njit(cache=True, nogil=True)
def _us_value(b, i, n, is_dur):  # pragma: no cover - compiled
    """(end, nanoseconds) of a microsecond number at i read exactly; end -1 if it is not in the
    form read here (the chunk then takes the msgspec path)."""
    i, v, neg = _whole(b, i, n, 16)
    if i < 0 or v >= MAX_US:
        return -1, 0
    frac = 0
    nf = 0
    if i < n and u8(b, i) == 46:
        i += 1
        while i < n and 48 <= u8(b, i) <= 57:
            if nf == 3:
                return -1, 0
            frac = frac * 10 + (u8(b, i) - 48)
            nf += 1
            i += 1
        if nf == 0:
            return -1, 0
        if is_dur and v >= FLOAT_SAFE_US_INT:
            return -1, 0
    if i < n and (u8(b, i) == 101 or u8(b, i) == 69):
        return -1, 0
    while nf < 3:
        frac *= 10
        nf += 1
    ns = v * 1000 + frac
    return i, -ns if neg else ns


@njit(cache=True, nogil=True)
def _key(b, i, n, key_tab, key_mask, key_off, key_len, key_bytes):  # pragma: no cover - compiled
    """i at a key's opening quote: (index after the closing quote, key id or -1 unknown); the
    index is -1 for invalid text and -2 for a key written with escapes (left to msgspec)."""
    s = i + 1
    j = s
    h = FNV_OFFSET
    while j < n:
        c = u8(b, j)
        if c == 34:
            break
        if c == 92:
            return -2, -1
        if c < 32:
            return -1, -1
        h = (h ^ np.uint64(c)) * FNV_PRIME
        j += 1
    if j >= n:
        return -1, -1
    slot = np.int64(h & np.uint64(key_mask))
    ln = j - s
    while True:
        k = i32(key_tab, slot)
        if k < 0:
            return j + 1, -1
        if i64(key_len, k) == ln:
            off = i64(key_off, k)
            same = True
            for t in range(ln):
                if u8(key_bytes, off + t) != u8(b, s + t):
                    same = False
                    break
            if same:
                return j + 1, k
        slot = (slot + 1) & key_mask


@njit(cache=True, nogil=True)
def _push(rows, slots, vals, cap, nt, row, slot, val):  # pragma: no cover - compiled
    """Write the triple (row, slot, val) at position nt of the triple arrays (addresses, `cap`
    long): the next position, or -1 when they are full (the caller grows them)."""
    if nt >= cap:
        return -1
    put_i32(rows, nt, np.int32(row))
    put_i8(slots, nt, np.int8(slot))
    put_i64(vals, nt, np.int64(val))
    return nt + 1


@njit(cache=True, nogil=True)
def _text_id(b, i, n, tab, mask, arena, arena_cap, off, ln, id_cap, state):  # pragma: no cover - compiled
    """i at a string: (index after it, intern id of its content); index -1 if it is not a
    valid string, id -1 if the intern table is full (see _intern)."""
    e = _string_end(b, i, n)
    if e < 0:
        return -1, -1
    return e + 1, _intern(b, i + 1, e, text_hash(b, i + 1, e), tab, mask, arena, arena_cap, off, ln, id_cap, state)


@njit(cache=True, nogil=True)
def _member(b, i, n, key_tab, key_mask, key_off, key_len, key_bytes):  # pragma: no cover - compiled
    """i at an object member: (index of its value, key id or -1 unknown); index -1 if the
    text is not `"key": value` or the key is written with escapes."""
    if i >= n or u8(b, i) != 34:
        return -1, -1
    i, k = _key(b, i, n, key_tab, key_mask, key_off, key_len, key_bytes)
    if i < 0:
        return -1, -1
    i = _ws(b, i, n)
    if i >= n or u8(b, i) != 58:
        return -1, -1
    i = _ws(b, i + 1, n)
    return (i, k) if i < n else (-1, -1)


@njit(cache=True, nogil=True)
def _next_member(b, i, n):  # pragma: no cover - compiled
    """i after a member's value: (index of the next member, False) after a comma, (index after
    the object, True) at its end; index -1 for anything else."""
    i = _ws(b, i, n)
    if i < n and u8(b, i) == 44:
        return _ws(b, i + 1, n), False
    if i < n and u8(b, i) == 125:
        return i + 1, True
    return -1, False


@njit(cache=True, nogil=True)
def scan(b, key_tab, key_off, key_len, key_bytes, top_of_key, slot_of_key, slot_kind, ph_class, class_layout,
         ph, ts, dur, pid, tid, cat, name,
         t_row, t_slot, t_val, t_n,
         tab_id, arena, id_off, id_len, state):  # pragma: no cover - compiled
    """Scan one chunk (a JSON array of events). Per event: class code, ts/dur ns, pid/tid,
    cat/name intern ids (-1 absent). Every other field found becomes a triple (row, slot,
    value) in t_*: the int value, or for string and raw slots the intern id; a string in an
    int-or-text slot (pid, tid, stream, bytes) is a triple with slot + 64 and the id.
    Returns (status, events); t_n[0] holds the triples written."""
    n = len(b)
    # Addresses for the helpers (see _loader); the arrays are this call's arguments, alive to its end.
    p = b.ctypes.data
    kt, kmask, ko, kl, kb = key_tab.ctypes.data, len(key_tab) - 1, key_off.ctypes.data, key_len.ctypes.data, key_bytes.ctypes.data
    tab, tmask, ar, acap = tab_id.ctypes.data, len(tab_id) - 1, arena.ctypes.data, len(arena)
    io, il, icap, st = id_off.ctypes.data, id_len.ctypes.data, len(id_off), state.ctypes.data
    tr, tsl, tv = t_row.ctypes.data, t_slot.ctypes.data, t_val.ctypes.data
    i = _ws(p, 0, n)
    if i >= n or u8(p, i) != 91:
        return ODD, 0
    i = _ws(p, i + 1, n)
    if i < n and u8(p, i) == 93:
        return (OK if _ws(p, i + 1, n) == n else ODD), 0
    cap = len(ph)
    tcap = len(t_row)
    nt = 0
    row = 0
    while True:
        if i >= n or u8(p, i) != 123:
            return ODD, row
        if row >= cap:
            return FULL_ROWS, row
        # One event object.
        ph[row] = -1
        ts[row] = NO_TS
        dur[row] = NO_TS
        pid[row] = -1
        tid[row] = -1
        cat[row] = -1
        name[row] = -1
        layout = -1
        seen_top = 0
        seen_args = np.uint64(0)
        i = _ws(p, i + 1, n)
        if i < n and u8(p, i) == 125:
            return ODD, row  # no ph: the msgspec path's business
        while True:
            i, k = _member(p, i, n, kt, kmask, ko, kl, kb)
            if i < 0:
                return ODD, row
            f = top_of_key[k] if k >= 0 else -1
            if f >= 0:
                if seen_top & (1 << f):
                    return ODD, row
                seen_top |= 1 << f
            c = u8(p, i)
            if f == T_PH:
                if c != 34 or i + 2 >= n or u8(p, i + 2) != 34:
                    return ODD, row
                code = ph_class[u8(p, i + 1)]
                if code < 0:
                    return ODD, row
                ph[row] = code
                layout = class_layout[code]
                i += 3
            elif f == T_CAT or f == T_NAME or (f == T_BP and layout == L_FLOW):
                if c == 34:
                    e, sid = _text_id(p, i, n, tab, tmask, ar, acap, io, il, icap, st)
                    if e < 0:
                        return ODD, row
                    if sid < 0:
                        return FULL_INTERN, row
                    if f == T_CAT:
                        cat[row] = sid
                    elif f == T_NAME:
                        name[row] = sid
                    else:
                        nt = _push(tr, tsl, tv, tcap, nt, row, S_BP, sid)
                        if nt < 0:
                            return FULL_ROWS, row
                    i = e
                else:
                    e = _literal_end(p, i, n)
                    if c != 110 or e < 0:
                        return ODD, row
                    i = e
            elif f == T_PID or f == T_TID:
                if c == 34:
                    e, sid = _text_id(p, i, n, tab, tmask, ar, acap, io, il, icap, st)
                    if e < 0:
                        return ODD, row
                    if sid < 0:
                        return FULL_INTERN, row
                    nt = _push(tr, tsl, tv, tcap, nt, row, 64 + S_PID + f - T_PID, sid)
                    if nt < 0:
                        return FULL_ROWS, row
                    i = e
                else:
                    e, v = _int_value(p, i, n)
                    if e < 0:
                        return ODD, row
                    if f == T_PID:
                        pid[row] = v
                    else:
                        tid[row] = v
                    i = e
            elif f == T_TS or (f == T_DUR and layout == L_COMPLETE):
                e, v = _us_value(p, i, n, f == T_DUR)
                if e < 0:
                    return ODD, row
                if f == T_TS:
                    ts[row] = v
                else:
                    dur[row] = v
                i = e
            elif f == T_ID and layout == L_FLOW:
                e, v = _int_value(p, i, n)
                if e < 0:
                    return ODD, row
                nt = _push(tr, tsl, tv, tcap, nt, row, S_FLOW_ID, v)
                if nt < 0:
                    return FULL_ROWS, row
                i = e
            elif f == T_ARGS and (layout == L_COMPLETE or layout == L_INSTANT or layout == L_META):
                # The args object: its known keys become triples.
                if c != 123:
                    return ODD, row
                i = _ws(p, i + 1, n)
                if i < n and u8(p, i) == 125:
                    i += 1
                else:
                    while True:
                        i, k = _member(p, i, n, kt, kmask, ko, kl, kb)
                        if i < 0:
                            return ODD, row
                        s = slot_of_key[layout, k] if k >= 0 else -1
                        if s < 0:
                            e = _value_end(p, i, n, 3)
                            if e < 0:
                                return ODD, row
                            i = e
                        else:
                            bit = np.uint64(1) << np.uint64(s)
                            if seen_args & bit:
                                return ODD, row
                            seen_args |= bit
                            kind = slot_kind[s]
                            c = u8(p, i)
                            if kind == K_RAW:
                                e = _value_end(p, i, n, 3)
                                if e < 0:
                                    return ODD, row
                                sid = _intern(p, i, e, text_hash(p, i, e), tab, tmask, ar, acap, io, il, icap, st)
                                if sid < 0:
                                    return FULL_INTERN, row
                                nt = _push(tr, tsl, tv, tcap, nt, row, s, sid)
                                if nt < 0:
                                    return FULL_ROWS, row
                                i = e
                            elif c == 34 and (kind == K_STR or kind == K_INT_OR_STR):
                                e, sid = _text_id(p, i, n, tab, tmask, ar, acap, io, il, icap, st)
                                if e < 0:
                                    return ODD, row
                                if sid < 0:
                                    return FULL_INTERN, row
                                nt = _push(tr, tsl, tv, tcap, nt, row, s if kind == K_STR else s + 64, sid)
                                if nt < 0:
                                    return FULL_ROWS, row
                                i = e
                            elif c == 110 and (kind == K_STR or kind == K_INT_OR_NULL):
                                e = _literal_end(p, i, n)
                                if e < 0:
                                    return ODD, row
                                i = e  # null: absent
                            elif kind != K_STR:
                                e, v = _int_value(p, i, n)
                                if e < 0:
                                    return ODD, row
                                nt = _push(tr, tsl, tv, tcap, nt, row, s, v)
                                if nt < 0:
                                    return FULL_ROWS, row
                                i = e
                            else:
                                return ODD, row
                        i, closed = _next_member(p, i, n)
                        if i < 0:
                            return ODD, row
                        if closed:
                            break
            else:
                if f >= 0 and layout < 0:
                    return ODD, row  # a layout-dependent key before ph
                e = _value_end(p, i, n, 2)
                if e < 0:
                    return ODD, row
                i = e
            i, closed = _next_member(p, i, n)
            if i < 0:
                return ODD, row
            if closed:
                break
        if layout < 0:
            return ODD, row
        row += 1
        t_n[0] = nt
        i = _ws(p, i, n)
        if i >= n:
            return ODD, row
        if u8(p, i) == 44:
            i = _ws(p, i + 1, n)
            continue
        if u8(p, i) == 93:
            return (OK if _ws(p, i + 1, n) == n else ODD), row
        return ODD, row
