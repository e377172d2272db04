import torch

from actzip.memory.modules import SparseReLUMLP
from actzip_bench.models import GPT, GPTConfig
from actzip_bench.one_liner import compressed_copy, max_grad_diffs, shared_copy


def test_a_shared_copy_holds_the_same_tensors():
    model = GPT(GPTConfig.of_size("tiny"))
    twin = shared_copy(model)
    assert twin is not model
    assert all(a is b for a, b in zip(model.parameters(), twin.parameters()))
    assert all(a is b for a, b in zip(model.buffers(), twin.buffers()))


def test_the_compressed_copy_leaves_the_model_untouched_and_its_gradients_match():
    torch.manual_seed(0)
    model = GPT(GPTConfig.of_size("tiny"))
    twin, arena = compressed_copy(model, {}, "torch")
    assert arena is None  # the torch kernel writes no arena
    assert all(isinstance(b.mlp, SparseReLUMLP) for b in twin.h)
    assert not any(isinstance(b.mlp, SparseReLUMLP) for b in model.h)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    idx = torch.randint(0, model.config.vocab_size, (2, 16))

    def backward(m):
        return lambda: m(idx, idx)[1].backward()

    diffs = max_grad_diffs({"none": backward(model), "compress": backward(twin)}, list(model.parameters()))
    assert diffs == {"none": 0.0, "compress": 0.0}
    assert all(p.grad is None for p in model.parameters())


def test_a_different_model_shows_a_gradient_difference():
    torch.manual_seed(0)
    model = GPT(GPTConfig.of_size("tiny"))
    idx = torch.randint(0, model.config.vocab_size, (2, 16))

    def scaled(k):
        return lambda: (k * model(idx, idx)[1]).backward()

    diffs = max_grad_diffs({"none": scaled(1.0), "double": scaled(2.0)}, list(model.parameters()))
    assert diffs["none"] == 0.0 and diffs["double"] > 0
