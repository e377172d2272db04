"""One rank of ``actzip bench decentralized`` (stage s of replica r, under torchrun): every (seed, task,
method) in turn on the same mesh; global rank 0 writes every run's records to ``--out`` and prints a line per
run done (the parent's progress)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from actzip.errors import ActzipError
from actzip.wire import PipelineConfig
from actzip.wire.mesh import Mesh, TwoCircuit
from actzip_bench.data.domains import domain_corpora
from actzip_bench.decentralized_config import (TASKS, DecentralizedBenchConfig, method_boundary, method_circuits,
                                               method_codecs)
from actzip_bench.models.gpt_stages import build_gpt_stages
from actzip_bench.wire_config import Batches


def config_from_json(text: str) -> DecentralizedBenchConfig:
    fields = json.loads(text)
    fields["links"] = tuple(tuple(link) for link in fields["links"])
    fields.setdefault("schedule", "1f1b")  # records made before the field
    return DecentralizedBenchConfig(**{k: tuple(v) if isinstance(v, list) and k != "links" else v
                                       for k, v in fields.items()})


def _val_loss(tc: TwoCircuit, corpus, cfg: DecentralizedBenchConfig, seed: int) -> float | None:
    g = torch.Generator().manual_seed(10_000 + seed)
    losses = []
    for _ in range(cfg.eval_batches):
        x, y = corpus.get_batch("val", cfg.batch_size, cfg.block_size, generator=g)
        loss = tc.pipe.eval_loss(x, y)
        if loss is not None:
            losses.append(loss)
    return sum(losses) / len(losses) if losses else None


def run_one(mesh: Mesh, cfg: DecentralizedBenchConfig, states: list, corpus, seed: int, method: str,
            device: torch.device) -> list | None:
    """Train ``method`` on ``corpus`` from the pretrained ``states``; every rank's record on rank 0."""
    stages = build_gpt_stages(cfg.gpt_config(), cfg.stages, method_boundary(method, cfg), seed=seed)
    module = stages[mesh.stage]
    got = module.load_state_dict(states[mesh.stage], strict=False)  # the pretrained (dense) stages' weights
    own = [k for k in got.missing_keys if not k.startswith(("sender.", "receiver."))]
    if own or got.unexpected_keys:  # only a boundary's own state may be new
        raise ActzipError(f"bench decentralized: the pretrained stage {mesh.stage} does not fit {method}'s stage: "
                          f"missing {own}, unexpected {got.unexpected_keys}")
    module.to(device)
    fwd, bwd = method_codecs(method, cfg)
    pcfg = PipelineConfig(schedule=cfg.schedule, microbatches=cfg.microbatches, fwd_codec=fwd, bwd_codec=bwd, lr=cfg.lr,
                          seed=seed, timeout_s=cfg.timeout_s)
    tc = TwoCircuit(module, mesh, pcfg, method_circuits(method, cfg))
    batches = Batches(corpus, cfg.batch_size, cfg.block_size, seed * 101 + mesh.replica, cfg.dataset_windows)
    t0 = time.monotonic()
    for step in range(cfg.steps):
        x, y, ids = batches(step)
        tc.train_step(x, y, ids)
    wall = time.monotonic() - t0
    rec = tc.record()  # before the evaluation's forwards add to the meter
    rec["val_loss"], rec["wall_s"] = _val_loss(tc, corpus, cfg, seed), wall
    tc.close()
    got = [None] * dist.get_world_size() if mesh.rank == 0 else None
    dist.gather_object(rec, got, dst=0)
    return got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m actzip_bench.decentralized_worker", description=__doc__)
    p.add_argument("--config", required=True, help="DecentralizedBenchConfig fields as JSON")
    p.add_argument("--states", required=True, help="torch.save'd {seed: [stage state dicts]} after pretraining")
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cpu", help="cpu, or cuda: every rank on GPU LOCAL_RANK %% device count "
                   "(several ranks may share one; they talk over gloo through CPU copies)")
    args = p.parse_args(argv)
    cfg = config_from_json(args.config)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=cfg.timeout_s))
    try:
        mesh = Mesh(cfg.stages, cfg.replicas)
        corpora = domain_corpora(cfg.corpus_bytes)
        pretrained = torch.load(args.states, weights_only=True)
        device = torch.device("cpu")
        if args.device == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
            torch.cuda.set_device(device)
        runs = []
        for seed in cfg.seeds:
            for task in cfg.tasks:
                for method in cfg.methods:
                    got = run_one(mesh, cfg, pretrained[seed], corpora[TASKS[task]], seed, method, device)
                    if got is not None:
                        runs.append({"seed": seed, "task": task, "method": method, "ranks": got})
                        print(f"done {seed} {task} {method}", flush=True)
    except ActzipError as e:
        print(f"actzip: error: rank {dist.get_rank()}: {e}", file=sys.stderr, flush=True)
        return 2
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(runs, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
