"""The MILP: one option per unit, least time under the peak and risk budgets, the minimum peak when none fits."""

import pytest

from actzip.errors import ConfigError
from actzip.memory.planner import UnitCosts, minimum_peak, solve

pytest.importorskip("scipy")

OPTS = ("keep", "checkpoint", "lossless", "balanced")


def unit(name, keep=100.0, exposure=1.0):
    #               keep    checkpoint   lossless   balanced (lossy)
    return UnitCosts(name, OPTS, (keep, 10.0, 60.0, 30.0), (0.0, 5.0, 1.0, 0.5), (0.0, 0.0, 0.0, 0.1),
                     (0.0, keep, 0.0, 0.0), exposure)


def test_a_budget_that_fits_keeps_everything():
    units = [unit(f"u{i}") for i in range(4)]
    assert solve(units, budget_bytes=400, base_bytes=0, max_risk=0) == [0, 0, 0, 0]


def test_a_tighter_budget_takes_the_cheapest_savings_first():
    units = [unit(f"u{i}") for i in range(4)]
    # 4 x lossless = 240 bytes at 4 s; checkpointing any unit costs 5 s and adds its 100-byte transient
    assert solve(units, budget_bytes=250, base_bytes=0, max_risk=0) == [2, 2, 2, 2]
    # 240 no longer fits; checkpointing brings a 100-byte transient, paid once: 3 checkpointed + 1 kept = 230
    # (15 s) beats 1 checkpointed + 3 lossless (too big) and every other mix
    picks = solve(units, budget_bytes=230, base_bytes=0, max_risk=0)
    assert sorted(picks) == [0, 1, 1, 1]


def test_the_transient_of_a_checkpointed_unit_counts_once():
    units = [unit(f"u{i}") for i in range(4)]
    # all checkpointed: 4 x 10 + the largest transient 100 = 140
    assert solve(units, budget_bytes=140, base_bytes=0, max_risk=0) == [1, 1, 1, 1]
    assert minimum_peak(units, base_bytes=0, max_risk=0) == pytest.approx(140)


def test_lossy_options_only_within_the_risk_budget_weighted_by_exposure():
    units = [unit("a", exposure=1.0), unit("b", exposure=10.0)]
    assert solve(units, 120, 0, max_risk=0.0) == [2, 2]  # 120 bytes, lossless
    with pytest.raises(ConfigError, match="below the smallest feasible peak"):
        solve(units, 100, 0, max_risk=0.0)
    # the lossy option is smaller and faster; its risk fits only where exposure is small
    assert solve(units, 100, 0, max_risk=0.5) == [3, 2]
    assert solve(units, 100, 0, max_risk=2.0) == [3, 3]


def test_a_budget_below_every_plan_names_the_minimum():
    units = [unit(f"u{i}") for i in range(3)]
    with pytest.raises(ConfigError, match="smallest feasible peak 130"):
        solve(units, budget_bytes=100, base_bytes=0, max_risk=0)
    with pytest.raises(ConfigError, match="smallest feasible peak 1,130"):
        solve(units, budget_bytes=1100, base_bytes=1000, max_risk=0)


def test_bad_costs_are_refused():
    with pytest.raises(ConfigError, match="one bytes, seconds"):
        UnitCosts("u", ("keep", "lossless"), (1.0,), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0))


def test_a_300_unit_model_gets_a_plan_within_its_budget():
    # (how long it takes is measured by `actzip bench grpo`: solve_300_units_s)
    units = [unit(f"u{i}", keep=100.0 + i % 7) for i in range(300)]
    picks = solve(units, budget_bytes=300 * 60, base_bytes=0, max_risk=0)
    assert len(picks) == 300 and sum(u.bytes[k] for u, k in zip(units, picks)) <= 300 * 60


def test_real_byte_counts_beside_millisecond_costs_get_the_optimum():
    # a 1B model's layers at eight thousand tokens: keeping one holds 680 MiB, checkpointing it 32.5 MiB for
    # 2.89 ms, offloading it nothing for 36.68 ms; 4,578 MiB to spend. The optimum keeps five layers and
    # checkpoints the other eleven (offloading would cost more time for nothing the budget needs)
    mib = 2**20
    units = [UnitCosts(f"layers.{i}", ("keep", "checkpoint", "offload"), (680 * mib, 32.5 * mib, 0.0),
                       (0.0, 2.89e-3, 36.68e-3), (0.0, 0.0, 0.0), (0.0, 680 * mib, 0.0)) for i in range(16)]
    picks = solve(units, budget_bytes=6003 * mib, base_bytes=1425 * mib, max_risk=0.0)
    assert sorted(picks).count(0) == 5 and picks.count(1) == 11 and 2 not in picks
    assert minimum_peak(units, 1425 * mib, 0.0) == 1425 * mib  # everything offloaded: the base alone
