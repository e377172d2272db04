"""The sparse codec's Triton kernels (:mod:`actzip.kernels.sparse`) against its PyTorch implementation, bit for bit.

Every case runs on the CPU under Triton's interpreter (see conftest.py) and on CUDA when there is a GPU.
The kernels move bits through integer views, so everything is compared exactly.
"""

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install 'actzip[triton]')")

from actzip.codecs.bitpack import pack_bool, pack_tile_words, tile_words  # noqa: E402
from actzip.codecs.sparse import SparseCodec  # noqa: E402
from actzip.core.dtypes import bit_view_dtype  # noqa: E402
from actzip.errors import ConfigError, InvalidValueError, KernelUnavailableError  # noqa: E402
from actzip.kernels import runtime  # noqa: E402
from actzip.kernels import sparse as st  # noqa: E402
from actzip.kernels import sparse_encode as se  # noqa: E402
from actzip.kernels import sparse_launch as sl  # noqa: E402
from actzip.kernels import sparse_signpack as sp  # noqa: E402

from kernel_cases import DEVICES, DTYPES, assert_bit_equal, bits, random_tensor, special_values  # noqa: E402

DENSITIES = [0.0, 0.05, 0.5, 1.0]


def payloads_equal(p, q) -> None:
    assert p.buffers.keys() == q.buffers.keys() == {"mask", "tile_offsets", "values"}
    for k in p.buffers:
        a, b = p.buffers[k], q.buffers[k]
        assert a.dtype == b.dtype and a.shape == b.shape, k
        assert torch.equal(a.cpu(), b.cpu()), k
    assert p.meta == q.meta and p.shape == q.shape and p.dtype == q.dtype and p.device == q.device


def check_both_paths(x: torch.Tensor, tile: int, sign_pack: bool, check: bool = True) -> None:
    """Triton and PyTorch payloads are identical, and each path decodes both to x's bits."""
    ref = SparseCodec(tile_size=tile, sign_pack=sign_pack, check=check, kernel="torch")
    tri = SparseCodec(tile_size=tile, sign_pack=sign_pack, check=check, kernel="triton")
    p_ref, p_tri = ref.encode(x), tri.encode(x)
    payloads_equal(p_tri, p_ref)
    first = ref.decode(p_ref)
    assert_bit_equal(first, x if check or not sign_pack else first)  # unchecked: the sign is dropped, as in torch
    for codec in (ref, tri):
        for p in (p_ref, p_tri):
            y = codec.decode(p)
            assert y.device == x.device and y.stride() == first.stride()
            assert_bit_equal(y, first)


# -- the codec, both paths ------------------------------------------------------------------------------

