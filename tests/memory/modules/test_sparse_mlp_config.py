"""compress_(model, SparseMLPConfig()): swaps ReLU / ReLU² MLPs; gradients stay bit-identical; restore_ undoes it."""

import copy

import pytest
import torch

import actzip
from actzip.errors import ConfigError, NothingToCompressError, UnknownConfigError
from actzip.memory.cache import CacheContext as ActivationCache
from actzip.memory.modules import SparseGatedReLUMLP, SparseMLPConfig, SparseReLUMLP, arena_of, compress_, restore_
from actzip_bench.models import GPT, GPTConfig


def grads_after(model, fn):
    model.zero_grad(set_to_none=True)
    loss = fn(model)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same(a, b):
    assert torch.equal(a[0], b[0])
    assert a[1].keys() == b[1].keys() and a[1]
    for k in a[1]:
        assert torch.equal(a[1][k], b[1][k]), k


@pytest.mark.parametrize("activation", ["relu2", "relu"])
def test_reference_gpt(activation):
    cfg = GPTConfig.of_size("tiny", activation=activation)
    ref = GPT(cfg)
    model = copy.deepcopy(ref)
    report = compress_(model, SparseMLPConfig())
    assert [n for n, _ in report.swapped] == [f"h.{i}.mlp" for i in range(cfg.n_layer)]
    assert all(isinstance(b.mlp, SparseReLUMLP) for b in model.h)
    assert model.state_dict().keys() == ref.state_dict().keys()
    idx = torch.randint(0, 256, (2, cfg.block_size))

    def loss(m):
        return m(idx, idx)[1]

    assert_same(grads_after(ref, loss), grads_after(model, loss))


def test_gelu_gpt_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match=r"h\.0\.mlp: activation .* is not relu or relu2"):
        compress_(GPT(GPTConfig.of_size("tiny", activation="gelu")), SparseMLPConfig())


def test_filter_fn_and_report():
    model = GPT(GPTConfig.of_size("tiny"))
    report = compress_(model, SparseMLPConfig(), filter_fn=lambda m, name: name.startswith("h.0."))
    assert [n for n, _ in report.swapped] == ["h.0.mlp"] and len(report) == 1
    assert ("h.1.mlp", "excluded by filter_fn") in report.skipped
    again = compress_(model, SparseMLPConfig(), filter_fn=lambda m, name: True)
    assert ("h.0.mlp", "already swapped") in again.skipped


def test_bad_config():
    with pytest.raises(ConfigError, match="no option"):
        SparseMLPConfig(codec_options={"bits": 2})
    with pytest.raises(UnknownConfigError, match="no handler for config type int"):
        compress_(torch.nn.Linear(2, 2), 3)
    with pytest.raises(NothingToCompressError, match=r"nothing to swap.*actzip_mlp_layout.*trust_structure"):
        compress_(torch.nn.Sequential(torch.nn.Linear(2, 2)), SparseMLPConfig())


def test_cache_bytes_drop_on_the_swapped_gpt():
    cfg = GPTConfig.of_size("tiny")
    ref = GPT(cfg)
    model = copy.deepcopy(ref)
    compress_(model, SparseMLPConfig(codec_options={"sign_pack": True}))
    idx = torch.randint(0, 256, (4, cfg.block_size))
    counts = []
    for m in (ref, model):
        cache = ActivationCache.count_only()
        with cache:
            loss = m(idx, idx)[1]
        loss.backward()
        counts.append(cache.last)
    assert counts[0].bytes_before == counts[1].bytes_before
    assert counts[1].bytes_after < 0.8 * counts[0].bytes_after


def _transformers():
    # Only the HuggingFace tests need it; the rest of this file runs without it.
    return pytest.importorskip("transformers")


# Tiny models from local configs, nothing downloaded. A config that no longer builds fails the test.
def _llama(act):
    transformers = _transformers()
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   hidden_act=act)
    return transformers.LlamaForCausalLM(cfg)


