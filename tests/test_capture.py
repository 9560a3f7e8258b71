"""tokentrace.capture through its Python API: tiny random-weight models captured on the CPU, end to end.

Every capture here uses the tiny presets, prompts of 8-16 tokens and 4 decode steps, so the whole
module runs in seconds; the expensive captures are module-scoped fixtures shared by the checks.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from capture_checks import check_phase_annotations, check_run_folder, check_timings, read_trace

import tokentrace
import tokentrace.profiling as tc
from tokentrace.errors import TokentraceError

NEW = 5  # max_new_tokens: the prefill token plus 4 decode steps
MANUAL = ("combined", "prefill", "decode")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tc.CaptureResult:
    out = tmp_path_factory.mktemp("sweep") / "out"
    # Python stacks off here to keep the sweep quick; the local-model test below runs the defaults.
    return tc.capture(preset="tiny-llama", prompt_lens=[8, 16], batches=[1, 2], max_new_tokens=NEW, out_dir=out,
                      device="cpu", warmup=1, with_stack=False, progress=False)


def test_sweep_writes_one_folder_per_run(sweep: tc.CaptureResult) -> None:
    names = sorted(r.name for r in sweep.runs)
    assert names == sorted(f"tiny-llama_p{p}_b{b}" for p in (8, 16) for b in (1, 2))
    top = json.loads((sweep.out_dir / "run.json").read_text())
    assert top["schema"] == 1 and top["shared"]["preset"] == "tiny-llama"
    assert [r["name"] for r in top["runs"]] == [r.name for r in sweep.runs]
    for r in top["runs"]:
        for rel in r["traces"].values():
            assert (sweep.out_dir / rel).is_file()
    # Nothing but the run folders and run.json: the staging folder was renamed, not left beside.
    assert sorted(p.name for p in sweep.out_dir.iterdir()) == sorted(names + ["run.json"])
    assert not [p for p in sweep.out_dir.parent.iterdir() if "tokentrace-tmp" in p.name]


def test_every_trace_has_metadata_annotations_and_timings(sweep: tc.CaptureResult) -> None:
    for run in sweep.runs:
        check_run_folder(run.path, kinds=MANUAL, prompt_len=run.prompt_len, batch=run.batch, max_new_tokens=NEW)
        check_timings(run.timings.to_dict(), steps=NEW - 1)
        meta = read_trace(run.traces["combined"])["tokentrace"]
        assert meta["preset"] == "tiny-llama" and meta["model"] is None
        assert meta["device"] == "cpu" and meta["dtype"] == "float32" and meta["gpu_name"] is None
        assert meta["config"]["num_layers"] == 2 and meta["config"]["num_kv_heads"] == 2
        assert meta["compile"] == "none" and meta["static_cache"] is False
        assert meta["attn_implementation"] == "sdpa"
        assert f"--prompt-lens {run.prompt_len} --batch {run.batch} " in meta["command"]


def test_traces_load_with_tokentrace_load(sweep: tc.CaptureResult) -> None:
    for run in sweep.runs:
        for kind, path in run.traces.items():
            trace = tokentrace.load(path)
            assert trace.meta["tokentrace"]["kind"] == kind
            ann = trace.events[trace.events["cat"] == "user_annotation"]
            names = list(ann["name"].astype(str))
            assert names.count("tokentrace/prefill") == (0 if kind == "decode" else 1)
            steps = [n for n in names if n.startswith("tokentrace/decode_step[")]
            assert len(steps) == (0 if kind == "prefill" else NEW - 1)
            assert ann["ts"].is_monotonic_increasing


def test_greedy_tokens_are_reproducible_and_static_cache_matches_dynamic() -> None:
    import torch

    from tokentrace.profiling.loop import DecodeLoop
    from tokentrace.profiling.models import load_model, resolve_source

    src = resolve_source("tiny-llama", None)
    model = load_model(src, torch.device("cpu"), torch.float32, "sdpa")
    ids = torch.randint(0, 1024, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        dyn = DecodeLoop(model, torch.device("cpu")).run(ids, NEW).host_tokens
        again = DecodeLoop(model, torch.device("cpu")).run(ids, NEW).host_tokens
        static = DecodeLoop(model, torch.device("cpu"), static_cache=True).run(ids, NEW).host_tokens
    assert len(dyn) == NEW and all(len(step) == 2 for step in dyn)
    assert dyn == again == static


def test_static_cache_gpt2_only_combined(tmp_path: Path) -> None:
    out = tmp_path / "gpt2"
    result = tc.capture(preset="tiny-gpt2", prompt_lens=8, batches=2, max_new_tokens=NEW, out_dir=out, device="cpu",
                        static_cache=True, attn_implementation="eager", traces="combined", with_stack=False, warmup=1,
                        progress=False)
    (run,) = result.runs
    check_run_folder(run.path, kinds=("combined",), prompt_len=8, batch=2, max_new_tokens=NEW)
    meta = read_trace(run.traces["combined"])["tokentrace"]
    assert meta["static_cache"] is True and meta["config"]["model_type"] == "gpt2"
    assert meta["profiler"]["with_stack"] is False and meta["attn_implementation"] == "eager"
    assert "--static-cache" in meta["command"] and "--traces combined" in meta["command"]


def test_generate_mode(tmp_path: Path) -> None:
    result = tc.capture(preset="tiny-gpt2", prompt_lens=8, batches=1, max_new_tokens=NEW, out_dir=tmp_path / "gen",
                        device="cpu", mode="generate", with_stack=False, warmup=1, progress=False)
    (run,) = result.runs
    check_run_folder(run.path, kinds=("generate",), prompt_len=8, batch=1, max_new_tokens=NEW)
    assert run.timings.clock == "perf_counter"


def _save_local_model(folder: Path) -> Path:
    """A tiny Llama saved with a word-level tokenizer: a real --model folder with no download."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from tokentrace.profiling.presets import build_config, get_preset
    from tokentrace.profiling.prompts import _FILLER

    words = sorted(set(_FILLER.replace(".", " .").split()))
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(build_config(get_preset("tiny-llama"))).save_pretrained(folder)
    return folder


