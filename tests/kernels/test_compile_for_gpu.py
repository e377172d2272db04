"""The sparse and quant kernels compile for a Hopper GPU, checked without one.

Triton's interpreter (what CPU-only test runs use) accepts code the GPU compiler refuses, e.g. a module-level
constant that is not a ``tl.constexpr``. Compiling ahead of time for an sm_90 target (Triton's own front end,
LLVM and the bundled ptxas; no driver needed) catches that on any machine. The kernels must be defined with
the interpreter off, so each case runs this file as a script in a fresh interpreter.
"""

import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton", reason="Triton is not installed (pip install 'actzip[triton]')")

import triton.language as tl  # noqa: E402

try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError:  # pragma: no cover - older or newer Triton layouts
    GPUTarget = ASTSource = None

pytestmark = pytest.mark.skipif(ASTSource is None, reason="this Triton has no ahead-of-time compile API")


def compile_for_hopper(fn, signature: dict, constants: dict, aligned: bool = False) -> str:
    """PTX of ``fn`` for sm_90. ``aligned``: every argument 16-divisible, as a launch with 16-byte aligned
    buffers and sizes specializes it (the layout and vectorization a real launch gets)."""
    sig = {**signature, **{k: "constexpr" for k in constants}}
    names = list(sig)
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(signature))} if aligned else {}
    src = ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in constants.items()}, attrs=attrs)
    try:
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    except RuntimeError as e:  # no ptxas or no CUDA backend in this Triton build
        if "ptxas" in str(e) or "backend" in str(e).lower():
            print(f"SKIP cannot compile for CUDA here: {e}")
            sys.exit(0)
        raise
    return kernel.asm["ptx"]


ENCODE_SIG = {"src_ptr": "*bf16", "act_ptr": "*bf16", "mask_ptr": "*u8", "tile_offsets_ptr": "*i32",
              "values_ptr": "*i16", "work_ptr": "*i64", "start_ptr": "*i64", "counters_ptr": "*i64", "n": "i64",
              "capacity": "i64"}


def check_single_pass_encoder_compiles(relu, act, arena, row):
    from actzip.kernels import sparse_encode as se

    sig = dict(ENCODE_SIG, src_ptr="*bf16" if relu else "*i16")
    consts = dict(T=4096, ELEM_BYTES=2, BITS_DTYPE=tl.int16, RELU=relu, ACT_OUT=act, ARENA=arena, ROW=row)
    ptx = compile_for_hopper(se.encode_kernel, sig, consts)
    assert "atom" in ptx  # the ticket and the published status words
    compile_for_hopper(se.reserve_kernel, {"total_ptr": "*i64", "res_ptr": "*i64", "counters_ptr": "*i64",
                                           "start_ptr": "*i64", "capacity": "i64"}, dict(ELEM_BYTES=4, ARENA=arena))


COMPACT_SIG = {"bits_ptr": "*i16", "tile_offsets_ptr": "*i32", "values_ptr": "*i16", "values_base_ptr": "*i64",
               "ok_ptr": "*i32", "act_ptr": "*bf16", "n": "i64"}


def check_two_pass_and_decode_kernels_compile(sign_pack):
    from actzip.kernels import sparse_signpack as sp
    from actzip.kernels import sparse as st

    width = 15 if sign_pack else 16
    for relu in (False, True):
        compile_for_hopper(st.count_kernel, {"bits_ptr": "*bf16" if relu else "*i16", "mask_ptr": "*u8",
                                             "sizes_ptr": "*i32", "nvals_ptr": "*i32", "nsign_ptr": "*i32", "n": "i64"},
                           dict(T=4096, NBITS=16, WIDTH=width, SIGN_PACK=sign_pack, RELU=relu, BITS_DTYPE=tl.int16))
        compile_for_hopper(st.compact_kernel, dict(COMPACT_SIG, bits_ptr="*bf16" if relu else "*i16"),
                           dict(T=4096, HAS_OK=True, VEC=8, SLOT=sign_pack, RELU=relu, ACT_OUT=2 if relu else 0,
                                BITS_DTYPE=tl.int16))
    if sign_pack:
        for slot in (False, True):
            compile_for_hopper(sp.pack_kernel, {"scratch_ptr": "*i16", "value_offsets_ptr": "*i64",
                                                "nvals_ptr": "*i32", "tile_offsets_ptr": "*i32", "words_ptr": "*i32",
                                                "words_base_ptr": "*i64", "ok_ptr": "*i32"},
                               dict(T=4096, WIDTH=width, LANES=512, SLOT=slot, HAS_OK=True))


