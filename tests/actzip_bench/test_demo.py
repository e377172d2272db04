"""``actzip demo``: the JSON schema, lossless gradients, fewer saved bytes, clear errors."""

import json
import math

import pytest
import torch

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


def poison_checkpoint(monkeypatch, change):
    """Make the gradient of each checkpointed block's first parameter ``change(g)``, its forward untouched (so
    the strategy's loss stays the reference's)."""
    import actzip_bench.models.gpt as gpt

    real, hooked = gpt.checkpoint, set()

    def wrapped(fn, *args, **kwargs):
        p = next(fn.parameters())
        if id(p) not in hooked:  # one hook per parameter, whatever the number of steps
            hooked.add(id(p))
            p.register_hook(change)
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(gpt, "checkpoint", wrapped)


@pytest.mark.parametrize(
    "change,check",
    [
        (lambda g: g * 1.5, lambda d: 0 < d < math.inf),
        (lambda g: torch.full_like(g, math.nan), math.isnan),
        (lambda g: torch.full_like(g, math.inf), math.isinf),
    ],
    ids=["changed", "nan", "inf"],
)
def test_a_changed_gradient_is_reported(monkeypatch, corpus_file, change, check):
    poison_checkpoint(monkeypatch, change)
    cfg = DemoConfig(preset="tiny", steps=1, warmup_steps=0, batch_size=2, text_file=str(corpus_file), device="cpu")
    runs = {r["strategy"]: r for r in run_demo(cfg, progress=False)["runs"]}
    assert runs["checkpoint"]["final_loss"] == runs["none"]["final_loss"]  # only the gradients differ
    assert check(runs["checkpoint"]["max_grad_abs_diff"]) and runs["checkpoint"]["lossless"] is False
    assert runs["none"]["lossless"] is True and runs["sparse"]["lossless"] is True
    assert runs["sparse"]["max_grad_abs_diff"] == 0.0


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