def _gpt2(act):
    transformers = _transformers()
    cfg = transformers.GPT2Config(vocab_size=128, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                  activation_function=act, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def _nemotron_h(act):
    transformers = _transformers()
    cfg = transformers.NemotronHConfig(
        vocab_size=128, hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, mlp_hidden_act=act, hybrid_override_pattern="*-",
        mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=1,
    )
    return transformers.NemotronHForCausalLM(cfg)


LLAMA_MLPS = ["model.layers.0.mlp", "model.layers.1.mlp"]


@pytest.mark.parametrize(
    "build,act,kind,swapped",
    [(_llama, "relu2", SparseGatedReLUMLP, LLAMA_MLPS), (_llama, "relu", SparseGatedReLUMLP, LLAMA_MLPS),
     (_gpt2, "relu", SparseReLUMLP, ["transformer.h.0.mlp", "transformer.h.1.mlp"]),
     (_nemotron_h, "relu2", SparseReLUMLP, ["model.layers.1.mixer"])],  # "*-": attention, then the MLP
)
def test_huggingface_models(build, act, kind, swapped):
    torch.manual_seed(0)
    ref = build(act)
    model = copy.deepcopy(ref)
    report = compress_(model, SparseMLPConfig())
    assert report.swapped == [(name, f"{kind.__name__}({act})") for name in swapped]
    assert all(isinstance(model.get_submodule(name), kind) for name in swapped)
    ids = torch.randint(0, 128, (2, 32))

    def loss(m):
        return m(input_ids=ids, labels=ids).loss

    assert_same(grads_after(ref, loss), grads_after(model, loss))


def test_top_level_alias():
    assert actzip.compress_ is compress_


# -- restore_ ------------------------------------------------------------------------------------------------


def test_restore_gives_back_the_mlps_with_their_trained_parameters():
    cfg = GPTConfig.of_size("tiny")
    model = GPT(cfg)
    ref = copy.deepcopy(model)
    compress_(model, SparseMLPConfig())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    idx = torch.randint(0, 256, (2, cfg.block_size))
    model(idx, idx)[1].backward()
    opt.step()
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    assert restore_(model) == ["SparseMLPConfig"]
    assert all(type(b.mlp) is type(ref.h[0].mlp) for b in model.h)
    assert model.state_dict().keys() == ref.state_dict().keys()
    assert all(torch.equal(v, trained[k]) for k, v in model.state_dict().items())  # the training is kept
    ref.load_state_dict(trained)
    assert_same(grads_after(ref, lambda m: m(idx, idx)[1]), grads_after(model, lambda m: m(idx, idx)[1]))


# -- which modules are MLPs ----------------------------------------------------------------------------------


class DeclaredMLP(torch.nn.Module):
    actzip_mlp_layout = ("w_in", "f", "w_out")

    def __init__(self):
        super().__init__()
        self.w_in, self.f, self.w_out = torch.nn.Linear(16, 48), torch.nn.ReLU(), torch.nn.Linear(48, 16)

    def forward(self, x):
        return self.w_out(self.f(self.w_in(x)))


class DeclaredGated(torch.nn.Module):
    actzip_mlp_layout = ("g", "u", "act", "d")
    actzip_mlp_activation = "relu2"

    def __init__(self):
        super().__init__()
        self.g, self.u, self.d = torch.nn.Linear(16, 48), torch.nn.Linear(16, 48), torch.nn.Linear(48, 16)
        self.act = lambda t: torch.relu(t).square()

    def forward(self, x):
        return self.d(self.act(self.g(x)) * self.u(x))


def test_any_mlp_can_declare_its_layout():
    ref = torch.nn.Sequential(DeclaredMLP(), DeclaredGated())
    model = copy.deepcopy(ref)
    report = compress_(model, SparseMLPConfig())
    assert report.swapped == [("0", "SparseReLUMLP(relu)"), ("1", "SparseGatedReLUMLP(relu2)")]
    assert model.state_dict().keys() == ref.state_dict().keys()
    x = torch.randn(4, 16)
    assert_same(grads_after(ref, lambda m: m(x).square().sum()), grads_after(model, lambda m: m(x).square().sum()))


def test_undeclared_structures_need_trust_structure_and_bad_declarations_are_named():
    class Undeclared(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up_proj, self.act_fn, self.down_proj = torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8)

        def forward(self, x):
            return self.down_proj(self.act_fn(self.up_proj(x)))

    with pytest.raises(NothingToCompressError, match="trust_structure"):
        compress_(torch.nn.Sequential(Undeclared()), SparseMLPConfig())
    assert len(compress_(torch.nn.Sequential(Undeclared()), SparseMLPConfig(trust_structure=True))) == 1

    broken = DeclaredMLP()
    broken.actzip_mlp_layout = ("w_in", "w_out")
    with pytest.raises(ConfigError, match="actzip_mlp_layout must be a tuple of 3 or 4"):
        compress_(torch.nn.Sequential(broken), SparseMLPConfig())
    missing = DeclaredMLP()
    missing.actzip_mlp_layout = ("w_in", "g", "w_out")
    with pytest.raises(NothingToCompressError, match="missing attribute"):
        compress_(torch.nn.Sequential(missing), SparseMLPConfig())


# -- the arena through compress_ -----------------------------------------------------------------------------


def _kernels_run_on_cpu():
    from actzip.kernels import runtime

    return runtime.unavailable_reason("cpu") is None


needs_kernels = pytest.mark.skipif(not _kernels_run_on_cpu(), reason="the Triton kernels cannot run on the CPU here")
ARENA_DEVICES = [pytest.param("cpu", marks=needs_kernels), pytest.param("cuda", marks=pytest.mark.cuda)]


def test_arena_options_are_checked_and_serialized():
    from actzip.memory.modules import Arena

    with pytest.raises(ConfigError, match="SparseMLPConfig.arena must be None, 'auto' or an Arena"):
        SparseMLPConfig(arena="yes")
    with pytest.raises(ConfigError, match="kernel='torch'"):
        SparseMLPConfig(arena=Arena(device="cpu"), codec_options={"kernel": "torch"})
    with pytest.raises(ConfigError, match="check=False"):
        SparseMLPConfig(arena=Arena(device="cpu"), codec_options={"sign_pack": True})
    assert SparseMLPConfig().arena == "auto"  # the default: no arena where it cannot be used, and the report says why
    for options, why in (({"kernel": "torch"}, "kernel='torch'"), ({"sign_pack": True}, "check=False")):
        model = GPT(GPTConfig.of_size("tiny", activation="relu2"))
        report = actzip.compress_(model, SparseMLPConfig(codec_options=options))
        assert report.swapped and any("arena='auto': none on cpu" in n and why in n for n in report.notes)
        with pytest.raises(ConfigError, match="no fused MLP of GPT uses an arena"):
            arena_of(model)
    cfg = SparseMLPConfig(arena="auto", codec_options={"sign_pack": True, "check": False})
    assert SparseMLPConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="cannot be serialized"):
        SparseMLPConfig(arena=Arena(device="cpu")).to_dict()
    with pytest.raises(ConfigError, match="no fused MLP of GPT uses an arena"):
        arena_of(GPT(GPTConfig.of_size("tiny")))


