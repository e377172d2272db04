"""Backends of the wire transport: they move uint8 tensors between ranks, nothing more.

:class:`DistBackend` uses ``torch.distributed`` point-to-point operations (gloo on CPU, NCCL between GPUs);
:class:`LoopbackHub` gives the stages of one process in-memory queues with the same interface. Framing, schemas
and metering live in :mod:`actzip.wire.transport`.
"""

from __future__ import annotations

import datetime
import os
import queue
import threading
import time
from collections import deque

import torch

from actzip.errors import ConfigError
from actzip.errors import WireDesyncError, WireError, WirePeerError, WireTimeoutError


def _map_dist_error(e: Exception, rank: int, peer: int, what: str, timeout_s: float) -> WireError:
    text = str(e)
    if "Timed out" in text or "timed out" in text or "Timeout" in text:
        return WireTimeoutError(
            f"rank {rank} waited {timeout_s:g} s for {what} from rank {peer} and nothing arrived: the peer is "
            f"stuck or slower than the timeout (raise timeout_s if it is only slow)"
        )
    if "closed" in text or "reset" in text.lower() or "Broken pipe" in text:
        return WirePeerError(f"rank {peer} went away (its process failed or exited) while rank {rank} was "
                             f"waiting for {what}; see rank {peer}'s own error")
    return WireError(f"rank {rank}: transfer of {what} with rank {peer} failed: {text.splitlines()[0][:300]}")


class DistBackend:
    """Moves uint8 tensors with ``torch.distributed`` point-to-point ops (an initialized process group)."""

    def __init__(self, group=None, device: torch.device | str | None = None, down_group=None,
                 send_delay_s: float | None = None) -> None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ConfigError("DistBackend needs an initialized torch.distributed process group "
                              "(torch.distributed.init_process_group, e.g. under torchrun)")
        self.dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        backend = dist.get_backend(group)
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self.device = torch.device(device)
        self._pending: deque = deque()  # (work, tensor, peer, what): tensors stay alive until sent
        self._lock = threading.Lock()  # the delay line's thread posts sends too
        # one-way latency added in software (a shaped link whose kernel has no netem): every send is held this
        # long, in order, by a delay line; ACTZIP_SEND_DELAY_MS sets it for the processes of a NetnsLink
        delay = send_delay_s if send_delay_s is not None else float(os.environ.get("ACTZIP_SEND_DELAY_MS", "0"))
        if not delay >= 0:
            raise ConfigError(f"DistBackend: the send delay must be >= 0 seconds, got {delay!r}")
        self.send_delay_s = delay / 1e3 if send_delay_s is None else delay
        # a receive may be posted from another thread (Transport.expect): gloo's CPU point-to-point ops may; an
        # NCCL receive there would order itself on that thread's stream, so NCCL receives stay on the caller's
        self.prefetches = backend == "gloo"
        self._line: queue.Queue | None = None
        self._line_error: BaseException | None = None
        self._failed: WireError | None = None  # after a failed receive the stream position is lost for good
        # An NCCL send holds its stream until the peer posts the receive, and a pair's sends and receives share
        # one stream per communicator: two neighbours sending to each other at once (hellos, a forward crossing
        # a backward) would wait on each other for ever. Traffic towards lower ranks gets a communicator of its
        # own, so each communicator carries one direction per pair. (Gloo buffers sends, but takes the same
        # path, so the CPU tests cover it.)
        # ``down_group``: that communicator made already (every rank of the world must create each group, in
        # one order: a mesh of several pipelines makes them all up front)
        self._down = down_group if down_group is not None else dist.new_group(
            dist.get_process_group_ranks(group) if group is not None else None, backend=backend)
        self._connect_neighbours()

    def _connect_neighbours(self) -> None:
        """Create every neighbour pair's two NCCL communicators now, pair by pair in rank order on every rank.

        NCCL creates a pair's communicator at its first message, blocking both ends until both arrive; left to
        the traffic, rank 0 would wait in the upward communicator while rank 1 waits in the downward one."""
        one = torch.zeros(1, dtype=torch.uint8, device=self.device)
        n = self.dist.get_world_size(self.group)
        for low in range(n - 1):
            if self.rank == low:
                self.dist.isend(one, dst=self._peer(low + 1), group=self.group).wait()
                self.dist.irecv(one, src=self._peer(low + 1), group=self._down).wait()
            elif self.rank == low + 1:
                self.dist.irecv(one, src=self._peer(low), group=self.group).wait()
                self.dist.isend(one, dst=self._peer(low), group=self._down).wait()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _peer(self, peer: int) -> int:
        return peer if self.group is None else self.dist.get_global_rank(self.group, peer)

    def _group_to(self, peer: int):
        """The group whose communicator carries messages between this rank and ``peer`` in that direction."""
        return self._down if peer < self.rank else self.group

    def send(self, peer: int, data: torch.Tensor, what: str) -> None:
        if self.send_delay_s > 0:  # a software link latency: the delay line posts it when it is due
            self._start_delay_line()
            self._line.put((time.monotonic() + self.send_delay_s, peer, data, what))
            return
        self._post(peer, data, what)

    def _post(self, peer: int, data: torch.Tensor, what: str) -> None:
        with self._lock:
            work = self.dist.isend(data, dst=self._peer(peer), group=self._group_to(peer))
            self._pending.append((work, data, peer, what))
            while self._pending and self._pending[0][0].is_completed():
                self._pending.popleft()

    def _start_delay_line(self) -> None:
        if self._line is not None:
            return
        self._line = queue.Queue()

        def serve() -> None:
            while True:
                due, peer, data, what = self._line.get()
                try:
                    time.sleep(max(0.0, due - time.monotonic()))
                    self._post(peer, data, what)
                except BaseException as e:  # noqa: BLE001 - raised by the next flush, on the caller's thread
                    self._line_error = e
                finally:
                    self._line.task_done()

        threading.Thread(target=serve, name="actzip-send-delay", daemon=True).start()

    def recv(self, peer: int, nbytes: int, what: str, timeout_s: float) -> torch.Tensor:
        if self._failed is not None:
            raise type(self._failed)(f"rank {self.rank} cannot receive {what}: an earlier receive failed and left "
                                     f"the stream out of step ({self._failed})")
        out = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        try:
            # a message from a higher rank travels downwards: the same communicator its sender used
            self.dist.irecv(out, src=self._peer(peer), group=self._down if peer > self.rank else self.group).wait(
                timeout=datetime.timedelta(seconds=timeout_s))
        except RuntimeError as e:
            self._failed = _map_dist_error(e, self.rank, peer, what, timeout_s)
            raise self._failed from None
        return out

    def flush(self, timeout_s: float) -> None:
        """Wait until every message sent so far was taken by its receiver."""
        if self._line is not None:
            self._line.join()  # every delayed message posted
            if self._line_error is not None:
                raise WireError(f"rank {self.rank}: a delayed send failed: {self._line_error}")
        while self._pending:
            work, _, peer, what = self._pending[0]
            try:
                work.wait(timeout=datetime.timedelta(seconds=timeout_s))
            except RuntimeError as e:
                self._pending.clear()
                raise _map_dist_error(e, self.rank, peer, f"the delivery of {what}", timeout_s) from None
            self._pending.popleft()

    def drop_pending(self) -> None:
        self._pending.clear()


