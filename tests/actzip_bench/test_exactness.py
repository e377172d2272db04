import torch

from actzip_bench.exactness import MODES, VARIANTS, compare, run


def test_lossless_paths_are_bit_identical_on_the_cpu():
    record = run("tiny", batch=2, seq=32, dtype="float32", device=torch.device("cpu"))
    assert set(record["modes"]) == set(MODES)
    for rows in record["modes"].values():
        for variant in VARIANTS[1:]:
            assert rows[variant]["params_compared"] > 10
            assert rows[variant]["bit_identical"], (variant, rows[variant])
            assert rows[variant]["rel_error"] == 0.0


def test_a_changed_gradient_is_found():
    ref = {"a": torch.ones(3), "b": torch.zeros(2)}
    got = {"a": torch.ones(3), "b": torch.tensor([0.0, 1e-30])}
    row = compare(ref, got)
    assert not row["bit_identical"] and row["params_differing"] == 1 and row["first_differing"] == ["b"]
