"""Messages timed over a real shaped link against the link model."""

import pytest

from actzip.errors import ConfigError
from actzip.wire.link import LinkSpec, netns_unavailable_reason
from actzip.wire.link_probe import gather_times, model_seconds, transfer_times


def test_the_model_time_of_a_message_is_its_transfer_and_one_latency():
    assert model_seconds(LinkSpec(bandwidth_mbps=200, latency_ms=50), 1_000_000) == pytest.approx(0.04 + 0.05)


@pytest.mark.parametrize("probe", [transfer_times, gather_times])
@pytest.mark.parametrize("bad", [{"sizes": ()}, {"sizes": (0,)}, {"repeats": 0}, {"repeats": True}])
def test_bad_options_are_named(bad, probe):
    with pytest.raises(ConfigError, match="sizes" if "sizes" in bad else "repeats"):
        probe(LinkSpec(bandwidth_mbps=200), **bad)


@pytest.mark.skipif(netns_unavailable_reason(shaped=True) is not None,
                    reason=f"shaped real link: {netns_unavailable_reason(shaped=True)}")
def test_a_megabyte_over_a_shaped_link_takes_about_what_the_model_says():
    link = LinkSpec(bandwidth_mbps=100)
    got = transfer_times(link, sizes=(1_000_000,), repeats=3, idle_s=0.05)
    assert 0.85 < got[1_000_000] / model_seconds(link, 1_000_000) < 1.25


@pytest.mark.skipif(netns_unavailable_reason(shaped=True) is not None,
                    reason=f"shaped real link: {netns_unavailable_reason(shaped=True)}")
def test_two_ranks_all_gather_over_their_shaped_uplinks_no_faster_than_the_rate():
    link = LinkSpec(bandwidth_mbps=100)  # 1 MB a rank: 80 ms on each uplink at the rate
    got = gather_times(link, sizes=(1_000_000,), repeats=3, idle_s=0.05)
    assert 0.07 < got[1_000_000] < 1.0  # the uplinks' rate bounds it; how far above is what the bench records
