"""The reference model that follows instructions: a small byte-level HuggingFace Llama (vocabulary 256, one
token a byte) trained on the generated instruction suite plus standard-library source, saved and loaded as one
file.

No pretrained decoder ships in a package, so the prompt benchmark trains its own. Rotary positions, not a learned
position table: every training row starts with its instruction, so a model with absolute positions would never
have seen a query near the start of a sequence, where the vector puts it. A batch holds instruction
rows (a task's prompt, then one to four ``query = answer`` pairs of it; loss on the answer bytes only) and source
rows (every byte scored); the two mean losses are added, so the few answer bytes are not drowned by source text.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import random
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from actzip.errors import ConfigError, DataError
from actzip_bench.data.corpus import Corpus
from actzip_bench.data.instructions import InstructionSuite, InstructionSuiteConfig, instruction_batch

__all__ = ["PromptModelConfig", "QUICK_MODEL", "load_reference_model", "save_reference_model",
           "train_reference_model"]


@dataclass
class PromptModelConfig:
    """Shape of the reference model and how it is trained."""

    n_layer: int = 6  # transformer blocks
    n_head: int = 6  # attention heads per block
    n_embd: int = 384  # residual width
    block_size: int = 192  # longest sequence (a prompt and four pairs fit)
    steps: int = 4000  # optimizer steps
    batch_size: int = 96  # instruction rows a step
    corpus_rows: int = 32  # source rows a step (0: instructions only)
    corpus_weight: float = 0.25  # weight of the source loss beside the answer loss
    corpus_bytes: int = 8 << 20  # bytes of standard-library source read
    lr: float = 2e-3  # peak AdamW learning rate (linear warm-up, cosine to a tenth)
    warmup: int = 200  # warm-up steps
    weight_decay: float = 0.1
    bf16: bool = True  # autocast to bfloat16 on CUDA (CPU runs stay float32)
    rope_theta: float = 10000.0  # rotary base

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "block_size", "steps", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"PromptModelConfig.{name}: a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ConfigError(f"PromptModelConfig: n_head {self.n_head} must divide n_embd {self.n_embd}")
        if self.corpus_rows < 0 or self.corpus_weight < 0:
            raise ConfigError("PromptModelConfig: corpus_rows and corpus_weight must be >= 0")
        if not (0 <= self.warmup < self.steps):
            raise ConfigError(f"PromptModelConfig.warmup: in [0, steps), got {self.warmup}")

    def build(self):
        """A freshly initialized ``LlamaForCausalLM`` of this shape (float32, train mode)."""
        import transformers

        hidden = -(-(8 * self.n_embd // 3) // 64) * 64  # SwiGLU width, Llama's 8/3 rounded up to 64
        config = transformers.LlamaConfig(
            vocab_size=256, hidden_size=self.n_embd, intermediate_size=hidden, num_hidden_layers=self.n_layer,
            num_attention_heads=self.n_head, num_key_value_heads=self.n_head, max_position_embeddings=self.block_size,
            rope_theta=self.rope_theta, tie_word_embeddings=True, bos_token_id=None, eos_token_id=ord("\n"),
            pad_token_id=0, attn_implementation="sdpa")
        return transformers.LlamaForCausalLM(config)


#: What ``--quick`` trains on a 2-core CPU in about two minutes.
QUICK_MODEL = PromptModelConfig(n_layer=4, n_head=4, n_embd=128, block_size=112, steps=700, batch_size=24,
                                corpus_rows=4, warmup=50, lr=3e-3)


def _lr_at(cfg: PromptModelConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def _loss(model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=x, use_cache=False).logits
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100)


def _optimizer(model, cfg: PromptModelConfig) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=all(p.is_cuda for p in params))


def train_reference_model(cfg: PromptModelConfig, suite_cfg: InstructionSuiteConfig, seed: int,
                          device: torch.device, progress: Callable[[int, float], None] | None = None
                          ) -> tuple[torch.nn.Module, dict]:
    """Train a fresh reference model; returns it (eval mode) and a log of its losses.

    ``progress(step, answer_loss)`` is called every 50 steps (a host sync there: this is a benchmark's set-up,
    not a measured step).
    """
    torch.manual_seed(seed)
    suite = InstructionSuite(suite_cfg)
    rng = random.Random(seed)
    model = cfg.build().to(device)
    opt = _optimizer(model, cfg)
    corpus = Corpus.from_stdlib(max_bytes=cfg.corpus_bytes) if cfg.corpus_rows else None
    gen = torch.Generator().manual_seed(seed)
    autocast = torch.autocast("cuda", torch.bfloat16, enabled=cfg.bf16 and device.type == "cuda")
    log: list[dict] = []
    start = time.perf_counter()
    model.train()
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = _lr_at(cfg, step)
        x, y = instruction_batch(suite, cfg.batch_size, cfg.block_size, rng, split="train")
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast:
            loss = _loss(model, x, y)
            corpus_loss = None
            if corpus is not None:
                cx, cy = corpus.get_batch("train", cfg.corpus_rows, cfg.block_size, generator=gen, device=device)
                corpus_loss = _loss(model, cx, cy)
                total = loss + cfg.corpus_weight * corpus_loss
            else:
                total = loss
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == cfg.steps - 1:
            entry = {"step": step, "answer_loss": float(loss.detach()), "seconds": time.perf_counter() - start}
            if corpus_loss is not None:
                entry["corpus_loss"] = float(corpus_loss.detach())
            log.append(entry)
            if progress is not None:
                progress(step + 1, entry["answer_loss"])
    model.eval()
    return model, {"seed": seed, "seconds": time.perf_counter() - start, "log": log}


def save_reference_model(path: str | pathlib.Path, model: torch.nn.Module, cfg: PromptModelConfig,
                         suite_cfg: InstructionSuiteConfig, train_log: dict) -> None:
    """One file: weights, the model's and the suite's configs, and the training log."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    partial = path.with_suffix(path.suffix + ".partial")  # renamed when whole: a reader never sees half a file
    torch.save({"model": state, "config": asdict(cfg), "suite": asdict(suite_cfg), "train": train_log}, partial)
    os.replace(partial, path)


def load_reference_model(path: str | pathlib.Path, device: torch.device
                         ) -> tuple[torch.nn.Module, PromptModelConfig, InstructionSuiteConfig, dict]:
    """The model ``save_reference_model`` wrote (eval mode), with its configs and training log."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise DataError(f"reference model {str(path)!r} does not exist; train one with `actzip bench prompt "
                        "--model-dir DIR` first")
    blob = torch.load(path, map_location="cpu", weights_only=True)
    cfg = PromptModelConfig(**blob["config"])
    fields = {f.name for f in dataclasses.fields(InstructionSuiteConfig)}
    suite_cfg = InstructionSuiteConfig(**{k: (tuple(v) if isinstance(v, list) else v)
                                          for k, v in blob["suite"].items() if k in fields})
    model = cfg.build()
    model.load_state_dict(blob["model"])
    return model.to(device).eval(), cfg, suite_cfg, blob["train"]
