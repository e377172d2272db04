"""The cache around torch.compile'd code: a compiled graph's saves are kept, counted and announced, never silently
left out; code run eagerly around them is still compressed, and gradients stay bit-identical."""

import shutil
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import actzip
from actzip.memory.cache import StepAccount, compiled, preset_names
from actzip_bench.models import GPT, GPTConfig


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


def test_aot_eager_keeps_and_counts_the_graph_saves_and_compresses_the_eager_part():
    model = Halves("aot_eager")
    x = torch.randn(512, 64)
    loss0, g0 = run(model, x)
    cache = actzip.cache(min_bytes=0)
    compiled.reset_warning()
    with pytest.warns(RuntimeWarning, match=r"torch.compile'd code saves.*kept uncompressed.*'compiled'"):
        loss1, g1 = run(model, x, cache)
    assert torch.equal(loss0, loss1)
    assert_same(g0, g1)
    acct = cache.last
    # the compiled half: its two (512, 256) intermediates are kept, in the totals, not passed off as leaves
    assert acct.uncompressed_compiled == 2 and acct.uncompressed_compiled_bytes == 2 * 512 * 256 * 4
    assert acct.by_rule["compiled"].stored_bytes == acct.by_rule["compiled"].dense_bytes == 2 * 512 * 256 * 4
    assert acct.bytes_before >= acct.uncompressed_compiled_bytes
    # the eager half is compressed as before
    assert acct.by_rule["sparse"].tensors >= 1 and acct.bytes_after < acct.bytes_before
    assert "2 tensors saved by torch.compile'd code kept uncompressed (1.00 MiB)" in str(acct)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: the next block only counts
        run(model, x, cache)
    assert cache.last.uncompressed_compiled == 2


def test_the_whole_model_compiled_with_aot_eager_matches_eager_gradients():
    model = ReLU2MLP()
    x = torch.randn(512, 64)
    _, g_eager = run(model, x)
    compiled_model = torch.compile(model, backend="aot_eager")
    cache = actzip.cache(min_bytes=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        run(compiled_model, x, cache)
    assert_same(g_eager, grads_of(model))
    assert cache.last.uncompressed_compiled == 2 and "compiled" in cache.last.by_rule


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
                                          "the cache does not compress inside compiled graphs yet")
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
def test_inductor_every_preset_says_what_it_does_not_compress(deterministic):
    cfg = GPTConfig.of_size("tiny", activation="relu2")
    model = GPT(cfg)
    idx, tgt = torch.randint(0, 256, (4, cfg.block_size)), torch.randint(0, 256, (4, cfg.block_size))

    def step(m, cache=None):
        m.zero_grad(set_to_none=True)
        with cache if cache is not None else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            _, loss = m(idx, tgt)
        loss.backward()
        return grads_of(model)

    eager = actzip.cache("lossless")
    step(model, eager)
    assert eager.last.bytes_after < eager.last.bytes_before  # eager compresses: the baseline this is about
    compiled_model = torch.compile(model)  # the default backend: inductor
    g0 = step(compiled_model)
    for preset in preset_names():
        cache = actzip.cache(preset)
        compiled.reset_warning()
        with pytest.warns(RuntimeWarning, match=r"torch.compile'd code saves.*kept uncompressed"):
            g1 = step(compiled_model, cache)
        acct = cache.last
        assert acct.uncompressed_compiled > 0 and acct.by_rule["compiled"].dense_bytes > 0, preset
        assert acct.bytes_before >= acct.uncompressed_compiled_bytes > 0, preset
        assert "torch.compile'd code kept uncompressed" in str(acct), preset
        if preset == "lossless":
            assert_same(g0, g1)
