"""Users' phase patterns: the documented defaults, custom patterns replacing a role's defaults, and
the spellings the CLI, the API and the TOML config accept."""

from __future__ import annotations

import pytest

from tokentrace.analysis.common import phase_patterns as pp
from tokentrace.errors import TokentraceError


@pytest.mark.parametrize(("name", "role"), [
    ("prefill", "prefill"), ("Prefill", "prefill"), ("## prefill ##", "prefill"), ("##prefill##", "prefill"),
    ("decode", "decode"), ("DECODE", "decode"), ("decode_step_3", "decode"), ("decode_3", "decode"), ("decode[12]", "decode"),
    ("decode step 4", "decode"), ("## decode ##", "decode"), ("decode_step", "decode"),
    ("generate", "request"), ("## generate ##", "request"), ("Generate", "request"),
])
def test_default_patterns(name, role):
    assert pp.compile_patterns().role_of(name) == role


@pytest.mark.parametrize("name", [
    "prefill_cache", "decode_tokens", "my_decode", "aten::embedding", "ProfilerStep#1", "tokentrace/prefill",
    "generate_batch", "## forward ##", "decode[x]", "",
])
def test_default_patterns_match_whole_names_only(name):
    assert pp.compile_patterns().role_of(name) is None


def test_step_number():
    assert [pp.step_number(n) for n in ("decode_step_3", "decode[12]", "decode", "gen 7 of 9")] == [3, 12, -1, 7]


def test_a_custom_pattern_replaces_its_role_only():
    pats = pp.compile_patterns(pp.normalize({"decode": r"gen_step_\d+"}))
    assert pats.role_of("gen_step_5") == "decode" and pats.role_of("GEN_STEP_5") == "decode"
    assert pats.role_of("decode_step_5") is None  # the default decode patterns are gone
    assert pats.role_of("## prefill ##") == "prefill"  # the other roles keep theirs
    assert pats.custom == frozenset({"decode"})
    assert pats.describe()["decode"] == [r"gen_step_\d+"]


def test_several_patterns_for_one_role():
    pats = pp.compile_patterns(pp.normalize(["decode=tok_\\d+", "decode=spec_\\d+", "prefill=prompt"]))
    assert [pats.role_of(n) for n in ("tok_1", "spec_2", "prompt", "prefill")] == ["decode", "decode", "prefill", None]


@pytest.mark.parametrize("spec", [
    {"decode": "a", "prefill": ["b", "c"]}, [("decode", "a"), ("prefill", "b"), ("prefill", "c")],
    ["decode=a", "prefill=b", "prefill=c"],
])
def test_normalize_accepts_each_spelling(spec):
    assert sorted(pp.normalize(spec)) == [("decode", "a"), ("prefill", "b"), ("prefill", "c")]


def test_a_regex_holding_equals_signs_keeps_them():
    assert pp.parse_spec("decode=step(?P<x>=)") == ("decode", "step(?P<x>=)")
    assert pp.normalize(None) == () and pp.normalize("Prefill=x") == (("prefill", "x"),)


@pytest.mark.parametrize(("spec", "message"), [
    ("decode", "not ROLE=REGEX"), ("decode=", "not ROLE=REGEX"), ("bogus=x", "unknown phase role 'bogus'"),
    ("decode=(", "not a valid regular expression"),
])
def test_bad_specs_name_the_problem(spec, message):
    with pytest.raises(TokentraceError, match="--phase") as exc:
        pp.parse_spec(spec)
    assert message in str(exc.value)


def test_bad_mapping_values():
    with pytest.raises(TokentraceError, match="cfg.toml: phases: decode pattern must be a string"):
        pp.normalize({"decode": [3]}, "cfg.toml: phases")
    with pytest.raises(TokentraceError, match="neither ROLE=REGEX"):
        pp.normalize([("decode",)])  # type: ignore[list-item]


@pytest.mark.parametrize("rows_per_name", [0, 10**6])
@pytest.mark.parametrize("rows", [[], [2, -1, 0, 2], [3, 3, 1, -1, 0, 2, 4, 1] * 2])
def test_names_matched_per_name_present_as_per_category(rows, rows_per_name, monkeypatch):
    """A view is matched per name present or per category of the trace (latency.names_to_test,
    used by regex_mask and step_markers._role_hits, by rows per name): the same masks and roles
    either way, rows without a name included."""
    import re

    import numpy as np
    import pandas as pd

    from tokentrace.analysis.common import latency as lat
    from tokentrace.analysis.common import step_markers as sm

    monkeypatch.setattr(lat, "_ROWS_PER_NAME", rows_per_name)
    monkeypatch.setattr(sm, "_ROWS_PER_NAME_ROLE", rows_per_name)
    cats = ["decode_step_1", "ProfilerStep#3", "aten::mm", "prefill", "generate"]
    names = pd.Series(pd.Categorical.from_codes(np.array(rows, np.int8), categories=cats))
    assert isinstance(lat.names_to_test(names)[0], list) == (rows_per_name > 0)
    pattern = re.compile(r"Step|mm$")
    assert lat.regex_mask(names, pattern).tolist() == [c >= 0 and bool(pattern.search(cats[c])) for c in rows]
    patterns = pp.compile_patterns()
    hit, role = sm._role_hits(names, patterns)
    expect = [patterns.role_of(cats[c]) or "" if c >= 0 else "" for c in rows]
    assert hit.tolist() == [r != "" for r in expect]
    assert role.tolist() == [r for r in expect if r]


@pytest.mark.parametrize("specs", [(), (("decode", r"gen_step_\d+"), ("prefill", "decode_step_1")),
                                   (("request", "prefill"), ("decode", "pre.*")), (("prefill", r"(a)\1"),),
                                   (("decode", "x|y"), ("request", "(?i)gen"))])
def test_one_combined_regex_gives_each_names_role_as_testing_each_pattern(specs):
    # The first role (in ROLES order) with a pattern matching the whole name: from one combined
    # regex where the patterns have no groups of their own, else pattern by pattern.
    pats = pp.compile_patterns(specs)
    assert (pats.combined is None) == any(r in ("(a)\\1", "(?i)gen") for _, r in specs)
    names = ["prefill", " Prefill ", "decode_step_1", "decode", "gen_step_5", "GEN", "generate", "aa", "x", "y",
             "## decode ##", "prefilled", "pre", ""]
    for name in names:
        want = next((role for role in pp.ROLES if any(p.fullmatch(name.strip()) for p in pats.patterns.get(role, ()))), None)
        assert pats.role_of(name) == want, name
    assert [pats.role_of(n) for n in ("prefill", "decode_step_1", "generate")] == {
        (): ["prefill", "decode", "request"],
        (("decode", r"gen_step_\d+"), ("prefill", "decode_step_1")): [None, "prefill", "request"],
        (("request", "prefill"), ("decode", "pre.*")): ["prefill", None, None],
        (("prefill", r"(a)\1"),): [None, "decode", "request"],
        (("decode", "x|y"), ("request", "(?i)gen")): ["prefill", None, None],
    }[specs]
