"""A verifiable task for policy-gradient runs: multi-digit addition, a character tokenizer, an exact-match reward.

Everything is made here: the prompts (``"417+86="``, fixed by a seed), a ``tokenizers`` word-level tokenizer over
the characters ``0-9 + =`` wrapped as a transformers ``PreTrainedTokenizerFast`` (left padding, as generation
wants), and the reward: 1.0 when the completion starts with the sum, else 0.0.
"""

from __future__ import annotations

import random

from actzip.errors import MissingDependencyError

__all__ = ["CHARS", "addition_dataset", "char_tokenizer", "exact_sum_reward"]

CHARS = "0123456789+="
PAD, EOS = "<pad>", "<eos>"


def char_tokenizer():
    """A PreTrainedTokenizerFast with one token per character of :data:`CHARS`, plus pad (0) and eos (1)."""
    try:
        import transformers
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    except ImportError as e:
        raise MissingDependencyError("the arithmetic task needs tokenizers and transformers") from e
    vocab = {PAD: 0, EOS: 1, **{c: i + 2 for i, c in enumerate(CHARS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS)
    hf.padding_side = "left"
    return hf


def addition_dataset(n: int, digits: int = 2, seed: int = 0):
    """A ``datasets.Dataset`` of ``n`` prompts ``"a+b="`` with their ``answer`` (operands of up to ``digits``
    digits)."""
    try:
        import datasets
    except ImportError as e:
        raise MissingDependencyError("the arithmetic task needs datasets (pip install datasets)") from e
    rng = random.Random(seed)
    pairs = [(rng.randrange(10 ** digits), rng.randrange(10 ** digits)) for _ in range(n)]
    return datasets.Dataset.from_dict({"prompt": [f"{a}+{b}=" for a, b in pairs],
                                       "answer": [str(a + b) for a, b in pairs]})


def exact_sum_reward(completions, answer, **_):
    """TRL reward function: 1.0 where the completion starts with the sum."""
    return [float(c.strip().startswith(a)) for c, a in zip(completions, answer)]
