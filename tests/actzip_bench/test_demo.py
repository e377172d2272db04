"""``actzip demo``: the JSON schema, lossless gradients, fewer saved bytes, clear errors."""

import json

import pytest

from actzip_bench.demo import DemoConfig, render, run_demo
from actzip_bench.cli import main
from actzip.errors import ConfigError

KEYS = {"strategy", "lossless", "saved_bytes_per_token", "peak_bytes", "step_time_s", "final_loss", "max_grad_abs_diff"}


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    # A small text file keeps the test independent of the stdlib cache and fast.
    import inspect

    import actzip_bench.models.gpt as gpt

    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text(inspect.getsource(gpt) * 4)
    return path


def test_cli_demo_writes_the_documented_json(tmp_path, corpus_file, capsys):
    out = tmp_path / "demo.json"
    rc = main(["demo", "--preset", "tiny", "--steps", "4", "--batch-size", "4", "--text-file", str(corpus_file),
               "--device", "cpu", "--json", str(out), "--no-progress"])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["device"] == "cpu"
    assert [r["strategy"] for r in result["runs"]] == ["none", "checkpoint", "sparse"]
    for r in result["runs"]:
        assert set(r) == KEYS
        assert r["lossless"] is True and r["peak_bytes"] is None
        assert r["step_time_s"] > 0 and r["final_loss"] > 0
    runs = {r["strategy"]: r for r in result["runs"]}
    assert runs["sparse"]["max_grad_abs_diff"] == 0.0
    assert runs["checkpoint"]["max_grad_abs_diff"] == 0.0
    assert runs["sparse"]["final_loss"] == runs["none"]["final_loss"]
    assert runs["sparse"]["saved_bytes_per_token"] <= 0.85 * runs["none"]["saved_bytes_per_token"]
    assert runs["checkpoint"]["saved_bytes_per_token"] < runs["sparse"]["saved_bytes_per_token"]
    assert "actzip demo" in capsys.readouterr().out


def test_small_preset_meets_the_saved_bytes_target(corpus_file):
    # The demo's claim on its default model: >= 20% fewer saved bytes per token, gradients bit-identical.
    cfg = DemoConfig(steps=3, warmup_steps=1, batch_size=2, text_file=str(corpus_file), device="cpu")
    result = run_demo(cfg, progress=False)
    runs = {r["strategy"]: r for r in result["runs"]}
    assert runs["sparse"]["saved_bytes_per_token"] <= 0.8 * runs["none"]["saved_bytes_per_token"]
    assert runs["sparse"]["max_grad_abs_diff"] == 0.0
    assert render(result).row_count == 3


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"strategies": ("none", "zip")}, "unknown strategies"),
        ({"steps": 0}, "steps"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"dtype": "float16"}, "dtype"),
    ],
)
def test_bad_demo_options(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        DemoConfig(**kwargs)


def test_cli_reports_actzip_errors_without_traceback(capsys):
    rc = main(["demo", "--preset", "huge", "--steps", "2", "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "actzip: error:" in err and "huge" in err
