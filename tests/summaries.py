"""Snapshot and compare the JSON summaries of every shared and sample trace.

A refactor or a speed change must leave every summary identical unless an issue changes a number
on purpose. Usage (from the repository root, with tokentrace installed):

    python tests/summaries.py snapshot OUT_DIR      # analyse every trace, write OUT_DIR/<name>.json
    python tests/summaries.py compare OUT_DIR       # analyse again and list every key that differs

Traces: sample_traces/**/*.pt.trace.json.gz and ../shared/traces/*.json* (when present). The
tool version is left out of the comparison (it changes with every release, not with the analysis).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "traces"


def traces() -> list[Path]:
    found = sorted(ROOT.glob("sample_traces/**/*.pt.trace.json.gz"))
    if SHARED.is_dir():
        found += sorted(p for p in SHARED.iterdir() if p.name.endswith((".json", ".json.gz")))
    return found


def key_of(path: Path) -> str:
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else Path("shared") / path.name
    return str(rel).replace("/", "__")


def summary(path: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "tokentrace", "analyze", str(path), "-q", "--json", "-"],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"exit": out.returncode, "stderr": out.stderr.strip().splitlines()[-1:] }
    doc = json.loads(out.stdout)
    doc.get("tool", {}).pop("version", None)
    return doc


def diffs(a: object, b: object, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                out.append(f"{where}.{k}: {'added' if k not in a else 'removed'}")
            else:
                out += diffs(a[k], b[k], f"{where}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items -> {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in diffs(x, y, f"{where}[{i}]")]
    same = a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)  # NaN == NaN here
    return [] if same else [f"{where}: {str(a)[:80]} -> {str(b)[:80]}"]


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("snapshot", "compare"):
        print(__doc__)
        return 2
    mode, folder = argv[0], Path(argv[1])
    folder.mkdir(parents=True, exist_ok=True)
    changed = 0
    for path in traces():
        doc = summary(path)
        target = folder / f"{key_of(path)}.json"
        if mode == "snapshot":
            target.write_text(json.dumps(doc, indent=1, sort_keys=True))
            print(f"saved {target.name}")
            continue
        if not target.exists():
            print(f"{path}: no snapshot")
            changed += 1
            continue
        found = diffs(json.loads(target.read_text()), doc)
        changed += bool(found)
        print(f"{'DIFF' if found else 'same'} {path}")
        for d in found[:40]:
            print(f"    {d}")
        if len(found) > 40:
            print(f"    ... {len(found) - 40} more")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
