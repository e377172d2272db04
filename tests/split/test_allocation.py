"""Keep-ratios under one budget: the payload is the budget exactly, ratios in [0, 1], proportional to scores."""

import math
import random

import pytest

from actzip.errors import ConfigError
from actzip.split import equal_keep_ratios, keep_ratios


def _check_payload(k, sizes, budget):
    assert all(0.0 <= r <= 1.0 for r in k.ratios)
    assert math.isclose(k.payload(sizes), budget, rel_tol=1e-12)


def test_payload_shares_follow_the_scores_and_spend_the_budget_exactly():
    sizes, budget = [1000, 1000, 5000], 900
    k = keep_ratios([0.2, 0.6, 0.1], sizes, budget)
    _check_payload(k, sizes, budget)
    assert k.fallback is None and k.dropped == () and k.saturated == ()
    sent = [r * s for r, s in zip(k.ratios, sizes)]
    assert math.isclose(sent[1] / sent[0], 3.0) and math.isclose(sent[0] / sent[2], 2.0)


def test_a_small_useful_modality_is_sent_whole_and_the_rest_share_its_excess():
    sizes, budget = [100, 1000, 1000], 700
    k = keep_ratios([10.0, 1.0, 1.0], sizes, budget)  # its share of 700 would be 583 of its 100 elements
    _check_payload(k, sizes, budget)
    assert k.saturated == (0,) and k.ratios[0] == 1.0 and math.isclose(k.ratios[1], k.ratios[2])


def test_modalities_scored_zero_or_below_get_nothing():
    sizes, budget = [100, 100, 100], 90
    k = keep_ratios([0.5, 0.0, -0.3], sizes, budget)
    _check_payload(k, sizes, budget)
    assert k.dropped == (1, 2) and k.ratios[1:] == (0.0, 0.0)


def test_no_positive_score_falls_back_to_equal_ratios_and_says_so():
    sizes, budget = [10, 30], 20
    k = keep_ratios([0.0, -1.0], sizes, budget)
    assert k.fallback and "equal" in k.fallback and k.ratios == (0.5, 0.5)


def test_a_budget_past_what_the_useful_modalities_hold_goes_to_the_others_equally():
    sizes, budget = [10, 100, 100], 110
    k = keep_ratios([1.0, 0.0, 0.0], sizes, budget)
    _check_payload(k, sizes, budget)
    assert k.ratios[0] == 1.0 and math.isclose(k.ratios[1], 0.5) and k.fallback


@pytest.mark.parametrize("seed", range(20))
def test_random_scores_sizes_and_budgets(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 9)
    sizes = [rng.randint(1, 10_000) for _ in range(n)]
    scores = [rng.uniform(-0.2, 1.0) for _ in range(n)]
    budget = rng.uniform(0.01, 1.0) * sum(sizes)
    for k in (keep_ratios(scores, sizes, budget), equal_keep_ratios(sizes, budget)):
        _check_payload(k, sizes, budget)
    k = keep_ratios(scores, sizes, budget)
    free = [i for i in range(n) if 0 < k.ratios[i] < 1 and scores[i] > 0]
    for i in free:  # modalities not sent whole: elements sent / score the same for all
        lam = k.ratios[free[0]] * sizes[free[0]] / scores[free[0]]
        assert math.isclose(k.ratios[i] * sizes[i] / scores[i], lam, rel_tol=1e-9)
    for i in k.saturated:  # sent whole: its share would have been more than its size
        assert scores[i] * (lam if free else float("inf")) >= sizes[i] * (1 - 1e-9)


def test_bad_input_is_refused():
    with pytest.raises(ConfigError, match="budget"):
        keep_ratios([1.0], [10], 11)
    with pytest.raises(ConfigError, match="budget"):
        keep_ratios([1.0], [10], 0)
    with pytest.raises(ConfigError, match="sizes"):
        keep_ratios([1.0], [0], 1)
    with pytest.raises(ConfigError, match="2 scores for 1"):
        keep_ratios([1.0, 2.0], [10], 5)
    with pytest.raises(ConfigError, match="finite"):
        keep_ratios([float("inf")], [10], 5)


def test_floors_come_first_and_the_scores_share_the_rest():
    sizes, budget = [1000, 16, 1000], 400
    floor = [0.0, 0.25, 0.0]  # the small modality's least sendable payload: 4 of its 16 elements
    k = keep_ratios([1.0, 0.0, 1.0], sizes, budget, floor=floor)
    _check_payload(k, sizes, budget)
    assert k.ratios[1] == 0.25 and k.dropped == (1,)  # scored out, still sent at its floor
    assert math.isclose(k.ratios[0], k.ratios[2]) and math.isclose(k.ratios[0] * 1000, (400 - 4) / 2)


def test_a_floor_counts_toward_the_cap_of_a_modality_sent_whole():
    sizes, budget = [100, 1000], 500
    k = keep_ratios([10.0, 1.0], sizes, budget, floor=[0.5, 0.1])
    _check_payload(k, sizes, budget)
    assert k.ratios[0] == 1.0 and k.saturated == (0,) and math.isclose(k.ratios[1], 0.4)


def test_floors_that_do_not_fit_together_drop_the_largest_payload_first_and_say_so():
    sizes, budget = [100, 100, 10], 30
    k = keep_ratios([1.0, 1.0, 1.0], sizes, budget, floor=[0.2, 0.1, 1.0])
    _check_payload(k, sizes, budget)
    assert "[0]" in k.fallback and k.ratios[1] >= 0.1 and k.ratios[2] >= 1.0 - 1e-12


@pytest.mark.parametrize("seed", range(20))
def test_random_floors_are_kept_and_the_budget_spent(seed):
    rng = random.Random(100 + seed)
    n = rng.randint(1, 9)
    sizes = [rng.randint(1, 10_000) for _ in range(n)]
    scores = [rng.uniform(-0.2, 1.0) for _ in range(n)]
    budget = rng.uniform(0.05, 1.0) * sum(sizes)
    floor = [rng.uniform(0, 0.5 * budget / sum(sizes)) for _ in range(n)]  # they fit together
    k = keep_ratios(scores, sizes, budget, floor=floor)
    _check_payload(k, sizes, budget)
    assert all(r >= f - 1e-12 for r, f in zip(k.ratios, floor))


def test_bad_floors_are_refused():
    with pytest.raises(ConfigError, match="floor"):
        keep_ratios([1.0, 1.0], [10, 10], 5, floor=[0.1])
    with pytest.raises(ConfigError, match="floor"):
        keep_ratios([1.0, 1.0], [10, 10], 5, floor=[0.1, 1.5])
