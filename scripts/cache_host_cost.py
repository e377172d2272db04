"""Host time per saved tensor of the activation cache: what the host spends on a save before the GPU gets work.

Runs a tiny GPT's forward (4 blocks, width 64, 16 tokens: every kernel is tiny, so the forward's wall time is
its host time) under: nothing, the role tracker, the cache with count-only rules, the tracker with those, and the
4bit preset, with the roles replayed from a tracked step (the default) and tracked every step (``replay=False``).
Interleaved, median of 7 rounds of 30 forwards after warm-up; prints each variant's forward and the extra
microseconds per save, and with ``--json`` writes them with the machine and code version.

On the CPU the quant kernels' launches are stubbed out (Triton's interpreter is not a launch); on CUDA every
kernel runs, launches included, and each round ends with a synchronize.

    PYTHONPATH=src python scripts/cache_host_cost.py [--device cuda] [--json PATH]
"""

import argparse
import contextlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import torch  # noqa: E402

ROUNDS, FORWARDS, WARMUP = 7, 30, 3


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _stub_launches() -> None:
    from actzip.codecs.quant import QuantCodec
    from actzip.kernels import quant as quant_kernels

    quant_kernels.quant_encode_kernel = _NoLaunch()
    quant_kernels.quant_decode_kernel = _NoLaunch()
    QuantCodec.uses_triton = lambda self, *args: True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", default=None, help="write the record here")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
        _stub_launches()
    from actzip.errors import ConfigError
    from actzip.memory.cache import CacheContext, RoleTracker, cache
    from actzip_bench.harness import machine_record
    from actzip_bench.models import GPT, GPTConfig

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = GPT(GPTConfig.of_size("tiny", activation="gelu", n_layer=4)).to(device)
    idx = torch.randint(0, 256, (1, 17), device=device)
    x, y = idx[:, :-1], idx[:, 1:]
    caches = {"count": CacheContext.count_only(), "4bit": cache("4bit", min_bytes=0)}
    try:
        caches["4bit, tracked every step"] = cache("4bit", min_bytes=0, replay=False)
    except ConfigError:  # a tree from before role plans (the comparison's other side): it tracks every step
        pass
    variants = {
        "plain": lambda: [],
        "tracker": lambda: [RoleTracker()],
        "count": lambda: [caches["count"]],
        "tracker+count": lambda: [RoleTracker(), caches["count"]],
        **{name: (lambda c=c: [c]) for name, c in caches.items() if name.startswith("4bit")},
    }

    def forward(make) -> None:
        with contextlib.ExitStack() as stack:
            for ctx in make():
                stack.enter_context(ctx)
            model(x, y)
        for c in caches.values():
            c.history.clear()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(ROUNDS):  # interleaved
        for k, make in variants.items():
            for _ in range(WARMUP):
                forward(make)
            sync()
            t0 = time.perf_counter()
            for _ in range(FORWARDS):
                forward(make)
            sync()
            times[k].append((time.perf_counter() - t0) / FORWARDS * 1e3)
    four = caches["4bit"]
    with four:
        model(x, y)
    saves = four.save_index + 1
    encoded = sum(s.tensors for name, s in four.last.by_rule.items() if ":quant" in name)
    plan = getattr(four, "role_plan", None)
    replayed, misses = (plan.replayed_steps, plan.misses) if plan is not None else (0, 0)
    base = sorted(times["plain"])[ROUNDS // 2]
    rows = []
    for k, v in times.items():
        ms = sorted(v)[ROUNDS // 2]
        rows.append({"variant": k, "forward_ms": ms, "forward_ms_rounds": v, "us_per_save": (ms - base) * 1e3 / saves})
        print(f"{k:26s} {ms:6.2f} ms per forward, +{(ms - base) * 1e3 / saves:5.1f} us per save ({saves} saves)")
    print(f"4bit: {replayed} steps replayed their roles, {misses} left the plan")
    if args.json:
        record = {
            "command": " ".join(["python", *sys.argv]),
            "machine": machine_record(device),
            "device": str(device),
            "launches": "stubbed" if device.type == "cpu" else "real",
            "model": "tiny GPT, 4 blocks, width 64, 16 tokens, GELU",
            "saves_per_forward": saves,
            "quant_saves_per_forward": encoded,
            "rounds": ROUNDS, "forwards_per_round": FORWARDS,
            "replayed_steps": replayed, "plan_misses": misses,
            "rows": rows,
        }
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