def check_compact_stores_stay_scalar():
    # compact_kernel's VEC claims aligned runs of store offsets that are not there, for the layout only: the
    # per-element store mask must keep every value store scalar (each element through its own address).
    import re

    from actzip.kernels import sparse as st

    for bits, vec in (("i16", 8), ("u8", 16), ("i32", 4)):
        sig = dict(COMPACT_SIG, bits_ptr=f"*{bits}", values_ptr=f"*{bits}", act_ptr=f"*{bits}")
        for has_ok in (False, True):
            ptx = compile_for_hopper(st.compact_kernel, sig, dict(T=4096, HAS_OK=has_ok, VEC=vec, SLOT=False, RELU=False,
                                                                  ACT_OUT=0, BITS_DTYPE=tl.int16), aligned=True)
            stores = re.findall(r"st\.global[.\w]*", ptx)
            assert stores and not any(".v" in op for op in stores), (bits, has_ok, sorted(set(stores)))
            if not has_ok:  # the layout took effect: 16-byte loads
                assert "ld.global.v4" in ptx, (bits, sorted(set(re.findall(r"ld\.global[.\w]*", ptx))))


def check_relu_mlp_kernels_compile():
    from actzip.kernels import relu_mlp as rt

    payload = {"mask_ptr": "*u8", "tile_offsets_ptr": "*i32", "values_ptr": "*i16", "values_base_ptr": "*i64"}
    consts = dict(T=4096, WIDTH=16, SIGN_PACK=False, BITS_DTYPE=tl.int16, FLOAT_DTYPE=tl.bfloat16, SQUARE=True)
    compile_for_hopper(rt.relu_grad_kernel, {"grad_ptr": "*bf16", "out_ptr": "*bf16", **payload, "n": "i64"}, consts)
    compile_for_hopper(rt.activation_kernel, {"out_ptr": "*bf16", **payload, "n": "i64"}, consts)


def check_quant_kernels_compile():
    # bfloat16 in and out, packed 4-bit and 8-bit codes, both roundings: the GPU-only paths (HW) included
    from actzip.kernels import quant as qt
    from actzip.kernels import quant_tiles as tiles

    for bits, stochastic, rows in ((4, True, False), (8, False, False), (4, False, True)):
        geo = tiles.geometry(128, 2, bits)
        geo.pop("num_warps")
        word = {8: "*u8", 16: "*i16", 32: "*i32", 64: "*i64"}[geo["K"] * bits] if bits < 8 else "*u8"
        top = (1 << bits) - 1
        enc = {"x_ptr": "*bf16", "codes_ptr": word, "p0_ptr": "*fp32", "p1_ptr": "*fp32", "n": "i64",
               "n_rows": "i64", "key0": "i32", "key1": "i32", "row_groups": "i64", "row_stride": "i64",
               "noise_ptr": "*i32"}
        for noise in (False, True) if stochastic else (False,):  # the step offset read on the device, or not
            compile_for_hopper(qt.quant_encode_kernel, enc, dict(geo, BITS=bits, TOP=top, OFF=0, ABSMAX=False,
                                                                   STOCHASTIC=stochastic, IN_BF16=True, WIDE=False,
                                                                   HW=True, ROWS=rows, NOISE=noise))  # fmt: skip
        dec = {"codes_ptr": word if bits < 8 else "*i32", "p0_ptr": "*fp32", "p1_ptr": "*fp32", "out_ptr": "*bf16",
               "n": "i64", "n_rows": "i64", "zero": "i32"}
        compile_for_hopper(qt.quant_decode_kernel, dec, dict(geo, BITS=bits, TOP=top, RECIP=1.0 / top, ABSMAX=False,
                                                               OUT_BF16=True, HW=True))


ENCODE_CASES = [(True, 2, True, 8), (False, 0, False, 2), (False, 0, True, 8), (True, 1, False, 2)]


def _main(case: str) -> None:
    if case == "encode":
        for args in ENCODE_CASES:
            check_single_pass_encoder_compiles(*args)
    elif case == "quant":
        check_quant_kernels_compile()
    elif case == "two-pass":
        for sign_pack in (False, True):
            check_two_pass_and_decode_kernels_compile(sign_pack)
        check_compact_stores_stay_scalar()
    else:
        check_relu_mlp_kernels_compile()
    print("COMPILED")


@pytest.mark.parametrize("case", ["encode", "two-pass", "relu-mlp", "quant"])
def test_kernels_compile_for_hopper(case):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(root, "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, __file__, case], env=env, capture_output=True, text=True, timeout=300)
    if "SKIP" in done.stdout:
        pytest.skip(done.stdout.strip())
    assert done.returncode == 0 and "COMPILED" in done.stdout, done.stderr[-3000:]


if __name__ == "__main__":
    _main(sys.argv[1])
