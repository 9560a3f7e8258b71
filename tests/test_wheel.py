"""The wheel holds every package folder under its import name, and the report templates.

Builds the wheel the way a user's `pip install .` does (an isolated build: pip fetches the build
backend from the package index) from a copy of the files a source distribution holds, so nothing
is written into the checkout. Skips, saying why, when the backend cannot be fetched.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What pip's build could not fetch, as pip says it: no index, no network.
UNREACHABLE = ("No matching distribution found", "Could not find a version that satisfies", "Failed to establish a new connection",
               "Temporary failure in name resolution", "Network is unreachable", "No route to host", "ProxyError")
FOLDERS = ("tokentrace", "analyze", "capture", "reports")


def package_dirs() -> dict[str, str]:
    """setup.py's import name -> folder mapping (read, not executed: running it calls setup())."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id == "PACKAGE_DIRS" and node.value is not None:
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py defines no PACKAGE_DIRS")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
                         capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600)
    if res.returncode != 0:
        text = res.stdout + res.stderr
        if any(s in text for s in UNREACHABLE):
            pytest.skip(f"the build backend could not be fetched from the package index: {text.strip().splitlines()[-1]}")
        raise AssertionError(f"pip wheel failed:\n{text}")
    (built,) = out.glob("tokentrace-*.whl")
    return zipfile.ZipFile(built)


def test_every_folder_is_mapped():
    assert sorted(package_dirs().values()) == sorted(FOLDERS)


def test_every_package_and_module_is_in_the_wheel(wheel):
    names = set(wheel.namelist())
    missing = []
    for import_name, folder in package_dirs().items():
        for py in sorted((ROOT / folder).rglob("*.py")):
            rel = py.relative_to(ROOT / folder)
            if not (py.parent / "__init__.py").is_file():
                continue  # not a package module (none today; a stray script would not install)
            want = "/".join((*import_name.split("."), *rel.parts))
            if want not in names:
                missing.append(want)
    assert missing == []
    # Every folder with an __init__.py, under its import name (analyze/common -> tokentrace/analysis/common).
    assert {"tokentrace/analysis/common/__init__.py", "tokentrace/analysis/detectors/__init__.py",
            "tokentrace/analysis/loading/__init__.py", "tokentrace/analysis/compare/__init__.py",
            "tokentrace/profiling/__init__.py", "tokentrace/reports/__init__.py", "tokentrace/cli/__init__.py"} <= names


def test_templates_and_markers_are_in_the_wheel(wheel):
    names = set(wheel.namelist())
    templates = sorted(p.name for p in (ROOT / "reports" / "templates").iterdir() if p.is_file())
    assert templates, "reports/templates is empty"
    assert [t for t in templates if f"tokentrace/reports/templates/{t}" not in names] == []
    assert "tokentrace/py.typed" in names
    # The checkout's own folder names never appear: they install under the import names only.
    assert not [n for n in names if n.split("/")[0] in ("analyze", "capture", "reports")]