def test_local_model_folder_with_tokenizer_times_tokenization(tmp_path: Path) -> None:
    model_dir = _save_local_model(tmp_path / "my-model")
    result = tc.capture(model=str(model_dir), prompt_lens=8, batches=1, max_new_tokens=NEW, out_dir=tmp_path / "out",
                        device="cpu", warmup=1, progress=False)  # every profiler option at its default
    (run,) = result.runs
    check_run_folder(run.path, kinds=MANUAL, prompt_len=8, batch=1, max_new_tokens=NEW)
    assert run.name == "my-model_p8_b1"
    assert run.timings.tokenize_us is not None and run.timings.tokenize_us > 0
    trace = read_trace(run.traces["combined"])
    assert trace["tokentrace"]["model"] == str(model_dir) and trace["tokentrace"]["preset"] is None
    assert trace["tokentrace"]["profiler"] == {"record_shapes": True, "profile_memory": True, "with_stack": True}
    assert any(e.get("cat") == "python_function" for e in trace["traceEvents"])  # stacks were recorded
    names = [e["name"] for e in trace["traceEvents"] if e.get("cat") == "user_annotation"]
    assert names[0] == "tokentrace/tokenize"
    check_phase_annotations(trace, prefill=True, steps=NEW - 1)


def test_user_context_manager(tmp_path: Path) -> None:
    import torch

    from tokentrace.profiling.models import load_model, resolve_source

    model = load_model(resolve_source("tiny-llama", None), torch.device("cpu"), torch.float32, "sdpa")
    ids = torch.randint(0, 1024, (1, 8))
    out = tmp_path / "mine"
    with torch.inference_mode(), tc.profile(out, model=model, prompt_len=8, batch=1, max_new_tokens=3, with_stack=False) as p:
        with p.prefill():
            logits = model(ids).logits
            tok = logits[:, -1].argmax(-1).cpu()
        for i in range(2):
            with p.decode_step(i):
                ids = torch.cat([ids, tok[:, None]], dim=1)
                tok = model(ids).logits[:, -1].argmax(-1).cpu()
    assert sorted(x.name for x in out.iterdir()) == ["run.json", "user.pt.trace.json.gz"]
    trace = read_trace(out / "user.pt.trace.json.gz")
    meta = trace["tokentrace"]
    assert meta["kind"] == "user" and meta["config"]["model_type"] == "llama" and meta["dtype"] == "float32"
    check_timings(meta["timings"], steps=2)
    check_phase_annotations(trace, prefill=True, steps=2)
    assert p.timings is not None and len(p.timings.decode_step_us) == 2


def test_user_context_manager_leaves_nothing_on_error(tmp_path: Path) -> None:
    out = tmp_path / "failed"
    with pytest.raises(RuntimeError, match="boom"):
        with tc.profile(out, device="cpu", with_stack=False) as p:
            with p.prefill():
                raise RuntimeError("boom")
    assert not out.exists() and list(tmp_path.iterdir()) == []


# -- bad input: one TokentraceError, nothing written -------------------------------------------

