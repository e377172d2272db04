"""Sign packing (compact, then pack in the same program) against the PyTorch codec, bit for bit."""

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install 'actzip[triton]')")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from actzip.codecs.bitpack import pack_tile_words  # noqa: E402
from actzip.codecs.sparse import SparseCodec  # noqa: E402
from actzip.core.dtypes import bit_view_dtype  # noqa: E402
from actzip.core.errors import ConfigError  # noqa: E402
from actzip.kernels import sparse_signpack_triton as sp  # noqa: E402
from actzip.kernels import sparse_triton as st  # noqa: E402

from test_sparse_triton import DEVICES, random_tensor  # noqa: E402

WIDTHS = [(7, torch.uint8), (15, torch.int16), (31, torch.int32)]


def tiles_of_values(width, dtype, tile, seed):
    """Per-tile value counts (an empty and a full tile among them) and random raw values, sign bits set too."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, tile + 1, (6,), generator=g)
    counts[1], counts[4] = 0, tile
    nbits = width + 1
    raw = torch.randint(0, 1 << nbits, (int(counts.sum()),), generator=g, dtype=torch.int64)
    if dtype != torch.uint8:
        raw = torch.where(raw >= 1 << (nbits - 1), raw - (1 << nbits), raw)
    return counts, raw.to(dtype)


@triton.jit
def _pack_slots(scratch_ptr, nvals_ptr, offsets_ptr, words_ptr, T: tl.constexpr, WIDTH: tl.constexpr,
                LANES: tl.constexpr):
    # pack_words on each tile's slot, as the fused kernel calls it after compacting
    tile = tl.program_id(0)
    j, word, live = sp.pack_words(scratch_ptr + tile * T, tl.load(nvals_ptr + tile), WIDTH, LANES)
    tl.store(words_ptr + tl.load(offsets_ptr + tile) + j, word, mask=live)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("width,dtype", WIDTHS)
@pytest.mark.parametrize("tile", [64, 256])
def test_pack_words_matches_the_torch_packing(device, width, dtype, tile):
    counts, values = tiles_of_values(width, dtype, tile, seed=width + tile)
    want, word_offsets = pack_tile_words(values, counts, width)
    value_offsets = torch.cumsum(counts, 0) - counts
    scratch = torch.full((counts.numel() * tile,), 0x55, dtype=dtype)  # garbage after each tile's values
    for k, (o, c) in enumerate(zip(value_offsets.tolist(), counts.tolist())):
        scratch[k * tile : k * tile + c] = values[o : o + c]
    n = want.numel()
    out = torch.full((n + 7,), -5, dtype=torch.int32, device=device)
    _pack_slots[(counts.numel(),)](scratch.to(device), counts.to(torch.int32).to(device), word_offsets.to(device),
                                   out, T=tile, WIDTH=width, LANES=sp.lanes(tile, width))
    assert torch.equal(out[:n].cpu(), want) and (out[n:] == -5).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e5m2, torch.float32])
def test_compact_packs_into_a_dirty_buffer_and_may_overwrite_its_input(device, dtype):
    # The fused pass against the PyTorch codec, the input serving as its own scratch; a refused write
    # (ok false) leaves the buffer alone.
    x = random_tensor((700,), dtype, 0.5, seed=8, signed=False, device=device)
    want = SparseCodec(tile_size=128, sign_pack=True, kernel="torch").encode(x).buffers["values"]
    raw = x.view(bit_view_dtype(dtype)).clone()
    c = st.count(raw, raw.numel(), 128, True)
    out = torch.full((want.numel() + 9,), -5, dtype=torch.int32, device=device)
    at = torch.tensor([4], dtype=torch.int64, device=device)
    st.compact(raw, raw.numel(), c, out, 128, True, values_offset=at, scratch=raw)
    assert torch.equal(out[4 : 4 + want.numel()].cpu(), want.cpu())
    assert (out[:4] == -5).all() and (out[4 + want.numel() :] == -5).all()
    out.fill_(-5)
    raw = x.view(bit_view_dtype(dtype)).clone()
    st.compact(raw, raw.numel(), c, out, 128, True, ok=torch.zeros(1, dtype=torch.bool, device=device))
    assert (out == -5).all()


def test_scratch_must_fit():
    raw = torch.ones(100, dtype=torch.int16)
    c = st.count(raw, 100, 64, True)
    with pytest.raises(ConfigError, match="scratch must be"):
        st.compact(raw, 100, c, torch.empty(int(c.total), dtype=torch.int32), 64, True, scratch=raw[:50])
