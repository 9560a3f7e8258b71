"""Our GPU busy/idle against Holistic Trace Analysis' temporal breakdown (when HTA is installed)."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from click.testing import CliRunner
from conftest import SAMPLE_TRACES, real_trace_params

import tokentrace
from tokentrace.analysis.compare.hta_compare import HINT, hta_caveats, hta_comparison, hta_temporal_breakdown
from tokentrace.cli import main
from tokentrace.errors import TokentraceError
from tokentrace.reports.text import hta_text


def _hta_importable() -> bool:
    try:
        return importlib.util.find_spec("hta") is not None and importlib.util.find_spec("hta.trace_analysis") is not None
    except (ImportError, ValueError):
        return False


needs_hta = pytest.mark.skipif(not _hta_importable(), reason="HolisticTraceAnalysis (the hta extra) is not installed")


def _built(builder, tmp_path):
    builder.launch("k1", 0, 10, 100)
    builder.launch("k2", 20, 150, 50, stream=8)
    builder.launch("k3", 30, 300, 100)
    return builder.write(tmp_path / "built.pt.trace.json")


@needs_hta
def test_hta_matches_exactly_on_built_trace(builder, tmp_path):
    path = _built(builder, tmp_path)
    theirs = hta_temporal_breakdown(path)
    ours = tokentrace.analyze(path).gpu
    assert theirs == pytest.approx({"span_us": 390.0, "busy_us": 250.0, "idle_us": 140.0, "compute_us": 250.0,
                                    "non_compute_us": 0.0})
    assert (ours.span_us, ours.busy_us, ours.idle_us) == pytest.approx((390.0, 250.0, 140.0))


@needs_hta
def test_hta_reads_the_trace_at_its_own_resolution(builder, tmp_path):
    # Two kernels 1 ns apart over 11.016 us, as on SGLang's capture trace: HTA's default rounding of
    # every event inward to whole microseconds would give 1 us of idle in a 10 us span.
    builder.launch("k1", 0, 61.579, 5.367)
    builder.launch("k2", 1, 66.947, 5.648)
    path = builder.write(tmp_path / "ns.pt.trace.json")
    theirs = hta_temporal_breakdown(path)
    ours = tokentrace.analyze(path).gpu
    assert (theirs["span_us"], theirs["busy_us"], theirs["idle_us"]) == pytest.approx((11.016, 11.015, 0.001), abs=1e-6)
    assert (ours.span_us, ours.busy_us, ours.idle_us) == pytest.approx((11.016, 11.015, 0.001), abs=1e-6)


@needs_hta
@pytest.mark.parametrize("path", real_trace_params())
def test_idle_and_busy_within_one_percent_of_span(path):
    try:
        theirs = hta_temporal_breakdown(path)
    except TokentraceError as exc:
        pytest.skip(f"HTA cannot read this trace: {exc}")
    analysis = tokentrace.analyze(path)
    caveats = hta_caveats(analysis.trace)
    if caveats:
        pytest.skip(f"HTA misreads this trace: {caveats[0]}")
    ours = analysis.gpu
    span = max(ours.span_us, theirs["span_us"])
    assert abs(ours.idle_us - theirs["idle_us"]) <= 0.01 * span
    assert abs(ours.busy_us - theirs["busy_us"]) <= 0.01 * span


@needs_hta
def test_hta_lines_and_cli_flag(builder, tmp_path):
    path = _built(builder, tmp_path)
    lines = hta_text(hta_comparison(tokentrace.analyze(path))).splitlines()
    assert lines[0].startswith("GPU time (us)")
    idle = [ln for ln in lines if ln.startswith("idle")][0]
    assert idle.split()[1:] == ["140.0", "140.0", "0.000"]
    out = CliRunner().invoke(main, ["analyze", str(path), "--hta", "-q"])
    assert out.exit_code == 0, out.output
    assert "GPU time (us)" in out.output and "utilization" in out.output


@needs_hta
def test_trace_hta_cannot_read_gives_a_line_not_a_traceback(builder, tmp_path):
    builder.cpu_op("aten::add", 0, 10)  # no GPU rows: HTA's breakdown fails on it
    path = builder.write(tmp_path / "cpu.pt.trace.json")
    lines = hta_text(hta_comparison(tokentrace.analyze(path))).splitlines()
    assert lines == ["HTA comparison: HTA's temporal breakdown measures GPU kernels, and this trace has no GPU activity: nothing to compare"]


@needs_hta
def test_relative_path_is_given_to_hta_as_hta_accepts_it(builder, tmp_path, monkeypatch):
    """HTA joins a relative file name to its trace_dir and then fails "Trace files validation failed"."""
    _built(builder, tmp_path)
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(main, ["analyze", "built.pt.trace.json", "--hta", "-q"])
    assert out.exit_code == 0, out.output
    assert "validation failed" not in out.output
    assert [ln for ln in out.output.splitlines() if ln.startswith("idle")][0].split()[1:3] == ["140.0", "140.0"]


@needs_hta
def test_capture_samples_compare_with_hta():
    """GPU sample captures are read by HTA (they failed "Trace files validation failed" when
    given relative paths) and agrees with ours within 1% of the span at the trace's resolution."""
    samples = sorted(SAMPLE_TRACES.glob("gpu_*/*/combined.pt.trace.json.gz"))[:3]
    if not samples:
        pytest.skip(f"no GPU sample capture in {SAMPLE_TRACES}")
    for path in samples:
        comparison = hta_comparison(tokentrace.analyze(path))
        assert "error" not in comparison, (path, comparison)
        rows = {name: (ours, theirs) for name, ours, theirs in comparison["rows"]}
        assert abs(rows["idle"][0] - rows["idle"][1]) <= 0.01 * rows["span"][0], (path, rows)


def test_missing_hta_raises_one_line_hint(builder, tmp_path, monkeypatch):
    path = _built(builder, tmp_path)
    # Make `import hta...` fail as it does where the extra is not installed.
    monkeypatch.setitem(sys.modules, "hta", None)
    monkeypatch.setitem(sys.modules, "hta.trace_analysis", None)
    with pytest.raises(TokentraceError, match="HolisticTraceAnalysis is not installed"):
        hta_temporal_breakdown(path)
    out = CliRunner().invoke(main, ["analyze", str(path), "--hta", "-q"])
    assert out.exit_code == 2
    assert HINT in out.output and "Traceback" not in out.output