def _train(model, steps, idx, retain=False):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        model(idx, idx)[1].backward()
        opt.step()
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("device", ARENA_DEVICES)
def test_auto_arena_needs_no_reset_and_stays_exact(device):
    cfg = GPTConfig.of_size("tiny", block_size=16)
    ref = GPT(cfg).to(device)
    model = copy.deepcopy(ref)
    report = compress_(model, SparseMLPConfig(arena="auto", codec_options={"tile_size": 256}))
    arena = arena_of(model)
    assert arena.auto_reset and all(b.mlp.arena is arena for b in model.h)  # one arena, shared
    assert any(f"one self-resetting Arena on {device}" in note for note in report.notes)
    idx = torch.randint(0, 256, (2, cfg.block_size), device=device)
    want = _train(ref, 1, idx)
    got = _train(model, 1, idx)  # unsized: every payload refused and recomputed, exactly, without a warning
    assert all(torch.equal(v, want[k]) for k, v in got.items())
    refused = arena.overflows()
    assert refused > 0 and arena.capacity_bytes == 0
    want, got = _train(ref, 3, idx), _train(model, 3, idx)  # sized at the next step's start, then reset each step
    assert all(torch.equal(v, want[k]) for k, v in got.items())
    assert arena.capacity_bytes > 0 and arena.overflows() == refused
    # compress_ again on more of the model would share the same arena; restore_ drops it with the MLPs.
    restore_(model)
    with pytest.raises(ConfigError, match="uses an arena"):
        arena_of(model)


