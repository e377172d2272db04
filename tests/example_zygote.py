"""A process that has imported torch and actzip once and forks a fresh child for every example it is given.

Every example used to start its own interpreter and import torch again (seconds each, most of the examples'
time). The zygote imports them and runs no tensor operation, so each forked child starts as a fresh interpreter
would after ``import torch, actzip``: no example sees another's state. Run as a script, it reads one JSON request
per line on stdin (``code``, ``cwd``, ``out``: the file the child's stdout and stderr go to) and answers one JSON
line per request: ``{"pid": ...}`` once forked, then ``{"rc": ...}`` when the child ends (a signal as ``128 + n``).
:class:`Zygote` is the client; ``run`` gives the exit status, or None when the timeout passed (child killed).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path


def _child(code: str, cwd: str, out: str) -> None:
    os.chdir(cwd)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    sys.argv = ["-c"]
    sys.path[0] = ""  # as `python -c` has it: the working directory
    status = 0
    try:
        exec(compile(code, "<example>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def serve() -> None:
    import torch  # noqa: F401  (imported once, in the parent of every example)

    import actzip  # noqa: F401

    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req["code"], req["cwd"], req["out"])
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        rc = os.waitstatus_to_exitcode(status)
        print(json.dumps({"rc": rc if rc >= 0 else 128 - rc}), flush=True)


class Zygote:
    """The client: one zygote process per test session."""

    def __init__(self, src: Path) -> None:
        path = os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env = {**os.environ, "PYTHONPATH": path}
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, text=True, bufsize=1)
        self._buffer = b""  # bytes read from the zygote's stdout, not yet a whole line

    def _read(self, timeout: float | None) -> dict | None:
        # Lines are split here, from the pipe's raw bytes: a buffered readline could take both of an example's
        # answers at once, and select() would then wait for a second one that already arrived.
        fd = self.proc.stdout.fileno()
        end = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if end is None else max(0.0, end - time.monotonic())
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError("the example zygote ended")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def run(self, code: str, cwd: Path, out: Path, timeout: float) -> int | None:
        """The example's exit status, or None when it ran past ``timeout`` seconds (then it is killed)."""
        self.proc.stdin.write(json.dumps({"code": code, "cwd": str(cwd), "out": str(out)}) + "\n")
        self.proc.stdin.flush()
        pid = self._read(60)["pid"]
        done = self._read(timeout)
        if done is not None:
            return done["rc"]
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._read(60)
        return None

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


if __name__ == "__main__":
    serve()
