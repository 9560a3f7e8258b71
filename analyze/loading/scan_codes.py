"""The codes the compiled scanner (jit_scan.py) and its Python side (jit_columns.py) agree on:
a scan's status, the slot kinds, the top-level fields, the fixed slots and the event layouts.

They live apart from jit_scan so that a load whose scanner is already compiled (native_scan.py)
can build the scanner's tables without importing numba, which is what jit_scan needs. numba
compiles these values into the scanner as constants and keys its own cache on jit_scan.py
alone, so a change here must come with a change to jit_scan.py (native_scan's key covers both).
"""

from __future__ import annotations

# Status of a scan.
OK, ODD, FULL_ROWS, FULL_INTERN = 0, 1, 2, 3
MAX_DEPTH = 64  # deeper values are left to the msgspec path (which flattens them)

# Slot kinds (what a field's JSON value may be).
K_INT, K_INT_OR_STR, K_INT_OR_NULL, K_STR, K_RAW = 0, 1, 2, 3, 4

# Top-level fields (codes in the key table's top map).
T_PH, T_CAT, T_NAME, T_PID, T_TID, T_TS, T_DUR, T_ID, T_BP, T_ARGS = range(10)

# Fixed slots of the top-level fields that are not per-event arrays (args slots follow them).
S_PID, S_TID, S_FLOW_ID, S_BP = 0, 1, 2, 3

# Layouts (the order of json_decode._LAYOUT_NAMES): which args struct an event reads.
L_COMPLETE, L_INSTANT, L_FLOW, L_META, L_COUNTER = 0, 1, 2, 3, 4
