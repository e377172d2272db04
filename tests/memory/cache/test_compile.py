"""The cache around torch.compile'd code: the cache's hooks are inlined into the compiled graphs, which then
store what they save with the rules' codecs (decided once, at compile time, from the backward graph), report it
in the account, and announce what a graph cannot do; gradients of what is kept stay bit-identical. Where hooks
cannot be inlined (plain Python hooks, older PyTorch) a compiled graph's saves are kept, counted and announced."""

import shutil
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import actzip
from actzip.memory.cache import StepAccount, compiled, graph_hooks, preset_names
from actzip.memory.cache.rules import Rule, is_leaf_storage
from actzip_bench.models import GPT, GPTConfig

pytestmark = pytest.mark.skipif(not graph_hooks.inlining_available(),
                                reason="this PyTorch does not inline saved-tensor hooks into compiled graphs")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    # every test compiles its own functions: none may hit the limit of variants per code object of another
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class ReLU2MLP(nn.Module):
    def __init__(self, d=64, h=256):
        super().__init__()
        self.up, self.down = nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x):
        return self.down(F.relu(self.up(x)).square())


class Halves(nn.Module):
    """A compiled MLP, then an eager one: what the cache keeps of the first, what it compresses of the second."""

    def __init__(self, backend):
        super().__init__()
        self.first, self.second = ReLU2MLP(), ReLU2MLP()
        self.compiled_first = torch.compile(self.first, backend=backend)

    def forward(self, x):
        return self.second(self.compiled_first(x))


def grads_of(model):
    model = getattr(model, "_orig_mod", model)  # a torch.compile'd module: the parameters of the one it wraps
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def run(model, x, cache=None):
    model.zero_grad(set_to_none=True)
    with cache if cache is not None else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        loss = model(x).float().pow(2).mean()
    loss.backward()
    return loss.detach(), grads_of(model)


def assert_same(a, b):
    assert a.keys() == b.keys() and a
    for n in a:
        assert torch.equal(a[n], b[n]), f"gradient of {n} differs"


