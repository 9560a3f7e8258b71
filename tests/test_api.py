"""The Python API: plain typed functions with real signatures, and the CLI commands that call them."""

from __future__ import annotations

import inspect

import pytest
from click.testing import CliRunner

import tokentrace
from tokentrace import api
from tokentrace.cli import main
from tokentrace.errors import TokentraceError

API = ("analyze", "capture", "check", "diff", "load", "load_all", "ranks", "report", "scaling")


def test_analyze_has_its_real_signature():
    params = inspect.signature(tokentrace.analyze).parameters
    names = list(params)
    assert names[0] == "trace" and {"min_gap_us", "graph_maps", "options"} <= set(names)
    assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in names[1:])
    assert params["min_gap_us"].kind is inspect.Parameter.KEYWORD_ONLY and params["min_gap_us"].default is None
    assert tokentrace.analyze is api.analyze and inspect.isfunction(tokentrace.analyze)


def test_unknown_keyword_arguments_raise_type_error(tmp_path):
    # Refused before anything is read: the path need not exist.
    with pytest.raises(TypeError, match="min_gap"):
        tokentrace.analyze(tmp_path / "absent.json", min_gap=500)
    with pytest.raises(TypeError):
        tokentrace.report(tmp_path / "absent.json", fmt="html")
    with pytest.raises(TypeError):
        tokentrace.diff("a", "b", min_gap=1.0)


@pytest.mark.parametrize("name", API)
def test_every_noun_is_a_plain_function(name):
    fn = getattr(tokentrace, name)
    assert inspect.isfunction(fn) and fn.__doc__
    kinds = {p.kind for p in inspect.signature(fn).parameters.values()}
    assert not {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD} <= kinds  # no (*args, **kwargs) facade


def test_dir_lists_the_api():
    listed = dir(tokentrace)
    assert set(API) | {"Analysis", "Trace", "TokentraceError", "TraceError", "__version__"} <= set(listed)
    assert tokentrace.Trace.__name__ == "Trace" and tokentrace.Analysis.__name__ == "Analysis"


# Each command with arguments, the api function it must call, and what that function must receive.
COMMANDS = [
    (["analyze", "t.json", "--min-gap-us", "5"], "analyze", (("t.json",), {"min_gap_us": 5.0})),
    (["report", "a.json", "b.json", "-o", "r.html"], "report", ((["a.json", "b.json"], "r.html"), {"format": None, "min_gap_us": None})),
    (["diff", "base.json", "test.json"], "diff", (("base.json", "test.json"), {"min_gap_us": None})),
    (["check", "t.json", "--max-tpot-us", "20000"], "check", (("t.json",), {"max_tpot_us": 20000.0, "baseline": None})),
    (["scaling", "runs"], "scaling", ((["runs"],), {})),
    (["ranks", "dir", "--workers", "2"], "ranks", ((["dir"],), {"workers": 2})),
    (["capture", "--preset", "tiny-llama", "-o", "out"], "capture", ((), {"preset": "tiny-llama", "out_dir": "out"})),
]


@pytest.mark.parametrize("argv, name, expected", COMMANDS, ids=[c[1] for c in COMMANDS])
def test_each_command_calls_its_api_function(monkeypatch, argv, name, expected):
    calls = []

    def fake(*args, **kwargs):
        calls.append((args, kwargs))
        raise TokentraceError(f"fake {name} called")  # the command stops here: exit 2 with this line

    monkeypatch.setattr(tokentrace, name, fake)
    res = CliRunner().invoke(main, argv)
    assert res.exit_code == 2, res.output
    assert f"fake {name} called" in res.output
    assert len(calls) == 1
    args, kwargs = calls[0]
    want_args, want_kwargs = expected
    assert [str(a) if not isinstance(a, list) else [str(x) for x in a] for a in args] == list(want_args)
    for key, value in want_kwargs.items():
        got = kwargs[key]
        assert (str(got) if key == "out_dir" else got) == value, key


def test_importing_tokentrace_or_the_loader_leaves_the_capture_code_unread():
    """`import tokentrace`, and the analysis modules a repeat run imports, read only the capture
    side's conventions; its capture code (~50 ms of modules) loads when `capture` is first used,
    as the very function the capture package defines."""
    import subprocess
    import sys

    code = ("import sys, tokentrace, tokentrace.analysis.pipeline, tokentrace.analysis.compare.diff; "
            "print(sorted(m for m in sys.modules if m.startswith('tokentrace.profiling'))); "
            "from tokentrace.profiling.api import capture; "
            "import tokentrace.profiling as p; from tokentrace.api import capture as c; "
            "print(tokentrace.capture is capture is c is p.capture, p.PRESETS is sys.modules['tokentrace.profiling.presets'].PRESETS)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    first, second = out.stdout.splitlines()
    assert first == "['tokentrace.profiling', 'tokentrace.profiling.conventions']"
    assert second == "True True"
    import tokentrace.profiling as prof

    assert sorted(prof.__all__) == sorted(prof._EXPORTS) and all(getattr(prof, n) is not None for n in prof.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = prof.nothing  # type: ignore[attr-defined]
