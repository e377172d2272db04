"""Link models: the software link's arrival times, the schedule simulator, and the network-namespace link."""

import os
import subprocess
import sys
import textwrap

import pytest

from actzip.errors import ConfigError
from actzip.wire.link import (
    Action,
    LinkModel,
    LinkSpec,
    NetnsLink,
    NetnsMesh,
    netns_unavailable_reason,
    simulate,
)
from actzip.wire.transport import WireError


def test_arrivals_stream_with_latency_paid_once_per_message():
    link = LinkModel(LinkSpec(bandwidth_mbps=8.0, latency_ms=100.0))  # 1 byte per microsecond
    assert link.transmit(1000, 0.0) == pytest.approx(0.1 + 0.001)
    # sent while the first is in flight: streams right behind it
    assert link.transmit(1000, 0.0005) == pytest.approx(0.1 + 0.002)
    # sent after the link went idle: pays its own latency
    assert link.transmit(1000, 1.0) == pytest.approx(1.1 + 0.001)
    assert link.bytes == 3000 and link.messages == 3


def test_stop_and_wait_variant_serializes_latency():
    link = LinkModel(LinkSpec(bandwidth_mbps=8.0, latency_ms=100.0, serialize_latency=True))
    assert link.transmit(1000, 0.0) == pytest.approx(0.101)
    assert link.transmit(1000, 0.0) == pytest.approx(0.202)  # max(prev arrival, t) + bits/bw + latency


def test_infinite_link_and_bad_specs():
    assert LinkModel(LinkSpec()).transmit(10**9, 2.5) == 2.5
    for bad in ({"bandwidth_mbps": 0}, {"bandwidth_mbps": -1.0}, {"latency_ms": -1}, {"bandwidth_mbps": True}):
        with pytest.raises(ConfigError):
            LinkSpec(**bad)


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


def test_action_round_trips_as_a_tuple():
    a = Action(1, 2, "B", 3, 0.5, (0, "bwd", 2, 3), (0, "bwd", 2, 3), 99)
    assert Action.from_tuple(list(a.as_tuple())) == a


# ---- network namespaces ------------------------------------------------------------------------------------

_PEER = textwrap.dedent("""
    import datetime, json, os, sys, torch, torch.distributed as dist
    from actzip.wire.transport import DistBackend, Transport
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    name = os.environ["IFNAME"]
    def counters():
        return {k: int(open(f"/sys/class/net/{name}/statistics/{k}").read()) for k in ("tx_bytes", "tx_packets")}
    t = Transport(DistBackend(), rank, timeout_s=30)
    t.handshake(1 - rank, {"link": "test"})
    dist.barrier()
    before = counters()
    for i in range(int(sys.argv[1])):
        if rank == 0:
            t.send(1, {"x": torch.randn(int(sys.argv[2]))}, channel="fwd")
        else:
            t.recv(0, channel="fwd")
    t.flush()
    dist.barrier()
    after = counters()
    print(json.dumps({"meter": t.meter.total("sent", "fwd"), **{k: after[k] - before[k] for k in before}}))
""")


def _run_over(link: LinkSpec, messages: int, floats: int):
    import json

    with NetnsLink(link) as net:
        procs = []
        for side in (0, 1):
            env = dict(os.environ, RANK=str(side), WORLD_SIZE="2", MASTER_ADDR=net.addresses[0], MASTER_PORT="29591",
                       GLOO_SOCKET_IFNAME=net.ifnames[side], IFNAME=net.ifnames[side])
            procs.append(net.popen(side, [sys.executable, "-c", _PEER, str(messages), str(floats)], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=60) for p in procs]
        assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    return [json.loads(o[0].strip().splitlines()[-1]) for o in outs]


@pytest.mark.skipif(netns_unavailable_reason(shaped=False) is not None,
                    reason=f"real link: {netns_unavailable_reason(shaped=False)}")
def test_bytes_on_a_real_link_are_the_meter_plus_tcp_ip_overhead():
    sender, receiver = _run_over(LinkSpec(), messages=20, floats=50_000)
    meter = sender["meter"]
    assert meter == 20 * (48 + 200_000) + len('[["x","tensor",[50000],"float32",[["data","float32",[50000]]],{}]]') + 4
    overhead = sender["tx_bytes"] - meter  # Ethernet/IP/TCP headers and gloo's framing
    assert 0 < overhead < 0.05 * meter, (sender, meter)
    assert receiver["tx_bytes"] < 0.05 * meter  # the other way: acknowledgements only


