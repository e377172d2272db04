"""``actzip bench split-link``: its cells and config refused by name, the link model's step, and one real run of
the runtime's processes over a shaped link (root and network namespaces; skipped with the reason otherwise)."""

import pytest

from actzip.errors import ConfigError
from actzip.wire import LinkSpec, netns_unavailable_reason
from actzip_bench.split_link import SplitLinkConfig, model_step_s, parse_cell, plot, run_split_link, scoring_share


def test_cells_name_a_compressor_and_a_compression_or_dense():
    assert parse_cell("dense") == ("random", 1.0)
    assert parse_cell("topk:20") == ("topk", 20.0)
    assert parse_cell("quant:2.5") == ("quant", 2.5)
    for bad in ("topk", "gzip:4", "topk:0.5", "dct:x", ""):
        with pytest.raises(ConfigError, match="cell"):
            parse_cell(bad)


@pytest.mark.parametrize("field, value", [("cells", ()), ("cells", ("topk:1/2",)), ("policy", "greedy"),
                                          ("clients", 0), ("bandwidth_mbps", 0.0), ("latency_ms", -1.0),
                                          ("steps", 1), ("warmup", 0), ("refresh", 0), ("server_mbps", 0.0)])
def test_a_bad_config_is_refused_by_name(field, value):
    with pytest.raises(ConfigError, match="split-link"):
        SplitLinkConfig(**{field: value})


def test_the_model_is_the_work_and_each_way_s_transfer_and_latency_for_one_client_and_overlaps_for_two():
    link = LinkSpec(bandwidth_mbps=8.0, latency_ms=10.0)  # a byte a microsecond
    one = model_step_s(0.3, [0.2], [1000.0], [3000.0], link)
    assert one == pytest.approx(0.3 + 0.2 + 0.004 + 0.02)
    cycle = model_step_s(0.0, [0.0], [8000.0], [8000.0], link)  # 8 ms each way and 10 ms latency each way
    assert cycle == pytest.approx(0.036)
    two = model_step_s(0.0, [0.0, 0.0], [8000.0] * 2, [8000.0] * 2, link)
    assert cycle <= two < 2 * cycle  # each client's batch on its own uplink: the two cycles overlap
    heavy = model_step_s(0.0, [0.0, 0.0], [8000.0] * 2, [30000.0] * 2, link)
    assert heavy >= 0.060 - 1e-9  # but the replies share the server's uplink: 30 ms each, one after the other
    fast = model_step_s(0.0, [0.0, 0.0], [8000.0] * 2, [30000.0] * 2, link, server_link=LinkSpec(80.0, 10.0))
    assert fast == pytest.approx(0.008 + 0.010 + 0.003 + 0.010)  # replies 3 ms each: the cycle, not the server's link
    busy = model_step_s(0.5, [0.0, 0.0], [8000.0] * 2, [8000.0] * 2, link)
    assert busy == pytest.approx(0.5, rel=0.1)  # a server busier than the links sets the pace


def test_the_scoring_share_is_the_refresh_steps_work_over_the_others_of_all_the_work():
    work = [9.0] + [3.0 if (k + 1) % 5 == 0 else 1.0 for k in range(1, 15)]  # a warm-up step, refreshes at 5, 10, 15
    assert scoring_share(work, 5, 1) == pytest.approx(3 * (3.0 - 1.0) / (11 * 1.0 + 3 * 3.0))
    assert scoring_share([9.0] + [1.0] * 14, 5, 1) == 0.0  # refresh steps that cost nothing more


@pytest.mark.skipif(netns_unavailable_reason(shaped=True) is not None,
                    reason=f"shaped real link: {netns_unavailable_reason(shaped=True)}")
def test_the_runtime_over_a_shaped_link_meters_its_bytes_and_compression_pays(tmp_path):
    cfg = SplitLinkConfig(cells=("dense", "topk:20"), batch=64, steps=4, warmup=1, bandwidth_mbps=10.0,
                          latency_ms=5.0)
    record = run_split_link(cfg)
    plot(record, tmp_path / "split-link.png")
    assert (tmp_path / "split-link.png").stat().st_size > 10_000
    rows = {r["cell"]: r for r in record["rows"]}
    dense, topk = rows["dense"], rows["topk:20"]
    values = 64 * sum(dense["sizes"]) * 2  # bf16 bytes a step each way, before the transport's headers
    assert values <= dense["up_bytes"] <= 1.05 * values and values <= dense["down_bytes"] <= 1.05 * values
    assert topk["up_bytes"] <= values / 20 * 1.1
    # 8 ms a kilobyte at 10 Mbit/s: the dense step waits on about 84 ms of transfers, top-k on about 4
    assert topk["measured_step_s"] < dense["measured_step_s"] and topk["speedup_vs_dense"] > 1.5
    assert all(r["unshaped_step_s"] < r["measured_step_s"] for r in rows.values())
