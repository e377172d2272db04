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


def test_a_mesh_takes_one_link_a_node_and_refuses_a_list_of_another_length():
    with pytest.raises(ConfigError, match="one LinkSpec a node"):
        NetnsMesh(3, [LinkSpec(10.0), LinkSpec(10.0)])
    with pytest.raises(ConfigError, match="one LinkSpec a node"):
        NetnsMesh(2, [LinkSpec(10.0), 10.0])
