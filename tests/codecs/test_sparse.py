"""The lossless sparse codec: bit-exact round trips on any dtype, shape, layout, density and special value."""

import math
import os
import subprocess
import sys
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import actzip
from actzip.codecs.sparse import SparseCodec, entropy_bound
from actzip.core import layout
from actzip.core.dtypes import FLOAT_DTYPES, bit_view_dtype
from actzip.errors import (
    ConfigError,
    InvalidValueError,
    PayloadError,
    UnknownCodecError,
    UnsupportedDtypeError,
    UnsupportedLayoutError,
)


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(bit_view_dtype(x.dtype))


def assert_bit_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(bits(a), bits(b))


def special_values(dtype: torch.dtype) -> torch.Tensor:
    """-0.0, smallest subnormal, +-inf where the format has it, NaNs with payloads and sign, max."""
    info = torch.finfo(dtype)
    vals = [-0.0, info.tiny, -info.tiny, info.max, -info.max, info.eps]
    x = torch.tensor(vals, dtype=torch.float64).to(dtype)
    w = bit_view_dtype(dtype)
    nbits = dtype.itemsize * 8
    # Smallest subnormal and NaN payloads as raw bit patterns (e4m3fn has no inf: its top pattern is NaN).
    raw = [1, (1 << (nbits - 1)) + 1, (1 << nbits) - 1, (1 << (nbits - 1)) - 1]
    raw_t = torch.tensor([r - (1 << nbits) if (w != torch.uint8 and r >= 1 << (nbits - 1)) else r for r in raw])
    extra = raw_t.to(w).view(dtype)
    if dtype not in (torch.float8_e4m3fn,):
        extra = torch.cat([extra, torch.tensor([math.inf, -math.inf]).to(dtype)])
    return torch.cat([x, extra])


def random_tensor(shape, dtype, density, g, signed=True):
    """Random raw bit patterns (every float class appears) with a given fraction kept non-zero."""
    w = bit_view_dtype(dtype)
    nbits = dtype.itemsize * 8
    n = math.prod(shape)
    hi = 1 << min(nbits, 62)
    raw = torch.randint(0, hi, (n,), generator=g, dtype=torch.int64)
    if not signed:
        raw &= (1 << (nbits - 1)) - 1
    if w is not torch.uint8 and nbits < 64:
        raw = torch.where(raw >= 1 << (nbits - 1), raw - (1 << nbits), raw)
    x = raw.to(w).view(dtype)
    keep = torch.rand(n, generator=g) < density
    x = torch.where(keep, x, torch.zeros((), dtype=dtype)) if dtype.itemsize > 1 else _where8(keep, x)
    return x.reshape(shape)


def _where8(keep, x):
    # torch.where has no fp8 kernels on CPU in every version: select on the raw bytes instead.
    return torch.where(keep, x.view(torch.uint8), torch.zeros((), dtype=torch.uint8)).view(x.dtype)


LAYOUTS = ["contiguous", "transposed", "sliced", "permuted", "expanded"]


def apply_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "transposed" and x.dim() >= 2:
        return x.transpose(0, -1).contiguous().transpose(0, -1)
    if layout == "permuted" and x.dim() >= 3:
        order = list(range(1, x.dim())) + [0]  # memory order with dim 0 innermost
        inverse = [order.index(d) for d in range(x.dim())]
        return x.permute(order).contiguous().permute(inverse)
    if layout == "sliced" and x.dim() >= 1 and x.shape[-1] > 1:
        return x[..., ::2]
    if layout == "expanded" and x.dim() >= 1:
        return x[..., :1].expand(*x.shape)
    return x


shapes = st.lists(st.integers(0, 17), min_size=0, max_size=4).map(tuple)


@given(
    shape=shapes,
    dtype=st.sampled_from(FLOAT_DTYPES),
    density=st.sampled_from([0.0, 0.05, 0.5, 0.9, 1.0]),
    tile=st.sampled_from([8, 64, 4096]),
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**31 - 1),
)
@settings(max_examples=150, deadline=None)
def test_round_trip_is_bit_exact(shape, dtype, density, tile, layout, seed):
    g = torch.Generator().manual_seed(seed)
    x = apply_layout(random_tensor(shape, dtype, density, g), layout)
    codec = actzip.codecs.get("sparse", tile_size=tile)
    p = codec.encode(x)
    y = codec.decode(p)
    assert_bit_equal(y, x)
    assert p.nbytes == sum(b.numel() * b.element_size() for b in p.buffers.values())


