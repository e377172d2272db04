"""The data-parallel meter: bytes per collective, and the time inside the collectives kept apart."""

import time

import pytest

from actzip.wire.dp import DPMeter


def test_bytes_add_up_per_collective_and_the_ratio_is_dense_over_sent():
    m = DPMeter()
    m.add("all_gather", 100)
    m.add("all_gather", 50)
    m.add("all_reduce", 10)
    m.dense_bytes = 1600
    assert m.by_collective == {"all_gather": 150, "all_reduce": 10} and m.payload_bytes == 160
    assert m.ratio == 10.0 and DPMeter().ratio == 0.0


def test_waiting_counts_each_block_even_one_that_raises():
    m = DPMeter()
    with m.waiting():
        time.sleep(0.02)
    first = m.wait_s
    assert 0.02 <= first < 1.0
    with pytest.raises(RuntimeError), m.waiting():
        time.sleep(0.01)
        raise RuntimeError("a collective failed")
    assert m.wait_s >= first + 0.01
