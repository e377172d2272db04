"""``actzip bench split-link``: the split-learning runtime as processes over a real shaped link, its step time
against the link model's.

One server (:class:`~actzip.split.SplitServer`, rank 0) and ``clients`` clients (:class:`~actzip.split.SplitClient`,
ranks 1..), each a process in a network namespace of its own on one switch (:class:`~actzip.wire.link.NetnsMesh`),
every client's uplink shaped to ``bandwidth_mbps`` and the server's to ``server_mbps`` (the same by default) with
``tc tbf`` and ``latency_ms`` added in software, train on
the synthetic multimodal suite (linear encoders on the clients, the sim's head on the server) through gloo. The
server serves its clients in turn. For each cell the same run goes twice: through the mesh unshaped and shaped.
Every party times its own work a step (the step less the time it waits in a receive): the unshaped run's are the
compute the model takes. The link model's step replays the protocol with
:class:`~actzip.wire.link.LinkModel`: each client's batch crosses its own uplink (its bytes at the
link's rate, one latency), the server works on the clients' batches in turn for its measured time each, each
reply crosses the server's uplink (shared by the replies, in order) and the client works its measured time
before it sends again; the model's step is a round's median once it has settled. With one client that is the
measured work plus each way's bytes at the rate and a latency. Bytes are the transport's metered ones, headers
included; the link also carries TCP/IP's own headers (a few percent), which the model leaves out. Under
ModalShare (``policy="modalshare"``) the server scores the batch just received every ``refresh`` steps; the
share of its work that took is measured on the unshaped run (:func:`scoring_share`).
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
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn

from actzip.errors import ActzipError, ConfigError
from actzip.split.runtime import SPLIT_POLICIES, SplitClient, SplitConfig, SplitServer
from actzip.split.uplink import COMPRESSORS
from actzip.wire.link import LinkModel, LinkSpec, NetnsMesh

__all__ = ["SplitLinkConfig", "model_step_s", "parse_cell", "plot", "run_split_link", "scoring_share", "worker_main"]

_PORT = 29591


@dataclass
class SplitLinkConfig:
    """One comparison: the runtime in each cell, unshaped and over the shaped link."""

    # "compressor:compression" (compression: the modalities' dense bf16 payload / the payload sent), or "dense"
    cells: tuple[str, ...] = ("dense", "quant:2", "quant:4", "topk:5", "topk:20", "dct:20")
    policy: str = "equal"  # keep-ratios: "equal" or "modalshare"
    refresh: int = 5  # steps between ModalShare's refreshes (its Shapley scores of the batch just received)
    clients: int = 1  # client processes, served in turn
    bandwidth_mbps: float = 10.0  # every client's uplink rate (an edge device's uplink)
    server_mbps: float | None = None  # the server's uplink rate (None: bandwidth_mbps)
    latency_ms: float = 20.0  # one-way latency, added in software
    batch: int = 256  # samples a client step
    steps: int = 20  # timed steps, after the warm-up
    warmup: int = 3  # steps before the timing starts (connections, allocations)
    lr: float = 1e-3
    seed: int = 0
    threads: int = 1  # torch threads a process
    timeout_s: float = 120.0  # a silent peer is an error after this long

    def __post_init__(self) -> None:
        self.cells = tuple(self.cells)
        if not self.cells:
            raise ConfigError("bench split-link: no cells")
        for cell in self.cells:
            parse_cell(cell)
        if self.policy not in SPLIT_POLICIES:
            raise ConfigError(f"bench split-link: policy must be one of {SPLIT_POLICIES}, got {self.policy!r}")
        if not 1 <= self.clients <= 16:
            raise ConfigError(f"bench split-link: clients must be in [1, 16], got {self.clients}")
        if not self.bandwidth_mbps > 0 or self.latency_ms < 0 or not (self.server_mbps is None
                                                                      or self.server_mbps > 0):
            raise ConfigError(f"bench split-link: the links need rates > 0 and a latency >= 0, got "
                              f"{self.bandwidth_mbps} Mbit/s (server {self.server_mbps}), {self.latency_ms} ms")
        if self.refresh < 1:
            raise ConfigError(f"bench split-link: refresh must be >= 1, got {self.refresh}")
        if self.steps < 2 or self.warmup < 1 or self.batch < 1 or self.threads < 1:
            raise ConfigError(f"bench split-link: steps must be >= 2, warmup >= 1, batch and threads >= 1; got "
                              f"steps={self.steps}, warmup={self.warmup}, batch={self.batch}, threads={self.threads}")

    @property
    def link(self) -> LinkSpec:
        """A client's uplink."""
        return LinkSpec(bandwidth_mbps=self.bandwidth_mbps, latency_ms=self.latency_ms)

    @property
    def server_link(self) -> LinkSpec:
        """The server's uplink."""
        return LinkSpec(bandwidth_mbps=self.server_mbps or self.bandwidth_mbps, latency_ms=self.latency_ms)


