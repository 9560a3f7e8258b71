"""`tokentrace capture --compile reduce-overhead` writes its graph map, and `analyze` reads it.

On the CPU torch.compile records no CUDA graphs, but the capture runs the same map pass a GPU run
does (the compiled decode step on CUDA-graph trees' warm-up path, profiled) and writes the same
file in the same place; the analyzer finds it through run.json and reads its compiled graph. The
matching of replays against such a map is tested on built traces in test_graph_map.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")
pytest.importorskip("transformers")

import tokentrace  # noqa: E402
from tokentrace.analysis.loading.graph_map import read_graph_map  # noqa: E402
from tokentrace.cli import main  # noqa: E402
from tokentrace.profiling.conventions import GRAPH_MAP_ANNOTATION  # noqa: E402

RUN = "tiny-llama_p8_b1_reduce-overhead"
MAP = "capture_traces/graph_map.pt.trace.json.gz"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ro") / "out"
    res = CliRunner().invoke(main, ["capture", "--preset", "tiny-llama", "--device", "cpu", "--compile", "reduce-overhead",
                                    "--prompt-lens", "8", "--max-new-tokens", "3", "--warmup", "1", "--traces", "decode",
                                    "--no-with-stack", "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


def test_capture_writes_the_map_beside_the_run_and_lists_it(run):
    folder = run / RUN
    assert (folder / MAP).is_file()
    assert json.loads((folder / "run.json").read_text())["graph_maps"] == [MAP]
    top = json.loads((run / "run.json").read_text())
    assert top["runs"][0]["graph_maps"] == [f"{RUN}/{MAP}"]
    # The map is not one of the run's traces: a folder of traces still holds only those.
    assert [Path(t.path).name for t in tokentrace.load_all(folder)] == ["decode.pt.trace.json.gz"]


def test_map_is_the_compiled_decode_step_of_the_replay_trace(run):
    folder = run / RUN
    trace = tokentrace.load(folder / MAP)
    assert trace.capture["kind"] == "graph_map" and trace.capture["profiler"]["with_stack"] is True
    names = set(trace.annotations["name"].astype(str))
    assert GRAPH_MAP_ANNOTATION in names
    m = read_graph_map(folder / MAP)
    assert [g.how for g in m.graphs] == ["eager_pass"]
    g = m.graphs[0]
    assert g.batch_size == 1 and g.kernels == 0  # no GPU: the compiled graph recorded no GPU work
    assert "recorded no GPU work" in m.notes[0]
    decode = tokentrace.load(folder / "decode.pt.trace.json.gz")
    keys = {n.split()[3] for n in decode.annotations["name"].astype(str) if n.startswith("## Call CompiledFxGraph")}
    assert keys == {g.fx_graph}  # the replays' compiled graph is the one the map ran


def test_analyze_finds_and_reads_the_map(run):
    out = CliRunner().invoke(main, ["analyze", str(run / RUN / "decode.pt.trace.json.gz"), "--json", "-"])
    assert out.exit_code == 0, out.output
    g = json.loads(out.output)["graphs"]
    assert [(m["found_by"], m["how"], m["kernels_recorded"]) for m in g["maps"]] == [("run.json", ["eager_pass"], 0)]
    m = read_graph_map(run / RUN / MAP)
    assert g["maps"][0]["compiled_graphs"] == [m.graphs[0].fx_graph]
    assert g["launches"] == 0  # a CPU run replays no graph
