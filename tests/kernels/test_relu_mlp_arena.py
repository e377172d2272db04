"""The fused ReLU² MLP on the kernel path with an arena: exact, no host sync, overflow recomputed; with a
capturable arena (or under CUDA graph capture) a refused payload gives NaN and skips a fused optimizer's step."""

import copy
import warnings
import weakref

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import actzip
from actzip.errors import ConfigError
from actzip.memory.cache import CacheContext as ActivationCache
from actzip.memory.modules import SparseGatedReLUMLP, SparseReLUMLP
from actzip.memory.modules import relu_mlp as R
from actzip.memory.modules.arena import Arena, GraphedStep
from actzip.memory.cache.rebuild import rebuild_saved, recompute

pytest.importorskip("triton")
from actzip.kernels import runtime  # noqa: E402
from actzip.kernels import sparse_encode as se  # noqa: E402

DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(runtime.unavailable_reason("cpu") is not None, reason="no interpreter")),
    pytest.param("cuda", marks=pytest.mark.cuda),
]


def ref_and_fused(device, dtype, arena, square=True, sign_pack=False, gated=False):
    torch.manual_seed(0)
    d, h = 32, 96
    if gated:
        ref = nn.ModuleDict({"gate_proj": nn.Linear(d, h), "up_proj": nn.Linear(d, h), "down_proj": nn.Linear(h, d)})
    else:
        ref = nn.ModuleDict({"up": nn.Linear(d, h), "down": nn.Linear(h, d)})
    ref = ref.to(device=device, dtype=dtype)
    m = copy.deepcopy(ref)
    codec = actzip.codecs.get("sparse", kernel="triton", tile_size=256, sign_pack=sign_pack, check=not sign_pack)
    if gated:
        fused = SparseGatedReLUMLP(m["gate_proj"], m["up_proj"], m["down_proj"], square=square, codec=codec, arena=arena)
    else:
        fused = SparseReLUMLP(m["up"], m["down"], square=square, codec=codec, arena=arena)

    def run_ref(x):
        if gated:
            r = F.relu(ref["gate_proj"](x))
            return ref["down_proj"]((r.square() if square else r) * ref["up_proj"](x))
        r = F.relu(ref["up"](x))
        return ref["down"](r.square() if square else r)

    return run_ref, ref, fused


def grads(fn, params, x):
    x = x.clone().requires_grad_()
    y = fn(x)
    (y.float() * torch.linspace(-1, 1, y.shape[-1], device=y.device)).sum().backward()
    return [y.detach(), x.grad] + [p.grad for p in params]


