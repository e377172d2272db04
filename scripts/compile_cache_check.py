"""CUDA check of the activation cache under torch.compile (inductor): each preset's ratio over the compiled
count-only step, the lossless preset bit-identical to the compiled step without a cache, and no host
synchronization in a compiled 4bit, 2bit and conservative training step. Usage: python scripts/compile_cache_check.py OUT.json"""
import json, os, sys, time, warnings
import torch
warnings.simplefilter("ignore", RuntimeWarning)
import actzip
from actzip.memory.cache import graph_hooks
from actzip_bench.models import GPT, GPTConfig

out = {"torch": torch.__version__, "inlining": graph_hooks.inlining_available()}
dev = torch.device("cuda")
torch.manual_seed(0)
cfg = GPTConfig.of_size("tiny", activation="gelu")
model = GPT(cfg).to(dev).to(torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
idx = torch.randint(0, 256, (8, cfg.block_size), device=dev)
tgt = torch.randint(0, 256, (8, cfg.block_size), device=dev)
cm = torch.compile(model)

def step(cache=None, optimize=False):
    model.zero_grad(set_to_none=True)
    ctx = cache if cache is not None else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
    with ctx:
        _, loss = cm(idx, tgt)
    loss.backward()
    if optimize:
        opt.step()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

torch.use_deterministic_algorithms(True)
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
g0 = step(); g0b = step()
out["compiled_none_repeatable"] = all(torch.equal(g0[n], g0b[n]) for n in g0)
counter = actzip.memory.cache.CacheContext.count_only()
step(counter)
before = counter.last.bytes_before
res = {}
for preset in ["lossless", "conservative", "balanced", "4bit", "2bit"]:
    c = actzip.cache(preset, min_bytes=0)
    g1 = step(c)
    a = c.last
    res[preset] = {"ratio": before / a.bytes_after, "compiled_saves": a.compiled_saves,
                   "uncompressed_compiled": a.uncompressed_compiled,
                   "bit_identical": all(torch.equal(g0[n], g1[n]) for n in g0),
                   "grad_rel_error": float(sum(((g1[n].float() - g0[n].float()) ** 2).sum() for n in g0).sqrt()
                                           / sum((g0[n].float() ** 2).sum() for n in g0).sqrt()),
                   "by_rule": {k: vars(v) for k, v in a.by_rule.items()}}
torch.use_deterministic_algorithms(False)
out["presets"] = res
# no host synchronization in a compiled 4bit / 2bit training step after warm-up
sync = {}
for preset in ["4bit", "2bit", "conservative"]:
    c = actzip.cache(preset)
    for _ in range(3):
        step(c, optimize=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step(c, optimize=True)
        sync[preset] = "no sync"
    except RuntimeError as e:
        sync[preset] = f"sync: {str(e)[:200]}"
    finally:
        torch.cuda.set_sync_debug_mode(0)
out["sync_free"] = sync
print(json.dumps(out, indent=1, default=str)[:6000])
json.dump(out, open(sys.argv[1], "w"), indent=1, default=str)
