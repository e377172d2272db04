"""The sign-packing pass against the PyTorch codec's packing (``pack_tile_words``), bit for bit."""

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install 'actzip[triton]')")

from actzip.codecs.bitpack import pack_tile_words  # noqa: E402
from actzip.errors import ConfigError  # noqa: E402
from actzip.kernels import sparse as st  # noqa: E402
from actzip.kernels import sparse_signpack as sp  # noqa: E402

from kernel_cases import DEVICES  # noqa: E402

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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("width,dtype", WIDTHS)
@pytest.mark.parametrize("tile", [64, 256, 4096])  # 4096: several rounds of 512 words in a full tile
@pytest.mark.parametrize("slot", [False, True])
def test_pack_matches_the_torch_packing(device, width, dtype, tile, slot):
    counts, values = tiles_of_values(width, dtype, tile, seed=width + tile)
    want, word_offsets = pack_tile_words(values, counts, width)
    value_offsets = torch.cumsum(counts, 0) - counts
    if slot:  # each tile's values at the start of its own slot of `tile` elements; garbage after them
        scratch = torch.full((counts.numel() * tile,), 0x55, dtype=dtype)
        for k, (o, c) in enumerate(zip(value_offsets.tolist(), counts.tolist())):
            scratch[k * tile : k * tile + c] = values[o : o + c]
    else:
        scratch = torch.cat([values, torch.full((9,), 0x55, dtype=dtype)])
    n = want.numel()
    out = torch.full((n + 7,), -5, dtype=torch.int32, device=device)
    base = torch.tensor([3], dtype=torch.int64, device=device)
    args = (scratch.to(device), counts.to(torch.int32).to(device), word_offsets.to(torch.int32).to(device), out,
            width, tile)
    offsets = None if slot else value_offsets.to(device)
    sp.pack(*args, value_offsets=offsets, words_base=base)
    assert torch.equal(out[3 : 3 + n].cpu(), want)
    assert (out[:3] == -5).all() and (out[3 + n :] == -5).all()
    out.fill_(-5)  # refused (an arena without room): nothing is written
    sp.pack(*args, value_offsets=offsets, words_base=base, ok=torch.zeros(1, dtype=torch.int32, device=device))
    assert (out == -5).all()


def test_pack_refuses_bad_buffers():
    counts = torch.ones(1, dtype=torch.int32)
    with pytest.raises(ConfigError, match="must be int32"):
        sp.pack(torch.zeros(64, dtype=torch.int16), counts, counts, torch.zeros(4, dtype=torch.int16), 15, 64)
    with pytest.raises(ConfigError, match="width must be 1..31"):
        sp.pack(torch.zeros(64, dtype=torch.int64), counts, counts, torch.zeros(4, dtype=torch.int32), 63, 64)


def test_compact_refuses_scratch_that_cannot_hold_the_values():
    raw = torch.ones(100, dtype=torch.int16)
    fake = st.TileCounts(torch.zeros(16, dtype=torch.uint8), torch.ones(2, dtype=torch.int32),
                         torch.zeros(2, dtype=torch.int32), torch.ones(1, dtype=torch.int64),
                         torch.ones(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64),
                         torch.ones(2, dtype=torch.int32))
    with pytest.raises(ConfigError, match="at least 100 elements"):
        st.compact(raw, 100, fake, raw[:50], 64, slots=True)
    with pytest.raises(ConfigError, match="out must be a torch.int16 tensor"):  # words are the packing pass's
        st.compact(raw, 100, fake, torch.empty(4, dtype=torch.int32), 64)
