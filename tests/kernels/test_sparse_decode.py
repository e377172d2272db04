"""The run decoder (:mod:`actzip.kernels.sparse_decode`) against the original one and the PyTorch codec, bit for bit.

Every case runs on the CPU under Triton's interpreter (see conftest.py) and on CUDA when there is a GPU. Tiles
are small and few: the interpreter's cost is per program.
"""

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install 'actzip[triton]')")

from actzip.codecs.sparse import SparseCodec  # noqa: E402
from actzip.errors import ConfigError  # noqa: E402
from actzip.kernels import sparse as st  # noqa: E402
from actzip.kernels import sparse_decode as sd  # noqa: E402
from actzip.kernels.sparse_launch import values_base  # noqa: E402

from kernel_cases import DEVICES, bits, random_tensor  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn]  # every width (and both 16-bit floats)
DENSITIES = [0.0, 0.2, 0.5, 1.0]
# (n, tile, knobs): a partial last tile, a group of tiles with a partial last group, one partial tile
SHAPES = [(1000, 256, {}), (500, 128, {"tiles": 2}), (5, 64, {"layout": "flat"})]
KNOBS = [{"tiles": t, "layout": lay} for t in (1, 2, 4) for lay in sd.LAYOUTS]


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    yield


def buffers(x: torch.Tensor, tile: int) -> dict:
    return SparseCodec(tile_size=tile, kernel="torch").encode(x).buffers


def run(b: dict, n: int, dtype, tile: int, out=None, values=None, at=None, **knobs) -> torch.Tensor:
    """decode_run of buffers ``b`` (``values``/``at``: another values buffer and the payload's start in it)."""
    values = b["values"] if values is None else values
    out = torch.empty(n, dtype=bits(torch.empty(0, dtype=dtype)).dtype, device=values.device) if out is None else out
    return sd.decode_run(b["mask"], b["tile_offsets"], values, values_base(at, values.device), out, n, tile, **knobs)


def check(x: torch.Tensor, tile: int, *knob_sets: dict) -> None:
    """The run decoder, through decompress and with each of ``knob_sets``, gives the original decoder's and
    torch's bits."""
    codec = SparseCodec(tile_size=tile, kernel="torch")
    payload = codec.encode(x)
    n, b = x.numel(), payload.buffers
    want = bits(codec.decode(payload)).reshape(-1)
    assert torch.equal(want, bits(x).reshape(-1))
    assert torch.equal(st.decompress(b["mask"], b["tile_offsets"], b["values"], n, x.dtype, tile), want)
    assert torch.equal(st.decompress(b["mask"], b["tile_offsets"], b["values"], n, x.dtype, tile, variant="run"), want)
    for knobs in filter(None, knob_sets):  # {} is decompress's own
        assert torch.equal(run(b, n, x.dtype, tile, **knobs), want), knobs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("density", DENSITIES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_run_decoder_matches_gather_and_torch(device, dtype, density):
    for i, (n, tile, knobs) in enumerate(SHAPES):
        seed = 100 * DTYPES.index(dtype) + 10 * DENSITIES.index(density) + i
        x = random_tensor((n,), dtype, density, seed=seed, device=device)
        check(x, tile, knobs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("density", [0.3, 1.0])
def test_every_knob(device, density):
    x = random_tensor((1000,), torch.bfloat16, density, seed=4, device=device)
    check(x, 128, *KNOBS, {"tiles": 2, "warps": 1})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float32])
def test_dense_tiles_after_a_misaligned_start(device, dtype):
    # 37 values in the first tile leave the next tiles' values off 16 bytes; the dense tiles then need more
    # than a tile of source (its second half), and the last block ends in the buffer's last, partial 16 bytes.
    raw = torch.randint(1, 100, (1024,), generator=torch.Generator().manual_seed(6))
    raw[torch.randperm(128, generator=torch.Generator().manual_seed(7))[37:]] = 0
    x = raw.to(bits(torch.empty(0, dtype=dtype)).dtype).view(dtype).to(device)
    b = buffers(x, 128)
    assert b["values"].numel() == 37 + 896 and (933 * x.element_size()) % 16 != 0
    check(x, 128, {"tiles": 2}, {"tiles": 4, "layout": "flat"})


@pytest.mark.parametrize("device", DEVICES)
def test_float64(device):
    check(random_tensor((300,), torch.float64, 0.5, seed=3, device=device), 128)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("slack", [0, 5, 64])
