"""Bits per element of the sparse codec against the entropy bound, on ReLU² activations of a trained GPT.

Trains the reference ReLU² GPT on the embedded corpus for ``steps`` steps, then encodes each block's
``relu(h)`` on held-out batches with and without sign packing, and reports per layer: density, the entropy
bound (mask entropy at that density + value bits), the codec's actual bits per element, and their ratio.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from actzip.codecs.sparse import entropy_bound
from actzip_bench.data import Corpus
from actzip_bench.models import GPT, GPTConfig


@dataclass
class BitsBenchConfig:
    preset: str = "small"  # model size
    steps: int = 300  # training steps before measuring (activations of a model that has learned something)
    batch_size: int = 16
    lr: float = 1e-3
    dtype: str = "bfloat16"  # dtype of the activations measured
    corpus_bytes: int = 8_000_000
    eval_batches: int = 4  # held-out batches whose activations are measured
    tile_size: int = 4096


def _relu_outputs(model: GPT, idx: torch.Tensor) -> list[torch.Tensor]:
    outs = []
    hooks = [b.mlp.c_fc.register_forward_hook(lambda m, i, o: outs.append(F.relu(o).detach())) for b in model.h]
    try:
        with torch.no_grad():
            model(idx)
    finally:
        for h in hooks:
            h.remove()
    return outs


def run_bits(cfg: BitsBenchConfig, device: torch.device, progress=None) -> dict:
    from actzip_bench.harness import machine_record

    torch.manual_seed(0)
    corpus = Corpus.from_stdlib(max_bytes=cfg.corpus_bytes)
    model = GPT(GPTConfig.of_size(cfg.preset, activation="relu2")).to(device)
    opt = model.configure_optimizer(lr=cfg.lr)
    g = torch.Generator().manual_seed(0)
    block = model.config.block_size
    losses = []
    for step in range(cfg.steps):
        x, y = corpus.get_batch("train", cfg.batch_size, block, generator=g, device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if progress is not None:
            progress(step)
    model.eval()
    dtype = getattr(torch, cfg.dtype)
    per_layer: list[list] = [[] for _ in model.h]
    gv = torch.Generator().manual_seed(1)
    for _ in range(cfg.eval_batches):
        x, _ = corpus.get_batch("val", cfg.batch_size, block, generator=gv, device=device)
        for i, r in enumerate(_relu_outputs(model, x)):
            r = r.to(dtype)
            per_layer[i].append((entropy_bound(r, sign_pack=False, tile_size=cfg.tile_size),
                                 entropy_bound(r, sign_pack=True, tile_size=cfg.tile_size)))
    layers = []
    for i, rows in enumerate(per_layer):
        def mean(f):
            return sum(f(r) for r in rows) / len(rows)

        layers.append({
            "layer": i,
            "density": mean(lambda r: r[0].density),
            "dense_bits": rows[0][0].dense_bits,
            "bound_bits": mean(lambda r: r[0].bound_bits),
            "codec_bits": mean(lambda r: r[0].codec_bits),
            "bound_bits_signpack": mean(lambda r: r[1].bound_bits),
            "codec_bits_signpack": mean(lambda r: r[1].codec_bits),
        })
    return {"config": asdict(cfg), "final_train_loss": sum(losses[-10:]) / min(10, len(losses)), "layers": layers,
            "machine": machine_record(device)}
