"""health: built traces with one known defect each produce that check's warning, shown first everywhere."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import SAMPLE_TRACES, shared_trace
from tracebuilder import TraceBuilder

import tokentrace
from tokentrace.analysis.detectors.health import _before_window, _clocks, _Cols, _cropped_step, _gpu_beyond_host
from tokentrace.cli import main

# A real profiler clock: microseconds since boot or the epoch, far from zero.
T0 = 5_145_219_478_727.0


def health(builder: TraceBuilder, tmp_path) -> tuple[tokentrace.Analysis, dict]:
    a = tokentrace.analyze(builder.load(tmp_path))
    return a, a.to_json()["health"]


def failed(doc: dict) -> dict[str, dict]:
    return {k: c for k, c in doc["checks"].items() if c["status"] in ("warning", "error")}


def steps(b: TraceBuilder, n: int, t: float = T0, layers: int = 2) -> float:
    """A prefill and n decode steps, each annotated and ending with its token's copy to the host
    (3 launches per layer, plus the embedding, the argmax and the copy)."""
    r = b.llm_step(t, q_len=16, annotation="tokentrace/prefill", layers=layers)
    t = r["host_end"] + 5
    for i in range(n):
        r = b.llm_step(t, q_len=1, kv_len=17 + i, annotation=f"tokentrace/decode_step[{i}]", gpu_free_at=t, layers=layers)
        t = r["host_end"] + 5
    return t


def test_a_clean_generation_has_no_warning(tmp_path):
    b = TraceBuilder()
    steps(b, 4)
    a, doc = health(b, tmp_path)
    assert doc["ok"] and doc["warnings"] == [] and doc["untrusted"] == []
    assert {c["status"] for c in doc["checks"].values()} <= {"ok", "skipped"}
    assert a.warnings == [] and a.to_json()["warnings"] == []


def test_kernels_and_runtime_calls_at_timestamp_zero(tmp_path):
    # What a profiler session exported after the next one started looks like: CPU ops at real
    # times, every CUPTI event (kernels, launches) at ts 0 with duration 0.
    b = TraceBuilder()
    for i in range(6):
        t = T0 + 100 * i
        b.cpu_op("aten::mm", t, 20)
        corr = b.runtime("cudaLaunchKernel", 0.0, 0.0)
        b.gpu("gemm", 0.0, 0.0, corr=corr)
        b.flow(corr, 0.0, 0.0)
    a, doc = health(b, tmp_path)
    c = failed(doc)
    assert list(c) == ["timestamps"] and c["timestamps"]["status"] == "error"
    msg = c["timestamps"]["message"]
    assert "6 of 6 GPU activities at timestamp 0 with duration 0" in msg
    assert "6 of 6 runtime/driver calls at timestamp 0" in msg
    assert c["timestamps"]["count"] == 12
    assert "GPU busy/idle time, utilisation and gaps" in doc["untrusted"]
    # First in every output: the Analysis, the JSON's top level, the terminal before the headline.
    assert a.warnings == [msg] and a.to_json()["warnings"] == [msg]
    from tokentrace.reports.terminal import render_terminal

    text = render_terminal(a)
    assert text.index("timestamps are missing") < text.index("TTFT")


def test_constant_timestamps(tmp_path):
    b = TraceBuilder()
    for i in range(5):
        b.cpu_op("aten::mm", 10.0 * i, 5)
        b.launch("gemm", 10.0 * i + 1, 42.0, 0.0)  # every kernel at one instant
    _, doc = health(b, tmp_path)
    c = failed(doc)
    assert "timestamps" in c and "all 5 GPU activities at one timestamp (42.000 us)" in c["timestamps"]["message"]


def test_launches_without_any_gpu_activity(tmp_path):
    b = TraceBuilder()
    for i in range(12):
        b.cpu_op("aten::add", 100.0 * i, 20)
        b.runtime("cudaLaunchKernel", 100.0 * i + 1, 5)
    _, doc = health(b, tmp_path)
    c = failed(doc)
    assert list(c) == ["gpu_activity"] and c["gpu_activity"]["status"] == "error"
    assert c["gpu_activity"]["message"].startswith("12 launch calls but no GPU activity at all")


def test_many_launches_without_their_kernels_are_dropped_events(tmp_path):
    b = TraceBuilder()
    for i in range(40):
        b.cpu_op("aten::add", 100.0 * i, 20)
        if i % 2:
            b.launch("add", 100.0 * i + 1, 100.0 * i + 8, 4)
        else:
            b.runtime("cudaLaunchKernel", 100.0 * i + 1, 5)  # its kernel is not in the trace
    _, doc = health(b, tmp_path)
    c = failed(doc)["gpu_activity"]
    assert c["status"] == "warning" and c["count"] == 20 and "20 of 40 launch calls (50%)" in c["message"]


def test_launches_inside_a_graph_capture_record_instead_of_running(tmp_path):
    b = TraceBuilder()
    b.runtime("cudaStreamBeginCapture", 0, 2)
    for i in range(30):
        b.runtime("cudaLaunchKernel", 10.0 + 10 * i, 5)
    b.runtime("cudaStreamEndCapture", 400, 2)
    b.launch("k", 500, 505, 5)
    _, doc = health(b, tmp_path)
    assert doc["checks"]["gpu_activity"]["status"] == "ok"


def test_kernels_launched_before_the_window(tmp_path):
    b = TraceBuilder()
    # Three kernels with no launch call in the trace, then ordinary launches.
    for i in range(3):
        b.gpu("leftover", 0.0 + 10 * i, 8.0, corr=99_000 + i)
    for i in range(4):
        b.cpu_op("aten::add", 40.0 + 20 * i, 10)
        b.launch("add", 41.0 + 20 * i, 45.0 + 20 * i, 4)
    _, doc = health(b, tmp_path)
    c = failed(doc)
    assert list(c) == ["launched_before_window"]
    assert c["launched_before_window"]["count"] == 3 and "(24.0 us)" in c["launched_before_window"]["message"]


def test_gpu_running_far_past_the_last_cpu_event(tmp_path):
    b = TraceBuilder()
    for i in range(4):
        b.cpu_op("aten::add", 10.0 * i, 8)
        b.launch("add", 10.0 * i + 1, 10.0 * i + 3, 2)
    b.cpu_op("aten::mm", 50, 5)
    b.launch("long_gemm", 51, 60, 5000)  # the host timeline stops at 56 us, the GPU runs to 5060 us
    _, doc = health(b, tmp_path)
    c = failed(doc)
    assert list(c) == ["gpu_beyond_host"]
    assert c["gpu_beyond_host"]["evidence"]["gpu_end_after_host_us"] == pytest.approx(5060 - 56)


def test_a_step_cropped_mid_way(tmp_path):
    b = TraceBuilder()
    t = steps(b, 4, layers=6)
    # The profiler stopped half way through decode step 4: its first layers ran, its annotation never closed.
    b.llm_step(t, q_len=1, kv_len=21, annotation=None, gpu_free_at=t, layers=3)
    _, doc = health(b, tmp_path)
    c = failed(doc)
    assert list(c) == ["cropped_step"]
    msg = c["cropped_step"]["message"]
    assert "the profiler window cuts a step" in msg and "12 launches after the last step (tokentrace/decode_step[3], which has 21)" in msg
    assert "per-step numbers" in doc["untrusted"]


def test_setup_before_the_first_step_is_not_a_cut_step_but_a_cut_step_is(tmp_path):
    b = TraceBuilder()
    for i in range(3):  # e.g. a static KV cache zeroed before prefill
        b.launch("Memset (Device)", T0 - 100 + 5 * i, T0 - 99 + 5 * i, 1, api="cudaMemsetAsync", cat="gpu_memset")
    steps(b, 2)
    _, doc = health(b, tmp_path)
    assert doc["checks"]["cropped_step"]["status"] == "ok"
    assert doc["checks"]["cropped_step"]["evidence"]["launches_before_first_step"] == 3
    # Profiling that starts inside a decode step: the step's second half, then whole annotated steps.
    b2 = TraceBuilder()
    r = b2.llm_step(T0, q_len=1, kv_len=40, annotation=None)
    t = r["host_end"] + 5
    for i in range(3):
        r = b2.llm_step(t, q_len=1, kv_len=41 + i, annotation=f"tokentrace/decode_step[{i}]", gpu_free_at=t)
        t = r["host_end"] + 5
    _, doc2 = health(b2, tmp_path)
    c = failed(doc2)["cropped_step"]
    assert "9 launches before the first step (tokentrace/decode_step[0], which has 9)" in c["message"]


def test_gpu_activity_before_its_own_launch_means_clocks_disagree(tmp_path):
    b = TraceBuilder()
    for i in range(10):
        b.cpu_op("aten::add", 100.0 * i, 50)
        b.launch("add", 100.0 * i + 40, 100.0 * i + 10, 5)  # starts 30 us before the call that launched it
    _, doc = health(b, tmp_path)
    c = failed(doc)
    assert list(c) == ["clocks"] and "10 of 10 GPU activities (100%) start before the call" in c["clocks"]["message"]
    assert c["clocks"]["evidence"]["max_lead_us"] == pytest.approx(30.0)


def test_truncated_file_is_reported(tmp_path):
    b = TraceBuilder()
    steps(b, 2)
    path = b.write(tmp_path / "cut.pt.trace.json")
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * 0.8)])  # the process was killed while writing
    a = tokentrace.analyze(path)
    c = failed(a.to_json()["health"])
    assert "damaged_file" in c and "truncated" in c["damaged_file"]["message"]
    assert any("truncated" in w for w in a.warnings)


def test_zero_timestamp_sample_is_flagged_first(tmp_path):
    # A GPU capture of 2026-11-30 whose prefill session was exported after the decode session had
    # started: every CUPTI event at ts 0 (the capture module now exports each session at once).
    path = SAMPLE_TRACES / "gpu_gpt2_full" / "gpt2_p128_b1" / "prefill.pt.trace.json.gz"
    if not path.exists():
        pytest.skip(f"sample trace {path} is absent")
    res = CliRunner().invoke(main, ["analyze", str(path)])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    warning = next(i for i, line in enumerate(lines) if "warning" in line)
    assert "timestamps are missing" in lines[warning] and "259 of 259 GPU activities at timestamp 0" in lines[warning]
    assert warning < next(i for i, line in enumerate(lines) if "TTFT" in line)
    doc = json.loads(CliRunner().invoke(main, ["analyze", str(path), "--json", "-"]).stdout)
    assert doc["warnings"][0].startswith("timestamps are missing") and not doc["health"]["ok"]


def test_max_end_of_a_mask_with_and_without_the_row_that_ends_last():
    trace = tokentrace.load(shared_trace("h100_hf_qwen05b_forward_bs16.json.gz"), cache=False, progress=False)
    c = _Cols.of(trace)
    for mask in (c.gpu, c.host, c.api, c.op, c.gpu | c.op):
        if mask.any():
            assert c.max_end(mask) == int(c.end[mask].max())


def test_checks_without_a_mask_of_real_times_equal_those_with_an_all_true_one():
    # run() passes real=None when every event's times are real: the checks then skip the mask,
    # which must not change what they find.
    trace = tokentrace.load(shared_trace("h100_hf_qwen05b_forward_bs16.json.gz"), cache=False, progress=False)
    segments = tokentrace.analyze(trace).results["phases"].segments
    c = _Cols.of(trace)
    real = np.ones(len(c.ts), dtype=bool)
    for check in (_before_window, _gpu_beyond_host, _clocks):
        assert check(c, None).to_json() == check(c, real).to_json()
    # The launches' start times the segments hold give what gathering them gives.
    assert _clocks(c, None, segments.gpu_launch_times(trace)).to_json() == _clocks(c, None).to_json()
    cropped = _cropped_step(c, None, segments)
    assert cropped.status != "skipped" and cropped.to_json() == _cropped_step(c, real, segments).to_json()


def test_gpu_columns_are_the_events_at_the_gpu_rows_and_the_real_ones_a_subset(tmp_path):
    """_Cols' GPU and launch columns (from the narrow views) are the events' columns at those
    rows; real_gpu keeps the rows whose times are real, with their columns."""
    b = TraceBuilder()
    steps(b, 2)
    trace = b.load(tmp_path)
    c = _Cols.of(trace)
    assert len(c.gpu_rows) > 2 and (c.gpu_launch >= 0).any()
    assert (c.gpu_ts.tolist(), c.gpu_end.tolist()) == (c.ts[c.gpu_rows].tolist(), c.end[c.gpu_rows].tolist())
    assert c.gpu_launch.tolist() == c.launch[c.gpu_rows].tolist() and c.launch_ts.tolist() == c.ts[c.launch_rows].tolist()
    real = np.ones(len(c.ts), dtype=bool)
    real[c.gpu_rows[1]] = False
    g = c.real_gpu(real)
    assert g.rows.tolist() == np.delete(c.gpu_rows, 1).tolist() and g.ts.tolist() == c.ts[g.rows].tolist()
    assert (g.end.tolist(), g.launch.tolist()) == (c.end[g.rows].tolist(), c.launch[g.rows].tolist())
    assert c.real_gpu(None).rows is c.gpu_rows


@pytest.mark.parametrize("rows", [[0], [6], [2, 3], [0, 9], [4, 5, 17], [17], list(range(18))])
def test_last_true_is_the_last_row_of_the_mask_in_every_chunk(rows):
    """health's last-True search by chunks from the end (chunk of 4 over 18 rows: the last chunk
    partial) gives the same row as flatnonzero, in the first, a middle or the last chunk."""
    from tokentrace.analysis.detectors.health import _last_true

    mask = np.zeros(18, dtype=bool)
    mask[rows] = True
    assert _last_true(mask, chunk=4) == int(np.flatnonzero(mask)[-1]) == max(rows)
    assert _last_true(mask) == max(rows)
    with pytest.raises(ValueError):
        _last_true(np.zeros(5, dtype=bool), chunk=2)
