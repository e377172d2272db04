"""``python -m actzip_bench.exactness``: are the lossless paths' gradients bit-identical to plain PyTorch here?

One training step of the reference GPT (same weights, same batch) is run as plain PyTorch twice, under the
lossless activation cache (``actzip.cache()``) and with the fused sparse MLPs (``SparseMLPConfig``), and every
gradient is compared with the first plain run's, bit for bit and as a relative norm. Each comparison is made in
two modes:

- ``default``: the kernels PyTorch picks (on CUDA: flash / memory-efficient attention, cuBLAS defaults);
- ``deterministic``: ``torch.use_deterministic_algorithms(True, warn_only=True)`` with the math attention
  backend; the warnings PyTorch gives for ops that have no deterministic implementation are recorded;
- ``deterministic-algorithms`` and ``math-attention``: each of the two alone, to tell which one matters;
- ``deterministic-strict``: ``torch.use_deterministic_algorithms(True)`` (errors, not warnings), under which
  cuDNN attention picks a deterministic backward.

On CUDA, deterministic cuBLAS also needs ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` in the environment before CUDA
starts; the record says whether it was set.

Two plain runs that differ show the device's own run-to-run noise; a lossless path is exact where it matches
the plain run as closely as a second plain run does, and bit-identical where the plain runs are.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import warnings
from contextlib import ExitStack

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import actzip
from actzip_bench.harness import machine_record
from actzip_bench.models import GPT, GPTConfig

VARIANTS = ("plain", "plain-again", "cache", "fused")
MODES = ("default", "deterministic", "deterministic-algorithms", "math-attention", "deterministic-strict")


def _grads(model: GPT, idx: torch.Tensor, targets: torch.Tensor, variant: str) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    with ExitStack() as stack:
        if variant == "cache":
            stack.enter_context(actzip.cache())
        _, loss = model(idx, targets)
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def compare(ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> dict:
    if set(ref) != set(got) or not ref:
        raise RuntimeError(f"gradients of different parameters: {sorted(set(ref) ^ set(got))}")
    differing = [n for n in ref if not torch.equal(ref[n], got[n])]
    num = sum(float((ref[n].float() - got[n].float()).norm()) ** 2 for n in ref) ** 0.5
    den = sum(float(ref[n].float().norm()) ** 2 for n in ref) ** 0.5
    return {"bit_identical": not differing, "params_compared": len(ref), "params_differing": len(differing),
            "rel_error": num / den if den else float("nan"), "first_differing": differing[:5]}


def run(size: str, batch: int, seq: int, dtype: str, device: torch.device, seed: int = 0) -> dict:
    cfg = GPTConfig.of_size(size, activation="relu2", block_size=seq)
    torch.manual_seed(seed)
    plain = GPT(cfg).to(device=device, dtype=getattr(torch, dtype))
    fused = copy.deepcopy(plain)
    actzip.compress_(fused, actzip.SparseMLPConfig())
    gen = torch.Generator().manual_seed(seed + 1)
    idx = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen).to(device)
    targets = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen).to(device)
    out = {}
    for mode in MODES:
        was = torch.are_deterministic_algorithms_enabled()
        with ExitStack() as stack, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if mode in ("deterministic", "deterministic-algorithms"):
                torch.use_deterministic_algorithms(True, warn_only=True)
                stack.callback(torch.use_deterministic_algorithms, was)
            if mode == "deterministic-strict":
                torch.use_deterministic_algorithms(True)
                stack.callback(torch.use_deterministic_algorithms, was)
            if mode in ("deterministic", "math-attention"):
                stack.enter_context(sdpa_kernel([SDPBackend.MATH]))
            ref = _grads(plain, idx, targets, "plain")
            rows = {v: compare(ref, _grads(fused if v == "fused" else plain, idx, targets, v)) for v in VARIANTS[1:]}
        rows["nondeterministic_ops_warned"] = sorted({str(w.message).split("\n")[0][:160] for w in caught
                                                      if "deterministic" in str(w.message)})
        out[mode] = rows
    return {"config": {"size": size, "batch": batch, "seq": seq, "dtype": dtype, "seed": seed,
                       "activation": "relu2",
                       "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG")}, "modes": out}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m actzip_bench.exactness", description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="gpt2-124m", help="reference GPT size (GPTConfig.of_size)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--commit", default="", help="code version to record (git commit of the tree that ran)")
    ap.add_argument("--json", help="write the record here")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    record = run(args.size, args.batch, args.seq, args.dtype, device)
    record["machine"] = machine_record(device)
    record["code_version"] = args.commit
    record["command"] = "python -m actzip_bench.exactness " + " ".join(argv if argv is not None else sys.argv[1:])
    text = json.dumps(record, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
