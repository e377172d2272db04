"""``actzip bench wire`` with one process per stage: under torchrun, or in two network namespaces.

:func:`train_entry_processes` launches the stage processes (``python -m actzip_bench.wire_processes``, one
:func:`worker_main` per stage) and turns rank 0's record into what :func:`actzip_bench.wire.train_entry` returns
for a run in one process, plus measured wall-clock step ends and, through a real link, interface counters.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict

import torch
import torch.distributed as dist

from actzip.errors import ActzipError, ConfigError
from actzip.wire import Action, LinkSpec, NetnsLink, Pipeline
from actzip_bench.data import Corpus
from actzip_bench.wire_config import (
    Batches,
    WireBenchConfig,
    build_stages_for,
    codec_specs,
    parse_entry,
    pipeline_config,
)


def _worker_command(cfg: WireBenchConfig, entry: str, device: torch.device, out: str,
                    target: float | None = None) -> list[str]:
    fields = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg).items()}
    return ["-m", "actzip_bench.wire_processes", "--entry", entry, "--config", json.dumps(fields),
            "--device", str(device), "--out", out, *(["--target", repr(target)] if target is not None else [])]


def train_entry_processes(cfg: WireBenchConfig, entry: str, device: torch.device,
                          link: LinkSpec | None = None, target: float | None = None) -> dict:
    """Train one entry with one process per stage for ``steps`` steps (then on towards ``target`` as
    :func:`train_entry` does): under torchrun (``link=None``: the processes talk over loopback TCP with gloo, or
    NCCL between GPUs), or in two network namespaces joined by a ``link``-shaped veth pair.
    Returns what :func:`train_entry` does, plus measured wall-clock step ends (and interface counters)."""
    name, ratio = parse_entry(entry)
    with tempfile.TemporaryDirectory(prefix="actzip-wire-") as tmp:
        out = os.path.join(tmp, "rank0.json")
        cmd = _worker_command(cfg, entry, device, out, target)
        limit = cfg.timeout_s + 60 + 5.0 * cfg.steps * (cfg.target_steps if target is not None else 1)
        if link is None:
            argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={cfg.stages}",
                    *cmd]
            r = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=limit)
            failed = [(0, r)] if r.returncode else []
        else:
            with NetnsLink(link) as net:
                procs = []
                for side in (0, 1):
                    env = dict(os.environ, RANK=str(side), LOCAL_RANK="0", WORLD_SIZE="2",
                               MASTER_ADDR=net.addresses[0], MASTER_PORT="29581",
                               GLOO_SOCKET_IFNAME=net.ifnames[side], ACTZIP_WIRE_IFNAME=net.ifnames[side])
                    procs.append(net.popen(side, [sys.executable, *cmd], env=env, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True))
                results = []
                for p in procs:
                    so, se = p.communicate(timeout=limit)
                    results.append(subprocess.CompletedProcess(p.args, p.returncode, so, se))
            failed = [(i, r) for i, r in enumerate(results) if r.returncode]
        if failed:
            i, r = failed[0]
            raise ConfigError(f"bench wire: the stage processes of {entry!r} failed (rank {i}, exit "
                              f"{r.returncode}): {_failure_digest(r.stderr or r.stdout)}")
        with open(out) as f:
            res = json.load(f)
    gcfg = cfg.gpt_config()
    tokens = cfg.steps * cfg.batch_size * gcfg.block_size
    acts = [Action.from_tuple(a) for a in res["actions"]]
    fwd, bwd = codec_specs(name, ratio, cfg.bwd_codec, cfg.stage_codec)
    counted = [a for a in acts if a.step < cfg.steps]  # equal tokens: the first `steps` steps

    def per_token(kind: str) -> float:
        return sum(a.send_bytes for a in counted if a.kind == kind) / (tokens * (cfg.stages - 1))

    out = {"entry": entry, "compressor": name, "ratio": ratio, "fwd_codec": fwd, "bwd_codec": bwd,
           "losses": res["losses"], "val_loss": None, "actions": acts, "tokens": tokens,
           "bytes_per_token_fwd": per_token("F"), "bytes_per_token_bwd": per_token("B"),
           "wall_step_end_s": res["wall_step_end_s"]}
    if res.get("probes") and all(p and p[0] for p in res["probes"]):
        out["link_counters"] = [{k: p[1][k] - p[0][k] for k in p[0]} | {"meter": m}
                                for p, m in zip(res["probes"], res["meters"])]
    return out


def _failure_digest(text: str, limit: int = 3000) -> str:
    """The lines of a failed worker's output that say why (the launcher's own report buries them)."""
    lines = text.strip().splitlines()
    why = [ln for ln in lines if any(k in ln for k in ("actzip: error", "Error", "error:", "Exception", "NCCL WARN"))]
    head = "\n".join(dict.fromkeys(why))[:limit // 2]
    return (head + "\n...\n" if head else "") + "\n".join(lines)[-(limit - len(head)):]


def _interface_counters() -> dict:
    name = os.environ.get("ACTZIP_WIRE_IFNAME")
    if not name:
        return {}
    base = f"/sys/class/net/{name}/statistics/"
    return {k: int(open(base + k).read()) for k in ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets")}


def worker_main(argv: list[str] | None = None) -> int:
    """One stage process (rank = stage), started by torchrun or by the netns harness; rank 0 writes ``--out``."""
    p = argparse.ArgumentParser(prog="python -m actzip_bench.wire_processes", description=worker_main.__doc__)
    p.add_argument("--entry", required=True)
    p.add_argument("--config", required=True, help="WireBenchConfig fields as JSON")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", required=True)
    p.add_argument("--target", type=float, default=None,
                   help="after --steps, train on (up to target_steps times) until the smoothed loss reaches this")
    args = p.parse_args(argv)
    fields = json.loads(args.config)
    cfg = WireBenchConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
    device = torch.device(args.device)
    if cfg.threads is not None and device.type == "cpu":
        torch.set_num_threads(cfg.threads)
    torch.set_float32_matmul_precision(cfg.matmul_precision)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            timeout=datetime.timedelta(seconds=cfg.timeout_s))
    rank = dist.get_rank()
    try:
        if dist.get_world_size() != cfg.stages:
            raise ConfigError(f"bench wire worker: {dist.get_world_size()} processes for {cfg.stages} stages")
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(device)
        name, ratio = parse_entry(args.entry)
        module = build_stages_for(cfg.gpt_config(), cfg.stages, name, ratio, cfg.seed,
                                  cfg.boundary_options())[rank].to(device)
        corpus = Corpus.from_stdlib(max_bytes=cfg.corpus_bytes)
        batches = Batches(corpus, cfg.batch_size, cfg.gpt_config().block_size, cfg.seed, cfg.dataset_windows)
        window = max(1, round(cfg.smooth * cfg.steps))
        until = None if args.target is None else (
            lambda losses: statistics.fmean(losses[-window:]) <= args.target)
        pipe = Pipeline(module, pipeline_config(cfg, args.entry), device, distributed=True)
        res = pipe.run(batches, cfg.steps, probe=_interface_counters, until=until,
                       max_steps=round(cfg.target_steps * cfg.steps))
    except ActzipError as e:
        print(f"actzip: error: rank {rank}: {e}", file=sys.stderr)
        return 2
    if res is not None:
        res["actions"] = [a.as_tuple() for a in res["actions"]]
        with open(args.out, "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
