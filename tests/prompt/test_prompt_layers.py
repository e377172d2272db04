"""Finding decoder blocks, width and logits by structure, for each model kind and for a model of no known kind."""

import pytest
import torch
from torch import nn

from actzip.errors import ConfigError
from actzip.prompt import accepts, check_layer, decoder_blocks, embedding, forward_logits, hidden_size

from .tiny_models import VOCAB


def _expected_blocks(kind, model):
    return {"llama": lambda: model.model.layers, "qwen2": lambda: model.model.layers,
            "gpt2": lambda: model.transformer.h, "gpt": lambda: model.h}[kind]()


def test_each_kind_has_its_blocks_width_and_logits(make, kind):
    model = make(kind, hidden=48, layers=3)
    assert decoder_blocks(model) is _expected_blocks(kind, model) and len(decoder_blocks(model)) == 3
    assert hidden_size(model) == 48 and embedding(model).num_embeddings == VOCAB
    ids = torch.randint(3, VOCAB, (2, 5))
    with torch.no_grad():
        logits = forward_logits(model, ids, torch.ones_like(ids))
    assert logits.shape == (2, 5, VOCAB)
    assert accepts(model, "attention_mask") == (kind != "gpt")  # the reference GPT reads right padding as is


class _Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return x + self.lin(x)


class _Stack(nn.Module):
    """No known attribute path: the longest list of same-class modules is the decoder."""

    def __init__(self, d=8, n=3):
        super().__init__()
        self.emb = nn.Embedding(10, d)
        self.heads = nn.ModuleList([nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d), nn.ReLU()])  # mixed classes
        self.stages = nn.ModuleList([_Block(d) for _ in range(n)])
        self.short = nn.ModuleList([_Block(d)])
        self.out = nn.Linear(d, 10)

    def forward(self, idx):
        x = self.emb(idx)
        for block in self.stages:
            x = block(x)
        return self.out(x)


def test_the_fallback_takes_the_longest_list_of_one_class():
    model = _Stack()
    assert decoder_blocks(model) is model.stages and hidden_size(model) == 8
    assert forward_logits(model, torch.zeros(1, 4, dtype=torch.long)).shape == (1, 4, 10)


def test_no_blocks_and_no_width_name_the_model_class():
    class Flat(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

    with pytest.raises(ConfigError, match="Flat: no decoder blocks found"):
        decoder_blocks(Flat())
    with pytest.raises(ConfigError, match="Flat: cannot tell the width"):
        hidden_size(Flat())


def test_layer_bounds_name_the_model_its_blocks_and_the_index(make):
    model = make("llama")
    assert check_layer(model, 2, "layer", allow_output=True) == 2
    with pytest.raises(ConfigError, match=r"layer 2 is out of range for LlamaForCausalLM, which has 2 decoder blocks "
                                          r"\(valid: 0 \.\. 1\)"):
        check_layer(model, 2, "layer", allow_output=False)
    for bad in (-1, 3, True, 1.0):
        with pytest.raises(ConfigError, match="out of range"):
            check_layer(model, bad, "layer", allow_output=True)


def test_a_forward_without_logits_is_refused():
    class Embedder(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(4, 2)

        def forward(self, idx):
            return {"hidden": self.emb(idx)}

    with pytest.raises(ConfigError, match="Embedder: its forward returned no"):
        forward_logits(Embedder(), torch.zeros(1, 2, dtype=torch.long))