@pytest.mark.skipif(netns_unavailable_reason(shaped=True) is not None,
                    reason=f"shaped real link: {netns_unavailable_reason(shaped=True)}")
def test_shaped_link_takes_the_time_the_model_says():
    import time

    t0 = time.monotonic()
    _run_over(LinkSpec(80.0, 50.0), messages=10, floats=250_000)  # 10 MB at 80 Mbps: about 1 s
    assert time.monotonic() - t0 > 1.0


def test_unavailable_reason_is_a_sentence_or_none():
    for shaped in (False, True):
        why = netns_unavailable_reason(shaped)
        assert why is None or (isinstance(why, str) and len(why) > 20)
    if netns_unavailable_reason(True) is not None:
        with pytest.raises(WireError, match="cannot run here"):
            NetnsLink(LinkSpec(80.0, 50.0))


def test_dp_sync_seconds_counts_ring_and_gather_traffic():
    from actzip.wire import dp_sync_seconds

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
    synced = simulate(acts, LinkSpec(), sync_s={(0, 0): 0.5})
    assert synced.total_s == pytest.approx(plain.total_s + 0.5)


def test_a_sync_goes_up_the_uplink_after_the_stages_messages_on_it():
    # stage 1's backward message (1 MB at 8 Mbps: 1 s on its uplink, 0.25 s latency) is still going up when its
    # sync starts: the sync's bytes follow it, from the moment it is through (its arrival less the latency)
    acts = [Action(0, 0, "F", 0, 0.1, None, (0, "fwd", 0, 0), 100), Action(1, 0, "F", 0, 0.1, (0, "fwd", 0, 0)),
            Action(1, 0, "B", 0, 0.1, None, (0, "bwd", 0, 0), 1_000_000), Action(1, 0, "O", -1, 0.0),
            Action(0, 0, "B", 0, 0.1, (0, "bwd", 0, 0)), Action(0, 0, "O", -1, 0.0)]
    link = LinkSpec(8.0, 250.0)
    plain = simulate(acts, link)
    synced = simulate(acts, link, sync_s={(1, 0): 0.5})
    b1_end = 0.1 + (0.25 + 0.0001) + 0.1 + 0.1  # stage 1's backward ends; its message is through 1.25 s later
    stage1 = max(b1_end, b1_end + 0.25 + 1.0 - 0.25) + 0.5
    assert synced.step_end_s == [pytest.approx(max(stage1, plain.total_s))]
    assert stage1 > plain.total_s  # not b1_end + 0.5, as if the uplink were free


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


_GATHER = textwrap.dedent("""
    import datetime, json, sys, time, torch, torch.distributed as dist
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    mine = torch.full((int(sys.argv[1]),), float(dist.get_rank()))
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.barrier()
    t0 = time.monotonic()
    dist.all_gather(parts, mine)
    took = time.monotonic() - t0
    dist.barrier()  # every rank done before any closes its connections
    dist.destroy_process_group()
    print(json.dumps({"s": took, "got": [float(p[0]) for p in parts]}))
""")


@pytest.mark.skipif(netns_unavailable_reason(shaped=True) is not None,
                    reason=f"shaped real link: {netns_unavailable_reason(shaped=True)}")
def test_a_mesh_of_namespaces_joins_every_node_and_shapes_each_uplink():
    import json

    floats = 1_000_000  # 4 MB a node, sent to each of the two others: 8 MB through each 80 Mbps uplink, 0.8 s
    with NetnsMesh(3, LinkSpec(80.0, 0.0)) as net:
        assert len(set(net.addresses)) == 3
        procs = [net.popen(i, [sys.executable, "-c", _GATHER, str(floats)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True,
                           env=dict(os.environ, RANK=str(i), WORLD_SIZE="3", MASTER_ADDR=net.addresses[0],
                                    MASTER_PORT="29593")) for i in range(3)]
        outs = [p.communicate(timeout=60) for p in procs]
        assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
        sent = [c["tx_bytes"] for c in net.counters()]
    results = [json.loads(o[0].strip().splitlines()[-1]) for o in outs]
    assert all(r["got"] == [0.0, 1.0, 2.0] for r in results)
    assert all(b > 2 * 4 * floats for b in sent), sent
    assert min(r["s"] for r in results) > 0.75  # the uplinks' rate, not the host's memory bandwidth


def test_a_mesh_needs_two_nodes_or_more():
    with pytest.raises(ConfigError, match="nodes"):
        NetnsMesh(1)