@given(
    shape=shapes,
    dtype=st.sampled_from(FLOAT_DTYPES),
    density=st.sampled_from([0.0, 0.3, 1.0]),
    tile=st.sampled_from([8, 4096]),
    seed=st.integers(0, 2**31 - 1),
)
@settings(max_examples=80, deadline=None)
def test_sign_packed_round_trip_is_bit_exact(shape, dtype, density, tile, seed):
    g = torch.Generator().manual_seed(seed)
    x = random_tensor(shape, dtype, density, g, signed=False)
    codec = actzip.codecs.get("sparse", sign_pack=True, tile_size=tile)
    p = codec.encode(x)
    assert_bit_equal(codec.decode(p), x)
    # Each tile's values fill whole 32-bit words; tile_offsets count the words of the earlier tiles.
    flags = bits(x).reshape(-1) != 0
    n_tiles = -(-flags.numel() // tile)
    counts = torch.zeros(n_tiles * tile, dtype=torch.bool)
    counts[: flags.numel()] = flags
    counts = counts.view(n_tiles, tile).sum(1)
    words = (counts * (dtype.itemsize * 8 - 1) + 31) // 32
    assert p.buffers["values"].dtype == torch.int32
    assert p.buffers["values"].numel() == int(words.sum())
    assert p.buffers["tile_offsets"].tolist() == (torch.cumsum(words, 0) - words).tolist()
    assert p.meta["nnz"] == int(flags.sum())


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_special_values_survive(dtype):
    x = special_values(dtype)
    x = torch.cat([x, torch.zeros(5, dtype=torch.uint8).view(dtype) if dtype.itemsize == 1 else torch.zeros(5, dtype=dtype)])
    codec = SparseCodec(tile_size=8)
    assert_bit_equal(codec.decode(codec.encode(x)), x)
    # -0.0 is stored as a value: only +0.0 counts as zero.
    assert codec.encode(x).meta["nnz"] == x.numel() - 5


@pytest.mark.parametrize("layout", ["transposed", "permuted"])
def test_dense_layouts_keep_their_strides(layout):
    x = apply_layout(torch.relu(torch.randn(4, 5, 6)), layout)
    y = SparseCodec().decode(SparseCodec().encode(x))
    assert y.stride() == x.stride()
    assert_bit_equal(y, x)


def test_format_sizes():
    x = torch.zeros(10_000, dtype=torch.bfloat16)
    x[::4] = 1.0
    p = SparseCodec(tile_size=4096).encode(x)
    n_tiles = 3
    assert p.buffers["mask"].numel() == n_tiles * 4096 // 8
    assert p.buffers["tile_offsets"].tolist() == [0, 1024, 2048]
    assert p.buffers["values"].numel() == 2500
    assert p.nbytes == 3 * 512 + 3 * 4 + 2500 * 2
    assert p.ratio == pytest.approx(20_000 / p.nbytes)


def test_sign_packed_format_sizes():
    x = torch.zeros(10_000, dtype=torch.bfloat16)
    x[::4] = 1.0
    p = SparseCodec(tile_size=4096, sign_pack=True).encode(x)
    # 1024, 1024 and 452 values of 15 bits: 480, 480 and ceil(452 * 15 / 32) = 212 words.
    assert p.buffers["tile_offsets"].tolist() == [0, 480, 960]
    assert p.buffers["values"].dtype == torch.int32 and p.buffers["values"].numel() == 1172
    assert p.nbytes == 3 * 512 + 3 * 4 + 1172 * 4
    assert p.meta["nnz"] == 2500


def test_sign_packed_stream_layout():
    # Two tiles of 64 fp8 elements; tile 0 stores 5 values, tile 1 stores 1. Value r of a tile sits at bits
    # [7r, 7r + 7) of the tile's words, and tile 1 starts on a fresh word.
    raw = torch.zeros(128, dtype=torch.uint8)
    raw[[0, 3, 9, 10, 63]] = torch.tensor([0x01, 0x7F, 0x55, 0x2A, 0x40], dtype=torch.uint8)
    raw[64 + 7] = 0x33
    x = raw.view(torch.float8_e4m3fn)
    p = SparseCodec(tile_size=64, sign_pack=True).encode(x)
    stream0 = 0x01 | 0x7F << 7 | 0x55 << 14 | 0x2A << 21 | 0x40 << 28  # 35 bits: two words
    words = [stream0 & 0xFFFFFFFF, stream0 >> 32, 0x33]
    assert p.buffers["values"].tolist() == [w - (1 << 32) if w >= 1 << 31 else w for w in words]
    assert p.buffers["tile_offsets"].tolist() == [0, 2]
    assert_bit_equal(SparseCodec(tile_size=64, sign_pack=True).decode(p), x)


def test_sign_packed_tiles_decode_alone():
    g = torch.Generator().manual_seed(4)
    x = random_tensor((1000,), torch.bfloat16, 0.3, g, signed=False)
    p = SparseCodec(tile_size=64, sign_pack=True).encode(x)
    mask = actzip.codecs.bitpack.unpack_bool(p.buffers["mask"])
    words = p.buffers["values"]
    offsets = p.buffers["tile_offsets"].tolist() + [words.numel()]
    for t in range(len(offsets) - 1):
        m = mask[t * 64 : (t + 1) * 64]
        stream = words[offsets[t] : offsets[t + 1]].view(torch.uint8)  # little-endian words = a byte stream
        got = torch.zeros(64, dtype=torch.int16)
        got[m] = actzip.codecs.bitpack.unpack_bits(stream, int(m.sum()), 15, torch.int16)
        assert torch.equal(got[: max(0, min(64, 1000 - t * 64))], bits(x)[t * 64 : (t + 1) * 64])


def test_tile_offsets_decode_each_tile_alone():
    g = torch.Generator().manual_seed(3)
    x = random_tensor((1000,), torch.float32, 0.3, g)
    p = SparseCodec(tile_size=64).encode(x)
    mask = actzip.codecs.bitpack.unpack_bool(p.buffers["mask"])
    vals = p.buffers["values"]
    for t, off in enumerate(p.buffers["tile_offsets"].tolist()):
        m = mask[t * 64 : (t + 1) * 64]
        got = torch.zeros(64, dtype=torch.int32)
        got[m] = vals[off : off + int(m.sum())]
        assert torch.equal(got[: max(0, min(64, 1000 - t * 64))], bits(x)[t * 64 : (t + 1) * 64])


def test_entropy_bound_values():
    x = torch.zeros(1 << 16, dtype=torch.bfloat16)
    x[::2] = 2.0
    b = entropy_bound(x)
    assert b.density == 0.5 and b.mask_bits == pytest.approx(1.0)
    assert b.value_bits == 15  # no sign bit set: the sign is known
    assert b.bound_bits == pytest.approx(1.0 + 0.5 * 15)
    p = SparseCodec(sign_pack=True).encode(x)
    assert b.codec_bits == pytest.approx(8 * p.nbytes / x.numel())
    assert 0.99 < b.efficiency <= 1.0
    neg = entropy_bound(-x)
    assert neg.value_bits == 16
    assert neg.codec_bits == pytest.approx(8 * SparseCodec().encode(-x).nbytes / x.numel())
    empty = entropy_bound(torch.zeros(1000))
    assert empty.bound_bits == 0.0 and empty.density == 0.0


def test_sparse_input_is_smaller_and_dense_is_not_much_bigger():
    x = torch.relu(torch.randn(256, 256)).bfloat16()
    assert SparseCodec().encode(x).ratio > 1.6
    d = torch.rand(256, 256).bfloat16() + 1
    assert SparseCodec().encode(d).nbytes <= d.numel() * 2 * (1 + 1 / 16 + 0.001)


# -- bad input ------------------------------------------------------------------------------------------


def test_sign_pack_refuses_negative_values_naming_the_tensor():
    x = torch.relu(torch.randn(100))
    x[7] = -1.0
    with pytest.raises(InvalidValueError, match=r"acts.*1 of 100.*sign bit"):
        SparseCodec(sign_pack=True).encode(x, name="acts")


def test_sign_pack_refuses_negative_zero():
    with pytest.raises(InvalidValueError):
        SparseCodec(sign_pack=True).encode(torch.tensor([0.0, -0.0, 1.0]))


def test_sign_pack_unchecked_drops_the_sign_as_documented():
    x = torch.tensor([1.0, -2.0, 0.0, -0.0])
    y = SparseCodec(sign_pack=True, check=False).decode(SparseCodec(sign_pack=True, check=False).encode(x))
    assert torch.equal(bits(y), bits(x.abs()))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.complex64, torch.uint8])
