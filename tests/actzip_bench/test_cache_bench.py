import dataclasses
import json
import math

import pytest
import torch

from actzip_bench.cache import KNOWN_STRATEGIES, MODELS, STRATEGIES, CacheBenchConfig
from actzip_bench.report import build
from actzip_bench.cli import main
from actzip.errors import ConfigError

pytest.importorskip("transformers")

RUN_FIELDS = {"strategy", "bytes_dense", "bytes_saved", "head_bytes", "x_smaller", "x_smaller_without_head", "by_rule",
              "grad_rel_error", "grad_cosine", "median_ms", "rounds", "peak_bytes", "peak_vs_none", "time_vs_none",
              "last_loss", "probe_loss"}
MODEL_FIELDS = {"model", "params", "vocab_size", "seq_len", "batch_size", "tokens_per_step", "resident_bytes", "runs"}


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """The --quick run on the CPU, through the command line (one thread: the machine may be shared)."""
    tmp = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("ACTZIP_CACHE_DIR", str(tmp))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = tmp / "results" / "cpu" / "cache.json"
        assert main(["bench", "cache", "--quick", "--device", "cpu", "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
        mp.undo()
    return tmp, json.loads(out.read_text())


def _runs(rec, model):
    m = next(m for m in rec["models"] if m["model"] == model)
    return {r["strategy"]: r for r in m["runs"]}


def test_quick_record_has_every_model_strategy_and_field(quick):
    _, rec = quick
    assert rec["config"]["gpt_preset"] == "tiny" and rec["config"]["min_bytes"] == 0 and rec["config"]["loss_chunk"] == 128
    assert {"config", "strategies", "models", "targets", "machine", "command", "kernel_fallbacks"} <= rec.keys()
    assert [m["model"] for m in rec["models"]] == list(MODELS)
    for m in rec["models"]:
        assert MODEL_FIELDS <= m.keys()
        assert [r["strategy"] for r in m["runs"]] == list(STRATEGIES)
        for r in m["runs"]:
            assert RUN_FIELDS <= r.keys(), r["strategy"]
            assert r["peak_bytes"] is None  # CPU: no peak
            assert r["head_bytes"] == 0 and r["x_smaller_without_head"] == r["x_smaller"]  # chunked loss: no logits kept
            assert math.isfinite(r["last_loss"]) and 0 < r["last_loss"] < 10


@pytest.mark.parametrize("model", MODELS)
def test_each_strategy_reduces_bytes_where_it_should(quick, model):
    _, rec = quick
    runs = _runs(rec, model)
    none = runs["none"]["bytes_saved"]
    assert runs["none"]["x_smaller"] == 1.0 and runs["none"]["grad_rel_error"] == 0.0
    # Exact strategies: identical gradients (CPU kernels are deterministic).
    for s in ("checkpoint", "sparse"):
        assert runs[s]["grad_rel_error"] == 0.0 and runs[s]["grad_bit_identical"] is True, s
    assert runs["balanced"]["grad_bit_identical"] is False  # lossy: the flag is measured, not assumed
    assert runs["checkpoint"]["bytes_saved"] < none / 2
    if model == "gpt-relu2":
        assert runs["sparse"]["bytes_saved"] < 0.9 * none  # relu outputs are about half zeros
    else:
        assert runs["sparse"]["bytes_saved"] == none  # nothing is mostly zero
    # Lossy: fewer bits, fewer bytes, larger gradient error.
    order = ["none", "conservative", "balanced", "aggressive"]
    assert all(runs[a]["bytes_saved"] > runs[b]["bytes_saved"] for a, b in zip(order, order[1:]))
    # every float activation at 4 bits + 64 bits of group parameters per 128 (4.5 of 16): 3.56x at most; 2bit
    # takes linear inputs further, to 2.5 bits
    assert runs["2bit"]["bytes_saved"] < runs["4bit"]["bytes_saved"] and runs["4bit"]["x_smaller"] > 3.4
    assert runs["2bit"]["bytes_saved"] < runs["aggressive"]["bytes_saved"]
    assert 0 < runs["conservative"]["grad_rel_error"] < runs["balanced"]["grad_rel_error"] < runs["aggressive"]["grad_rel_error"] < 1
    # What each quantized rule stores: bits + 64 bits of group parameters per 128 elements, of 16-bit tensors.
    for s, rule, bits in (("balanced", "linear_input:quant4", 4), ("2bit", "linear_input:quant2", 2),
                          ("4bit", "attention:quant4", 4), ("2bit", "attention:quant4", 4)):
        st = runs[s]["by_rule"][rule]
        assert st["stored_bytes"] <= st["dense_bytes"] * (bits + 0.5) / 16 + 64, (s, rule)
    # The sketch keeps in_features/8 columns of each linear input (the output head excluded).
    sk = runs["sketch-d8"]
    assert sk["by_rule"]["sketch"]["stored_bytes"] * 8 == sk["by_rule"]["sketch"]["dense_bytes"]
    assert sk["bytes_saved"] < none and 0 < sk["grad_rel_error"] < 5 and sk["grad_cosine"] > 0


def test_targets_and_report(quick):
    root, rec = quick
    keys = {t["target"] for t in rec["targets"]}
    assert keys == {"cache_4bit_x", "peak_4bit_llama", "time_4bit", "peak_sketch", "cache_2bit_x"}
    for t in rec["targets"]:
        assert t["line"] and t["model"] in MODELS
        if t["target"] in ("peak_4bit_llama", "time_4bit", "peak_sketch"):
            assert t["met"] is None  # not measured on a CPU
    x4 = next(t for t in rec["targets"] if t["target"] == "cache_4bit_x" and t["model"] == "llama-swiglu"
              and t["strategy"] == "balanced")
    assert x4["value"] == _runs(rec, "llama-swiglu")["balanced"]["x_smaller"] and x4["met"] is False
    text = build(root)
    assert "## Activation cache: bytes, peak memory and step time per strategy (tiny size, vocabulary 256)" in text
    assert "### llama-swiglu:" in text and "| 4bit |" in text and "`sketch-d8`:" in text
    assert x4["line"] in text


def test_full_loss_head_reported_apart(tmp_path, monkeypatch):
    from actzip_bench.cache import run_cache, with_quick

    monkeypatch.setenv("ACTZIP_CACHE_DIR", str(tmp_path))
    cfg = with_quick(CacheBenchConfig(models=("llama-swiglu", "gpt-gelu"), strategies=("none", "balanced")))
    rec = run_cache(dataclasses.replace(cfg, loss_chunk=0, rounds=1, warmup=0), torch.device("cpu"))
    for m in rec["models"]:
        runs = {r["strategy"]: r for r in m["runs"]}
        head = m["tokens_per_step"] * m["vocab_size"] * 4  # float32 log-softmax, kept by every strategy
        assert runs["none"]["head_bytes"] == runs["balanced"]["head_bytes"] == head
        b = runs["balanced"]
        assert b["x_smaller_without_head"] == pytest.approx((runs["none"]["bytes_saved"] - head) / (b["bytes_saved"] - head))
        assert b["x_smaller_without_head"] > b["x_smaller"] > 1


def test_config_errors(capsys):
    with pytest.raises(ConfigError, match="unknown strategies"):
        CacheBenchConfig(strategies=("none", "3bit"))
    with pytest.raises(ConfigError, match="must include 'none'"):
        CacheBenchConfig(strategies=("balanced",))
    with pytest.raises(ConfigError, match="unknown or no models"):
        CacheBenchConfig(models=("gpt-swish",))
    with pytest.raises(ConfigError, match="vocab_size"):
        CacheBenchConfig(vocab_size=100)
    assert "lossless" in KNOWN_STRATEGIES and "lossless" not in STRATEGIES  # the same rules as "sparse"
    assert main(["bench", "cache", "--quick", "--strategies", "none,5bit", "--device", "cpu"]) == 2
    assert "unknown strategies" in capsys.readouterr().err


def test_norm_rebuilding_strategies_free_the_llama_norms_outputs_and_leave_the_model_as_it_was():
    from actzip.memory.modules.rms_norm import ExactRMSNorm
    from actzip_bench.cache import run_model, with_quick
    from actzip_bench.data import Corpus

    cfg = with_quick(CacheBenchConfig(models=("llama-swiglu",),
                                      strategies=("none", "4bit", "4bit+norms", "sketch-d8", "sketch-d8+norms")))
    cfg = dataclasses.replace(cfg, rounds=1, warmup=0)
    built = []
    import actzip_bench.cache as bench

    real_build = bench.build_model
    hooks = lambda module: [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in module.modules()]  # noqa: E731

    def bench_build(*args, **kwargs):
        model = real_build(*args, **kwargs)
        built.append((model, hooks(model.module)))
        return model

    try:
        bench.build_model = bench_build
        rec = run_model("llama-swiglu", cfg, torch.device("cpu"), Corpus.from_stdlib(max_bytes=cfg.corpus_bytes))
    finally:
        bench.build_model = real_build
    saved = {r["strategy"]: r["bytes_saved"] for r in rec["runs"]}
    assert saved["4bit+norms"] < saved["4bit"] and saved["sketch-d8+norms"] < saved["sketch-d8"]
    model, hooks_at_build = built[0]
    assert not any(isinstance(m, ExactRMSNorm) for m in model.module.modules())  # undone after every step
    assert hooks(model.module) == hooks_at_build


def test_derivative_strategies_keep_less_where_an_activation_takes_them_and_leave_the_model_as_it_was():
    from actzip.memory.modules import DerivativeActivation
    from actzip_bench.cache import run_model, with_quick
    from actzip_bench.cache_config import base_strategy, not_graphed
    from actzip_bench.data import Corpus

    assert base_strategy("2bit+norms+derivatives") == "2bit" and base_strategy("2bit+derivatives") == "2bit"
    assert "activations are swapped in" in not_graphed("2bit+derivatives")
    corpus = None
    for model_name, fewer in (("gpt-gelu", True), ("gpt-relu2", False)):  # ReLU²: nothing to take, its base's step
        cfg = with_quick(CacheBenchConfig(models=(model_name,), strategies=("none", "2bit", "2bit+norms",
                                                                              "2bit+derivatives",
                                                                              "2bit+norms+derivatives")))
        cfg = dataclasses.replace(cfg, rounds=1, warmup=0)
        corpus = corpus or Corpus.from_stdlib(max_bytes=cfg.corpus_bytes)
        import actzip_bench.cache as bench

        built, real_build = [], bench.build_model
        try:
            bench.build_model = lambda *a, **k: built.append(real_build(*a, **k)) or built[-1]
            rec = run_model(model_name, cfg, torch.device("cpu"), corpus)
        finally:
            bench.build_model = real_build
        saved = {r["strategy"]: r["bytes_saved"] for r in rec["runs"]}
        if fewer:
            assert saved["2bit+derivatives"] < saved["2bit"] and saved["2bit+norms+derivatives"] < saved["2bit+norms"]
        else:
            assert saved["2bit+derivatives"] == saved["2bit"]
        assert not any(isinstance(m, DerivativeActivation) for m in built[0].module.modules())  # undone after


def test_the_cudagraphs_mode_compiles_with_reduce_overhead_and_marks_each_step(monkeypatch):
    """compile="inductor-cudagraphs": inductor with mode="reduce-overhead", and every step of a strategy first
    tells the CUDA graph trees that the step before's outputs are no longer read (the loss it returns is a copy)."""
    import torch

    from actzip_bench.cache import compiled_model
    from actzip_bench.cache_models import adamw, build_model
    from actzip_bench.cache_strategies import Strategy
    from actzip_bench.cache_config import QUICK

    with pytest.raises(ConfigError, match="compile must be one of"):
        CacheBenchConfig(compile="cudagraphs")
    cfg = CacheBenchConfig(**{**QUICK, "models": ("gpt-gelu",), "strategies": ("none", "4bit"),
                              "compile": "inductor-cudagraphs"})
    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: (seen.append(kw), fn)[1])
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    model = compiled_model(build_model("gpt-gelu", cfg, torch.device("cpu")), cfg.compile)
    assert seen == [{"backend": "inductor", "mode": "reduce-overhead"}]
    opt = adamw(model.module, cfg.lr)
    x = torch.randint(0, 256, (2, cfg.seq_len))
    s = Strategy("4bit", cfg, model, None, None)
    with s:
        loss = s.train_step(opt, x, x)
    assert marks == [1] and loss.dim() == 0 and not loss.requires_grad
    eager = Strategy("4bit", CacheBenchConfig(**{**QUICK, "models": ("gpt-gelu",)}), model, None, None)
    with eager:
        eager.train_step(opt, x, x)
    assert marks == [1]  # only the graphed mode marks its steps


def test_the_fused_compiled_codec_is_an_option_of_the_compiled_bench_only():
    import torch

    from actzip_bench.cache_config import QUICK
    from actzip_bench.cache_models import build_model
    from actzip_bench.cache_strategies import Strategy

    with pytest.raises(ConfigError, match="fuse_compiled needs compile"):
        CacheBenchConfig(fuse_compiled=True)
    cfg = CacheBenchConfig(**{**QUICK, "models": ("gpt-gelu",), "compile": "aot_eager", "fuse_compiled": True})
    s = Strategy("4bit", cfg, build_model("gpt-gelu", cfg, torch.device("cpu")), None, None)
    assert s.cache.config.fuse_compiled


def test_graphs_take_the_strategies_a_graph_can_replay_and_need_a_gpu():
    import torch

    from actzip_bench.cache import run_model
    from actzip_bench.cache_config import QUICK
    from actzip_bench.data import Corpus

    from actzip_bench.cache_models import build_model
    from actzip_bench.cache_strategies import Strategy

    for bad, why in (({"strategies": ("none", "sketch-d8")}, "sketch-d8: the sketch draws its signs on the host"),
                     ({"strategies": ("none", "4bit+norms")}, "4bit\\+norms: its norms are swapped in"),
                     ({"compile": "inductor"}, "compile='inductor'")):
        with pytest.raises(ConfigError, match=f"graphs runs eager steps.*{why}"):
            CacheBenchConfig(graphs=True, **bad)
    cfg = CacheBenchConfig(**{**QUICK, "models": ("gpt-gelu",), "strategies": ("none", "4bit", "sparse"),
                              "graphs": True})
    model = build_model("gpt-gelu", cfg, torch.device("cpu"))
    with pytest.raises(ConfigError, match="graph_safe=True, but rule 'sparse'"):  # the cache's own refusal
        Strategy("sparse", cfg, model, None, None)
    cfg = CacheBenchConfig(**{**QUICK, "models": ("gpt-gelu",), "strategies": ("none", "4bit"), "graphs": True})
    with pytest.raises(ConfigError, match="graphs capture CUDA graphs"):  # a CPU device, whatever the machine has
        run_model("gpt-gelu", cfg, torch.device("cpu"), Corpus.from_stdlib(max_bytes=cfg.corpus_bytes))


@pytest.mark.cuda
def test_graphed_steps_replay_every_strategy_with_the_eager_probes_bytes():
    import torch

    from actzip_bench.cache import run_model
    from actzip_bench.cache_config import QUICK
    from actzip_bench.data import Corpus

    cfg = CacheBenchConfig(**{**QUICK, "models": ("gpt-gelu",), "strategies": ("none", "4bit", "2bit", "checkpoint"),
                              "graphs": True})
    rec = run_model("gpt-gelu", cfg, torch.device("cuda"), Corpus.from_stdlib(max_bytes=cfg.corpus_bytes))
    runs = {r["strategy"]: r for r in rec["runs"]}
    assert runs["4bit"]["x_smaller"] > 3 and runs["4bit"]["peak_vs_none"] is None
    assert all(math.isfinite(r["last_loss"]) and r["median_ms"] > 0 for r in runs.values())
    assert rec["replays_consistent"]  # every graph trains the shared weights as its eager step would


def test_a_graphed_loss_far_from_the_plain_steps_marks_the_record():
    from actzip_bench.cache import replays_consistent

    runs = [{"strategy": "none", "last_loss": 2.9}, {"strategy": "4bit", "last_loss": 2.85}]
    assert replays_consistent("gpt-gelu", runs)
    for bad in (1e-42, -0.004, float("nan")):
        with pytest.warns(RuntimeWarning, match="4bit .*far from none's loss"):
            assert not replays_consistent("gpt-gelu", [runs[0], {"strategy": "4bit", "last_loss": bad}])
