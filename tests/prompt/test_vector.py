"""PromptVector: the fit learns a task a prompt sets, with the model left as it was; generate, save / load and the
compress_ handler agree with applying the vector by hand."""

import pytest
import torch
import torch.nn.functional as F

import actzip
from actzip.errors import ConfigError, MissingDependencyError, NothingToCompressError, PromptVectorMismatchError
from actzip.prompt import PromptVector, PromptVectorConfig, decoder_blocks, forward_logits

from .tiny_models import BOS, EOS, VOCAB

# The toy task: [task, q1, q2, q3] -> two answer tokens, each the previous token shifted by task + 1.
TASKS, FIRST, TOY_VOCAB = 4, 4, 32


def _rule(q: torch.Tensor, task: int) -> torch.Tensor:
    n = TOY_VOCAB - FIRST
    a1 = FIRST + (q[..., -1] - FIRST + task + 1) % n
    return torch.stack([a1, FIRST + (a1 - FIRST + task + 1) % n], -1)


@pytest.fixture(scope="module")
def toy():
    """A reference GPT trained until the first token sets the task."""
    from actzip_bench.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=TOY_VOCAB))
    g = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(200):
        task = torch.randint(0, TASKS, (64,), generator=g)
        q = torch.randint(FIRST, TOY_VOCAB, (64, 3), generator=g)
        seq = torch.cat([task[:, None], q, torch.stack([_rule(qi, int(t)) for qi, t in zip(q, task)])], 1)
        logits, _ = model(seq[:, :-1])
        loss = F.cross_entropy(logits[:, 3:].reshape(-1, TOY_VOCAB), seq[:, 4:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def _queries(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(FIRST, TOY_VOCAB, (3,), generator=g) for _ in range(n)]


def _accuracy(pv, task, queries):
    outs = pv.generate(queries, max_new_tokens=2)
    return sum(torch.equal(o, _rule(q, task)) for o, q in zip(outs, queries)) / len(queries)


def test_the_fit_folds_the_task_prompt_into_the_vector(toy):
    task, prompt = 2, torch.tensor([2, 9, 17, 23])  # the task token first, then tokens the model never needed
    examples = [(q, _rule(q, task)) for q in _queries(8, seed=1)]
    start = PromptVector(toy, extract_layer=0, inject_layer=0, steps=0).fit(prompt, examples)
    pv = PromptVector(toy, extract_layer=0, inject_layer=0, steps=150, lr=0.1).fit(prompt, examples)
    assert len(pv.loss_history) == 151 and pv.loss_history[0] == start.loss_history[0] and pv.fit_seconds > 0
    assert pv.loss_history[-1] < 0.2 * pv.loss_history[0]
    assert int(pv.weights.positions.argmax()) == 0 and abs(float(pv.weights.positions.sum()) - 1) < 1e-6
    held_out = _queries(16, seed=2)
    assert _accuracy(pv, task, held_out) >= 0.9 > _accuracy(start, task, held_out)


def test_the_model_is_left_as_it_was(make, kind):
    model = make(kind)
    model.train()
    frozen = next(iter(model.parameters()))
    frozen.requires_grad_(False)  # a mix of frozen and trainable parameters comes back as it was
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    wanted = {n: p.requires_grad for n, p in model.named_parameters()}
    prompt = torch.randint(3, VOCAB, (5,))
    examples = [(torch.randint(3, VOCAB, (n,)), torch.randint(3, VOCAB, (2,))) for n in (2, 4, 3)]
    rng = torch.get_rng_state()
    pv = PromptVector(model, extract_layer=2, inject_layer=1, over_layers=1, steps=5).fit(prompt, examples)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert {n: p.requires_grad for n, p in model.named_parameters()} == wanted
    assert all(m.training for m in model.modules()) and torch.equal(torch.get_rng_state(), rng)
    # gradients reached every logit: positions, layers and the gain all moved from their start
    start = PromptVector(model, extract_layer=2, inject_layer=1, over_layers=1, steps=0).fit(prompt, examples)
    assert pv.layer_indices == (1, 2) and pv.weights.layers.shape == (2,)
    assert (pv.position_logits != start.position_logits).all() and (pv.layer_logits != start.layer_logits).all()
    assert pv.weights.scale != 1.0 and start.weights.scale == 1.0
    again = PromptVector(model, extract_layer=2, inject_layer=1, over_layers=1, steps=5).fit(prompt, examples)
    assert torch.equal(again.vector, pv.vector)  # seeded and deterministic


def test_the_padded_batch_loss_is_the_per_example_loss(make, kind):
    model = make(kind)
    prompt = torch.randint(3, VOCAB, (4,))
    examples = [(torch.randint(3, VOCAB, (n,)), torch.randint(3, VOCAB, (m,))) for n, m in ((1, 3), (5, 1), (0, 2))]
    pv = PromptVector(model, extract_layer=1, inject_layer=0, steps=0, learn_scale=False).fit(prompt, examples)
    total, count = 0.0, 0
    with torch.no_grad(), pv.applied():
        for q, a in examples:
            ids = torch.cat([pv.input_ids(q), a[:-1]])[None]
            logits = forward_logits(model, ids)[0, len(q):]
            total += F.cross_entropy(logits, a, reduction="sum").item()
            count += len(a)
    assert pv.loss_history == pytest.approx([total / count], rel=1e-5)
    assert pv.weights.scale == 1.0 and pv.slot_token_id == (BOS if kind != "gpt" else 0)


def _greedy_without_cache(model, ids, steps, eos):
    out = []
    for _ in range(steps):
        nxt = forward_logits(model, ids)[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)
        out.append(int(nxt))
        if out[-1] == eos:
            break
    return out


def test_generate_matches_a_greedy_loop_without_cache(make, kind):
    model = make(kind)
    pv = PromptVector(model, extract_layer=2, inject_layer=0, steps=3).fit(
        torch.randint(3, VOCAB, (6,)), [(torch.randint(3, VOCAB, (3,)), torch.randint(3, VOCAB, (2,)))])
    queries = [torch.randint(3, VOCAB, (n,)) for n in (3, 1, 5)]
    outs = pv.generate(queries, max_new_tokens=6)
    with torch.no_grad(), pv.applied():
        loops = [_greedy_without_cache(model, pv.input_ids(q)[None], 6, EOS if kind != "gpt" else None)
                 for q in queries]
    assert [o.tolist() for o in outs] == loops
    one = pv.generate(queries[0], max_new_tokens=6)
    assert len(one) == 1 and torch.equal(one[0], outs[0])
    first = int(outs[0][0])
    assert pv.generate(queries[0], max_new_tokens=6, eos_token_id=first)[0].tolist() == [first]  # stops at eos


def test_save_and_load_round_trip(make, kind, tmp_path):
    model = make(kind)
    prompt, q = torch.randint(3, VOCAB, (5,)), torch.randint(3, VOCAB, (3,))
    pv = PromptVector(model, extract_layer=1, inject_layer=1, mode="add", over_layers=1, steps=3).fit(
        prompt, [(q, torch.randint(3, VOCAB, (2,)))])
    path = tmp_path / "v.safetensors"
    pv.save(path)
    back = PromptVector.load(path, make(kind))
    assert torch.equal(back.vector, pv.vector) and back.config == pv.config and back.prompt_length == 5
    assert torch.equal(back.weights.positions, pv.weights.positions) and back.weights.scale == pv.weights.scale
    with torch.no_grad(), pv.applied():
        ref = forward_logits(model, pv.input_ids(q)[None])
    with torch.no_grad(), back.applied():
        assert torch.equal(forward_logits(back.model, back.input_ids(q)[None]), ref)


@pytest.mark.parametrize("other, differs", [
    (dict(kind="llama", hidden=48), "hidden size 32 != 48"),
    (dict(kind="llama", layers=3), "blocks 2 != 3"),
    (dict(kind="qwen2"), "class 'LlamaForCausalLM' != 'Qwen2ForCausalLM'"),
])
def test_loading_into_another_model_names_both(make, tmp_path, other, differs):
    pv = PromptVector(make("llama"), extract_layer=1, inject_layer=0, steps=0).fit(
        torch.randint(3, VOCAB, (3,)), [(torch.randint(3, VOCAB, (2,)), torch.randint(3, VOCAB, (1,)))])
    pv.save(tmp_path / "v.safetensors")
    target = make(other.pop("kind"), **other)
    with pytest.raises(PromptVectorMismatchError, match="fitted on LlamaForCausalLM") as err:
        PromptVector.load(tmp_path / "v.safetensors", target)
    assert type(target).__name__ in str(err.value) and differs in str(err.value)


def test_files_that_are_not_prompt_vectors_and_a_missing_safetensors(make, tmp_path, monkeypatch):
    import safetensors.torch

    safetensors.torch.save_file({"x": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    model = make("gpt")
    with pytest.raises(ConfigError, match="not a prompt vector file"):
        PromptVector.load(tmp_path / "other.safetensors", model)
    with pytest.raises(FileNotFoundError, match="no file at"):
        PromptVector.load(tmp_path / "none.safetensors", model)
    monkeypatch.setitem(__import__("sys").modules, "safetensors.torch", None)
    with pytest.raises(MissingDependencyError, match="pip install safetensors"):
        PromptVector.load(tmp_path / "other.safetensors", model)


def test_errors_name_what_is_wrong(make):
    model = make("llama")
    with pytest.raises(ConfigError, match="extract_layer 3 is out of range for LlamaForCausalLM, which has 2 "
                                          "decoder blocks"):
        PromptVector(model, extract_layer=3, inject_layer=0)
    with pytest.raises(ConfigError, match="inject_layer 2 is out of range for LlamaForCausalLM, which has 2"):
        PromptVector(model, extract_layer=2, inject_layer=2)
    with pytest.raises(ConfigError, match="PromptVectorConfig.mode"):
        PromptVector(model, extract_layer=1, inject_layer=0, mode="concat")
    with pytest.raises(ConfigError, match="a config or its fields, not both"):
        PromptVector(model, PromptVectorConfig(extract_layer=1, inject_layer=0), steps=3)
    pv = PromptVector(model, extract_layer=1, inject_layer=0, steps=1)
    with pytest.raises(ConfigError, match="no vector yet"):
        pv.vector
    pair = (torch.tensor([5]), torch.tensor([6]))
    with pytest.raises(ConfigError, match="prompt_ids is empty"):
        pv.fit(torch.tensor([], dtype=torch.long), [pair])
    with pytest.raises(ConfigError, match="examples is empty"):
        pv.fit(torch.tensor([4, 5]), [])
    with pytest.raises(ConfigError, match=r"examples\[1\] answer_ids is empty"):
        pv.fit(torch.tensor([4, 5]), [pair, (torch.tensor([5]), torch.tensor([], dtype=torch.long))])
    with pytest.raises(ConfigError, match="must be a 1-D tensor of token ids"):
        pv.fit(torch.tensor([[4, 5]]), [pair])


def test_compress_installs_a_saved_vector_and_restore_removes_it(make, tmp_path):
    model = make("qwen2")
    q = torch.randint(3, VOCAB, (4,))
    pv = PromptVector(model, extract_layer=2, inject_layer=1, steps=2).fit(
        torch.randint(3, VOCAB, (5,)), [(q, torch.randint(3, VOCAB, (2,)))])
    pv.save(tmp_path / "v.safetensors")
    ids = pv.input_ids(q)[None]
    with torch.no_grad():
        plain = forward_logits(model, ids)
        with pv.applied():
            applied = forward_logits(model, ids)
    config = PromptVectorConfig(extract_layer=2, inject_layer=1, vector_path=str(tmp_path / "v.safetensors"))
    report = actzip.compress_(model, config)
    assert report.swapped[0][0] == "model.layers.1" and "prompt vector (replace)" in str(report)
    assert f"start inputs with token {BOS}" in str(report)
    with torch.no_grad():
        assert torch.equal(forward_logits(model, ids), applied)
    assert actzip.restore_(model) == ["PromptVectorConfig"]
    with torch.no_grad():
        assert torch.equal(forward_logits(model, ids), plain)
    assert not decoder_blocks(model)[1]._forward_pre_hooks
    with pytest.raises(NothingToCompressError, match="excluded by filter_fn"):
        actzip.compress_(model, config, filter_fn=lambda m, fqn: False)


def test_compress_refuses_a_config_without_a_file_or_with_other_layers(make, tmp_path):
    model = make("gpt")
    with pytest.raises(ConfigError, match="vector_path is None"):
        actzip.compress_(model, PromptVectorConfig(extract_layer=1, inject_layer=0))
    pv = PromptVector(model, extract_layer=1, inject_layer=0, steps=0).fit(
        torch.randint(3, VOCAB, (3,)), [(torch.randint(3, VOCAB, (2,)), torch.randint(3, VOCAB, (1,)))])
    pv.save(tmp_path / "v.safetensors")
    with pytest.raises(ConfigError, match="inject_layer=0 in the file, 1 in the config"):
        actzip.compress_(model, PromptVectorConfig(extract_layer=1, inject_layer=1,
                                                   vector_path=str(tmp_path / "v.safetensors")))
    assert not any(b._forward_pre_hooks for b in decoder_blocks(model))


def test_fit_many_follows_each_prompts_own_fit(make, kind):
    model = make(kind)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 64, (n,), generator=g) for n in (5, 9, 2)]
    examples = [[(torch.randint(3, 64, (q,), generator=g), torch.randint(3, 64, (2,), generator=g))
                 for q in sizes] for sizes in ((3, 4), (2, 5, 3), (4,))]
    fields = dict(extract_layer=1, inject_layer=0, steps=6, lr=0.1, over_layers=1)
    together = PromptVector.fit_many(model, prompts, examples, **fields)
    for pv, prompt, ex in zip(together, prompts, examples):
        alone = PromptVector(model, **fields).fit(prompt, ex)
        assert torch.allclose(pv.vector, alone.vector, atol=1e-4, rtol=1e-4)
        assert pv.loss_history == pytest.approx(alone.loss_history, rel=1e-4, abs=1e-5)
        assert pv.prompt_length == prompt.numel() and pv.weights.positions.shape == (prompt.numel(),)
    assert together[0].loss_history[-1] < together[0].loss_history[0]
    with pytest.raises(ConfigError, match="one examples list per prompt"):
        PromptVector.fit_many(model, prompts, examples[:2], **fields)
