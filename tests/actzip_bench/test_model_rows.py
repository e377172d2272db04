import torch

from actzip_bench.harness import VariantResult
from actzip_bench.model_rows import random_tokens, strategy_rows


def test_random_tokens_are_seeded_by_the_length_and_shifted_by_one():
    x, y = random_tokens(50, 2, 8, torch.device("cpu"))
    x2, _ = random_tokens(50, 2, 8, torch.device("cpu"))
    assert x.shape == y.shape == (2, 8) and torch.equal(x, x2) and torch.equal(x[:, 1:], y[:, :-1])


def test_rows_are_against_none():
    def result(name, ms, peak):
        r = VariantResult(name)
        r.times_ms.append(ms)
        r.peaks.append(peak)
        return r

    results = {"none": result("none", 10.0, 1000), "compress": result("compress", 11.0, 600)}
    rows = strategy_rows(results, 16, 2, 32, {"compress": 0}, {"none": 0.0, "compress": 0.0})
    by = {r["strategy"]: r for r in rows}
    assert abs(by["compress"]["time_vs_none"] - 1.1) < 1e-12 and by["compress"]["peak_vs_none"] == 0.6
    assert by["none"]["arena_refusals"] is None and by["compress"]["peak_bytes_per_token"] == 600 / 32
