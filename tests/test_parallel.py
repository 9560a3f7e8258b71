"""Detectors in several threads (analysis.parallel, pipeline._run_detectors): the same summary,
errors and cache entries as in one; the rule for how many threads; what they share computed once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from conftest import SAMPLE_TRACES, shared_trace

from tokentrace.analysis import parallel, pipeline
from tokentrace.analysis.context import Context
from tokentrace.analysis.detectors import gaps, launches
from tokentrace.analysis.loading.loader import load
from tokentrace.analysis.pipeline import Options, run_pipeline

GPU_SAMPLES = sorted(SAMPLE_TRACES.glob("gpu_*/*/combined.pt.trace.json.gz"))


def _summary(path, jobs, **kw):
    return json.dumps(run_pipeline(path, Options(cache=False, jobs=jobs, **kw)).to_json(), sort_keys=False)


@pytest.mark.parametrize("path", GPU_SAMPLES[:3] or [None], ids=lambda p: p.parent.parent.name if p else "none")
def test_threads_give_the_summary_one_thread_gives(path):
    if path is None:
        pytest.skip("no GPU sample traces")
    one = _summary(path, 1)
    # Byte for byte, key order included: results are put in run order whatever thread ends first.
    assert _summary(path, 3) == one
    assert _summary(path, 2) == one


def test_threads_on_a_serving_engine_trace():
    path = shared_trace("mi300x_vllm_mixed_prefill_decode_piecewise_graph.json.gz")
    assert _summary(path, 4) == _summary(path, 1)


def test_a_failing_detector_and_its_readers_are_recorded_the_same(monkeypatch, capsys):
    path = GPU_SAMPLES[0] if GPU_SAMPLES else pytest.skip("no GPU sample traces")

    def broken(trace, ctx):
        time.sleep(0.05)  # its readers must wait for it, not read a result that is not there
        raise ValueError("odd input")

    monkeypatch.setattr(gaps, "run", broken)
    runs = {}
    for jobs in (1, 3):
        a = run_pipeline(path, Options(cache=False, jobs=jobs))
        runs[jobs] = (list(a.results), a.errors, list(a.seconds))
    assert runs[3] == runs[1]
    results, errors, seconds = runs[1]
    assert errors["gaps"] == "ValueError: odd input"
    # Every detector that NEEDS gaps reads the failed result: its own error says so.
    readers = [m.NAME for m in pipeline.RUN_ORDER if "gaps" in m.NEEDS]
    assert readers and all("the 'gaps' result, which failed" in errors[n] for n in readers)
    assert list(errors) == [m.NAME for m in pipeline.RUN_ORDER if m.NAME in errors]
    assert "gaps" not in results and seconds == [m.NAME for m in pipeline.RUN_ORDER]
    assert capsys.readouterr().err.count("gaps analysis failed") == 2


def test_a_reader_starts_only_after_what_it_needs(monkeypatch):
    path = GPU_SAMPLES[0] if GPU_SAMPLES else pytest.skip("no GPU sample traces")
    events: list[tuple[str, str]] = []
    real_gaps, real_launches = gaps.run, launches.run

    def slow_gaps(trace, ctx):
        events.append(("start", "gaps"))
        time.sleep(0.2)
        out = real_gaps(trace, ctx)
        events.append(("end", "gaps"))
        return out

    def watched_launches(trace, ctx):
        events.append(("start", "launches"))
        return real_launches(trace, ctx)

    monkeypatch.setattr(gaps, "run", slow_gaps)
    monkeypatch.setattr(launches, "run", watched_launches)
    a = run_pipeline(path, Options(cache=False, jobs=4))
    assert not a.errors
    assert events.index(("end", "gaps")) < events.index(("start", "launches"))


def test_threads_with_the_results_cache(cache_every_trace):
    path = GPU_SAMPLES[0] if GPU_SAMPLES else pytest.skip("no GPU sample traces")
    first = run_pipeline(path, Options(jobs=3))
    assert first.cached == ()
    again = run_pipeline(path, Options(jobs=3))
    assert again.cached == tuple(m.NAME for m in pipeline.RUN_ORDER)
    assert again.to_json() == first.to_json() == run_pipeline(path, Options(cache=False, jobs=1)).to_json()
    # Another min gap: gaps runs again, what reads it is refreshed from the cached results or run
    # once gaps is done, in threads as in one.
    other = run_pipeline(path, Options(jobs=3, min_gap_us=10.0))
    assert "gaps" not in other.cached and "phases" in other.cached
    assert other.to_json() == run_pipeline(path, Options(cache=False, jobs=1, min_gap_us=10.0)).to_json()


def test_how_many_threads(monkeypatch):
    monkeypatch.delenv(parallel.JOBS_ENV, raising=False)
    monkeypatch.setattr(parallel, "_program_pid", None)
    big = parallel.AUTO_MIN_EVENTS
    assert parallel.jobs(None, big) == 1  # a library: one thread unless asked
    assert parallel.jobs(3, 10) == 3 and parallel.jobs(0, big) == 1
    monkeypatch.setenv(parallel.JOBS_ENV, "5")
    assert parallel.jobs(None, 10) == 5 and parallel.jobs(2, 10) == 2
    monkeypatch.setenv(parallel.JOBS_ENV, "many")  # not a count: ignored
    assert parallel.jobs(None, big) == 1
    monkeypatch.delenv(parallel.JOBS_ENV)
    monkeypatch.setattr(parallel, "cpus", lambda: 16)
    parallel.allow_threads()
    assert parallel.jobs(None, big) == parallel.MAX_DEFAULT_JOBS
    assert parallel.jobs(None, big - 1) == 1  # a small trace: one thread
    monkeypatch.setattr(parallel, "cpus", lambda: 2)
    assert parallel.jobs(None, big) == 2
    # A process forked from the program (a worker of `ranks`) is not the program.
    monkeypatch.setattr(parallel, "_program_pid", os.getpid() + 1)
    assert parallel.jobs(None, big) == 1


def test_a_shared_value_is_computed_once_for_every_thread():
    trace = load(GPU_SAMPLES[0], cache=False) if GPU_SAMPLES else pytest.skip("no GPU sample traces")
    ctx = Context(trace, Options())
    calls = []

    def slow(t):
        calls.append(1)
        time.sleep(0.1)
        return object()

    views = [ctx.for_detector(f"d{i}", ()) for i in range(4)]
    got: list[object] = []
    threads = [threading.Thread(target=lambda v=v: got.append(v.shared(slow))) for v in views]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(got) == 4 and all(g is got[0] for g in got)


def test_the_program_allows_threads_and_the_api_does_not():
    code = (
        "import sys\n"
        "from tokentrace.analysis import parallel\n"
        "from tokentrace import cli\n"
        "n = parallel.AUTO_MIN_EVENTS\n"
        "print(parallel.jobs(None, n))\n"
        "sys.argv = ['tokentrace', '--version']\n"
        "try:\n    cli.run()\nexcept SystemExit:\n    pass\n"
        "print(parallel.jobs(None, n), parallel.cpus())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != parallel.JOBS_ENV}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout.split()
    before, after, cpus = out[0], out[-2], int(out[-1])
    assert before == "1"
    glibc = sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    assert int(after) == (min(parallel.MAX_DEFAULT_JOBS, cpus) if glibc else 1)


def test_the_jobs_option_of_a_command(monkeypatch):
    from click.testing import CliRunner

    from tokentrace.cli import main

    path = GPU_SAMPLES[0] if GPU_SAMPLES else pytest.skip("no GPU sample traces")
    threads: list[str] = []
    real_run = gaps.run
    monkeypatch.setattr(gaps, "run", lambda t, c: threads.append(threading.current_thread().name) or real_run(t, c))
    outs = []
    for jobs in ("1", "3"):
        r = CliRunner().invoke(main, ["analyze", str(path), "--no-cache", "--jobs", jobs, "--json", "-", "-q"])
        assert r.exit_code == 0, r.output
        outs.append(json.loads(r.stdout))
    assert outs[0] == outs[1]
    assert threads[0] == threading.main_thread().name and threads[1].startswith("tokentrace-detector")
    assert parallel.JOBS_ENV not in os.environ  # set for the command only
    r = CliRunner().invoke(main, ["analyze", str(path), "--jobs", "0"])
    assert r.exit_code == 2 and "--jobs" in r.output


def test_a_run_changes_nothing_the_detectors_share():
    """What threads share (the trace's events and its views) reads the same after a run as
    before it: no detector writes into them (the contract in pipeline's docstring)."""
    import pandas as pd

    path = GPU_SAMPLES[0] if GPU_SAMPLES else pytest.skip("no GPU sample traces")
    # The analysed trace (its graph replays attributed: a copy of the loaded one), whose views the
    # detectors made; a second run is given it as it is and reads those views again.
    trace = run_pipeline(load(path, cache=False), Options(jobs=1)).trace
    views = {k: v.copy(deep=True) for k, v in trace._narrow_cache.items()}
    kinds = {name: getattr(trace, name).copy(deep=True) for name in ("gpu", "kernels", "runtime", "cpu_ops")}
    events = trace.events.copy(deep=True)
    assert views and len(events)
    assert run_pipeline(trace, Options(jobs=3)).trace is trace
    pd.testing.assert_frame_equal(trace.events, events)
    for k, v in views.items():
        pd.testing.assert_frame_equal(trace._narrow_cache[k], v)
    for name, v in kinds.items():
        pd.testing.assert_frame_equal(getattr(trace, name), v)