def quiet(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return fn(*args)


def test_lossless_under_aot_eager_keeps_the_graph_saves_bit_identical_and_compresses_the_eager_part():
    model = Halves("aot_eager")
    x = torch.randn(512, 64)
    loss0, g0 = run(model, x)
    cache = actzip.cache(min_bytes=0)
    with pytest.warns(RuntimeWarning, match=r"rule 'sparse' \(codec 'sparse'\) skipped.*payload size depends"):
        loss1, g1 = run(model, x, cache)
    assert torch.equal(loss0, loss1)
    assert_same(g0, g1)
    acct = cache.last
    # the compiled half: its (512, 256) intermediates are decided in the graph and kept (the sparse codec's
    # payload size depends on the values), in the totals under the rule that kept them
    assert acct.compiled_saves >= 2 and acct.uncompressed_compiled == 0
    assert acct.by_rule["dense"].tensors >= 2 and acct.by_rule["dense"].dense_bytes >= 2 * 512 * 256 * 4
    # the eager half is compressed as before
    assert acct.by_rule["sparse"].tensors >= 1 and acct.bytes_after < acct.bytes_before
    assert "decided inside the graphs" in str(acct)
    assert graph_hooks.announcements()["rule 'sparse' (codec 'sparse') skipped"] >= 1


def test_4bit_under_aot_eager_compresses_the_graph_saves_by_role():
    model = ReLU2MLP(64, 512)
    x = torch.randn(1024, 64)
    compiled_model = torch.compile(model, backend="aot_eager")
    counted = actzip.cache.__wrapped__ if hasattr(actzip.cache, "__wrapped__") else None
    plain = actzip.memory.cache.CacheContext.count_only()
    quiet(run, compiled_model, x, plain)
    cache = actzip.cache("4bit", min_bytes=0)
    loss0, g0 = run(model, x)
    loss1, g1 = quiet(run, compiled_model, x, cache)
    assert torch.equal(loss0, loss1)  # the forward is the same; only what backward reads is quantized
    acct = cache.last
    assert acct.compiled_saves == plain.last.compiled_saves >= 2 and acct.uncompressed_compiled == 0
    assert acct.bytes_before == plain.last.bytes_before
    assert plain.last.bytes_before / acct.bytes_after >= 3.5  # float32 to 4.5 bits: about 7x
    names = set(acct.by_rule)
    assert "linear_input:quant4" in names  # the relu² output, read by the down projection's weight gradient
    assert names & {"relu_output:quant4", "nonlinear_input:quant4"}  # the up projection's output
    for n in g0:  # a quantized backward: close, not equal
        rel = (g1[n] - g0[n]).norm() / g0[n].norm()
        assert 0 < rel < 0.2, (n, float(rel))


@pytest.mark.parametrize("fuse", [False, True])
def test_stochastic_rounding_draws_new_noise_every_compiled_step(fuse):
    # Unbiased: the weight gradient of a linear layer whose input is stored 2-bit stochastically averages to
    # the exact one; each step draws new noise (the codec runs in the graph, not a constant of it).
    torch.manual_seed(0)
    lin = nn.Linear(64, 32, bias=False)
    x = torch.randn(256, 64).exp()  # positive, skewed: a biased rounding would show
    f = torch.compile(lambda t: lin(t * 1.5).square().sum() * 0 + (lin(t * 1.5) * 1.0).sum(), backend="aot_eager")
    lin.weight.grad = None
    f(x).backward()
    exact = lin.weight.grad.clone()
    cache = actzip.cache(rules=[Rule("linear input 2-bit", lambda t: True, "quant",
                                     codec_options={"bits": 2, "rounding": "stochastic", "check": False})],
                         fuse_compiled=fuse)
    grads = []
    for _ in range(64):
        lin.weight.grad = None
        with cache:
            loss = f(x)
        loss.backward()
        grads.append(lin.weight.grad.clone())
    assert cache.last.compiled_saves >= 1
    one = (grads[0] - exact).norm() / exact.norm()
    assert not torch.equal(grads[0], grads[1])
    mean = (torch.stack(grads).mean(0) - exact).norm() / exact.norm()
    assert one > 0.01 and mean < one / 4, (float(one), float(mean))  # error of the mean ~ 1/sqrt(64)


def test_the_fused_form_stores_what_the_custom_op_stores_and_keeps_exactness_to_nearest():
    model = ReLU2MLP(64, 512)
    x = torch.randn(1024, 64)
    compiled_model = torch.compile(model, backend="aot_eager")
    accounts, grads = {}, {}
    for fuse in (False, True):
        cache = actzip.cache("4bit", min_bytes=0, fuse_compiled=fuse,
                             treatments={"linear_input": "quant4-rn", "other": "quant4-rn"})
        _, grads[fuse] = quiet(run, compiled_model, x, cache)
        accounts[fuse] = cache.last
    assert accounts[True].bytes_after == accounts[False].bytes_after < accounts[False].bytes_before / 3.5
    assert accounts[True].compiled_saves == accounts[False].compiled_saves >= 2
    for n in grads[False]:  # nearest rounding: the fused form makes the codec's payloads, so the same gradients
        torch.testing.assert_close(grads[True][n], grads[False][n], rtol=1e-5, atol=1e-7)


def test_caches_of_the_same_rules_share_one_compiled_graph_and_other_rules_get_their_own():
    from torch._dynamo.utils import counters

    model = ReLU2MLP()
    x = torch.randn(256, 64)
    compiled_model = torch.compile(model, backend="aot_eager")
    quiet(run, compiled_model, x, actzip.cache("4bit", min_bytes=0))
    graphs = counters["stats"]["unique_graphs"]
    second = actzip.cache("4bit", min_bytes=0)  # a new cache of the same config: no recompilation
    quiet(run, compiled_model, x, second)
    assert counters["stats"]["unique_graphs"] == graphs and second.last.compiled_saves >= 2
    other = actzip.cache("conservative", min_bytes=0)
    quiet(run, compiled_model, x, other)
    assert counters["stats"]["unique_graphs"] == graphs + 1
    assert "linear_input:quant8" in other.last.by_rule and "linear_input:quant4" not in other.last.by_rule


def test_fullgraph_and_graph_breaks_both_compress():
    model = ReLU2MLP()
    x = torch.randn(256, 64)

    def broken(t):
        h = model.up(t)
        torch._dynamo.graph_break()
        return model.down(F.relu(h).square())

    for fn in (torch.compile(model, backend="aot_eager", fullgraph=True), torch.compile(broken, backend="aot_eager")):
        cache = actzip.cache("4bit", min_bytes=0)
        with cache:
            loss = quiet(fn, x).float().pow(2).mean()
        loss.backward()
        acct = cache.last
        assert acct.bytes_after * 3 < acct.bytes_before and acct.uncompressed_compiled == 0


def test_offload_and_an_undecidable_rule_are_announced_and_kept_safe():
    model = ReLU2MLP()
    x = torch.randn(256, 64)
    compiled_model = torch.compile(model, backend="aot_eager")
    offloaded = actzip.cache("4bit", min_bytes=0, offload=True)
    with pytest.warns(RuntimeWarning, match="not offloaded.*stays on the device"):
        run(compiled_model, x, offloaded)
    assert offloaded.last.bytes_after * 3 < offloaded.last.bytes_before

    def reads_values(t):  # the hidden activations only (not the eager loss's input), by a test of the data
        return t.shape[-1] == 256 and bool(t.abs().max() > 0)

    undecided = actzip.cache(rules=[Rule("by value", reads_values, "quant", codec_options={"check": False})])
    loss0, g0 = run(model, x)
    with pytest.warns(RuntimeWarning, match="rule 'by value' cannot decide"):
        loss1, g1 = run(compiled_model, x, undecided)
    assert_same(g0, g1)  # kept: exact
    assert undecided.last.by_rule["by value:kept-compiled"].tensors >= 1


def test_leaves_are_not_leaves_while_a_graph_save_is_decided():
    from actzip.memory.cache.roles import assumed_role, current_role

    t = torch.randn(4)
    assert is_leaf_storage(t) and current_role(t) == "other"
    with assumed_role("norm"):
        assert not is_leaf_storage(t) and current_role(t) == "norm"
    assert is_leaf_storage(t)
    with pytest.raises(ValueError, match="unknown role"):
        assumed_role("nope")


def test_plain_python_hooks_still_see_a_compiled_graphs_saves_and_the_cache_keeps_them():
    # Hooks that are not graph modules run eagerly on what the compiled function saved: the cache's fallback
    # (actzip.memory.cache.compiled) recognizes those as the graph's, keeps them, counts them and says so.
    model = ReLU2MLP()
    x = torch.randn(512, 64)
    loss0, g0 = run(model, x)
    compiled_model = torch.compile(model, backend="aot_eager")
    cache = actzip.cache(min_bytes=0)
    compiled.reset_warning()
    model.zero_grad(set_to_none=True)
    with pytest.warns(RuntimeWarning, match=r"torch.compile'd code saves.*kept uncompressed.*'compiled'"):
        with cache:
            with torch.autograd.graph.saved_tensors_hooks(lambda t: cache.pack(t), cache.unpack):
                loss = compiled_model(x).float().pow(2).mean()
    loss.backward()
    assert_same(g0, grads_of(model))
    acct = cache.last
    assert acct.uncompressed_compiled == 2 and acct.uncompressed_compiled_bytes == 2 * 512 * 256 * 4
    assert acct.by_rule["compiled"].stored_bytes == acct.by_rule["compiled"].dense_bytes
    assert "2 tensors saved by torch.compile'd code kept uncompressed (1.00 MiB)" in str(acct)


def test_the_whole_model_compiled_with_aot_eager_matches_eager_gradients_under_lossless():
    model = ReLU2MLP()
    x = torch.randn(512, 64)
    _, g_eager = run(model, x)
    compiled_model = torch.compile(model, backend="aot_eager")
    cache = actzip.cache(min_bytes=0)
    quiet(run, compiled_model, x, cache)
    assert_same(g_eager, grads_of(model))
    assert cache.last.compiled_saves >= 2 and cache.last.uncompressed_compiled == 0


def test_the_signal_is_an_aot_autograd_function_not_any_autograd_function():
    # The detection needs no compiler: a function class with AOTAutograd's `_aot_id` saving an intermediate is
    # recognized, an ordinary custom function saving the same is not (eager behaviour unchanged).
    class Plain(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            h = x @ w
            ctx.save_for_backward(x, w, h)  # x, w: inputs; h: made inside forward
            return h.relu()

        @staticmethod
        def backward(ctx, g):
            x, w, h = ctx.saved_tensors
            gh = g * (h > 0)
            return gh @ w.t(), x.t() @ gh

    class LikeCompiled(Plain):
        _aot_id = 0

    x, w = torch.randn(128, 64), torch.randn(64, 256, requires_grad=True)
    counts = {}
    for fn in (Plain, LikeCompiled):
        cache = actzip.cache(min_bytes=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            with cache:
                y = fn.apply(x, w).sum()
        y.backward()
        counts[fn.__name__] = cache.last.uncompressed_compiled
        assert cache.last.by_rule["leaf"].tensors == (3 if fn is Plain else 2)  # x, w are inputs either way
    assert counts == {"Plain": 0, "LikeCompiled": 1}


def test_the_account_lists_compiled_saves_in_its_totals_dict_and_caption():
    acct = StepAccount()
    acct.add("sparse", 4 << 20, 1 << 20)
    acct.add_compiled(2 << 20)
    assert acct.bytes_before == 6 << 20 and acct.bytes_after == 3 << 20
    d = acct.as_dict()
    assert d["uncompressed_compiled"] == 1 and d["uncompressed_compiled_bytes"] == 2 << 20
    assert str(acct).splitlines()[-1] == ("1 tensors saved by torch.compile'd code kept uncompressed (2.00 MiB): "
                                          "the rules could not run inside those graphs (see "
                                          "actzip.memory.cache.compiled)")
    assert "compiled" not in str(StepAccount())


_NO_CXX = shutil.which("g++") is None and shutil.which("c++") is None and shutil.which("cc") is None


@pytest.fixture
def deterministic():
    # inductor's CPU embedding backward adds in parallel, in no fixed order, unless asked not to
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(was)


@pytest.mark.slow
@pytest.mark.skipif(_NO_CXX, reason="torch.compile's inductor backend on the CPU needs a C++ compiler (g++/cc)")
def test_inductor_every_preset_compresses_inside_the_graph_and_lossless_stays_exact(deterministic):
    cfg = GPTConfig.of_size("tiny", activation="relu2")
    model = GPT(cfg)
    idx, tgt = torch.randint(0, 256, (4, cfg.block_size)), torch.randint(0, 256, (4, cfg.block_size))

    def step(m, cache=None):
        model.zero_grad(set_to_none=True)
        with cache if cache is not None else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            _, loss = m(idx, tgt)
        loss.backward()
        return grads_of(model)

    compiled_model = torch.compile(model)  # the default backend: inductor
    g0 = step(compiled_model)
    plain = actzip.memory.cache.CacheContext.count_only()
    quiet(step, compiled_model, plain)
    before = plain.last.bytes_before
    assert plain.last.compiled_saves > 0 and before > 0
    ratios = {}
    for preset in preset_names():
        cache = actzip.cache(preset, min_bytes=0)
        g1 = quiet(step, compiled_model, cache)
        acct = cache.last
        assert acct.compiled_saves > 0 and acct.uncompressed_compiled == 0, preset
        assert acct.bytes_before == before, preset  # the same graph saves, counted the same way
        ratios[preset] = before / acct.bytes_after
        if preset == "lossless":
            assert_same(g0, g1)
        else:
            assert all(torch.isfinite(g).all() for g in g1.values())
    assert ratios["lossless"] == 1.0 and ratios["4bit"] >= 3.5 and ratios["2bit"] > ratios["4bit"]
    assert ratios["balanced"] > ratios["conservative"] > 1.0