def test_unsupported_dtype(dtype):
    x = torch.zeros(4, dtype=dtype)
    with pytest.raises(UnsupportedDtypeError, match=r"sparse: grads has dtype .*supported: float64, float32"):
        SparseCodec().encode(x, name="grads")


def test_sparse_layout_is_refused_with_advice():
    x = torch.eye(4).to_sparse()
    with pytest.raises(UnsupportedLayoutError, match=r"x has layout torch.sparse_coo.*to_dense"):
        SparseCodec().encode(x, name="x")


def test_non_tensor_is_refused():
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        SparseCodec().encode([1.0, 2.0])


@pytest.mark.parametrize("tile", [0, -8, 12, 8.0])
def test_bad_tile_size(tile):
    with pytest.raises(ConfigError, match="tile_size"):
        actzip.codecs.get("sparse", tile_size=tile)


def test_registry_errors_list_what_fits():
    with pytest.raises(UnknownCodecError, match=r"unknown codec 'zip'.*available:.*sparse"):
        actzip.codecs.get("zip")
    with pytest.raises(ConfigError, match=r"no option\(s\) bits.*options: tile_size, sign_pack, check, kernel"):
        actzip.codecs.get("sparse", bits=4)
    assert {"sparse", "passthrough"} <= set(actzip.codecs.available())


