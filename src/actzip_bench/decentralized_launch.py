"""How ``actzip bench decentralized`` starts its S x R ranks: under torchrun on this machine, or, with
``shaped_link``, one process per rank in a network namespace of its own, every node's uplink shaped
(:class:`actzip.wire.NetnsMesh`), so that each message and each collective crosses a real slow link."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable

from actzip.wire import LinkSpec, NetnsMesh

__all__ = ["launch_ranks"]

WORKER = ["-m", "actzip_bench.decentralized_worker"]


def _follow(stdout, progress: Callable[[str], None] | None, finished: set[str]) -> None:
    for line in stdout:
        if line.startswith("done ") and progress is not None:
            progress(line[5:].strip())
        elif line.startswith("finished "):
            finished.add(line.split()[1])


def launch_ranks(world: int, worker_args: list[str], err_file, progress: Callable[[str], None] | None = None,
                 shaped_link: tuple[float, float] | None = None) -> tuple[int, set[str]]:
    """Run the worker (``worker_args`` after its module) on ``world`` ranks, their stderr into ``err_file``;
    rank 0's progress lines go to ``progress``. Returns the exit status (torchrun's, or the first non-zero of
    the ranks') and the ranks that printed their ``finished`` line."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    finished: set[str] = set()
    if shaped_link is None:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
                *WORKER, *worker_args]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err_file, text=True, env=env)
        _follow(proc.stdout, progress, finished)
        return proc.wait(), finished
    bandwidth, latency = shaped_link
    with NetnsMesh(world, LinkSpec(bandwidth_mbps=bandwidth, latency_ms=latency)) as net:
        procs, outs = [], []
        for rank in range(world):
            rank_env = dict(env, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                            MASTER_ADDR=net.addresses[0], MASTER_PORT="29500")
            # rank 0's output is read as it comes (the progress); the others' after they end (a file: a full
            # pipe nobody reads would stall them)
            out = subprocess.PIPE if rank == 0 else tempfile.TemporaryFile("w+")
            outs.append(out)
            procs.append(net.popen(rank, [sys.executable, *WORKER, *worker_args], env=rank_env, stdout=out,
                                   stderr=err_file, text=True))
        _follow(procs[0].stdout, progress, finished)
        codes = [p.wait() for p in procs]
        for out in outs[1:]:
            out.seek(0)
            _follow(out, None, finished)
            out.close()
    return next((c for c in codes if c), 0), finished
