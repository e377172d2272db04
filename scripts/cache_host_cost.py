"""Host time per saved tensor of the activation cache: what the host spends on a save before the GPU gets work.

Runs a tiny GPT's forward (4 blocks, width 64, 16 tokens: every kernel is tiny, so the forward's wall time is
its host time) under: nothing, the role tracker, the cache with count-only rules, the tracker with those, and the
4bit preset, with the roles replayed from a tracked step (the default) and tracked every step (``replay=False``).
Interleaved, median of 7 rounds of 30 forwards after warm-up; prints each variant's forward and the extra
microseconds per save, and with ``--json`` writes them with the machine and code version.

On CUDA also the same model's forward and backward captured whole as a CUDA graph, plain and under the 4bit cache
(``graph_safe``), the way ``bench cache --graphs`` and ``bench presets --graphs`` train: the host's time per step
is then the replay call alone, timed without a synchronize (and the replays' wall time with one), so its extra
microseconds per save are what the cache costs the host in a graphed step.

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
    graphed = graphed_rows(model, x, y, saves) if device.type == "cuda" else []
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
            "graphed_rows": graphed,
        }
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


def graphed_rows(model, x, y, saves: int) -> list[dict]:
    """The forward and backward captured as a CUDA graph, plain and under the 4bit cache: per replay, the host's
    time in the replay call (no synchronize) and the wall time with one; the extra host microseconds per save."""
    from actzip.memory.cache import cache

    caches = {"plain, graphed": None, "4bit, graphed": cache("4bit", min_bytes=0, graph_safe=True)}

    def step(c) -> None:  # forward under the cache (entered once a step), backward
        with c if c is not None else contextlib.nullcontext():
            loss = model(x, y)[1]
        loss.backward()
        if c is not None:
            c.history.clear()

    graphs = {}
    for name, c in caches.items():
        side = torch.cuda.Stream(x.device)
        side.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(side):  # torch's warm-up before capture (roles tracked, kernels compiled)
            for _ in range(WARMUP):
                model.zero_grad(set_to_none=True)
                step(c)
        torch.cuda.current_stream(x.device).wait_stream(side)
        model.zero_grad(set_to_none=True)  # the gradients are then made in the graph's memory
        graphs[name] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[name]):
            step(c)
    host: dict[str, list[float]] = {k: [] for k in graphs}
    wall: dict[str, list[float]] = {k: [] for k in graphs}
    for _ in range(ROUNDS):  # interleaved
        for name, graph in graphs.items():
            for _ in range(WARMUP):
                graph.replay()
            torch.cuda.synchronize(x.device)
            t0 = time.perf_counter()
            for _ in range(FORWARDS):
                graph.replay()
            t1 = time.perf_counter()
            torch.cuda.synchronize(x.device)
            t2 = time.perf_counter()
            host[name].append((t1 - t0) / FORWARDS * 1e6)
            wall[name].append((t2 - t0) / FORWARDS * 1e6)
    base = sorted(host["plain, graphed"])[ROUNDS // 2]
    rows = []
    for name in graphs:
        h, w = sorted(host[name])[ROUNDS // 2], sorted(wall[name])[ROUNDS // 2]
        rows.append({"variant": name, "host_us_per_step": h, "host_us_rounds": host[name], "wall_us_per_step": w,
                     "wall_us_rounds": wall[name], "host_us_per_save": (h - base) / saves})
        print(f"{name:26s} host {h:7.1f} us per step (+{(h - base) / saves:5.2f} us per save), "
              f"wall {w:7.1f} us per step")
    return rows


if __name__ == "__main__":
    main()
