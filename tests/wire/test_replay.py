"""The link model's replay: a recorded schedule over modelled uplinks, with the data-parallel syncs."""

import pytest

from actzip.wire import Sync, dp_sync, dp_sync_seconds
from actzip.wire.link import Action, LinkSpec
from actzip.errors import ConfigError
from actzip.wire.replay import exchange_seconds, simulate
from actzip.wire.transport import WireError


def _two_stage_step(fwd_bytes, bwd_bytes, f=1.0, b=2.0, o=0.5):
    """One GPipe step, one microbatch: F0 -> F1 (loss) -> B1 -> B0, then both optimizers."""
    return [
        Action(0, 0, "F", 0, f, None, (0, "fwd", 0, 0), fwd_bytes),
        Action(0, 0, "B", 0, b, (0, "bwd", 0, 0), None, 0),
        Action(0, 0, "O", -1, o),
        Action(1, 0, "F", 0, f, (0, "fwd", 0, 0), None, 0),
        Action(1, 0, "B", 0, b, None, (0, "bwd", 0, 0), bwd_bytes),
        Action(1, 0, "O", -1, o),
    ]


def test_simulate_by_hand():
    acts = _two_stage_step(1_000_000, 500_000)
    # 8 Mbps: 1 MB takes 1 s, 0.5 MB 0.5 s; latency 0.25 s each way.
    tl = simulate(acts, LinkSpec(8.0, 250.0))
    # stage 0: F ends 1.0; fwd arrives 1.0 + 0.25 + 1.0 = 2.25; stage 1: F ends 3.25, B ends 5.25;
    # bwd arrives 5.25 + 0.25 + 0.5 = 6.0; stage 0: B ends 8.0, O ends 8.5; stage 1: O ends 5.75.
    assert tl.step_end_s == [pytest.approx(8.5)]
    assert tl.busy_s == [pytest.approx(3.5), pytest.approx(3.5)]
    assert tl.link_bytes == {"b0.bwd": 500_000, "b0.fwd": 1_000_000}
    assert simulate(acts, LinkSpec()).total_s == pytest.approx(1 + 1 + 2 + 2 + 0.5)


def test_simulate_overlaps_communication_with_compute():
    # Two microbatches: the second forward runs while the first's activation is on the wire.
    acts = [
        Action(0, 0, "F", 0, 1.0, None, (0, "fwd", 0, 0), 1_000_000),
        Action(0, 0, "F", 1, 1.0, None, (0, "fwd", 0, 1), 1_000_000),
        Action(0, 0, "O", -1, 0.0),
        Action(1, 0, "F", 0, 1.0, (0, "fwd", 0, 0)),
        Action(1, 0, "F", 1, 1.0, (0, "fwd", 0, 1)),
        Action(1, 0, "O", -1, 0.0),
    ]
    tl = simulate(acts, LinkSpec(8.0, 0.0))
    # arrivals 2.0 and max(2.0, 2.0) + 1.0 = 3.0; stage 1 ends at 4.0, not 5.0 (no overlap) or 6.0.
    assert tl.total_s == pytest.approx(4.0)


def test_simulate_refuses_an_impossible_trace():
    acts = [Action(0, 0, "F", 0, 1.0, (0, "bwd", 0, 0)), Action(1, 0, "F", 0, 1.0, (0, "fwd", 0, 0))]
    with pytest.raises(WireError, match="cannot proceed"):
        simulate(acts, LinkSpec())


def test_dp_sync_seconds_counts_ring_and_gather_traffic():
    link = LinkSpec(bandwidth_mbps=8.0, latency_ms=10.0)  # 1 MB/s
    assert dp_sync_seconds({"all_reduce": 1_000_000}, 1, link) == 0.0
    # ring all-reduce of 1 MB over 2 replicas: 1 MB on the wire, two hops
    assert dp_sync_seconds({"all_reduce": 1_000_000}, 2, link) == pytest.approx(1.0 + 0.02)
    assert dp_sync_seconds({"all_gather": 500_000}, 3, link) == pytest.approx(1.0 + 0.02)


def test_simulate_adds_the_sync_time_before_each_update():
    acts = [Action(0, 0, "F", 0, 0.1, None, (0, "fwd", 0, 0), 100), Action(1, 0, "F", 0, 0.1, (0, "fwd", 0, 0)),
            Action(1, 0, "B", 0, 0.1, None, (0, "bwd", 0, 0), 100), Action(1, 0, "O", -1, 0.0),
            Action(0, 0, "B", 0, 0.1, (0, "bwd", 0, 0)), Action(0, 0, "O", -1, 0.0)]
    plain = simulate(acts, LinkSpec())
    assert simulate(acts, LinkSpec(), {(0, 0): Sync(host_s=0.5)}).total_s == pytest.approx(plain.total_s + 0.5)
    # alone on its uplink: the host work, the bytes at the bandwidth, a latency per hop
    link = LinkSpec(8.0, 10.0)
    synced = simulate(acts, link, {(0, 0): Sync(wire_bytes=1_000_000, hops=2, host_s=0.5)})
    assert synced.total_s == pytest.approx(simulate(acts, link).total_s + 0.5 + 1.0 + 0.02)


def test_dp_sync_prices_ring_and_gather_traffic_for_the_replay():
    assert dp_sync({"all_reduce": 1_000_000}, 2, 0.1) == Sync(1_000_000, 2, 0.1)
    assert dp_sync({"all_gather": 500_000, "all_reduce": 0}, 3) == Sync(1_000_000, 2, 0.0)
    assert dp_sync({"all_reduce": 1_000_000}, 1, 0.1) == Sync(host_s=0.1)


