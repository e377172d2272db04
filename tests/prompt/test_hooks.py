"""capture and inject: exact where they should change nothing, confined to positions from the slot on, gradients
through the vector, and under HuggingFace ``generate`` with a KV cache only in the prefill."""

import pytest
import torch
from torch import nn

from actzip.errors import ConfigError
from actzip.prompt import capture, decoder_blocks, forward_logits, inject

from .tiny_models import BOS, VOCAB


def _ids(batch=2, seq=7):
    return torch.randint(3, VOCAB, (batch, seq))


@pytest.mark.parametrize("layer", [0, 1])
@pytest.mark.parametrize("slot", [0, 3])
def test_writing_back_the_captured_state_changes_no_bit(make, kind, layer, slot):
    model, ids = make(kind), _ids()
    with torch.no_grad(), capture(model, [layer]) as cap:
        ref = forward_logits(model, ids)
    state = cap.states[layer][:, slot]  # (batch, d): each row its own
    with torch.no_grad():
        with inject(model, layer, state, slot=slot, mode="replace"):
            replaced = forward_logits(model, ids)
        with inject(model, layer, torch.zeros(state.shape[-1]), slot=slot, mode="add"):
            added = forward_logits(model, ids)
    assert torch.equal(replaced, ref) and torch.equal(added, ref)
    assert not decoder_blocks(model)[layer]._forward_pre_hooks  # the hooks are gone after the block


@pytest.mark.parametrize("mode", ["replace", "add"])
def test_only_positions_from_the_slot_on_change(make, kind, mode):
    model, ids = make(kind), _ids()
    vector = 3 * torch.randn(32)
    with torch.no_grad():
        ref = forward_logits(model, ids)
        for slot in (0, 4):
            with inject(model, 1, vector, slot=slot, mode=mode):
                out = forward_logits(model, ids)
            assert torch.equal(out[:, :slot], ref[:, :slot])
            assert (out[:, slot:] != ref[:, slot:]).any(-1).all()  # every later position sees the slot


def test_capture_follows_the_huggingface_convention_but_before_the_final_norm(make):
    model, ids = make("llama", layers=3), _ids()
    with torch.no_grad(), capture(model, [0, 1, 2, 3]) as cap:
        out = model(ids, output_hidden_states=True)
    assert all(torch.equal(cap.states[i], out.hidden_states[i]) for i in range(3))
    assert torch.equal(model.model.norm(cap.states[3]), out.hidden_states[3])  # HF's last entry is normed


def test_gradients_reach_the_vector(make, kind):
    model, ids = make(kind), _ids()
    for p in model.parameters():
        p.requires_grad_(False)
    for mode in ("replace", "add"):
        vector = torch.randn(2, 32, requires_grad=True)
        with inject(model, 1, vector, slot=2, mode=mode):
            forward_logits(model, ids)[:, 2:].square().sum().backward()
        assert vector.grad is not None and (vector.grad != 0).all(-1).all()


def _greedy_without_cache(model, ids, steps):
    for _ in range(steps):
        nxt = forward_logits(model, ids)[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)
    return ids


def test_generate_with_a_kv_cache_injects_only_in_the_prefill(make, hf_kind):
    model = make(hf_kind)
    vector, steps = 8 * torch.randn(32), 6
    rows = [torch.tensor([BOS, 11, 12, 13]), torch.tensor([BOS, 21])]  # two lengths: the batch is left-padded
    ids = torch.zeros(2, 4, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, 4 - len(r):], mask[i, 4 - len(r):] = r, 1
    with torch.no_grad():
        plain = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, do_sample=False,
                               eos_token_id=None, pad_token_id=0)
        with inject(model, 1, vector, slot=1):  # each row's second real token
            cached = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, do_sample=False,
                                    eos_token_id=None, pad_token_id=0)
            loops = [_greedy_without_cache(model, r[None], steps)[0, len(r):] for r in rows]
    assert not torch.equal(cached, plain)  # the vector matters, so injecting in decode steps would show
    for row, loop in zip(cached[:, 4:], loops):
        assert torch.equal(row, loop)


class _KwargBlock(nn.Module):
    """Takes its hidden states as ``hidden_states=`` and returns a tuple, as some HF layers do."""

    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, hidden_states, scale=1.0):
        return (hidden_states + scale * torch.tanh(self.lin(hidden_states)), None)


class _KwargModel(nn.Module):
    def __init__(self, d=8, n=2):
        super().__init__()
        self.wte = nn.Embedding(16, d)
        self.layers = nn.ModuleList([_KwargBlock(d) for _ in range(n)])
        self.head = nn.Linear(d, 16)

    def forward(self, idx):
        x = self.wte(idx)
        for layer in self.layers:
            x = layer(hidden_states=x, scale=0.5)[0]
        return self.head(x)


def test_keyword_hidden_states_and_tuple_outputs():
    model, ids = _KwargModel(), torch.randint(0, 16, (2, 5))
    with torch.no_grad(), capture(model, [1, 2]) as cap:
        ref = forward_logits(model, ids)
    with torch.no_grad(), inject(model, 1, cap.states[1][:, 2], slot=2):
        assert torch.equal(forward_logits(model, ids), ref)
    with torch.no_grad(), inject(model, 1, torch.ones(8), slot=2):
        out = forward_logits(model, ids)
    assert torch.equal(out[:, :2], ref[:, :2]) and not torch.equal(out[:, 2:], ref[:, 2:])
    assert cap.states[2].shape == (2, 5, 8)  # the last block's output, taken from its tuple


def test_bad_arguments(make):
    model = make("gpt")
    with pytest.raises(ConfigError, match="mode must be one of"):
        with inject(model, 0, torch.zeros(32), mode="mul"):
            pass
    with pytest.raises(ConfigError, match="inject: layer 2 is out of range for GPT, which has 2 decoder blocks"):
        with inject(model, 2, torch.zeros(32)):
            pass
    with pytest.raises(ConfigError, match="capture: layer 3 is out of range"):
        with capture(model, [3]):
            pass
    with pytest.raises(ConfigError, match="slot must be"):
        with inject(model, 0, torch.zeros(32), slot=-1):
            pass
    with pytest.raises(ConfigError, match="floating-point"):
        with inject(model, 0, torch.zeros(1, 1, 32)):
            pass
    with pytest.raises(ConfigError, match="does not fit the hidden states"), torch.no_grad():
        with inject(model, 0, torch.zeros(16)):
            forward_logits(model, _ids())
    assert not decoder_blocks(model)[0]._forward_pre_hooks