# (shape, tile): n a multiple of the tile, not a multiple, smaller than one tile, one element, empty.
SHAPES = [
    ((3, 50), 64), ((), 64), ((128,), 64), ((5, 7, 3), 128), ((1,), 64), ((0,), 64), ((2, 0, 3), 128), ((300,), 256)
]  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("density", DENSITIES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_codec_paths_agree(device, dtype, density):
    for i, (shape, tile) in enumerate(SHAPES):
        x = random_tensor(shape, dtype, density, seed=hash((str(dtype), density, i)) % 2**31, device=device)
        check_both_paths(x, tile, sign_pack=False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("density", DENSITIES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_codec_paths_agree_sign_packed(device, dtype, density):
    # The sign-packing scan is slow in the interpreter: fewer, smaller tensors (still several tiles, a
    # partial last tile, and an empty tensor).
    for i, (shape, tile) in enumerate([((2, 70), 64), ((9,), 64), ((0, 4), 64)]):
        x = random_tensor(shape, dtype, density, seed=i + 7, signed=False, device=device)
        check_both_paths(x, tile, sign_pack=True)


@pytest.mark.parametrize("device", DEVICES)
def test_float64_without_sign_packing(device):
    x = random_tensor((3, 70), torch.float64, 0.5, seed=3, device=device)
    check_both_paths(x, 64, sign_pack=False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["transposed", "sliced", "expanded", "permuted"])
def test_non_contiguous_inputs(device, layout):
    x = random_tensor((6, 10, 4), torch.bfloat16, 0.5, seed=5, device=device)
    if layout == "transposed":
        x = x.transpose(0, 2).contiguous().transpose(0, 2)
    elif layout == "sliced":
        x = x[:, ::3]
    elif layout == "expanded":
        x = x[:, :1].expand(6, 10, 4)
    else:
        x = x.permute(1, 2, 0).contiguous().permute(2, 0, 1)
    assert not x.is_contiguous()
    check_both_paths(x, 64, sign_pack=False)
    check_both_paths(x.view(torch.int16).abs().view(torch.bfloat16), 64, sign_pack=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_special_values(device, dtype):
    x = special_values(dtype).to(device)
    check_both_paths(x, 64, sign_pack=False)
    # -0.0 is stored: only the one +0.0 counts as zero.
    assert SparseCodec(tile_size=64, kernel="triton").encode(x).meta["nnz"] == x.numel() - 1
    check_both_paths(special_values(dtype, signed=False).to(device), 64, sign_pack=True)


@pytest.mark.parametrize("device", DEVICES)
def test_sign_packing_refuses_sign_bits_like_torch(device):
    x = random_tensor((100,), torch.bfloat16, 0.5, seed=9, signed=False, device=device)
    x = x.view(torch.int16).clone()
    x[[3, 50]] |= -0x8000  # a negative value and -0.0 (or a negative NaN)
    x = x.view(torch.bfloat16)
    msgs = []
    for kernel in ("torch", "triton"):
        with pytest.raises(InvalidValueError, match=r"acts has 2 of 100 elements with the sign bit set") as e:
            SparseCodec(sign_pack=True, tile_size=64, kernel=kernel).encode(x, name="acts")
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]
    # Unchecked, both drop the sign the same way.
    check_both_paths(x, 64, sign_pack=True, check=False)


# -- the kernels one by one -----------------------------------------------------------------------------


def oracle(raw: torch.Tensor, n: int, tile: int, sign_pack: bool):
    """mask, sizes per tile, tile_offsets, values: the format computed directly from its definition."""
    n_tiles = -(-n // tile)
    flags = torch.zeros(n_tiles * tile, dtype=torch.bool)
    flags[:n] = raw[:n].cpu() != 0
    counts = flags.view(n_tiles, tile).sum(1)
    values = raw[:n].cpu()[flags[:n]]
    if sign_pack:
        width = raw.dtype.itemsize * 8 - 1
        values, offsets = pack_tile_words(values.to(torch.int64), counts, width)
        sizes = tile_words(counts, width)
    else:
        sizes = counts
        offsets = torch.cumsum(counts, 0) - counts
    return pack_bool(flags), sizes.to(torch.int32), offsets.to(torch.int32), values


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "dtype,sign_pack", [(torch.int32, False), (torch.int16, False), (torch.uint8, False), (torch.int64, False),
                        (torch.int16, True), (torch.uint8, True), (torch.int32, True)],
)  # fmt: skip
@pytest.mark.parametrize("n,tile", [(200, 64), (64, 64), (33, 128), (0, 64)])
def test_count_compact_decompress_kernels(device, dtype, sign_pack, n, tile):
    flt = {torch.int32: torch.float32, torch.int16: torch.bfloat16, torch.uint8: torch.float8_e5m2,
           torch.int64: torch.float64}[dtype]  # fmt: skip
    # A few elements of slack past n: the kernels must not read them.
    raw = bits(random_tensor((n + 5,), flt, 0.4, seed=n + tile, signed=not sign_pack, device=device))
    raw[n:] = 1
    mask, sizes, offsets, values = oracle(raw, n, tile, sign_pack)

    c = st.count(raw, n, tile, sign_pack)
    assert torch.equal(c.mask.cpu(), mask)
    assert torch.equal(c.sizes.cpu(), sizes) and torch.equal(c.tile_offsets.cpu(), offsets)
    assert c.total.tolist() == [values.numel()] and c.nnz.tolist() == [int((raw[:n] != 0).sum())]
    if sign_pack:
        assert c.sign_set.tolist() == [0]

    out = torch.empty(values.numel(), dtype=values.dtype, device=device)
    if sign_pack:  # whole values into one slot per tile, then packed into words
        scratch = torch.full((c.sizes.numel() * tile,), 3, dtype=raw.dtype, device=device)
        st.compact(raw, n, c, scratch, tile, slots=True)
        if n:
            sp.pack(scratch, c.nvals, c.tile_offsets, out, raw.dtype.itemsize * 8 - 1, tile)
    else:
        st.compact(raw, n, c, out, tile)
    assert torch.equal(out.cpu(), values)
    # The encoder runs the same passes.
    e = se.encode(raw[:n], tile, sign_pack)
    assert torch.equal(e.values.cpu(), values) and torch.equal(e.mask.cpu(), mask)
    assert torch.equal(e.tile_offsets.cpu(), offsets) and e.host.total == values.numel()

    # Decompress from the oracle's buffers: the raw bits come back; the slack of a larger out is untouched.
    dec = torch.full((n + 3,), 7, dtype=dtype, device=device)
    st.decompress(mask.to(device), offsets.to(device), values.to(device), n, dtype, tile, sign_pack, out=dec)
    assert torch.equal(dec[:n].cpu(), raw[:n].cpu()) and dec[n:].tolist() == [7, 7, 7]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sign_pack", [False, True])
def test_preallocated_values_at_a_device_offset(device, sign_pack):
    # An arena: a dirty buffer, this payload's values written at a device-side offset and nowhere else.
    x = random_tensor((150,), torch.float16, 0.5, seed=11, signed=not sign_pack, device=device)
    raw = bits(x)
    ref = se.encode(raw, 64, sign_pack)
    arena = torch.full((ref.values.numel() + 20,), -3, dtype=ref.values.dtype, device=device)
    at = torch.tensor([13], dtype=torch.int64, device=device)
    got = se.encode(raw, 64, sign_pack, values=arena, values_offset=at)
    assert got.values is arena and got.total.tolist() == [ref.values.numel()] and got.start.tolist() == [13]
    k = ref.values.numel()
    assert torch.equal(arena[13 : 13 + k].cpu(), ref.values.cpu())
    assert (arena[:13] == -3).all() and (arena[13 + k :] == -3).all()
    assert torch.equal(got.mask.cpu(), ref.mask.cpu()) and torch.equal(got.tile_offsets.cpu(), ref.tile_offsets.cpu())
    dec = st.decompress(got.mask, got.tile_offsets, arena, raw.numel(), torch.float16, 64, sign_pack, values_offset=at)
    assert torch.equal(dec.cpu(), raw.cpu())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sign_pack", [False, True])
@pytest.mark.parametrize("square", [False, True])
def test_count_compact_of_relu(device, dtype, sign_pack, square):
    # Both passes apply the ReLU to a float input themselves; the compact pass also writes relu(h) or its
    # square. Signed zeros and NaN as torch's relu treats them.
    g = torch.Generator().manual_seed(4)
    h = torch.randn(330, generator=g)
    h[::7], h[3::11], h[5::13] = -0.0, 0.0, float("nan")
    h = h.to(dtype)
    # NaNs with payloads, of both signs, pass unchanged
    nans = [0x7F800001, -0x003FFFFF] if dtype == torch.float32 else [0x7F81, -0x003F]
    h.view(bit_view_dtype(dtype))[[10, 20]] = torch.tensor(nans, dtype=bit_view_dtype(dtype))
    h = h.to(device)
    # torch's relu on CUDA (the CPU's keeps -0.0)
    r = torch.where((h > 0) | h.isnan(), h, torch.zeros_like(h))
    if device == "cuda":
        assert_bit_equal(r, torch.relu(h))
    want = SparseCodec(tile_size=64, sign_pack=sign_pack, check=False, kernel="torch").encode(r).buffers
    c = st.count(h, h.numel(), 64, sign_pack, relu=True)
    assert torch.equal(c.mask, want["mask"]) and torch.equal(c.tile_offsets, want["tile_offsets"])
    values = torch.full((int(c.total) + 3,), 7, dtype=want["values"].dtype, device=device)
    act = torch.empty_like(h)
    if sign_pack:  # compact whole relu(h) values into slots, then pack them
        scratch = torch.empty(c.sizes.numel() * 64, dtype=bit_view_dtype(dtype), device=device)
        st.compact(h, h.numel(), c, scratch, 64, slots=True, relu=True, act=act, square=square)
        sp.pack(scratch, c.nvals, c.tile_offsets, values, dtype.itemsize * 8 - 1, 64)
    else:
        st.compact(h, h.numel(), c, values, 64, relu=True, act=act, square=square)
    assert torch.equal(values[: int(c.total)], want["values"]) and (values[int(c.total) :] == 7).all()
    if not square:
        assert_bit_equal(act, r)
    elif device == "cuda" or dtype == torch.float32:  # bf16 rounding differs in Triton's interpreter
        assert_bit_equal(act, r.square())


# -- the jit helper, called from another kernel ---------------------------------------------------------

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _relu_grad_mask_kernel(mask_ptr, offsets_ptr, values_ptr, out_ptr, stored_ptr, n, T: tl.constexpr,
                           WIDTH: tl.constexpr, SIGN_PACK: tl.constexpr):  # fmt: skip
    # A consumer fused with decoding: reads one tile of a bf16 payload, writes the bits and the flags.
    tile = tl.program_id(0)
    b, s = st.load_tile_bits(mask_ptr, offsets_ptr, values_ptr, 0, tile, T, WIDTH, SIGN_PACK, tl.int16)
    offs = tile * T + tl.arange(0, T)
    tl.store(out_ptr + offs, b, mask=offs < n)
    tl.store(stored_ptr + offs, s.to(tl.int8), mask=offs < n)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sign_pack", [False, True])
def test_load_tile_bits_from_another_kernel(device, sign_pack):
    x = random_tensor((140,), torch.bfloat16, 0.5, seed=2, signed=not sign_pack, device=device)
    p = SparseCodec(tile_size=64, sign_pack=sign_pack, kernel="torch").encode(x)
    n = x.numel()
    out = torch.empty(n, dtype=torch.int16, device=device)
    flags = torch.empty(n, dtype=torch.int8, device=device)
    b = p.buffers
    _relu_grad_mask_kernel[(3,)](b["mask"], b["tile_offsets"], b["values"], out, flags, n, T=64,
                                 WIDTH=15 if sign_pack else 16, SIGN_PACK=sign_pack)  # fmt: skip
    assert torch.equal(out.cpu(), bits(x).cpu())
    assert torch.equal(flags.cpu().bool(), bits(x).cpu() != 0)


# -- options and errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize("tile", [32, 96, 100, 1 << 17, 64.0])
def test_kernel_tile_size_must_be_a_power_of_two(tile):
    with pytest.raises(ConfigError, match="tile_size must be a power of two from 64 to 65536"):
        sl.check_tile_size(tile)
    with pytest.raises(ConfigError, match="tile_size must be a power of two from 64 to 65536"):
        st.count(torch.zeros(10, dtype=torch.int16), 10, tile)


def test_kernel_refuses_sign_packed_float64():
    with pytest.raises(ConfigError, match="sign packing of 64-bit elements"):
        st.count(torch.zeros(10, dtype=torch.int64), 10, 64, sign_pack=True)


def test_codec_triton_refuses_float64_sign_packing_and_small_tiles(monkeypatch):
    monkeypatch.setattr(runtime, "unavailable_reason", lambda device: None)
    codec = SparseCodec(sign_pack=True, kernel="triton", tile_size=64)
    with pytest.raises(KernelUnavailableError, match="sign packing of torch.float64 has no Triton kernel"):
        codec.encode(torch.ones(4, dtype=torch.float64))
    p = SparseCodec(kernel="torch", tile_size=8).encode(torch.ones(4))
    with pytest.raises(KernelUnavailableError, match="tile_size=8 is not a power of two"):
        SparseCodec(kernel="triton").decode(p)


def test_wrappers_check_their_inputs():
    with pytest.raises(ConfigError, match="contiguous 1-D"):
        st.count(torch.zeros(4, 4, dtype=torch.int16), 16, 64)
    with pytest.raises(ConfigError, match="at least n=20"):
        st.count(torch.zeros(10, dtype=torch.int16), 20, 64)
    with pytest.raises(ConfigError, match="values_offset must be a one-element int64"):
        sl.values_base(torch.zeros(2, dtype=torch.int64), torch.device("cpu"))
    with pytest.raises(ConfigError, match="out must be a torch.int16 tensor"):
        st.compact(torch.zeros(10, dtype=torch.int16), 10, st.count(torch.zeros(10, dtype=torch.int16), 10, 64),
                   torch.zeros(10, dtype=torch.int32), 64)


# -- CUDA only ------------------------------------------------------------------------------------------


@pytest.mark.cuda
def test_auto_uses_triton_on_cuda(monkeypatch):
    def no_torch(*args, **kwargs):
        raise AssertionError("the PyTorch path was taken on a CUDA tensor")

    monkeypatch.setattr(SparseCodec, "_encode_torch", no_torch)
    monkeypatch.setattr(SparseCodec, "_decode_torch", no_torch)
    x = torch.relu(torch.randn(1000, 700, device="cuda")).bfloat16()
    for sign_pack in (False, True):
        codec = SparseCodec(sign_pack=sign_pack)
        assert_bit_equal(codec.decode(codec.encode(x)), x)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sign_pack", [False, True])
def test_default_tiles_on_a_large_tensor(dtype, sign_pack):
    x = random_tensor(((1 << 20) + 77,), dtype, 0.3, seed=1, signed=not sign_pack, device="cuda")
    check_both_paths(x, 4096, sign_pack)


@pytest.mark.cuda
@pytest.mark.parametrize("sign_pack", [False, True])
def test_compress_into_an_arena_does_not_synchronize(sign_pack):
    raw = bits(random_tensor((100_000,), torch.bfloat16, 0.5, seed=1, signed=not sign_pack, device="cuda"))
    arena = torch.empty(200_000, dtype=torch.int32 if sign_pack else torch.int16, device="cuda")
    at = torch.zeros(1, dtype=torch.int64, device="cuda")
    se.encode(raw, 4096, sign_pack, values=arena, values_offset=at)  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        c = se.encode(raw, 4096, sign_pack, values=arena, values_offset=at)
        st.decompress(c.mask, c.tile_offsets, arena, raw.numel(), torch.int16, 4096, sign_pack, values_offset=at)
    finally:
        torch.cuda.set_sync_debug_mode("default")
