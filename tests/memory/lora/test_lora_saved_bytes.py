"""saved_bytes_by_module: attributing what autograd saves, without keeping the graph alive."""

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from actzip.memory.lora import saved_bytes_by_module

def test_accounting_does_not_keep_the_graph_alive():
    x = torch.randn(64, 64, requires_grad=True)
    kept = []

    def run():
        y = torch.relu(x * 2)  # relu saves its own output: returning it as is from a pack hook would make a cycle
        kept.append(StorageWeakRef(y.untyped_storage()))
        return y.sum()

    by, out = saved_bytes_by_module(nn.Module(), run)
    assert by[""] == 64 * 64 * 4
    del out
    assert kept[0].expired()
