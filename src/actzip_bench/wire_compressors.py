"""Convergence of the stage-boundary compressors, in one process.

The reference GPT is split into pipeline stages (:func:`actzip_bench.models.gpt_stages.build_gpt_stages`) and
trained from the same initial weights on the same batches of the embedded corpus once per run (a boundary at a
forward compression ratio), the stages chained by :func:`actzip.wire.run_chain`, which meters the bytes every
boundary sends each way (headers, side channels and codebook updates included). Recorded per run: the
training loss, its mean over the last ``steps / 20`` steps at ``steps`` (the loss "at equal tokens"; the
runs see less than one epoch, so these batches are new to the model), the validation loss at ``steps``
(the corpus' held-out tail, a somewhat different distribution), bytes per token and ratio each way, and
the median compute time of a step on this machine.

Time to target is *modelled*, not measured on a link: a step costs the measured compute time plus, for every
boundary, (forward + backward bytes) * 8 / bandwidth, nothing overlapped. The target is the dense run's loss
at equal tokens; a compressed run may train up to ``overtime * steps`` steps to reach it (its smoothed training
loss at or below the target). The link-only figure drops the compute term: the limit of a fast accelerator on
a slow link. ``actzip bench wire`` measures real links.

    python -m actzip_bench.wire_compressors --quick --out results/cpu/wire-compressors-quick.json
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from actzip.errors import ConfigError
from actzip_bench.data import Corpus
from actzip_bench.harness import machine_record
from actzip_bench.models import GPTConfig
from actzip.wire import WireMeter, exchange_backward, run_chain
from actzip_bench.models.gpt_stages import build_gpt_stages

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class WireStudyConfig:
    model: str = "small"  # model size (GPTConfig.of_size)
    block_size: int | None = 64  # override of the preset's sequence length (None: the preset's)
    n_stages: int = 4  # pipeline stages (boundaries = n_stages - 1)
    # Runs: "compressor@ratio", optionally "+bf16" (bfloat16 code and gradient) and ",field=value" overrides.
    runs: tuple[str, ...] = (
        "dense",
        "subspace@16",
        "subspace@100",
        "bottleneck@16",
        "bottleneck@100+bf16",
        "stiefel@16",
        "stiefel@16,anchor_rank=256",
        "stiefel@16,lr=1e-6",  # the projections frozen at their initial values
        "stiefel@100+bf16",
        "stiefel-rvq@128+bf16,rvq_sync_every=50,rvq_delta_dtype=bf16",
    )
    steps: int = 1000
    batch_size: int = 8
    lr: float = 3e-4  # AdamW, constant; 1e-3 trains the dense 4-layer model worse at this length
    corpus_bytes: int = 4_000_000
    eval_batches: int = 16  # validation batches at ``steps``
    log_every: int = 10  # keep every n-th training loss in the record
    # Compressed runs may go on up to this many times ``steps``, stopping once they reach the dense run's
    # loss at equal tokens, to measure steps and time to that target.
    overtime: float = 2.0
    bandwidth_mbps: float = 200.0  # link model for time to target
    seed: int = 0
    threads: int = 1  # torch CPU threads


QUICK = {
    "model": "tiny",
    "n_stages": 2,
    "runs": ("dense", "subspace@100", "bottleneck@100", "stiefel@16", "stiefel-rvq@100"),
    "steps": 300,
    "batch_size": 16,
}


def parse_run(spec: str) -> tuple[str, float, dict]:
    """``"stiefel@16+bf16,anchor_rank=8"`` -> ``("stiefel", 16.0, {"code_dtype": bfloat16, "anchor_rank": 8})``."""
    head, *pairs = spec.split(",")
    options: dict = {}
    if "+" in head:
        head, dt = head.split("+", 1)
        if dt not in _DTYPES:
            raise ConfigError(f"run {spec!r}: code dtype suffix must be one of {sorted(_DTYPES)}, got {dt!r}")
        options["code_dtype"] = _DTYPES[dt]
    name, _, ratio = head.partition("@")
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            options[key] = _DTYPES[value] if value in _DTYPES else json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return name, float(ratio) if ratio else 1.0, options


def _gpt_config(cfg: WireStudyConfig) -> GPTConfig:
    extra = {} if cfg.block_size is None else {"block_size": cfg.block_size}
    return GPTConfig.of_size(cfg.model, **extra)


def _val_loss(stages, corpus: Corpus, cfg: WireStudyConfig, block: int, n: int) -> float:
    g = torch.Generator().manual_seed(1234)
    for s in stages:
        s.eval()
    losses = []
    with torch.no_grad():
        for _ in range(n):
            x, y = corpus.get_batch("val", cfg.batch_size, block, generator=g)
            logits = run_chain(stages, x)
            losses.append(float(F.cross_entropy(logits.flatten(0, 1), y.flatten())))
    for s in stages:
        s.train()
    return sum(losses) / len(losses)


def _window(cfg: WireStudyConfig) -> int:
    return max(10, cfg.steps // 20)


def smoothed(losses: list[float], window: int) -> list[float]:
    """Mean of the last ``window`` losses at every step from ``window`` on (``out[i]`` ends at step ``i + window``)."""
    out, acc = [], sum(losses[:window])
    for i in range(window, len(losses) + 1):
        out.append(acc / window)
        if i < len(losses):
            acc += losses[i] - losses[i - window]
    return out


def train_run(spec: str, cfg: WireStudyConfig, corpus: Corpus, target: float | None = None, progress=None) -> dict:
    """Train one run; returns its record. ``target``: the dense run's final smoothed training loss."""
    name, ratio, options = parse_run(spec)
    gcfg = _gpt_config(cfg)
    stages = build_gpt_stages(gcfg, cfg.n_stages, name, ratio=ratio, seed=cfg.seed, **options)
    params = [p for s in stages for p in s.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(cfg.seed)
    meter = WireMeter()
    losses, times = [], []
    window = _window(cfg)
    limit = cfg.steps if target is None else int(cfg.steps * cfg.overtime)
    for step in range(limit):
        x, y = corpus.get_batch("train", cfg.batch_size, gcfg.block_size, generator=g)
        t0 = time.perf_counter()
        logits = run_chain(stages, x, meter)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss.backward()
        exchange_backward(stages, meter)
        opt.step()
        opt.zero_grad(set_to_none=True)
        for s in stages:
            s.after_optimizer_step()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
        if progress is not None:
            progress(spec, step)
        if step + 1 == cfg.steps:
            val = _val_loss(stages, corpus, cfg, gcfg.block_size, cfg.eval_batches)
            per_tok = meter.per_token()
        # Past the equal-token point, go on only until the dense run's final loss is reached.
        if step + 1 >= cfg.steps and target is not None and sum(losses[-window:]) / window <= target:
            break
    boundary_cfg = stages[0].sender.cfg if stages[0].sender is not None else None
    return {
        "run": spec,
        "compressor": name,
        "ratio_requested": ratio,
        "width": None if boundary_cfg is None else boundary_cfg.width,
        "boundary_config": None if boundary_cfg is None else repr(boundary_cfg),
        "steps_run": len(losses),
        "final_train_loss": sum(losses[cfg.steps - window : cfg.steps]) / window,
        "val_loss": val,
        "fwd_bytes_per_token": per_tok["fwd"],
        "bwd_bytes_per_token": per_tok["bwd"],
        "nominal_bytes_per_token": None if boundary_cfg is None else boundary_cfg.nominal_bytes_per_token(),
        "step_compute_s": statistics.median(times[5:]) if len(times) > 5 else statistics.median(times),
        "train_loss": losses[:: cfg.log_every],
        "smoothed_train_loss": smoothed(losses, window)[:: cfg.log_every],
        "params": sum(p.numel() for p in params),
        "_losses": losses,
    }


def _time_to_target(run: dict, target: float, tokens: int, cfg: WireStudyConfig, boundaries: int) -> None:
    link_s = boundaries * (run["fwd_bytes_per_token"] + run["bwd_bytes_per_token"]) * tokens * 8 / (
        cfg.bandwidth_mbps * 1e6
    )
    run["step_link_s"] = link_s
    window = _window(cfg)
    hit = next((i + window for i, v in enumerate(smoothed(run["_losses"], window)) if v <= target + 1e-12), None)
    run["steps_to_target"] = hit
    run["time_to_target_s"] = None if hit is None else hit * (run["step_compute_s"] + link_s)
    run["link_time_to_target_s"] = None if hit is None else hit * link_s


def run_study(cfg: WireStudyConfig, progress=None) -> dict:
    torch.set_num_threads(cfg.threads)
    corpus = Corpus.from_stdlib(max_bytes=cfg.corpus_bytes)
    runs, target = [], None
    # Dense first: its final smoothed training loss is the others' target.
    for spec in sorted(cfg.runs, key=lambda s: parse_run(s)[0] != "dense"):
        runs.append(train_run(spec, cfg, corpus, target, progress))
        if runs[-1]["compressor"] == "dense" and target is None:
            target = runs[-1]["final_train_loss"]
    gcfg = _gpt_config(cfg)
    tokens = cfg.batch_size * gcfg.block_size
    dense = next((r for r in runs if r["compressor"] == "dense"), None)
    for r in runs:
        r["fwd_ratio"] = gcfg.n_embd * 4 / r["fwd_bytes_per_token"]
        r["bwd_ratio"] = gcfg.n_embd * 4 / r["bwd_bytes_per_token"]
        r["both_ways_ratio"] = 2 * gcfg.n_embd * 4 / (r["fwd_bytes_per_token"] + r["bwd_bytes_per_token"])
        if dense is not None:
            r["val_loss_gap"] = r["val_loss"] / dense["val_loss"] - 1
            r["train_loss_gap"] = r["final_train_loss"] / dense["final_train_loss"] - 1
            _time_to_target(r, dense["final_train_loss"], tokens, cfg, cfg.n_stages - 1)
    if dense is not None and dense.get("time_to_target_s"):
        for r in runs:
            t, lt = r.get("time_to_target_s"), r.get("link_time_to_target_s")
            r["speedup_vs_dense"] = None if t is None else dense["time_to_target_s"] / t
            r["link_speedup_vs_dense"] = None if not lt else dense["link_time_to_target_s"] / lt
    for r in runs:
        del r["_losses"]
    machine = machine_record(torch.device("cpu"))
    return {"config": asdict(cfg), "tokens_per_step": tokens, "runs": runs, "machine": machine}


def table(record: dict) -> str:
    """A plain-text summary, one row per run."""

    def fmt(v, spec):
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)

    cols = ("run", "width", "fwd x", "bwd x", "loss", "gap", "val gap", "steps", "speedup", "link-only")
    rows = ["  ".join(cols)]
    for r in record["runs"]:
        rows.append("  ".join([
            r["run"], fmt(r["width"], "d"), fmt(r["fwd_ratio"], ".1f"), fmt(r["bwd_ratio"], ".1f"),
            fmt(r["final_train_loss"], ".4f"), fmt(r.get("train_loss_gap"), "+.2%"), fmt(r.get("val_loss_gap"), "+.2%"),
            fmt(r.get("steps_to_target"), "d"), fmt(r.get("speedup_vs_dense"), ".2f"),
            fmt(r.get("link_speedup_vs_dense"), ".2f"),
        ]))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m actzip_bench.wire_compressors", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny model, 2 stages, 5 runs, 300 steps (a few minutes)")
    p.add_argument("--model")
    p.add_argument("--block-size", type=int)
    p.add_argument("--n-stages", type=int)
    p.add_argument("--runs", help="comma-separated is ambiguous with overrides: separate runs with ';'")
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--threads", type=int)
    p.add_argument("--out", help="write the JSON record here")
    args = p.parse_args(argv)
    fields = dict(QUICK) if args.quick else {}
    for key in ("model", "block_size", "n_stages", "steps", "batch_size", "lr", "seed", "threads"):
        if getattr(args, key) is not None:
            fields[key] = getattr(args, key)
    if args.runs:
        fields["runs"] = tuple(s.strip() for s in args.runs.split(";") if s.strip())
    cfg = WireStudyConfig(**fields)
    def progress(spec: str, step: int) -> None:
        if (step + 1) % 100 == 0:
            print(f"{spec}: step {step + 1}", file=sys.stderr, flush=True)

    record = run_study(cfg, progress=progress)
    args_used = argv if argv is not None else sys.argv[1:]
    record["command"] = "python -m actzip_bench.wire_compressors " + shlex.join(args_used)
    print(table(record))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