BAD = [
    (dict(preset="no-such-model"), "unknown preset 'no-such-model'"),
    (dict(model="./no/such/folder"), "does not exist"),
    (dict(preset="tiny-llama", model="x"), "exactly one of"),
    (dict(), "exactly one of"),
    (dict(preset="tiny-llama", prompt_lens=[300]), "exceeds tiny-llama's context of 256"),
    (dict(preset="tiny-llama", prompt_lens=[250], max_new_tokens=32), "exceeds"),
    (dict(preset="tiny-llama", compile="turbo"), "unknown value 'turbo'"),
    (dict(preset="tiny-llama", prompt_lens=[0]), "must be at least 1"),
    (dict(preset="tiny-llama", dtype="int3"), "unknown dtype"),
    (dict(preset="tiny-llama", traces="everything"), "unknown value 'everything'"),
    (dict(preset="tiny-llama", attn_implementation="flash_attention_2"), "flash"),
]


@pytest.mark.parametrize("kwargs,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_raises_one_line_and_writes_nothing(tmp_path: Path, kwargs: dict, message: str) -> None:
    out = tmp_path / "out"
    with pytest.raises(TokentraceError, match=re.escape(message)) as err:
        tc.capture(out_dir=out, device="cpu", progress=False, **kwargs)
    assert "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_hub_failure_is_one_line_pointing_at_offline_choices(tmp_path: Path) -> None:
    # local_files_only: the hub is never contacted, so the id cannot resolve (and tests stay offline).
    with pytest.raises(TokentraceError, match="from the Hugging Face hub.*local model folder.*--preset") as err:
        tc.capture(model="tokentrace-test/no-such-model", local_files_only=True, out_dir=tmp_path / "out", progress=False)
    assert "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_cuda_requested_without_cuda(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(TokentraceError, match="CUDA is not available"):
        tc.capture(preset="tiny-llama", device="cuda", out_dir=tmp_path / "out", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_non_empty_out_dir_needs_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    kwargs = dict(preset="tiny-llama", prompt_lens=8, max_new_tokens=2, out_dir=out, device="cpu", traces="combined",
                  with_stack=False, warmup=0, progress=False)
    with pytest.raises(TokentraceError, match="not empty.*--overwrite"):
        tc.capture(**kwargs)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    result = tc.capture(overwrite=True, **kwargs)
    assert sorted(p.name for p in out.iterdir()) == ["run.json", "tiny-llama_p8_b1"]
    assert len(result.runs[0].timings.decode_step_us) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging or backup folder left


def test_empty_existing_out_dir_is_used(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    tc.capture(preset="tiny-gpt2", prompt_lens=8, max_new_tokens=2, out_dir=out, device="cpu", traces="prefill",
               with_stack=False, warmup=0, progress=False)
    assert (out / "tiny-gpt2_p8_b1" / "prefill.pt.trace.json.gz").is_file()


def test_failure_mid_sweep_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tokentrace.profiling import runs

    calls = []
    real = runs.run_manual

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("GPU fell off the bus")
        return real(*args, **kwargs)

    monkeypatch.setattr(runs, "run_manual", flaky)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="bus"):
        tc.capture(preset="tiny-llama", prompt_lens=[8, 16], max_new_tokens=2, out_dir=out, device="cpu",
                   traces="combined", with_stack=False, warmup=0, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_presets_cover_the_real_architectures() -> None:
    from tokentrace.profiling.models import config_summary
    from tokentrace.profiling.presets import build_config

    want = {
        "gpt2": (12, 12, 12, 768, 50257, 1024),
        "llama-3.2-1b": (16, 32, 8, 2048, 128256, 131072),
        "qwen2.5-0.5b": (24, 14, 2, 896, 151936, 32768),
    }
    for name, (layers, heads, kv, hidden, vocab, ctx) in want.items():
        s = config_summary(build_config(tc.PRESETS[name]))
        got = (s["num_layers"], s["num_heads"], s["num_kv_heads"], s["hidden_size"], s["vocab_size"], s["max_position_embeddings"])
        assert got == (layers, heads, kv, hidden, vocab, ctx)
    assert config_summary(build_config(tc.PRESETS["llama-3.2-1b"]))["head_dim"] == 64


def test_finalize_trace_inserts_metadata_and_flags_missing_gpu_activity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import gzip

    from tokentrace.profiling.writer import finalize_trace

    raw = tmp_path / "raw.json"
    raw.write_text('{\n  "schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2}]}')
    out = finalize_trace(raw, tmp_path / "t.pt.trace.json.gz", {"kind": "combined", "device": "cuda"}, expect_gpu=True)
    data = json.loads(gzip.decompress(out.read_bytes()))
    assert data["schemaVersion"] == 1 and len(data["traceEvents"]) == 1
    assert data["tokentrace"]["kind"] == "combined"
    assert "no GPU kernels" in data["tokentrace"]["warnings"][0]
    assert "no GPU kernels" in capsys.readouterr().err
    assert not raw.exists()

    raw.write_text("{}")  # an empty object gets no dangling comma
    out = finalize_trace(raw, tmp_path / "e.json.gz", {"kind": "user"})
    assert json.loads(gzip.decompress(out.read_bytes())) == {"tokentrace": {"kind": "user"}}
