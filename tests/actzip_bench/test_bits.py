import torch

from actzip_bench.bits import BitsBenchConfig, run_bits


def test_bits_against_bound(tmp_path, monkeypatch):
    monkeypatch.setenv("ACTZIP_CACHE_DIR", str(tmp_path))
    cfg = BitsBenchConfig(preset="tiny", steps=3, batch_size=2, corpus_bytes=200_000, eval_batches=1, dtype="float32")
    rec = run_bits(cfg, torch.device("cpu"))
    assert len(rec["layers"]) == 2
    for layer in rec["layers"]:
        assert 0 < layer["density"] < 1
        # The codec never beats the bound, and sign packing never costs bits on non-negative activations.
        assert layer["bound_bits"] <= layer["codec_bits"]
        assert layer["bound_bits_signpack"] <= layer["codec_bits_signpack"] <= layer["codec_bits"]
