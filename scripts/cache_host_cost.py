"""Host (Python) time per saved tensor of the activation cache, with the quant kernels' launches stubbed out.

Runs a tiny GPT's forward on the CPU under: nothing, the role tracker, the cache with count-only rules, the
tracker with those, and the tracker with the 4bit preset's rules (the quant codecs take their Triton path, whose
launches do nothing here). Prints the median forward time of each and the extra microseconds per save: what the
host spends before the GPU is given any work.

    PYTHONPATH=src python scripts/cache_host_cost.py
"""

import contextlib
import os
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import torch  # noqa: E402

from actzip.codecs.quant import QuantCodec  # noqa: E402
from actzip.kernels import quant as quant_kernels  # noqa: E402
from actzip.memory.cache import CacheContext, RoleTracker, preset_rules  # noqa: E402
from actzip_bench.models import GPT, GPTConfig  # noqa: E402


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def main() -> None:
    quant_kernels.quant_encode_kernel = _NoLaunch()
    quant_kernels.quant_decode_kernel = _NoLaunch()
    QuantCodec.uses_triton = lambda self, *args: True
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = GPT(GPTConfig.of_size("tiny", activation="gelu", n_layer=4))
    idx = torch.randint(0, 256, (1, 17))
    x, y = idx[:, :-1], idx[:, 1:]
    four = CacheContext(rules=preset_rules("4bit", min_bytes=0))
    count = CacheContext.count_only()
    variants = {
        "plain": lambda: [],
        "tracker": lambda: [RoleTracker()],
        "count": lambda: [count],
        "tracker+count": lambda: [RoleTracker(), count],
        "tracker+4bit": lambda: [four],  # the 4bit rules ask for roles: the cache runs its own tracker
    }

    def forward(make) -> None:
        with contextlib.ExitStack() as stack:
            for ctx in make():
                stack.enter_context(ctx)
            model(x, y)
        four.history.clear()
        count.history.clear()

    times = {k: [] for k in variants}
    for _ in range(7):  # interleaved, median of 7
        for k, make in variants.items():
            for _ in range(3):
                forward(make)
            t0 = time.perf_counter()
            for _ in range(30):
                forward(make)
            times[k].append((time.perf_counter() - t0) / 30 * 1e3)
    with four:
        model(x, y)
    saves = four.save_index + 1
    four.history.clear()
    base = sorted(times["plain"])[3]
    for k, v in times.items():
        ms = sorted(v)[3]
        print(f"{k:14s} {ms:6.2f} ms per forward, +{(ms - base) * 1e3 / saves:5.1f} us per save ({saves} saves)")


if __name__ == "__main__":
    main()
