"""Plans: buckets, JSON round trip, a cached lookup's cost."""

import pytest

from actzip.errors import ConfigError
from actzip.memory.planner import Plan, UnitCosts, bucket_of

pytest.importorskip("scipy")


def _plan():
    units = [UnitCosts(f"h.{i}", ("keep", "checkpoint"), (100.0, 10.0), (0.0, 1.0), (0.0, 0.0), (0.0, 100.0))
             for i in range(3)]
    return Plan("sig", probe_tokens=64, budget_bytes=250.0, base_bytes=0.0, max_risk=0.0, units=units)


def test_buckets_are_powers_of_two():
    assert [bucket_of(t) for t in (0, 1, 2, 3, 64, 65, 1000)] == [1, 1, 2, 4, 64, 128, 1024]


def test_json_round_trip_keeps_costs_and_choices():
    plan = _plan()
    # one checkpointed unit: 200 + 10 + its 100-byte transient > 250; two: 100 + 20 + 100
    assert sorted(plan.options_for(64)) == ["checkpoint", "checkpoint", "keep"]
    back = Plan.from_json(plan.to_json())
    assert back.units == plan.units and back.chosen == plan.chosen
    with pytest.raises(ConfigError, match="format"):
        Plan.from_json("{}")
    with pytest.raises(ConfigError, match="not a plan"):
        Plan.from_json('{"format": 1}')


def test_a_lookup_is_solved_once_per_bucket():
    # (how long a cached lookup takes is measured by `actzip bench grpo`: plan_lookup_ms)
    plan = _plan()
    first = plan.options_for(64)
    assert plan.options_for(60) is first and plan.options_for(33) is first  # the same bucket: the cached list
    assert len(plan.chosen) == 1


def test_a_smaller_exposure_opens_the_lossy_option():
    from actzip.memory.planner import exposure_bucket

    # lossy: fewer bytes and less time than checkpointing, at a relative gradient error of 0.1 per unit
    units = [UnitCosts(f"h.{i}", ("keep", "checkpoint", "balanced"), (100.0, 10.0, 30.0), (0.0, 2.0, 1.0),
                       (0.0, 0.0, 0.1), (0.0, 100.0, 0.0)) for i in range(4)]
    plan = Plan("sig", probe_tokens=64, budget_bytes=250.0, base_bytes=0.0, max_risk=0.15, units=units)
    full = plan.options_for(64, 1.0)  # the risk budget allows one lossy unit: the rest keep or checkpoint
    assert full.count("balanced") == 1 and "checkpoint" in full
    # an eighth of the gradient: three lossy units and one kept fit the budget with no checkpointing
    assert sorted(plan.options_for(64, 2.0 ** -3)) == ["balanced"] * 3 + ["keep"]
    assert sorted(plan.options_for(64, 0.0)) == ["balanced"] * 3 + ["keep"]  # no gradient at all
    assert set(plan.chosen) == {(64, 1.0), (64, 0.125), (64, 0.0)}
    assert [exposure_bucket(e) for e in (0.0, 0.3, 1.0, 3.0)] == [0.0, 0.25, 1.0, 4.0]
    assert Plan.from_json(plan.to_json()).chosen == plan.chosen
