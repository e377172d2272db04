"""Tiny causal LMs of every kind the prompt package knows, built from local configs (nothing is downloaded)."""

import torch

KINDS = ("llama", "qwen2", "gpt2", "gpt")  # HuggingFace Llama, Qwen2, GPT-2; actzip_bench's reference GPT
HF_KINDS = KINDS[:3]
VOCAB = 64
BOS, EOS, PAD = 1, 2, 0


def tiny(kind: str, *, hidden: int = 32, layers: int = 2, seed: int = 0) -> torch.nn.Module:
    """A freshly initialized model of ``kind`` in eval mode (seeded, so two calls give the same weights)."""
    torch.manual_seed(seed)
    if kind == "gpt":
        from actzip_bench.models.gpt import GPT, GPTConfig

        return GPT(GPTConfig(n_layer=layers, n_head=2, n_embd=hidden, block_size=64, vocab_size=VOCAB)).eval()
    import transformers

    ids = dict(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=hidden, n_layer=layers, n_head=2, n_positions=64,
                                         attn_implementation="eager", **ids)
        return transformers.GPT2LMHeadModel(config).eval()
    cls, model = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                  "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[kind]
    config = cls(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                 num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                 attn_implementation="eager", **ids)
    return model(config).eval()
