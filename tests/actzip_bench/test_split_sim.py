"""The one-process split-learning simulation: every policy spends the same budget, and ModalShare's scores move
the ratios toward the useful stream."""

import pytest

from actzip.errors import ConfigError
from actzip_bench.split_sim import POLICIES, SplitSimConfig, run_split_sim
from actzip_bench.split_suites import load_suite


def test_policies_spend_the_same_budget_and_modalshare_favours_the_sensor():
    cfg = SplitSimConfig(steps=60, refresh=20, seeds=(0,), train=600, test=200)
    rec = run_split_sim(cfg)
    rows = {r["policy"]: r for r in rec["rows"]}
    assert set(rows) == set(POLICIES)
    for r in rows.values():
        assert r["compressor"] == "random" and r["budget"] == cfg.compression
        assert r["uplink_features"] == pytest.approx(r["budget_features"], rel=1e-9)
        assert 0.0 <= r["accuracy"] <= 1.0
        # the random mask sends about the budget's share of the dense bf16 payload, and as much back
        assert r["uplink_bytes"] == pytest.approx(r["dense_bytes"] / cfg.compression, rel=0.1)
        assert r["downlink_bytes"] == pytest.approx(r["uplink_bytes"], rel=0.1)
    ms = rows["modalshare"]
    assert len(ms["history"]) == 3 and ms["ratios"][1] > rows["equal"]["ratios"][1]  # the small strong stream
    assert 0 < ms["scoring_share"] < 1
    assert rows["equal-payload"]["ratios"][1] > rows["equal"]["ratios"][1]


@pytest.mark.parametrize("compressor", ["topk", "dct", "quant"])
def test_every_compressor_stays_within_the_budget(compressor):
    cfg = SplitSimConfig(steps=20, refresh=10, seeds=(0,), train=400, test=100, compressor=compressor,
                         policies=("equal", "modalshare"))
    for r in run_split_sim(cfg)["rows"]:
        assert 0 < r["uplink_bytes"] <= r["dense_bytes"] / cfg.compression * 1.001


def test_heldout_scoring_replaces_a_training_batch_at_each_refresh_and_spends_the_same_budget():
    cfg = SplitSimConfig(steps=40, refresh=10, seeds=(0,), train=600, test=200, score_on="heldout",
                         policies=("equal", "equal-payload", "modalshare"))
    rows = {r["policy"]: r for r in run_split_sim(cfg)["rows"]}
    # equal payload reads nothing from a batch: it trains on every step as before, its gradients all come down
    assert rows["modalshare"]["downlink_bytes"] < 0.95 * rows["equal-payload"]["downlink_bytes"]
    ms = rows["modalshare"]
    assert [h["step"] for h in ms["history"]] == [10, 20, 30, 40]
    assert ms["ratios"][1] > rows["equal"]["ratios"][1]  # the small strong stream, scored on unseen samples
    # the scoring batches go up like any other (the same payload a step); no gradient comes down for them
    assert ms["uplink_bytes"] == pytest.approx(rows["equal"]["uplink_bytes"], rel=0.1)
    assert ms["downlink_bytes"] == pytest.approx(ms["uplink_bytes"] * 36 / 40, rel=0.1)
    with pytest.raises(ConfigError, match="too few left"):
        run_split_sim(SplitSimConfig(steps=1, seeds=(0,), train=200, test=50, score_on="heldout",
                                     policies=("modalshare",)))


def test_after_a_mid_training_switch_modalshare_moves_the_budget_to_the_stream_that_became_useful():
    cfg = SplitSimConfig(steps=80, refresh=10, seeds=(0,), train=600, test=200, switch_step=40,
                         policies=("equal", "modalshare"))
    rec = run_split_sim(cfg)
    assert rec["suite"]["switch_at"] == 800 and rec["suite"]["n"] == 1600  # before the switch, then as many after
    ms = next(r for r in rec["rows"] if r["policy"] == "modalshare")
    before = next(h["ratios"] for h in ms["history"] if h["step"] == 40)  # scored on the last batch before
    assert before[1] > before[0]  # the sensor first
    assert ms["ratios"][0] > before[0] and ms["ratios"][1] < before[1]  # then the image, the sensor silent
    with pytest.raises(ConfigError, match="switch_step"):
        SplitSimConfig(dataset="digits", switch_step=10)
    with pytest.raises(ConfigError, match="switch_step"):
        SplitSimConfig(steps=10, switch_step=10)
    with pytest.raises(ConfigError, match="only the synthetic suite has a switch"):
        load_suite("digits", switched=True)


def test_bad_settings_are_refused():
    for bad in ({"widths": (8, 0)}, {"compression": 0.5}, {"policies": ("equal", "oracle")}, {"compressor": "zip"},
                {"dataset": "mnist"}, {"client": "mlp"}, {"channels": 0}, {"score_on": "test"}):
        with pytest.raises(ConfigError):
            SplitSimConfig(**bad)
    with pytest.raises(ConfigError, match="one entry per modality"):
        run_split_sim(SplitSimConfig(widths=(8, 8), steps=1, seeds=(0,), train=10, test=10))
    with pytest.raises(ConfigError, match="data_root"):
        run_split_sim(SplitSimConfig(dataset="mvsa", steps=1, seeds=(0,)))


def test_scoring_at_equal_shares_keeps_the_budget_and_is_refused_without_heldout_scoring():
    base = dict(steps=40, refresh=10, seeds=(0,), train=600, test=200, score_on="heldout", policies=("modalshare",))
    current = run_split_sim(SplitSimConfig(**base))["rows"][0]
    equal = run_split_sim(SplitSimConfig(**base, score_at="equal"))["rows"][0]
    assert equal["uplink_bytes"] == pytest.approx(current["uplink_bytes"], rel=0.1)
    assert [h["step"] for h in equal["history"]] == [10, 20, 30, 40]
    assert equal["history"][1]["scores"] != current["history"][1]["scores"]  # scored on other payloads
    with pytest.raises(ConfigError, match="score_at"):
        SplitSimConfig(score_at="equal")


def test_nearest_rounding_runs_and_is_recorded_and_an_unknown_one_is_refused():
    cfg = SplitSimConfig(compressor="dct", compression=10.0, steps=5, seeds=(0,), train=300, test=100,
                         policies=("equal",), rounding="nearest")
    rec = run_split_sim(cfg)
    assert rec["config"]["rounding"] == "nearest" and 0 <= rec["mean_accuracy"]["equal"] <= 1
    with pytest.raises(ConfigError, match="rounding"):
        SplitSimConfig(rounding="up")
