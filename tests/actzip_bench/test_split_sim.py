"""The one-process split-learning simulation: every policy spends the same budget, and ModalShare's scores move
the ratios toward the useful stream."""

import pytest

from actzip.errors import ConfigError
from actzip_bench.split_sim import SplitSimConfig, run_split_sim


def test_policies_spend_the_same_budget_and_modalshare_favours_the_sensor():
    cfg = SplitSimConfig(steps=60, refresh=20, seeds=(0,), train=600, test=200)
    rec = run_split_sim(cfg)
    rows = {r["policy"]: r for r in rec["rows"]}
    for r in rows.values():
        assert r["uplink_features"] == pytest.approx(r["budget_features"], rel=1e-9)
        assert 0.0 <= r["accuracy"] <= 1.0
    ms = rows["modalshare"]
    assert len(ms["history"]) == 3 and ms["ratios"][1] > rows["equal"]["ratios"][1]  # the small strong stream


def test_bad_settings_are_refused():
    for bad in ({"widths": (8, 8)}, {"compression": 0.5}, {"policies": ("equal", "oracle")}):
        with pytest.raises(ConfigError):
            SplitSimConfig(**bad)
