"""The architecture's rules, checked: detectors are independent units, registered once, run in the
order their declarations give, and read only the results they declare."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

import tokentrace
from tokentrace.analysis import pipeline
from tokentrace.analysis.context import Context, DependencyError
from tokentrace.analysis.detectors import gaps

ANALYZE = Path(__file__).resolve().parent.parent / "analyze"
DETECTORS_DIR = ANALYZE / "detectors"
PACKAGE = "tokentrace.analysis.detectors"
DETECTOR_NAMES = sorted(p.stem for p in DETECTORS_DIR.glob("*.py") if p.stem != "__init__")


def imported_modules(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every module an import statement in the file names, at any depth
    (imports inside functions included), relative imports resolved against `package`;
    `from X import a, b` yields X.a and X.b too (a and b may be modules)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.append((node.lineno, module))
            out.extend((node.lineno, f"{module}.{alias.name}") for alias in node.names)
    return out


def detector_imports(path: Path, package: str) -> list[str]:
    """The detector modules a file imports (by any spelling: absolute, relative, from the package)."""
    found: set[str] = set()
    for line, module in imported_modules(path, package):
        for name in DETECTOR_NAMES:
            target = f"{PACKAGE}.{name}"
            if module == target or module.startswith(target + "."):
                found.add(f"{path.name}:{line} imports {name}")
    return sorted(found)


def test_the_import_scan_sees_every_spelling(tmp_path):
    src = tmp_path / "probe.py"
    src.write_text(
        "from tokentrace.analysis.detectors.syncs import X\n"
        "def f():\n"
        "    from . import gaps\n"
        "    import tokentrace.analysis.detectors.shapes as s\n"
        "    from tokentrace.analysis.detectors import attention\n"
        "from .memory import kv_cat_calls\n"
    )
    assert detector_imports(src, PACKAGE) == ["probe.py:1 imports syncs", "probe.py:3 imports gaps", "probe.py:4 imports shapes",
                                              "probe.py:5 imports attention", "probe.py:6 imports memory"]


@pytest.mark.parametrize("name", DETECTOR_NAMES)
def test_no_detector_imports_another_detector(name):
    path = DETECTORS_DIR / f"{name}.py"
    assert detector_imports(path, PACKAGE) == []


@pytest.mark.parametrize("path", sorted((ANALYZE / "common").glob("*.py")), ids=lambda p: p.stem)
def test_common_helpers_import_no_detector(path):
    assert detector_imports(path, "tokentrace.analysis.common") == []


def test_every_detector_module_is_registered_once_with_its_declarations():
    registered = [m.__name__.rsplit(".", 1)[1] for m in pipeline.DETECTORS]
    assert sorted(registered) == DETECTOR_NAMES
    for mod in pipeline.DETECTORS:
        assert isinstance(mod.NAME, str) and isinstance(mod.NEEDS, tuple) and callable(mod.run)
    # The JSON summary's sections keep their order.
    assert pipeline.SECTIONS == ("trace", "phases", "health", "gpu", "gaps", "launches", "syncs", "communication", "shapes",
                                 "attention", "roofline", "memory", "graphs")


def test_run_order_respects_needs():
    order = [m.NAME for m in pipeline.RUN_ORDER]
    for mod in pipeline.DETECTORS:
        for need in mod.NEEDS:
            assert order.index(need) < order.index(mod.NAME), (need, mod.NAME)


def _fake(name: str, needs: tuple[str, ...] = ()) -> SimpleNamespace:
    return SimpleNamespace(__name__=f"fake.{name}", NAME=name, NEEDS=needs, run=lambda trace, ctx: None)


def test_run_order_follows_needs_then_registry_order():
    order = pipeline.run_order((_fake("a", ("c",)), _fake("b"), _fake("c"), _fake("d", ("a",))))
    assert [m.NAME for m in order] == ["b", "c", "a", "d"]


@pytest.mark.parametrize("mods, message", [
    ((_fake("a", ("b",)), _fake("b", ("a",))), "cycle"),
    ((_fake("a", ("nope",)),), "'nope'"),
    ((_fake("a"), _fake("a")), "two detectors are named 'a'"),
    ((SimpleNamespace(__name__="fake.x", NAME="x", run=None),), "does not define NEEDS"),
])
def test_registry_errors_are_loud(mods, message):
    with pytest.raises(pipeline.RegistryError, match=message):
        pipeline.run_order(mods)


def test_a_detector_reads_only_what_it_declares(builder, tmp_path):
    builder.launch("k", 0, 10, 5)
    trace = builder.load(tmp_path)
    ctx = Context(trace, pipeline.Options(), results={"gaps": "the gaps result", "gpu": "the gpu result"})
    view = ctx.for_detector("syncs", ("phases", "gaps"))
    assert view.result("gaps") == "the gaps result"
    with pytest.raises(DependencyError, match="syncs reads the 'gpu' result but does not declare it"):
        view.result("gpu")
    with pytest.raises(DependencyError, match="'phases' result, which has not run"):
        _ = view.segments
    ctx.errors["phases"] = "ValueError: odd input"
    with pytest.raises(DependencyError, match="'phases' result, which failed .ValueError: odd input"):
        _ = view.segments


def test_shared_values_are_computed_once_per_run(builder, tmp_path):
    builder.launch("k", 0, 10, 5)
    trace = builder.load(tmp_path)
    calls = []

    def count(tr):
        calls.append(tr)
        return len(calls)

    ctx = Context(trace, pipeline.Options())
    a, b = ctx.for_detector("x", ()), ctx.for_detector("y", ())
    assert (a.shared(count), b.shared(count), ctx.shared(count)) == (1, 1, 1)
    assert Context(trace, pipeline.Options()).shared(count) == 2  # a new run computes afresh


def test_a_failed_result_fails_its_readers_and_spares_the_rest(builder, tmp_path, monkeypatch, capsys):
    builder.launch("k0", 0, 10, 5)
    builder.launch("k1", 30, 40, 5)

    def broken(trace, ctx):
        raise ValueError("odd input")

    monkeypatch.setattr(gaps, "run", broken)
    a = tokentrace.analyze(builder.load(tmp_path))
    assert a.errors["gaps"] == "ValueError: odd input"
    # syncs and launches read the gaps result: their sections say why they have none.
    for reader in ("syncs", "launches"):
        assert "needs the 'gaps' result, which failed (ValueError: odd input)" in a.errors[reader]
    doc = a.to_json()
    assert doc["gaps"] == {"error": "ValueError: odd input"} and "error" in doc["syncs"]
    assert doc["gpu"]["busy_us"] == 10.0  # detectors that do not read gaps still ran
    assert list(doc)[:3] == ["schema_version", "tool", "warnings"]
    assert list(doc)[3:] == [*pipeline.SECTIONS, "findings"]
    assert "gaps analysis failed" in capsys.readouterr().err