def parse_cell(cell: str) -> tuple[str, float]:
    """``"topk:20"`` -> ``("topk", 20.0)``; ``"dense"`` -> ``("random", 1.0)`` (at compression 1 every compressor
    sends every value in bf16)."""
    if cell == "dense":
        return "random", 1.0
    name, _, ratio = cell.partition(":")
    try:
        compression = float(ratio)
    except ValueError:
        compression = float("nan")
    if name not in COMPRESSORS or not compression >= 1:
        raise ConfigError(f"bench split-link: a cell is 'dense' or compressor:compression with a compressor of "
                          f"{COMPRESSORS} and a compression >= 1, got {cell!r}")
    return name, compression


def model_step_s(server_s: float, client_s: list[float], up_bytes: list[float], down_bytes: list[float],
                 link: LinkSpec, rounds: int = 60, server_link: LinkSpec | None = None) -> float:
    """The link model's step (module docstring): ``server_s`` the server's work a round (all clients), ``client_s``
    each client's work a step, ``up_bytes`` / ``down_bytes`` each client's a step; ``link`` each client's uplink,
    ``server_link`` the server's (default ``link``)."""
    ups, egress = [LinkModel(link) for _ in client_s], LinkModel(server_link or link)
    ready, free, ends = [0.0] * len(client_s), 0.0, []
    for _ in range(rounds):
        for k in range(len(client_s)):
            arrival = ups[k].transmit(round(up_bytes[k]), ready[k])
            free = max(free, arrival) + server_s / len(client_s)
            ready[k] = egress.transmit(round(down_bytes[k]), free) + client_s[k]
        ends.append(free)
    settled = [b - a for a, b in zip(ends, ends[1:])][rounds // 2:]
    return statistics.median(settled)


def _timed_receives(transport) -> list[float]:
    """Make ``transport.recv`` add the seconds it waits to the returned one-element list."""
    waited, recv = [0.0], transport.recv

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return recv(*args, **kwargs)
        finally:
            waited[0] += time.perf_counter() - t0

    transport.recv = timed
    return waited


def _work_steps(ends: list[float], waits: list[float], start: float) -> list[float]:
    """A party's work each step: the step less what it waited in receives during it."""
    t, w = [start, *ends], [0.0, *waits]
    return [(t[i + 1] - t[i]) - (w[i + 1] - w[i]) for i in range(len(ends))]


def scoring_share(work: list[float], refresh: int, warmup: int) -> float:
    """The share of the server's timed work that ModalShare's refreshes took: each refresh step's work over the
    median of the other steps', summed, over all the work (the split sim's ``scoring_share``)."""
    timed = list(enumerate(work))[warmup:]
    scoring = [w for k, w in timed if (k + 1) % refresh == 0]
    plain = statistics.median(w for k, w in timed if (k + 1) % refresh)
    return sum(w - plain for w in scoring) / sum(w for _, w in timed)


def _parties(cfg: SplitLinkConfig, cell: str):
    """The suite, its sizes, the split config and builders of a client's encoders and the server's head."""
    from actzip_bench.split_sim import client_encoder
    from actzip_bench.split_suites import load_suite

    suite = load_suite("synthetic")
    widths = suite.widths(None)
    shapes = [tuple(x.shape[1:]) for x in suite.streams.values()]
    compressor, compression = parse_cell(cell)
    split = SplitConfig(tuple(widths), compressor=compressor, compression=compression, policy=cfg.policy,
                        refresh=cfg.refresh, seed=cfg.seed)
    classes = int(suite.labels.max()) + 1

    def encoders() -> nn.ModuleList:
        return nn.ModuleList(client_encoder(s, w, "linear", 0) for s, w in zip(shapes, widths))

    def head() -> nn.Module:
        return nn.Sequential(nn.Linear(sum(widths), 128), nn.ReLU(), nn.Linear(128, classes))

    return suite, split, encoders, head


def worker_main(argv: list[str] | None = None) -> int:
    """One party: rank 0 the server (writes ``--out``), ranks 1.. the clients."""
    import torch.distributed as dist

    from actzip.wire.backends import DistBackend
    from actzip.wire.transport import Transport

    p = argparse.ArgumentParser(prog="python -m actzip_bench.split_link", description=worker_main.__doc__)
    p.add_argument("--config", required=True, help="SplitLinkConfig fields as JSON")
    p.add_argument("--cell", required=True, help="one of the config's cells")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    cfg = SplitLinkConfig(**json.loads(args.config))
    torch.set_num_threads(cfg.threads)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=cfg.timeout_s))
    rank = dist.get_rank()
    try:
        suite, split, encoders, head = _parties(cfg, args.cell)
        torch.manual_seed(cfg.seed * 1000 + rank)
        transport = Transport(DistBackend(), rank, timeout_s=cfg.timeout_s)
        total = cfg.warmup + cfg.steps
        waited, waits = _timed_receives(transport), []
        if rank == 0:
            model = head()
            server = SplitServer(model, transport, list(range(1, cfg.clients + 1)), split,
                                 torch.optim.Adam(model.parameters(), lr=cfg.lr))
            server.check()
            ends, losses, marks = [], [], {}
            start = time.perf_counter()
            for step in range(total):
                if step == cfg.warmup:
                    marks["up"] = transport.meter.total("received", "fwd")
                    marks["down"] = transport.meter.total("sent", "bwd")
                losses.append(server.step())
                ends.append(time.perf_counter())
                waits.append(waited[0])
            server.finish()
            work = _work_steps(ends, waits, start)
            record = {"step_end_s": ends, "losses": losses, "work_steps_s": work,
                      "work_s": statistics.median(work[cfg.warmup:]),
                      "up_bytes": (transport.meter.total("received", "fwd") - marks["up"]) / cfg.steps,
                      "down_bytes": (transport.meter.total("sent", "bwd") - marks["down"]) / cfg.steps,
                      "sizes": list(split.sizes)}
            with open(args.out, "w") as f:
                json.dump(record, f)
        else:
            enc = encoders()
            client = SplitClient(enc, transport, 0, split, torch.optim.Adam(enc.parameters(), lr=cfg.lr))
            client.check()
            gen = torch.Generator().manual_seed(cfg.seed * 1000 + rank)
            xs = list(suite.streams.values())
            ends, start = [], time.perf_counter()
            for _ in range(total):
                idx = torch.randint(0, suite.train, (cfg.batch,), generator=gen)
                client.step([x[idx] for x in xs], suite.labels[idx])
                ends.append(time.perf_counter())
                waits.append(waited[0])
            with open(f"{args.out}.{rank}", "w") as f:
                json.dump({"work_s": statistics.median(_work_steps(ends, waits, start)[cfg.warmup:])}, f)
    except ActzipError as e:
        print(f"actzip: error: rank {rank}: {e}", file=sys.stderr)
        return 2
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _run_once(cfg: SplitLinkConfig, cell: str, link: LinkSpec | list[LinkSpec]) -> dict:
    """One run of every party through a mesh shaped by ``link`` (one, or one a node); the server's record, and
    its median step."""
    world = cfg.clients + 1
    with tempfile.TemporaryDirectory(prefix="actzip-split-link-") as tmp:
        out = os.path.join(tmp, "server.json")
        cmd = [sys.executable, "-m", "actzip_bench.split_link", "--config", json.dumps(asdict(cfg)),
               "--cell", cell, "--out", out]
        limit = cfg.timeout_s + 60 + 10.0 * (cfg.warmup + cfg.steps)
        with NetnsMesh(world, link) as net:
            procs = [net.popen(rank, cmd, env=dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world),
                                                   MASTER_ADDR=net.addresses[0], MASTER_PORT=str(_PORT)),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for rank in range(world)]
            results = []
            for p in procs:
                try:
                    so, se = p.communicate(timeout=limit)
                except subprocess.TimeoutExpired:
                    for q in procs:
                        q.kill()
                    raise ConfigError(f"bench split-link: the parties at {cell} ran past {limit:.0f} s")
                results.append((p.returncode, so, se))
        failed = [(rank, r) for rank, r in enumerate(results) if r[0]]
        if failed:
            rank, (code, so, se) = failed[0]
            raise ConfigError(f"bench split-link: party {rank} in cell {cell} failed (exit {code}): "
                              f"{(se or so).strip()[-2000:]}")
        with open(out) as f:
            rec = json.load(f)
        rec["client_work_s"] = []
        for rank in range(1, world):
            with open(f"{out}.{rank}") as f:
                rec["client_work_s"].append(json.load(f)["work_s"])
    ends = rec["step_end_s"][cfg.warmup - 1:]  # the timed steps' ends, after the warm-up's last
    rec["step_s"] = statistics.median(b - a for a, b in zip(ends, ends[1:]))
    return rec