def test_decode_refuses_foreign_payload():
    p = actzip.codecs.get("passthrough").encode(torch.ones(3))
    with pytest.raises(PayloadError, match="made by codec 'passthrough'"):
        SparseCodec().decode(p)


def test_codec_flags_and_supports():
    c = actzip.codecs.get("sparse")
    assert c.lossless and c.unbiased
    assert c.supports(torch.ones(2)) is None
    assert "dtype torch.int64" in c.supports(torch.ones(2, dtype=torch.int64))


def test_requires_grad_input_is_encoded_detached():
    x = torch.relu(torch.randn(10, requires_grad=True))
    p = SparseCodec().encode(x)
    assert not any(b.requires_grad for b in p.buffers.values())
    assert_bit_equal(SparseCodec().decode(p), x.detach())


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cuda_round_trip_matches_cpu_payload(dtype):
    g = torch.Generator().manual_seed(1)
    x = random_tensor((33, 65), dtype, 0.4, g)
    codec = SparseCodec(tile_size=64)
    pc, pg = codec.encode(x), codec.encode(x.cuda())
    for k in pc.buffers:
        assert torch.equal(pc.buffers[k], pg.buffers[k].cpu())
    assert_bit_equal(codec.decode(pg).cpu(), x)


# -- kernel option ---------------------------------------------------------------------------------------


def test_kernel_option_is_checked():
    with pytest.raises(ConfigError, match=r"kernel must be one of 'auto', 'torch', 'triton'.*'cuda'"):
        actzip.codecs.get("sparse", kernel="cuda")
    for tile in (8, 96, 32, 1 << 17):
        with pytest.raises(ConfigError, match=r"kernel='triton'.*tile_size=\d+ is not a power of two from 64"):
            actzip.codecs.get("sparse", kernel="triton", tile_size=tile)
    assert actzip.codecs.get("sparse", kernel="torch", tile_size=8).options()["kernel"] == "torch"
    assert actzip.codecs.get("sparse").kernel == "auto"