def test_values_at_a_device_offset_in_a_dirty_arena(device, slack):
    # The payload at offset 13 of a larger buffer, with `slack` elements after it (0: the payload ends the
    # buffer's storage, whose length is no multiple of 16 bytes, so the last block reads the padded copy).
    x = random_tensor((900,), torch.bfloat16, 0.4, seed=8, device=device)
    b = buffers(x, 128)
    k = b["values"].numel()
    assert (13 + k) % 8  # the payload's end is inside a 16-byte block
    arena = torch.full((13 + k + slack,), -3, dtype=torch.int16, device=device)
    arena[13 : 13 + k] = b["values"]
    at = torch.tensor([13], dtype=torch.int64, device=device)
    out = torch.full((903,), 7, dtype=torch.int16, device=device)
    for knobs in ({}, {"tiles": 4}):
        out.fill_(7)
        run(b, 900, torch.bfloat16, 128, out=out, values=arena, at=at, **knobs)
        assert torch.equal(out[:900], bits(x)) and out[900:].tolist() == [7, 7, 7]
    # through decompress, from the arena and from a view of it that ends with the payload (its storage goes on)
    for values in (arena, arena[: 13 + k]):
        got = st.decompress(b["mask"], b["tile_offsets"], values, 900, torch.bfloat16, 128, values_offset=at,
                            variant="run")
        assert torch.equal(got, bits(x))


@pytest.mark.parametrize("device", DEVICES)
def test_decompress_takes_gather_where_run_does_not_apply(device):
    x = random_tensor((300,), torch.bfloat16, 0.5, seed=9, signed=False, device=device)
    p = SparseCodec(tile_size=128, sign_pack=True, kernel="torch").encode(x).buffers  # sign packed
    got = st.decompress(p["mask"], p["tile_offsets"], p["values"], 300, torch.bfloat16, 128, True, variant="run")
    assert torch.equal(got, bits(x))
    b = buffers(x, 128)
    odd = torch.empty(b["mask"].numel() + 1, dtype=torch.uint8, device=device)[1:]  # not 4-byte aligned
    odd.copy_(b["mask"])
    assert not sd.run_supported(odd)
    got = st.decompress(odd, b["tile_offsets"], b["values"], 300, torch.bfloat16, 128, variant="run")
    assert torch.equal(got, bits(x))
    with pytest.raises(ConfigError, match="4-byte aligned mask"):
        run(dict(b, mask=odd), 300, torch.bfloat16, 128)


def test_options_are_checked():
    b = buffers(torch.ones(10, dtype=torch.bfloat16), 64)
    with pytest.raises(ConfigError, match="variant must be one of"):
        st.decompress(b["mask"], b["tile_offsets"], b["values"], 10, torch.bfloat16, 64, variant="fast")
    with pytest.raises(ConfigError, match="tiles must be a power of two"):
        run(b, 10, torch.bfloat16, 64, tiles=3)
    with pytest.raises(ConfigError, match="layout must be one of"):
        run(b, 10, torch.bfloat16, 64, layout="cols")


# -- compiled for a Hopper GPU (the interpreter accepts code the GPU compiler refuses) -------------------

# Run in a fresh interpreter with TRITON_INTERPRET unset, so the kernel is defined for compiling.
HOPPER_SCRIPT = r"""
import re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from actzip.kernels import sparse_decode as sd

for ty, tiles, flat in (("i16", 2, False), ("u8", 1, True)):
    sig = {"mask_ptr": "*u8", "tile_offsets_ptr": "*i32", "values_ptr": f"*{ty}", "values_base_ptr": "*i64",
           "end_ptr": f"*{ty}", "out_ptr": f"*{ty}", "n": "i64", "n_tiles": "i32", "values_len": "i64",
           "end_start": "i64", "whole_len": "i64", "T": "constexpr", "G": "constexpr", "FLAT": "constexpr"}
    names = list(sig)
    consts = {(names.index("T"),): 4096, (names.index("G"),): tiles, (names.index("FLAT"),): flat}
    # every argument 16-divisible (as 16-byte aligned buffers specialize a launch) but values_len
    attrs = {(i,): [["tt.divisibility", 16]] for i, k in enumerate(names[:-3]) if k != "values_len"}
    try:
        kernel = triton.compile(ASTSource(sd.run_kernel, sig, constexprs=consts, attrs=attrs),
                                target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    except RuntimeError as e:  # no ptxas or no CUDA backend in this Triton build
        if "ptxas" in str(e) or "backend" in str(e).lower():
            print(f"SKIP cannot compile for CUDA here: {e}")
            raise SystemExit(0)
        raise
    ptx = kernel.asm["ptx"]
    loads = set(re.findall(r"ld\.global[.\w]*", ptx))
    # values in 16-byte loads only: the other loads are the int32 offsets and mask words and the int64 base
    assert "ld.global.v4.b32" in loads, loads
    assert not any(w in op for op in loads for w in (".b16", ".u16", ".b8", ".u8")), loads
    assert "st.global.v4.b32" in ptx
print("COMPILED")
"""


def test_run_kernel_compiles_for_hopper():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(root, "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", HOPPER_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    if "SKIP" in done.stdout:
        pytest.skip(done.stdout.strip())
    assert done.returncode == 0 and "COMPILED" in done.stdout, done.stderr[-3000:]
