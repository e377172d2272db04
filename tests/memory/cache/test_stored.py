"""One rebuilt tensor for every save that shares a stored activation."""

import gc

import torch

from actzip.memory.cache.stored import StoredActivation


def test_sharers_get_one_rebuild_then_it_is_let_go():
    h = StoredActivation()
    h.shares = 3
    rebuilds = []

    def rebuild():
        rebuilds.append(1)
        return torch.ones(4)

    first = id(h.hand_out(rebuild))  # each unpack drops its tensor at once, as autograd does after use
    assert id(h.hand_out(rebuild)) == first and len(rebuilds) == 1
    h.hand_out(rebuild)
    gc.collect()
    assert len(rebuilds) == 1 and h.last() is None  # every sharer had it: no longer held
    h.hand_out(rebuild)  # asked again (a second backward): rebuilt
    assert len(rebuilds) == 2