def test_auto_picks_torch_on_cpu(monkeypatch):
    from actzip.kernels import runtime

    def no_triton(*args, **kwargs):
        raise AssertionError("the Triton path was taken on a CPU tensor")

    monkeypatch.setattr(SparseCodec, "_encode_triton", no_triton)
    monkeypatch.setattr(runtime, "interpreter_enabled", lambda: True)  # even where the interpreter is on
    before = runtime.fallback_counts()
    x = torch.relu(torch.randn(300))
    for sign_pack in (False, True):
        codec = actzip.codecs.get("sparse", kernel="auto", sign_pack=sign_pack, tile_size=64)
        assert_bit_equal(codec.decode(codec.encode(x)), x)
    assert runtime.fallback_counts() == before  # CPU tensors are no fallback: nothing warned or counted


def test_triton_on_cpu_without_interpreter_is_a_clear_error(monkeypatch):
    from actzip.kernels import runtime

    monkeypatch.setattr(runtime, "interpreter_enabled", lambda: False)
    codec = actzip.codecs.get("sparse", kernel="triton", tile_size=64)
    on_cpu = r"the tensor is on the CPU.*TRITON_INTERPRET=1"
    reason = on_cpu if runtime.triton_available() else r"Triton is not installed"
    with pytest.raises(runtime.KernelUnavailableError, match=rf"sparse\(kernel='triton'\) cannot run: {reason}"):
        codec.encode(torch.ones(10))
    p = actzip.codecs.get("sparse", kernel="torch", tile_size=64).encode(torch.ones(10))
    with pytest.raises(ConfigError, match="cannot run"):
        codec.decode(p)


def test_triton_without_triton_installed_is_a_clear_error(monkeypatch):
    from actzip.kernels import runtime

    monkeypatch.setattr(runtime, "triton_import_error", lambda: "ModuleNotFoundError: No module named 'triton'")
    with pytest.raises(ConfigError, match=r"cannot run: Triton is not installed.*pip install 'actzip\[triton\]'"):
        actzip.codecs.get("sparse", kernel="triton").encode(torch.ones(10))


def test_triton_on_cpu_error_in_a_fresh_process():
    # The real check, with no interpreter variable in the environment and nothing patched.
    code = (
        "import torch, actzip\n"
        "try:\n"
        "    actzip.codecs.get('sparse', kernel='triton').encode(torch.ones(3))\n"
        "except actzip.errors.ConfigError as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("KernelUnavailableError sparse(kernel='triton') cannot run: ")
    assert ("TRITON_INTERPRET=1" in out.stdout) or ("Triton is not installed" in out.stdout)


def test_auto_falls_back_on_cuda_without_triton_warning_once(monkeypatch):
    # No CUDA tensor is needed: the choice is made from the device alone.
    from actzip.kernels import runtime

    monkeypatch.setattr(runtime, "triton_import_error", lambda: "ModuleNotFoundError: No module named 'triton'")
    runtime.reset_fallbacks()
    codec = actzip.codecs.get("sparse")
    cuda = torch.device("cuda", 0)
    with pytest.warns(RuntimeWarning, match=r"PyTorch implementation instead of the Triton kernels because Triton is"):
        assert codec.uses_triton(cuda, torch.bfloat16, 4096, False) is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second fallback for the same reason is counted, not warned
        assert codec.uses_triton(cuda, torch.bfloat16, 4096, False) is False
    [(key, count)] = runtime.fallback_counts().items()
    assert "Triton is not installed" in key and count == 2
    runtime.reset_fallbacks()
    assert runtime.fallback_counts() == {}
    assert actzip.codecs.get("sparse", kernel="torch").uses_triton(cuda, torch.bfloat16, 4096, False) is False


@pytest.mark.parametrize("name", ["memory_order", "memory_rows", "restore_order"])
def test_memory_order_helpers_still_import_from_here_with_a_warning(name):
    from actzip import compat
    from actzip.codecs import sparse

    compat.warned.discard(f"actzip.codecs.sparse.{name}")
    with pytest.warns(FutureWarning, match=rf"actzip.codecs.sparse.{name} is deprecated.*actzip.core.layout.{name}"):
        assert getattr(sparse, name) is getattr(layout, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        assert getattr(sparse, name) is getattr(layout, name)
    with pytest.raises(AttributeError, match="has no attribute 'memory_orders'"):
        sparse.memory_orders
