"""Shapley scores of modalities: exact values of known games, the sampled estimate against them."""

import math

import pytest

from actzip.errors import ConfigError
from actzip.split import EXACT_MAX, shapley


def test_an_additive_game_gives_each_modality_its_own_worth_from_every_coalition_once():
    worth = [0.5, 2.0, -1.0, 0.25]
    calls = []

    def v(s):
        calls.append(s)
        return sum(worth[i] for i in s)

    got = shapley(v, 4)
    assert got.exact and got.orders == 0 and got.stderr == (0.0,) * 4
    assert all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(got.values, worth))
    assert got.evaluations == len(calls) == 2 ** 4 and len(set(calls)) == len(calls)
    assert all(list(s) == sorted(s) for s in calls)


def test_the_glove_game_and_efficiency():
    # one left glove (0), two right gloves (1, 2): a pair is worth 1. Shapley values: 2/3, 1/6, 1/6.
    def v(s):
        return float(0 in s and (1 in s or 2 in s))

    got = shapley(v, 3)
    assert all(math.isclose(a, b, rel_tol=1e-12) for a, b in zip(got.values, (2 / 3, 1 / 6, 1 / 6)))
    assert math.isclose(sum(got.values), v((0, 1, 2)) - v(()), rel_tol=1e-12)


def _game(n):
    # an interaction game: pairs (i, i+1) together add i/n; a symmetric null player would be 0
    def v(s):
        s = set(s)
        return sum(0.1 * (i + 1) for i in s) + sum(i / n for i in range(n - 1) if i in s and i + 1 in s)
    return v


def test_the_sampled_estimate_matches_the_exact_values_within_its_error_and_keeps_efficiency():
    n = 7
    v = _game(n)
    exact = shapley(v, n)
    est = shapley(v, n, samples=400, seed=3)
    assert not est.exact and est.orders == 400
    for e, m, se in zip(exact.values, est.values, est.stderr):
        assert abs(m - e) <= 5 * se + 1e-12  # player 0 has one marginal in every order: no error
    assert math.isclose(sum(est.values), v(tuple(range(n))) - v(()), rel_tol=1e-9)


def test_beyond_the_exact_limit_it_samples():
    n = EXACT_MAX + 2
    got = shapley(_game(n), n, samples=50)
    assert not got.exact and got.evaluations < 2 ** n
    assert shapley(_game(n), n).orders == 200  # the default


def test_a_null_player_gets_zero_and_symmetric_players_equal_shares():
    def v(s):
        return float(len(set(s) & {0, 1}) >= 1)  # modality 2 adds nothing

    got = shapley(v, 3)
    assert got.values[2] == 0.0 and math.isclose(got.values[0], got.values[1])


def test_bad_input_is_refused():
    with pytest.raises(ConfigError, match="n_modalities"):
        shapley(lambda s: 0.0, 0)
    with pytest.raises(ConfigError, match="samples"):
        shapley(lambda s: 0.0, 3, samples=1)
    with pytest.raises(ConfigError, match="not a number"):
        shapley(lambda s: "high", 2)
    with pytest.raises(ConfigError, match="finite"):
        shapley(lambda s: float("nan"), 2)
