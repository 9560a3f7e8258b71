"""Engine step names: every vLLM / SGLang / graph-capture form parsed to exact numbers, unknown
variants kept as plain steps, and the causal attention work of the sums checked against a count."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tokentrace.analysis.common import engine_steps as es
from tokentrace.analysis.common.engine_steps import parse

VLLM_MIXED = "execute_8192_context_9(sq8155sk8430sqsq7475785sqsk7671310)_generation_37(sq37sk34489sqsq37sqsk34489)"


def test_vllm_detailed_mixed_step():
    s = parse(VLLM_MIXED)
    assert (s.engine, s.form, s.kind, s.phase) == ("vllm", "vllm_detailed", "mixed", "mixed")
    assert (s.prefill_requests, s.prefill_tokens, s.prefill_kv_tokens, s.prefill_sqsq, s.prefill_sqsk) == (9, 8155, 8430, 7475785, 7671310)
    assert (s.decode_requests, s.decode_tokens, s.decode_kv_tokens, s.decode_sqsq, s.decode_sqsk) == (37, 37, 34489, 37, 34489)
    assert (s.total_tokens, s.requests, s.note) == (8192, 46, None)


@pytest.mark.parametrize(("name", "kind", "pre", "dec", "total"), [
    ("execute_14721_context_2(sq14721sk14721sqsq108745533sqsk108745533)_generation_0(sq0sk0sqsq0sqsk0)", "prefill", 2, 0, 14721),
    ("execute_64_context_0(sq0sk0sqsq0sqsk0)_generation_64(sq64sk131072sqsq64sqsk131072)", "decode", 0, 64, 64),
    ("execute_0_context_0(sq0sk0sqsq0sqsk0)_generation_0(sq0sk0sqsq0sqsk0)", "idle", 0, 0, 0),
])
def test_vllm_detailed_kinds(name, kind, pre, dec, total):
    s = parse(name)
    assert (s.kind, s.prefill_requests, s.decode_requests, s.total_tokens) == (kind, pre, dec, total)
    assert s.phase == {"prefill": "prefill", "decode": "decode", "idle": "other"}[kind]


def test_vllm_detailed_token_count_that_disagrees_is_noted_not_guessed():
    s = parse("execute_100_context_1(sq90sk90sqsq8100sqsk8100)_generation_0(sq0sk0sqsq0sqsk0)")
    assert s.total_tokens == 90 and s.kind == "prefill"
    assert "100 tokens" in s.note and "90" in s.note


@pytest.mark.parametrize(("name", "kind", "nc", "a", "ng", "e", "sqsq", "noted"), [
    ("execute_context_2(14721)_generation_0(0)", "prefill", 2, 14721, 0, 0, None, False),
    ("execute_context_0(0)_generation_64(64)", "decode", 0, 0, 64, 64, 0, False),
    ("execute_context_0(0)_generation_32(128)", "decode", 0, 0, 32, 128, 0, False),  # 4 speculative tokens each
    ("execute_context_2(6144)_generation_3(3)", "mixed", 2, 6144, 3, 3, None, False),
    # One prompt: its sum of squares is known without the detailed form; the second number is not used.
    ("execute_context_1(888_788544)_generation_0(0)", "prefill", 1, 888, 0, 0, 888 * 888, True),
])
def test_vllm_native_form(name, kind, nc, a, ng, e, sqsq, noted):
    s = parse(name)
    assert (s.form, s.kind, s.prefill_requests, s.prefill_tokens, s.decode_requests, s.decode_tokens) == ("vllm_native", kind, nc, a, ng, e)
    assert s.total_tokens == a + e and s.requests == nc + ng
    assert s.prefill_sqsq == sqsq and s.prefill_kv_tokens is None and s.decode_kv_tokens is None
    assert (s.note is not None) == noted
    if noted:
        assert "788544" in s.note and "not used" in s.note


def test_vllm_new_cached():
    new_only = parse("execute_new_3_cached_0")
    assert (new_only.kind, new_only.prefill_requests, new_only.requests) == ("prefill", 3, 3)
    # Cached requests may decode or continue a chunked prompt: the name does not say which.
    for name in ("execute_new_0_cached_32", "execute_new_2_cached_30"):
        s = parse(name)
        assert s.kind == "step" and s.phase == "step" and s.requests == 32 and "does not say" in s.note


@pytest.mark.parametrize(("name", "kind", "pre_req", "pre_tok", "dec_req", "dec_tok", "total"), [
    ("step[EXTEND bs=2 toks=14721]", "prefill", 2, 14721, 0, 0, 14721),
    ("step[DECODE bs=32]", "decode", 0, 0, 32, 32, 32),
    ("step[DECODE bs=117/128]", "decode", 0, 0, 117, 117, 117),  # CUDA-graph padding: the real batch first
    ("step[decode bs=8]", "decode", 0, 0, 8, 8, 8),  # the span's first, lower-case format
    ("step[prefill bs=1 toks=300]", "prefill", 1, 300, 0, 0, 300),
    ("step[mixed bs=5 ext=200 dec=4]", "mixed", 1, 200, 4, 4, 204),
    ("step[MIXED bs=2]", "mixed", None, None, None, None, None),  # exact kind, counts unknown
])
def test_sglang_native(name, kind, pre_req, pre_tok, dec_req, dec_tok, total):
    s = parse(name)
    assert (s.engine, s.form, s.kind) == ("sglang", "sglang", kind)
    assert (s.prefill_requests, s.prefill_tokens, s.decode_requests, s.decode_tokens, s.total_tokens) == (pre_req, pre_tok, dec_req, dec_tok, total)
    assert s.note is None


def test_sglang_roofline_fields():
    e = parse("step[EXTEND bs=2 toks=14721 c_sq=14721 c_sqsq=108745533 c_sqsk=108745533 c_sk=14721]")
    assert (e.form, e.kind, e.prefill_kv_tokens, e.prefill_sqsq, e.prefill_sqsk) == ("sglang_detailed", "prefill", 14721, 108745533, 108745533)
    d = parse("step[DECODE bs=64 g_sq=128 g_sqsq=256 g_sqsk=262144 g_sk=131072]")  # speculative: 2 tokens each
    assert (d.decode_requests, d.decode_tokens, d.decode_kv_tokens, d.total_tokens) == (64, 128, 131072, 128)
    m = parse("step[MIXED bs=66 c=2 g=64 c_sq=2048 c_sk=2048 c_sqsq=2097152 c_sqsk=2097152 g_sq=64 g_sk=65600 g_sqsq=64 g_sqsk=65600]")
    assert (m.kind, m.prefill_requests, m.prefill_tokens, m.decode_requests, m.decode_tokens, m.decode_kv_tokens) == ("mixed", 2, 2048, 64, 64, 65600)
    assert (m.total_tokens, m.requests) == (2112, 66)


def test_sglang_idle_and_other_modes():
    idle = parse("step[IDLE bs=0]")
    assert (idle.kind, idle.phase, idle.total_tokens) == ("idle", "other", 0)
    assert parse("step[idle]").kind == "idle"
    v = parse("step[TARGET_VERIFY bs=16]")
    assert (v.kind, v.requests) == ("step", 16) and "TARGET_VERIFY" in v.note
    # Words the parser does not know are kept in the note, the known fields still read.
    w = parse("step[DECODE smc-head-graph bs=8 toks=16]")
    assert (w.kind, w.decode_requests) == ("decode", 8) and "smc-head-graph" in w.note


def test_graph_capture_marks():
    g = parse("capture_32_DECODE")
    assert (g.engine, g.kind, g.phase, g.capture_size, g.capture_mode) == ("graph_capture", "capture", "other", 32, "DECODE")
    assert "decode graph of 32 requests" in g.note
    v = parse("capture_8192_PIECEWISE")
    assert (v.capture_size, v.capture_mode) == (8192, "PIECEWISE") and "8192 tokens" in v.note
    assert parse("capture_256_mixed_prefill").capture_mode == "mixed_prefill"


@pytest.mark.parametrize("name", [
    "execute_context_1(abc)_generation_0(0)", "execute_12_context_2(sq1sk2)_generation_0(sq0sk0sqsq0sqsk0)",
    "step[DECODE bs=32", "step[]", "capture_32_", "execute_new_x_cached_1",
])
def test_unknown_variants_are_plain_steps_with_a_note(name):
    s = parse(name)
    assert s is not None and s.kind == "step" and s.form == "unknown" and "not guessed" in s.note


@pytest.mark.parametrize("name", [
    "tokentrace/prefill", "ProfilerStep#3", "execute_model", "decode_step_3", "aten::mm", "step", "capture", "## forward ##",
])
def test_other_names_are_not_engine_steps(name):
    assert parse(name) is None and not es.is_engine_name(name)


def test_parse_names_keeps_rows_and_marks_unknowns():
    names = pd.Series(pd.Categorical(["aten::mm", VLLM_MIXED, "step[DECODE bs=4]", "aten::mm", VLLM_MIXED]), index=[10, 11, 12, 13, 14])
    t = es.parse_names(names)
    assert t.index.tolist() == [11, 12, 14]
    assert t["kind"].tolist() == ["mixed", "decode", "mixed"]
    assert t["decode_requests"].tolist() == [37, 4, 37]
    assert t["prefill_kv_tokens"].tolist() == [8430, -1, 8430]  # -1: the name does not say
    assert es.parse_names(pd.Series(["a", "b"])).empty


def _brute_force_pairs(requests: list[tuple[int, int]]) -> int:
    """Count causal query-key pairs one query at a time: (q new tokens, k keys after the step)."""
    total = 0
    for q, k in requests:
        for j in range(1, q + 1):
            total += sum(1 for key in range(1, k + 1) if key <= k - q + j)
    return total


@pytest.mark.parametrize("requests", [[(5, 5)], [(3, 10), (1, 7), (4, 4)], [(1, 100)] * 3, [(7, 20), (2, 2)]])
def test_causal_pairs_equal_a_brute_force_count(requests):
    sq = sum(q for q, _ in requests)
    sqsq = sum(q * q for q, _ in requests)
    sqsk = sum(q * k for q, k in requests)
    assert float(es.causal_pairs(sq, sqsq, sqsk)) == _brute_force_pairs(requests)


def test_attention_flops_of_the_vllm_mixed_step():
    # Context: 7671310 - (7475785 - 8155) / 2 pairs; decode: one per cached key.
    pairs = es.causal_pairs(8155, 7475785, 7671310) + es.causal_pairs(37, 37, 34489)
    assert float(pairs) == 3937495 + 34489
    # 64 query heads of 64, 24 layers: 2 * (64 + 64) * 64 FLOPs per pair and layer.
    assert float(es.attention_flops(pairs, 64, 64, layers=24)) == 4 * 64 * 64 * 3971984 * 24
    assert float(es.attention_flops(10, 2, 128, head_dim_v=64)) == 2 * (128 + 64) * 2 * 10
    np.testing.assert_array_equal(es.attention_flops(np.array([1.0, 2.0]), 1, 1), [4.0, 8.0])


def test_parse_names_counts_are_int64_with_minus_one_where_unknown():
    """parse_names fills unknown counts with -1 per distinct name: the frame converting each count
    column afterwards gave (repeated, unordered and non-engine names; no engine name at all)."""
    names = pd.Series(["execute_new_2_cached_0", "aten::mm", "step[DECODE bs=4]", "execute_new_2_cached_0",
                       "capture_8_DECODE", "execute_context_1(7)_generation_0(0)"], index=[5, 3, 9, 1, 7, 2])
    hits = [n for n in names if es.parse(n) is not None]
    ref = pd.DataFrame([es.parse(n).to_json() for n in hits], index=[5, 9, 1, 7, 2], columns=list(es.STEP_FIELDS))
    for c in es.COUNT_FIELDS:
        ref[c] = pd.to_numeric(ref[c], errors="coerce").fillna(-1).astype(np.int64)
    pd.testing.assert_frame_equal(es.parse_names(names), ref)
    none = es.parse_names(pd.Series(["aten::mm"]))
    assert none.empty and all(none[c].dtype == np.int64 for c in es.COUNT_FIELDS)