def run_split_link(cfg: SplitLinkConfig, progress=None) -> dict:
    """Every cell unshaped and shaped; rows of measured and modelled step times and bytes each way."""
    rows = []
    for cell in cfg.cells:
        unshaped = _run_once(cfg, cell, LinkSpec())
        if progress is not None:
            progress(f"{cell} unshaped")
        shaped = _run_once(cfg, cell, [cfg.server_link] + [cfg.link] * cfg.clients)
        if progress is not None:
            progress(f"{cell} shaped")
        # one client's bytes: the server's totals are over every client
        up = [shaped["up_bytes"] / cfg.clients] * cfg.clients
        down = [shaped["down_bytes"] / cfg.clients] * cfg.clients
        compressor, compression = parse_cell(cell)
        rows.append({"cell": cell, "compressor": compressor, "compression": compression,
                     "measured_step_s": shaped["step_s"], "unshaped_step_s": unshaped["step_s"],
                     "model_step_s": model_step_s(unshaped["work_s"], unshaped["client_work_s"], up, down, cfg.link,
                                                  server_link=cfg.server_link),
                     "server_work_s": unshaped["work_s"], "client_work_s": unshaped["client_work_s"],
                     "scoring_share": (scoring_share(unshaped["work_steps_s"], cfg.refresh, cfg.warmup)
                                       if cfg.policy == "modalshare" else None),
                     "up_bytes": shaped["up_bytes"], "down_bytes": shaped["down_bytes"],
                     "final_loss": shaped["losses"][-1][-1], "sizes": shaped["sizes"]})
    dense = next((r for r in rows if r["cell"] == "dense"), None)
    for r in rows:
        r["model_error"] = r["model_step_s"] / r["measured_step_s"] - 1
        r["speedup_vs_dense"] = dense["measured_step_s"] / r["measured_step_s"] if dense else None
    return {"config": asdict(cfg), "rows": rows}


def plot(record: dict, path) -> None:
    """Measured and modelled step per cell (one group of bars a cell), and the bytes up beside them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, c = record["rows"], record["config"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [1e3 * r["measured_step_s"] for r in rows], 0.4, label="measured")
    ax.bar([i + 0.2 for i in x], [1e3 * r["model_step_s"] for r in rows], 0.4, label="link model")
    ax.set_ylabel("step (ms)")
    ax.set_title(f"{c['clients']} client(s), {c['bandwidth_mbps']:g} Mbit/s, {c['latency_ms']:g} ms")
    bx.bar(list(x), [r["up_bytes"] / 1e3 for r in rows])
    bx.set_ylabel("uplink kB a step")
    bx.set_yscale("log")
    for axis in (ax, bx):
        axis.set_xticks(list(x), [r["cell"] for r in rows], rotation=30)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(worker_main())