def dtypes_for(device):
    return [torch.float32] if device == "cpu" else [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("capacity", [1 << 20, 0])
@pytest.mark.parametrize("sign_pack", [False, True])
@pytest.mark.parametrize("gated", [False, True])
def test_arena_path_is_exact_and_overflow_recomputes(device, capacity, sign_pack, gated):
    for dtype in dtypes_for(device):
        arena = Arena(capacity, device=device)
        run_ref, ref, fused = ref_and_fused(device, dtype, arena, sign_pack=sign_pack, gated=gated)
        # Small on the CPU: Triton's interpreter runs the sign-packing scan slowly.
        x = torch.randn(*((2, 8, 32) if device == "cpu" else (3, 40, 32)), device=device, dtype=dtype)
        before = R.arena_overflows()
        want = grads(run_ref, list(ref.parameters()), x)
        with pytest.warns(UserWarning, match="arena had no room") if capacity == 0 and before == 0 else _nothing():
            got = grads(fused, list(fused.parameters()), x)
        for a, b in zip(want, got):
            assert torch.equal(a, b)
        assert (R.arena_overflows() > before) == (capacity == 0)
        assert arena.overflows() == (1 if capacity == 0 else 0)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("capacity", [1 << 20, 0])
def test_rebuilt_input_is_not_kept_for_the_recompute(device, capacity):
    # The recompute that an overflow needs must not keep the MLP input alive: when a norm output is rebuilt
    # in backward, nothing may hold it in between (and an overflow recomputes from the rebuilt input).
    arena = Arena(capacity, device=device)
    run_ref, ref, fused = ref_and_fused(device, torch.float32, arena)
    norm = nn.LayerNorm(32).to(device)
    x0 = torch.randn(16, 32, device=device)
    want = grads(lambda t: run_ref(norm(t)), list(ref.parameters()), x0)
    x = x0.clone().requires_grad_()
    n = norm(x)
    with rebuild_saved([(n, recompute(norm, x))]):
        y = fused(n)
    alive = weakref.ref(n)
    del n
    assert alive() is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the overflow's one-time notice
        (y.float() * torch.linspace(-1, 1, y.shape[-1], device=device)).sum().backward()
    got = [y.detach(), x.grad] + [p.grad for p in fused.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert arena.overflows() == (1 if capacity == 0 else 0)


@pytest.mark.parametrize("device", DEVICES)
def test_arena_fit_then_no_overflow_and_account(device):
    arena = Arena(device=device)
    run_ref, ref, fused = ref_and_fused(device, torch.float32, arena)
    x = torch.randn(16, 32, device=device)
    grads(fused, list(fused.parameters()), x)  # first step: unsized, measured, recomputed
    arena.reset()
    cap = arena.fit()
    assert cap >= arena.high_water_bytes()
    refused = arena.overflows()
    cache = ActivationCache.count_only()
    with cache:
        y = fused(x.requires_grad_())
    y.sum().backward()
    assert arena.overflows() == refused
    st = cache.last.by_rule["relu_mlp"]
    assert 0 < st.stored_bytes < st.dense_bytes


def test_arena_needs_kernels_and_unchecked_sign_packing():
    arena = Arena(1024, device="cpu")
    with pytest.raises(ConfigError, match="Triton kernels"):
        SparseReLUMLP(nn.Linear(4, 8), nn.Linear(8, 4), square=True, codec=actzip.codecs.get("sparse", kernel="torch"), arena=arena)
    with pytest.raises(ConfigError, match="check=False"):
        SparseReLUMLP(nn.Linear(4, 8), nn.Linear(8, 4), square=True, codec=actzip.codecs.get("sparse", sign_pack=True), arena=arena)
    if runtime.unavailable_reason("cpu") is not None:
        with pytest.raises(ConfigError, match="cannot run"):
            SparseReLUMLP(nn.Linear(4, 8), nn.Linear(8, 4), square=True, arena=arena)


@pytest.mark.cuda
@pytest.mark.parametrize("capturable", [False, True])
def test_training_step_has_no_host_sync(capturable):
    device = "cuda"
    arena = Arena(64 << 20, device=device, capturable=capturable)
    _, _, fused = ref_and_fused(device, torch.bfloat16, arena, sign_pack=True)
    x = torch.randn(512, 32, device=device, dtype=torch.bfloat16, requires_grad=True)
    opt = torch.optim.SGD(fused.parameters(), lr=0.1)
    for _ in range(2):  # warm up: compile the kernels, fill caches
        fused(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        arena.reset()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = fused(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        arena.reset()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert arena.overflows() == 0


# -- the encoder's counters and the step flag -----------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_encoder_counts_like_reserve_and_raises_the_step_flag(device):
    from actzip.memory.modules import arena as A

    assert se.ONE_F32_BITS.value == A.ONE_F32_BITS
    h = torch.randn(3, 170, device=device)
    size = int(se.encode(h, 64, False, relu=True, arena=Arena(1 << 16, device=device)).total) * 4
    capacity = size * 3 // 2  # room for one payload, not two
    by_kernel, by_reserve = Arena(capacity, device=device), Arena(capacity, device=device)
    for _ in range(3):  # fits, then refused twice (the cursor stays where the refused payloads would start)
        e = se.encode(h, 64, False, relu=True, arena=by_kernel)
        by_reserve.reserve(e.total * 4)
        assert torch.equal(by_kernel.counters, by_reserve.counters)
    assert by_kernel.step_overflows() == 2 and by_kernel.overflows() == 2 and float(by_kernel.step_overflow) == 1.0
    by_kernel.reset()
    assert float(by_kernel.step_overflow) == 0.0 and by_kernel.step_overflows() == 0 and by_kernel.overflows() == 2
    e = se.encode(h, 64, False, relu=True, arena=by_kernel)
    assert int(e.ok) == 1 and float(by_kernel.step_overflow) == 0.0


# -- a capturable arena: decided on the device, NaN on refusal -----------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sign_pack", [False, True])
@pytest.mark.parametrize("gated", [False, True])
def test_capturable_arena_exact_when_it_fits_nan_when_refused(device, sign_pack, gated):
    for dtype in dtypes_for(device):
        x = torch.randn(*((2, 8, 32) if device == "cpu" else (3, 40, 32)), device=device, dtype=dtype)
        big = Arena(1 << 20, device=device, capturable=True)
        run_ref, ref, fused = ref_and_fused(device, dtype, big, sign_pack=sign_pack, gated=gated)
        want = grads(run_ref, list(ref.parameters()), x)
        before = R.arena_overflows()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            got = grads(fused, list(fused.parameters()), x)
            for a, b in zip(want, got):
                assert torch.equal(a, b)
            assert big.overflows() == 0 and float(big.step_overflow) == 0.0

            small = Arena(16, device=device, capturable=True)  # nonzero: a regression reads garbage, not a fault
            _, _, fused = ref_and_fused(device, dtype, small, sign_pack=sign_pack, gated=gated)
            got = grads(fused, list(fused.parameters()), x)
        assert not [w for w in seen if "arena had no room" in str(w.message)]
        assert R.arena_overflows() == before  # nothing recomputed: the host was never asked
        assert torch.equal(got[0], want[0])  # forward does not need the payload
        # Everything that depends on relu(h) is NaN (x, the projections before and the down weight); the
        # down projection's bias gradient does not.
        for g in got[1:-1]:
            assert g.isnan().all()
        assert torch.equal(got[-1], want[-1])
        assert float(small.step_overflow) == 1.0 and small.step_overflows() == 1 and small.overflows() == 1
        small.reset()
        assert float(small.step_overflow) == 0.0 and small.overflows() == 1


@pytest.mark.parametrize("device", DEVICES)
def test_capturable_refusal_skips_a_fused_adamw_step(device):
    arena = Arena(16, device=device, capturable=True)
    _, _, fused = ref_and_fused(device, torch.float32, arena)
    opt = torch.optim.AdamW(fused.parameters(), lr=0.1, fused=True)
    opt.found_inf = arena.step_overflow
    before = [p.detach().clone() for p in fused.parameters()]
    fused(torch.randn(8, 32, device=device)).square().mean().backward()
    opt.step()
    assert all(torch.equal(p, q) for p, q in zip(fused.parameters(), before))
    arena.reset()
    arena.fit()
    opt.zero_grad(set_to_none=True)
    fused(torch.randn(8, 32, device=device)).square().mean().backward()
    opt.step()
    assert float(arena.step_overflow) == 0.0
    assert not any(torch.equal(p, q) for p, q in zip(fused.parameters(), before))


# -- CUDA graphs --------------------------------------------------------------------------------------------


def relu2_stack(arena, dtype, sign_pack=False, layers=2, d=64, hidden=256):
    torch.manual_seed(0)
    ref = nn.ModuleList(nn.ModuleDict({"up": nn.Linear(d, hidden), "down": nn.Linear(hidden, d)})
                        for _ in range(layers)).to(device="cuda", dtype=dtype)
    m = copy.deepcopy(ref)
    codec = actzip.codecs.get("sparse", kernel="triton", tile_size=1024, sign_pack=sign_pack, check=not sign_pack)
    fused = nn.ModuleList(SparseReLUMLP(layer["up"], layer["down"], square=True, codec=codec, arena=arena)
                          for layer in m)
    return ref, fused


def run_ref(ref, x):
    for layer in ref:
        x = x + layer["down"](F.relu(layer["up"](x)).square())
    return x


def run_fused(fused, x):
    for layer in fused:
        x = x + layer(x)
    return x


def loss_of(y):
    return y.float().square().mean()


def adamw(module):
    # A small lr: densities barely drift between steps, so the fitted arena keeps fitting (margin 1.25).
    return torch.optim.AdamW(module.parameters(), lr=1e-3, fused=True, capturable=True)


def reference_step(ref, opt, x):
    opt.zero_grad(set_to_none=True)
    loss = loss_of(run_ref(ref, x))
    loss.backward()
    opt.step()
    return loss


def assert_same(fused, ref):
    for p, q in zip(fused.parameters(), ref.parameters()):
        assert torch.equal(p, q)
        assert torch.equal(p.grad, q.grad)


def captured_step(fused, opt, arena, static_x, ref, opt_ref, warmup_batches, fit):
    """Torch's whole-network recipe: warm up on a side stream, capture with found_inf wired, return the graph."""

    def step():
        opt.zero_grad(set_to_none=True)
        arena.reset()
        loss = loss_of(run_fused(fused, static_x))
        loss.backward()
        opt.step()
        return loss

    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    for x in warmup_batches:  # eager steps: a refusal is recomputed (exact), so no found_inf yet
        static_x.copy_(x)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            step()
        main.wait_stream(side)
        reference_step(ref, opt_ref, x)
        assert_same(fused, ref)
        if fit:
            arena.fit()
    opt.found_inf = arena.step_overflow
    opt.zero_grad(set_to_none=True)  # backward allocates the gradients in the graph's pool
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = step()
    return graph, loss


def captured_float32_stack(arena, n_batches: int, warm: int, fit: bool):
    """A float32 ReLU² stack and its reference with AdamW each, ``n_batches`` inputs, and a step captured after
    ``warm`` eager steps on both: ``(ref, fused, opt_ref, opt, batches, static_x, graph, static_loss)``."""
    ref, fused = relu2_stack(arena, torch.float32)
    opt_ref, opt = adamw(ref), adamw(fused)
    batches = [torch.randn(64, 64, device="cuda") for _ in range(n_batches)]
    static_x = torch.empty_like(batches[0])
    graph, static_loss = captured_step(fused, opt, arena, static_x, ref, opt_ref, batches[:warm], fit=fit)
    return ref, fused, opt_ref, opt, batches, static_x, graph, static_loss


@pytest.mark.cuda
def test_captured_training_step_matches_eager_reference():
    arena = Arena(device="cuda")
    ref, fused, opt_ref, _, batches, static_x, graph, static_loss = captured_float32_stack(arena, 6, 3, fit=True)
    refused = arena.overflows()
    for x in batches[3:]:  # new inputs, copied into the static one
        static_x.copy_(x)
        graph.replay()
        want = reference_step(ref, opt_ref, x)
        assert torch.equal(static_loss, want)
        assert_same(fused, ref)
    assert arena.overflows() == refused and float(arena.step_overflow) == 0.0


@pytest.mark.cuda
def test_captured_step_with_too_small_arena_is_skipped():
    arena = Arena(256, device="cuda")  # far less than any payload: every reservation is refused
    _, fused, _, opt, batches, static_x, graph, _ = captured_float32_stack(arena, 3, 2, fit=False)
    refused = arena.overflows()
    params = [p.detach().clone() for p in fused.parameters()]
    steps = [opt.state[p]["step"].clone() for p in fused.parameters()]
    static_x.copy_(batches[2])
    graph.replay()
    assert arena.overflows() > refused and float(arena.step_overflow) == 1.0
    assert fused[0].up.weight.grad.isnan().all()
    for p, before, step in zip(fused.parameters(), params, steps):
        assert torch.equal(p, before) and torch.equal(opt.state[p]["step"], step)


@pytest.mark.cuda
def test_graphed_step_replays_exactly_and_recaptures_when_the_arena_grows():
    arena = Arena(device="cuda")
    ref, fused = relu2_stack(arena, torch.bfloat16, sign_pack=True)
    opt_ref, opt = adamw(ref), adamw(fused)
    static_x = torch.empty(64, 64, device="cuda", dtype=torch.bfloat16)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_of(run_fused(fused, static_x))
        loss.backward()
        opt.step()
        return loss

    graphed = GraphedStep(step, arena, opt, warmup=2)

    def one_step():
        x = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
        static_x.copy_(x)
        loss = graphed()
        assert torch.equal(loss, reference_step(ref, opt_ref, x))
        assert_same(fused, ref)
        assert not graphed.refit()

    for _ in range(5):
        one_step()
    assert graphed.eager_steps == 2 and graphed.captures == 1
    # Denser activations than in any step so far: the replay's reservations are refused, its step skipped.
    with torch.no_grad():
        for net in (ref, fused):
            for layer in net:
                (layer["up"] if isinstance(layer, nn.ModuleDict) else layer.up).bias.add_(4.0)
    x = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    static_x.copy_(x)
    params = [p.detach().clone() for p in fused.parameters()]
    refused = arena.overflows()
    capacity = arena.capacity_bytes
    graphed()
    assert all(torch.equal(p, q) for p, q in zip(fused.parameters(), params))
    assert arena.overflows() > refused
    assert graphed.refit() and graphed.graph is None and arena.capacity_bytes > capacity
    loss = graphed()  # the same batch again, eagerly: the skipped step redone
    assert torch.equal(loss, reference_step(ref, opt_ref, x))
    assert_same(fused, ref)
    assert graphed.graph is None and graphed.eager_steps == 3
    for _ in range(3):  # captured anew, then replayed
        one_step()
    assert graphed.captures == 2 and graphed.eager_steps == 3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sign_pack", [False, True])
@pytest.mark.parametrize("square", [True, False])
def test_exact_allocation_kernel_path_is_exact(device, sign_pack, square):
    # No arena: the payload is sized on the host; the activation is still written over h in the same pass.
    for dtype in dtypes_for(device):
        run_ref, ref, fused = ref_and_fused(device, dtype, None, square=square, sign_pack=sign_pack)
        x = torch.randn(*((2, 8, 32) if device == "cpu" else (3, 40, 32)), device=device, dtype=dtype)
        want = grads(run_ref, list(ref.parameters()), x)
        got = grads(fused, list(fused.parameters()), x)
        for a, b in zip(want, got):
            assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_relu_grad_in_place_gives_the_same_bits(device):
    from actzip.kernels import relu_mlp as K

    for dtype in dtypes_for(device):
        h = torch.randn(5, 300, device=device, dtype=dtype)
        e = se.encode(torch.relu(h), 256)
        grad = torch.randn_like(h)
        args = dict(mask=e.mask, tile_offsets=e.tile_offsets, values=e.values, dtype=dtype, tile_size=256,
                    sign_pack=False, square=True)
        want = K.relu_grad(grad, **args)
        same = grad.clone()
        got = K.relu_grad(same, in_place=True, **args)
        assert got.data_ptr() == same.data_ptr() and torch.equal(got, want)
        with pytest.raises(ConfigError, match="contiguous"):
            K.relu_grad(grad.t(), in_place=True, **args)