class LoopbackHub:
    """Queues between the stages of one process; the stand-in for the network in the simulated pipeline."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.queues: dict[tuple[int, int], deque] = {}

    def backend(self, rank: int) -> LoopbackBackend:
        return LoopbackBackend(self, rank)

    def ready(self, src: int, dst: int) -> bool:
        """Is a message from ``src`` to ``dst`` waiting?"""
        return bool(self.queues.get((src, dst)))


class LoopbackBackend:
    """One stage's end of a :class:`LoopbackHub`."""

    def __init__(self, hub: LoopbackHub, rank: int) -> None:
        self.hub, self.rank, self.device = hub, rank, hub.device

    def send(self, peer: int, data: torch.Tensor, what: str) -> None:
        self.hub.queues.setdefault((self.rank, peer), deque()).append(data)

    def recv(self, peer: int, nbytes: int, what: str, timeout_s: float) -> torch.Tensor:
        q = self.hub.queues.get((peer, self.rank))
        if not q:
            raise WireTimeoutError(f"stage {self.rank} expected {what} from stage {peer} but none was sent "
                                   f"(in one process a receive cannot wait: the schedule ran out of order)")
        data = q.popleft()
        if data.numel() != nbytes:
            raise WireDesyncError(f"stage {self.rank}: {what} from stage {peer} has {data.numel()} bytes, "
                                  f"expected {nbytes}")
        return data

    def flush(self, timeout_s: float) -> None:
        pass

    def drop_pending(self) -> None:
        pass
