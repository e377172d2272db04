"""Tensors in memory order (:mod:`actzip.core.layout`): no copy for dense layouts, gapped views as rows read in
place, and the way back to the tensor's own strides."""

import pytest
import torch

from actzip.core.layout import memory_order, memory_rows, restore_order


def test_memory_order_makes_no_copy_for_dense_layouts():
    x = torch.randn(3, 4, 5).permute(2, 0, 1)
    flat, perm = memory_order(x)
    assert flat.data_ptr() == x.data_ptr() and perm is not None


def test_memory_rows_stand_for_the_copy_of_a_gapped_view():
    qkv = torch.randn(2, 5, 3 * 32)  # (batch, tokens, 3 d): q, k, v with 2 heads of 16, heads first
    q = qkv[..., 32:64].view(2, 5, 2, 16).transpose(1, 2)
    for view, length in ((q, 32), (qkv[:, :, :64], 64), (qkv[1, :, 8:16], 8)):
        rows, perm = memory_rows(view, 8)
        flat, perm_copy = memory_order(view)
        assert perm == perm_copy and rows.shape[1] == length and rows.data_ptr() == view.data_ptr()
        assert torch.equal(rows.reshape(-1), flat)
    assert memory_rows(q, 64) is None  # rows of 32: not whole groups of 64
    assert memory_rows(qkv, 8) is None and memory_rows(qkv.transpose(0, 1), 8) is None  # dense: no rows needed
    assert memory_rows(qkv[:, :3, :32], 8) is None and memory_rows(qkv[::2, :, ::2], 8) is None  # uneven gaps


@pytest.mark.parametrize("make", [
    lambda x: x,  # contiguous
    lambda x: x.transpose(0, 2),  # transposed
    lambda x: x.permute(1, 2, 0).contiguous().permute(2, 0, 1),  # dense in another order
    lambda x: x[:, ::2],  # a view with gaps: copied in its order of strides
    lambda x: x[:, :1].expand(3, 4, 5),  # broadcast
])
def test_restore_order_undoes_memory_order(make):
    x = make(torch.randn(3, 4, 5))
    flat, perm = memory_order(x)
    assert flat.dim() == 1 and flat.is_contiguous() and flat.numel() == x.numel()
    y = restore_order(flat.clone(), x.shape, perm)
    assert torch.equal(y, x)
    if x.is_contiguous() or x.permute(perm or tuple(range(x.dim()))).is_contiguous():
        assert y.stride() == x.stride()  # dense layouts come back with their strides
