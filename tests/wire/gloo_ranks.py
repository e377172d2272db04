"""Run a function on several gloo ranks (spawned processes) and collect what each returned or raised.

Every rank reports ``("ok", value, seconds)`` or ``("error", exception type name, message, seconds)``; one that
exits without reporting is ``("exited", exit code, ...)``; one that neither reports nor exits within the
deadline is killed and reported as ``("hung", ...)``, so a test of a fault can assert that no rank hangs.

Ranks are forked (no second import of torch: a rank starts in milliseconds instead of seconds) and run one
intra-op thread; ``ACTZIP_TEST_START_METHOD=spawn`` starts them fresh instead.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue
import tempfile
import time
import traceback


def _entry(fn, rank, world, store, timeout_s, args, out) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    t0 = time.monotonic()
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        value = fn(rank, world, *args)
        out.put((rank, ("ok", value, time.monotonic() - t0)))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which asserts on it
        out.put((rank, ("error", type(e).__name__, f"{e}\n{traceback.format_exc(limit=3)}", time.monotonic() - t0)))
    finally:
        out.close()
        out.join_thread()  # the report is on its way before the process ends
        os._exit(0)  # skip interpreter teardown: a process group with a dead peer may block on it


def run_ranks(fn, world: int = 2, *args, timeout_s: float = 10.0, deadline_s: float = 25.0) -> list[tuple]:
    """``fn(rank, world, *args)`` on ``world`` gloo ranks; the per-rank reports, in rank order."""
    ctx = mp.get_context(os.environ.get("ACTZIP_TEST_START_METHOD", "fork"))
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_entry, args=(fn, r, world, store, timeout_s, args, out)) for r in range(world)]
        for p in procs:
            p.start()
        got: dict[int, tuple] = {}
        end = time.monotonic() + deadline_s
        quiet_exit = 0.0
        while len(got) < world and time.monotonic() < end:
            try:
                rank, report = out.get(timeout=0.2)
                got[rank] = report
            except queue.Empty:
                # A rank that exited without reporting (killed, os._exit) will not report: stop waiting for it
                # once the others are done and nothing arrived for a second.
                exited = [r for r, p in enumerate(procs) if r not in got and p.exitcode is not None]
                if exited and len(got) + len(exited) == world:
                    quiet_exit = quiet_exit or time.monotonic()
                    if time.monotonic() - quiet_exit > 1.0:
                        for r in exited:
                            got[r] = ("exited", procs[r].exitcode, None, None)
        for p in procs:
            p.join(timeout=max(0.1, end - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
    return [got.get(r, ("hung", None, None, deadline_s)) for r in range(world)]
