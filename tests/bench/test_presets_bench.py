import json

from actzip.cli import main


def test_presets_bench_cli(tmp_path, monkeypatch):
    monkeypatch.setenv("ACTZIP_CACHE_DIR", str(tmp_path))
    out = tmp_path / "presets.json"
    rc = main(["bench", "presets", "--steps", "3", "--batch-size", "2", "--presets", "lossless,balanced",
               "--device", "cpu", "--json", str(out)])
    assert rc == 0
    rec = json.loads(out.read_text())
    runs = {r["preset"]: r for r in rec["runs"]}
    assert runs["lossless"]["val_loss_gap"] == 0.0
    assert runs["lossless"]["saved_bytes_per_token"] == runs["lossless"]["dense_bytes_per_token"]  # gelu: no zeros
    assert runs["balanced"]["saved_bytes_per_token"] < 0.8 * runs["lossless"]["saved_bytes_per_token"]
    assert out.with_suffix(".png").stat().st_size > 1000
