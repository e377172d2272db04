"""One rank of ``actzip bench decentralized`` (stage s of replica r, under torchrun): every (seed, task,
method) in turn on the same mesh; global rank 0 appends each run's records to ``--out`` as a JSON line when the
run is done (a later failure keeps it) and prints a line per run (the parent's progress)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from dataclasses import replace

import torch
import torch.distributed as dist

from actzip.errors import ActzipError
from actzip.wire import Pipeline, PipelineConfig
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


def _val_loss(pipe: Pipeline, corpus, cfg: DecentralizedBenchConfig, seed: int) -> float | None:
    g = torch.Generator().manual_seed(10_000 + seed)
    losses = []
    for _ in range(cfg.eval_batches):
        x, y = corpus.get_batch("val", cfg.batch_size, cfg.block_size, generator=g)
        loss = pipe.eval_loss(x, y)
        if loss is not None:
            losses.append(loss)
    return sum(losses) / len(losses) if losses else None


def _replicas_loss(losses: list[float], cfg: DecentralizedBenchConfig, last: bool) -> float:
    """The replicas' mean of their last stages' mean loss over the last ``cfg.window`` steps (on every rank)."""
    mine = sum(losses[-cfg.window:]) / min(len(losses), cfg.window) if last else 0.0
    total = torch.tensor([mine], dtype=torch.float64)
    dist.all_reduce(total)
    return float(total) / cfg.replicas


def _final_loss(ranks: list[dict], cfg: DecentralizedBenchConfig) -> float:
    """Dense's final loss from its gathered records, as :func:`actzip_bench.decentralized.summarize` takes it."""
    last = [r["losses"][:cfg.steps] for r in ranks if r["stage"] == cfg.stages - 1]
    mean = [sum(v) / len(v) for v in zip(*last)]
    return sum(mean[-cfg.window:]) / len(mean[-cfg.window:])


def run_one(mesh: Mesh, cfg: DecentralizedBenchConfig, states: list, corpus, seed: int, method: str,
            device: torch.device, target: float | None = None) -> list | None:
    """Train ``method`` on ``corpus`` from the pretrained ``states``; every rank's record on rank 0. With a
    ``target`` (dense's final loss) and ``cfg.until_target > 1``, training goes on past ``cfg.steps`` until the
    replicas' smoothed loss reaches it (every rank stops at the same step)."""
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
    losses, last = [], mesh.stage == cfg.stages - 1
    for step in range(cfg.steps):
        x, y, ids = batches(step)
        losses.append(tc.train_step(x, y, ids))
    wall = time.monotonic() - t0
    limit = round(cfg.steps * cfg.until_target) if target is not None else cfg.steps
    step = cfg.steps
    while step < limit and _replicas_loss(losses, cfg, last) > target:
        x, y, ids = batches(step)
        losses.append(tc.train_step(x, y, ids))
        step += 1
    rec = tc.record()  # before the evaluation's forwards add to the meter
    rec["val_loss"], rec["wall_s"] = _val_loss(tc.pipe, corpus, cfg, seed), wall
    tc.close()
    if tc.anchors is not None:  # with the anchors that were still in flight at record()
        rec["anchor_meter"] = tc.anchors.pipe.meters()[0].as_dict()
    # the trained model itself, as a user evaluates or serves it: the same stages with the wire's codecs off (a
    # boundary that is part of the model, pca's, stays), over the anchor groups, which are free once tc is closed
    plain = Pipeline(module, replace(pcfg, codec="none", fwd_codec=None, bwd_codec=None), distributed=True,
                     group=mesh.anchor_group, down_group=mesh.anchor_down_group)
    rec["model_val_loss"] = _val_loss(plain, corpus, cfg, seed)
    plain.transport.flush()
    del plain
    del tc, module, stages
    if device.type == "cuda":  # ranks sharing a GPU: what this method's shapes cached is free for the others
        torch.cuda.empty_cache()
    got = [None] * dist.get_world_size() if mesh.rank == 0 else None
    dist.gather_object(rec, got, dst=0)
    return got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m actzip_bench.decentralized_worker", description=__doc__)
    p.add_argument("--config", required=True, help="DecentralizedBenchConfig fields as JSON")
    p.add_argument("--states", required=True, help="torch.save'd {seed: [stage state dicts]} after pretraining")
    p.add_argument("--out", required=True)
    p.add_argument("--only", help="comma-separated methods of the config to run here (default all)")
    p.add_argument("--targets", default="{}", help="JSON {\"seed:task\": loss}: dense's final losses from a run "
                   "before this one (the target of the methods here when dense is not among them)")
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
        written = open(args.out, "w") if dist.get_rank() == 0 else None
        # dense first: its final loss is the others' target when they may train on until they reach it
        methods = sorted(cfg.methods, key=lambda m: m != "dense") if cfg.until_target > 1 else cfg.methods
        if args.only:
            methods = [m for m in methods if m in args.only.split(",")]
        given = json.loads(args.targets)
        for seed in cfg.seeds:
            for task in cfg.tasks:
                target = given.get(f"{seed}:{task}")
                for method in methods:
                    got = run_one(mesh, cfg, pretrained[seed], corpora[TASKS[task]], seed, method, device,
                                  None if method == "dense" else target)
                    if got is not None:
                        written.write(json.dumps({"seed": seed, "task": task, "method": method, "ranks": got}) + "\n")
                        written.flush()
                        print(f"done {seed} {task} {method}", flush=True)
                    if method == "dense" and cfg.until_target > 1:
                        shared = [_final_loss(got, cfg) if got is not None else None]
                        dist.broadcast_object_list(shared, src=0)
                        target = shared[0]
    except ActzipError as e:
        print(f"actzip: error: rank {dist.get_rank()}: {e}", file=sys.stderr, flush=True)
        return 2
    if written is not None:
        written.close()
    dist.barrier()  # every rank done with every message before any closes its connections
    print(f"finished {dist.get_rank()}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