@pytest.mark.parametrize("device", ARENA_DEVICES)
def test_a_given_arena_is_shared_and_a_stale_payload_is_recomputed(device):
    from actzip.memory.modules import Arena
    from actzip.memory.modules import relu_mlp, relu_payload

    cfg = GPTConfig.of_size("tiny", block_size=16)
    ref = GPT(cfg).to(device)
    model = copy.deepcopy(ref)
    arena = Arena(1 << 20, device=device)
    compress_(model, SparseMLPConfig(arena=arena, codec_options={"tile_size": 256}))
    assert arena_of(model) is arena and arena_of(model, device) is arena and not arena.auto_reset
    idx = torch.randint(0, 256, (2, cfg.block_size), device=device)

    def twice(m, reset):
        # A backward over a retained graph after a later step reset the arena: its payloads may be overwritten.
        m.zero_grad(set_to_none=True)
        first = m(idx, idx)[1]
        first.backward(retain_graph=True)
        reset()
        m(idx.flip(0), idx)[1].backward()
        first.backward()
        return {n: p.grad for n, p in m.named_parameters()}

    want = twice(ref, lambda: None)
    relu_payload._warned.discard("stale")
    before = relu_mlp.arena_overflows()
    with pytest.warns(UserWarning, match="read after its arena was reset"):
        got = twice(model, arena.reset)
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert relu_mlp.arena_overflows() > before and arena.overflows() == 0


@pytest.mark.cuda
def test_auto_arena_steps_have_no_host_sync():
    from actzip.memory.modules import Arena

    arena = Arena(device="cuda", auto_reset=True)
    codec = actzip.codecs.get("sparse", tile_size=1024, sign_pack=True, check=False)
    mlps = torch.nn.Sequential(*(SparseReLUMLP(torch.nn.Linear(64, 256), torch.nn.Linear(256, 64), square=True,
                                               codec=codec, arena=arena) for _ in range(2))).to("cuda", torch.bfloat16)
    x = torch.randn(512, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    opt = torch.optim.SGD(mlps.parameters(), lr=0.1)

    def step():
        mlps(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):  # the first step sizes the arena; kernels compile
        step()
    torch.cuda.synchronize()
    refused = arena.overflows()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
        step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert arena.overflows() == refused and arena.capacity_bytes > 0


@needs_kernels
def test_auto_arena_resets_once_every_payload_is_done():
    from actzip.memory.modules import Arena

    arena = Arena(1 << 20, device="cpu", auto_reset=True)
    mlp = SparseReLUMLP(torch.nn.Linear(16, 64), torch.nn.Linear(64, 16), square=True,
                        codec=actzip.codecs.get("sparse", tile_size=256), arena=arena)
    x = torch.randn(8, 16)
    y1 = mlp(x)
    gen = arena.generation
    y2 = mlp(x)  # y1's payload is still wanted: no reset
    assert arena.generation == gen
    y1.sum().backward()
    y3 = mlp(x)  # y2 is still pending
    assert arena.generation == gen
    del y2  # its graph freed without a backward
    y3.sum().backward()
    mlp(x)
    assert arena.generation == gen + 1
    with pytest.raises(ConfigError, match="auto_reset=True needs the host"):
        Arena(device="cpu", auto_reset=True, capturable=True)