@pytest.mark.parametrize("sync_bytes", [500_000, 100_000])
def test_a_sync_shares_the_uplink_with_the_stages_messages_still_on_it(sync_bytes):
    # 8 Mbps (1 MB/s), 0.25 s latency. Stage 1's backward message (1 MB) enters its uplink at 0.8001 and alone
    # would arrive at 1.8001; its sync's bytes enter at the same moment (its first hop's latency after the
    # backward) and the two go up at half the rate each until the shorter is through
    acts = [Action(0, 0, "F", 0, 0.1, None, (0, "fwd", 0, 0), 100), Action(1, 0, "F", 0, 0.1, (0, "fwd", 0, 0)),
            Action(1, 0, "B", 0, 0.1, None, (0, "bwd", 0, 0), 1_000_000), Action(1, 0, "O", -1, 0.0),
            Action(0, 0, "B", 0, 0.1, (0, "bwd", 0, 0)), Action(0, 0, "O", -1, 0.0)]
    link = LinkSpec(8.0, 250.0)
    assert simulate(acts, link).step_end_s == [pytest.approx(1.9001)]
    tl = simulate(acts, link, {(1, 0): Sync(wire_bytes=sync_bytes, hops=2)})
    alone = sync_bytes / 1e6  # the sync's seconds at the full rate, all shared with the message's 1 s
    message = 0.8001 + 1.0 + alone  # the message arrives late by the sync's share
    assert tl.step_end_s == [pytest.approx(max(message + 0.1, 0.8001 + 2 * alone + 0.25))]


def test_a_middle_stage_sends_both_ways_up_one_uplink():
    # stage 1 of three sends a forward and then a backward message, 1 MB each at 8 Mbps: the second waits for
    # the first on the stage's one uplink
    acts = [Action(0, 0, "F", 0, 0.0, None, (0, "fwd", 0, 0), 10), Action(0, 0, "B", 0, 0.0, (0, "bwd", 0, 0)),
            Action(1, 0, "F", 0, 0.0, (0, "fwd", 0, 0), (1, "fwd", 0, 0), 1_000_000),
            Action(1, 0, "B", 0, 0.0, None, (0, "bwd", 0, 0), 1_000_000),
            Action(2, 0, "F", 0, 0.0, (1, "fwd", 0, 0))]
    tl = simulate(acts, LinkSpec(8.0, 0.0))
    assert tl.link_bytes == {"b0.bwd": 1_000_000, "b0.fwd": 10, "b1.fwd": 1_000_000}
    assert tl.busy_s == [0.0, 0.0, 0.0]
    assert simulate(acts + [Action(0, 0, "O", -1, 0.0)], LinkSpec(8.0, 0.0)).total_s == pytest.approx(2.0, abs=1e-3)


def test_an_exchange_goes_at_its_measured_rate_between_and_beyond_the_sizes():
    # 8 Mbps: 1 MB alone takes 1 s; measured exchanges: 1 MB in 1.5 s, 4 MB in 8 s (ratios 1.5 and 2)
    link = LinkSpec(8.0, 10.0, exchange=((1_000_000, 1.5), (4_000_000, 8.0)))
    assert link.exchange_seconds(1_000_000) == pytest.approx(1.5)
    assert link.exchange_seconds(2_000_000) == pytest.approx(2.0 * 1.75)  # halfway in log bytes
    assert link.exchange_seconds(100_000) == pytest.approx(0.1 * 1.5)  # held below the smallest size
    assert link.exchange_seconds(16_000_000) == pytest.approx(16.0 * 2.0)  # and above the largest
    assert LinkSpec(8.0).exchange_seconds(2_000_000) == pytest.approx(2.0)  # none measured: the bandwidth
    # a sync's hops each exchange their share: 2 hops of 1 MB over 3 replicas
    assert exchange_seconds(Sync(2_000_000, 2), link) == pytest.approx(2 * 1.5)
    assert dp_sync_seconds({"all_gather": 1_000_000}, 2, link) == pytest.approx(1.5 + 0.01)


def test_the_replay_prices_a_sync_at_the_exchange_rate():
    acts = [Action(0, 0, "F", 0, 0.1, None, (0, "fwd", 0, 0), 100), Action(1, 0, "F", 0, 0.1, (0, "fwd", 0, 0)),
            Action(1, 0, "B", 0, 0.1, None, (0, "bwd", 0, 0), 100), Action(1, 0, "O", -1, 0.0),
            Action(0, 0, "B", 0, 0.1, (0, "bwd", 0, 0)), Action(0, 0, "O", -1, 0.0)]
    plain, measured = LinkSpec(8.0, 10.0), LinkSpec(8.0, 10.0, exchange=((1_000_000, 1.6),))
    sync = {(0, 0): Sync(wire_bytes=1_000_000, hops=1)}
    assert simulate(acts, measured, sync).total_s == pytest.approx(simulate(acts, plain, sync).total_s + 0.6)


@pytest.mark.parametrize("points", [((0, 1.0),), ((1000, 0.0),), ((2000, 1.0), (1000, 0.5))])
def test_a_bad_exchange_table_is_refused(points):
    with pytest.raises(ConfigError, match="LinkSpec.exchange"):
        LinkSpec(8.0, exchange=points)
    with pytest.raises(ConfigError, match="LinkSpec.exchange"):
        LinkSpec(exchange=((1000, 1.0),))  # no bandwidth to take a ratio of
