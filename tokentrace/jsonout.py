"""Strict JSON for every JSON output, with trace-borne strings capped.

Owns how a summary becomes JSON text: `analyze --json`, `report -o x.json`, and the `--json` of
diff, check, ranks and scaling all go through `dumps`, and `Analysis.to_json()` through `strict`,
so the rules below hold for every JSON a user or a script reads:

- Strict JSON (RFC 8259): a value that is undefined (NaN, an infinity) is `null`, never the
  `NaN`/`Infinity` tokens Python's json module writes by default and strict parsers reject.
- numpy scalars and arrays become plain numbers and lists; tuples become lists; keys become strings.
- A string longer than MAX_STRING_CHARS keeps as much of its start as fits in MAX_STRING_CHARS
  with a note of its length and SHA-256, so one hostile 500 MB kernel name cannot make a summary of gigabytes
  (it appears in several tables) while two summaries still name the same kernel the same way.
- Containers nested deeper than MAX_DEPTH (only a trace's own args can nest that deep) become a
  string saying so, so encoding never meets Python's recursion limit.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import numpy as np

# Longest string kept whole. Three times the longest real kernel name we have met (5,123
# characters: a templated CUDA distribution kernel in a shared AlexNet trace), so no real name is cut.
MAX_STRING_CHARS = 16384
# Deepest nesting kept; a summary's own structure is under 10 levels.
MAX_DEPTH = 64
# Characters hashed at a time: a capped string is never copied whole into UTF-8.
_HASH_CHUNK = 1 << 20


def cap_string(text: str) -> str:
    """`text`, or, when it is longer than MAX_STRING_CHARS, its start, its length and SHA-256 in that many characters."""
    if len(text) <= MAX_STRING_CHARS:
        return text
    h = hashlib.sha256()
    for i in range(0, len(text), _HASH_CHUNK):
        # surrogatepass: a lone surrogate (a JSON "\ud800" escape) is still hashable, and
        # chunk-wise encoding gives the same digest as encoding the whole string.
        h.update(text[i:i + _HASH_CHUNK].encode("utf-8", "surrogatepass"))
    tail = f"... [cut: {len(text)} characters, sha256 {h.hexdigest()[:16]}]"
    # The result is no longer than the cap itself, so capping twice changes nothing.
    return text[:MAX_STRING_CHARS - len(tail)] + tail


def _key(k: Any) -> str:
    return cap_string(k if isinstance(k, str) else str(strict(k)))


def strict(value: Any, depth: int = 0) -> Any:
    """A copy of `value` that strict JSON can hold: finite numbers or None, capped strings, lists, str keys.

    Decimal is kept (the annotated trace writes exact microseconds with it)."""
    if isinstance(value, np.generic):  # before float: np.float64 is a float subclass
        return strict(value.item(), depth)
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, str):
        return cap_string(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Decimal):
        return value if value.is_finite() else None
    if depth >= MAX_DEPTH and isinstance(value, (Mapping, list, tuple, np.ndarray)):
        return f"[nested deeper than {MAX_DEPTH} levels; left out]"
    if isinstance(value, Mapping):
        return {_key(k): strict(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v, depth + 1) for v in value]
    if isinstance(value, np.ndarray):
        return strict(value.tolist(), depth)
    if _is_missing(value):
        return None
    return cap_string(str(value))


def _is_missing(value: Any) -> bool:
    """pandas' NA and NaT (checked without importing pandas here)."""
    try:
        return bool(value != value)
    except (TypeError, ValueError):  # pd.NA: its comparison is NA, whose truth value raises
        return type(value).__name__ == "NAType"


def dumps(value: Any, *, indent: int | None = 2) -> str:
    """Strict JSON text of `value` (see the module docstring); ASCII only, so it is safe on any terminal."""
    # allow_nan=False: a non-finite float that slipped past `strict` is a bug, raised, never written.
    return json.dumps(strict(value), indent=indent, allow_nan=False, ensure_ascii=True)
