"""`tokentrace capture` through click's CliRunner: output layout, the timing table, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from capture_checks import check_run_folder
from click.testing import CliRunner


def test_capture_cli_module_imports_without_torch() -> None:
    # `tokentrace --help` must work on a laptop without torch: the command module may not import it.
    code = "import sys, tokentrace.cli.capture, tokentrace.cli; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_list_presets() -> None:
    from tokentrace.cli.capture import capture_cmd

    result = CliRunner().invoke(capture_cmd, ["--list-presets"])
    assert result.exit_code == 0
    for name in ("gpt2", "llama-3.2-1b", "qwen2.5-0.5b", "tiny-llama", "tiny-gpt2"):
        assert name in result.output


def test_capture_registered_in_main_help() -> None:
    from tokentrace.cli import main

    result = CliRunner().invoke(main, ["capture", "--help"])
    assert result.exit_code == 0 and "--prompt-lens" in result.output


torch_needed = pytest.mark.skipif(
    not all(__import__("importlib").util.find_spec(m) for m in ("torch", "transformers")), reason="needs torch and transformers"
)


@torch_needed
def test_cli_capture_sweep(tmp_path: Path) -> None:
    from tokentrace.cli import main

    out = tmp_path / "out"
    args = ["capture", "--preset", "tiny-gpt2", "--prompt-lens", "8,12", "--batch", "2", "--max-new-tokens", "5",
            "--device", "cpu", "--warmup", "1", "--no-with-stack", "--no-progress", "-o", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "TTFT ms" in result.stdout and "tiny-gpt2_p12_b2" in result.stdout
    for p in (8, 12):
        check_run_folder(out / f"tiny-gpt2_p{p}_b2", kinds=("combined", "prefill", "decode"), prompt_len=p, batch=2, max_new_tokens=5)
    top = json.loads((out / "run.json").read_text())
    assert top["command"].startswith("tokentrace capture --preset tiny-gpt2 --prompt-lens 8,12 --batch 2 ")
    assert [r["prompt_len"] for r in top["runs"]] == [8, 12]


@torch_needed
@pytest.mark.parametrize(
    "args,message",
    [
        (["--preset", "gpt5"], "unknown preset 'gpt5'"),
        (["--model", "./missing/model"], "does not exist"),
        (["--preset", "tiny-llama", "--prompt-lens", "512"], "exceeds tiny-llama's context"),
        (["--preset", "tiny-llama", "--batch", "two"], "'two' is not a whole number"),
        (["--preset", "tiny-llama", "--no-out"], "No such option"),
    ],
)
def test_cli_bad_input_exit_2_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    from tokentrace.cli import main

    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["capture", *args, "--device", "cpu", "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []


@torch_needed
def test_cli_refuses_non_empty_out_dir(tmp_path: Path) -> None:
    from tokentrace.cli import main

    (tmp_path / "notes.txt").write_text("x")
    result = CliRunner().invoke(main, ["capture", "--preset", "tiny-llama", "--device", "cpu", "-o", str(tmp_path)])
    assert result.exit_code == 2
    assert "not empty" in result.stderr and "--overwrite" in result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


@torch_needed
def test_cli_cuda_without_cuda(tmp_path: Path) -> None:
    import torch

    from tokentrace.cli import main

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = CliRunner().invoke(main, ["capture", "--preset", "tiny-llama", "--device", "cuda", "-o", str(tmp_path / "o")])
    assert result.exit_code == 2 and "CUDA is not available" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_capture_cmd_raises_tokentrace_error_standalone(tmp_path: Path) -> None:
    # Without the main CLI around it the command raises the error the main CLI turns into exit 2.
    from tokentrace.cli.capture import capture_cmd
    from tokentrace.errors import TokentraceError

    with pytest.raises(TokentraceError, match="output folder is required"):
        capture_cmd.main(["--preset", "tiny-llama"], standalone_mode=False)
