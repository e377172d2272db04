"""GRPO actor-update benchmark: tokens/s and peak of one policy update per strategy, and reward when trained.

The policy is a Llama-style model from a local config (``PRESETS``). Throughput runs on synthetic GRPO batches:
``prompts`` groups of ``group_size`` completions of ``completion_len`` tokens (lengths drawn below it), rewards
drawn 0/1 and turned into advantages per group as TRL does (a group whose rewards are all equal has zero
advantages), the loss TRL's own ``GRPOTrainer._compute_loss`` (``loss_type``). One actor update = forward and
backward of that loss (no optimizer step), interleaved across strategies, medians:

- ``none``: plain autograd;
- ``checkpoint``: transformers' gradient checkpointing of every layer (TRL's only memory option);
- ``compile``: the policy's forward under ``torch.compile`` with PyTorch's ``activation_memory_budget``, the
  largest of :data:`actzip_bench.grpo_compile.BUDGETS` whose peak is within checkpointing's (CUDA; elsewhere
  the first);
- ``lossless`` / ``8bit``: the whole update inside ``actzip.cache("lossless")`` / ``actzip.cache("conservative")``;
- ``offload``: the lossless cache with what it stores in pinned CPU memory (CUDA only; listed as skipped elsewhere);
- ``planner``: :class:`actzip.rl.PlannedGRPOMixin` with ``PlannerConfig(budget_bytes=...)``, the budget
  checkpointing's measured peak (CUDA; on the CPU, where no peak is read, half of what ``none`` keeps), and
  zero-advantage sequences left out; ``planner-no-drop``: the same plan with every sequence kept, which
  separates what the plan gains from what leaving sequences out gains (the record counts them:
  ``zero_advantage_rows``).

``reward_steps > 0`` also trains the policy that many GRPO steps per strategy and seed on the addition task
(:mod:`actzip_bench.data.arithmetic`) and records each step's mean reward per seed and the mean of the last half
(:mod:`actzip_bench.grpo_plots` draws the curves).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import warnings
from dataclasses import asdict, dataclass

import torch

from actzip.errors import ConfigError
from actzip_bench.model_rows import enable_hf_checkpointing

STRATEGIES = ("none", "checkpoint", "compile", "lossless", "8bit", "offload", "planner", "planner-no-drop")
PLANNED = ("planner", "planner-no-drop")
CACHE_PRESETS = {"lossless": {"preset": "lossless"}, "8bit": {"preset": "conservative"},
                 "offload": {"preset": "lossless", "offload": True}}
# Llama-style policies (transformers LlamaConfig fields). The throughput policy has a language model's vocabulary
# (its logits are a large part of a GRPO update's memory); trained policies the arithmetic tokenizer's 14 tokens.
PRESETS = {
    "tiny": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
    "small": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=16,
               num_key_value_heads=4, vocab_size=32000),
}


@dataclass
class GRPOBenchConfig:
    """One GRPO actor-update workload."""

    preset: str = "tiny"  # policy size (PRESETS)
    prompts: int = 4  # groups per update
    group_size: int = 8  # completions per prompt (TRL's num_generations)
    prompt_len: int = 16  # prompt tokens
    completion_len: int = 64  # longest completion; lengths drawn in [completion_len / 2, completion_len]
    loss_type: str = "dapo"  # TRL's loss
    dtype: str = "float32"  # policy weights and activations
    rounds: int = 5  # timed updates per strategy
    warmup: int = 1  # updates dropped first
    strategies: tuple[str, ...] = STRATEGIES
    reward_steps: int = 0  # GRPO training steps per strategy and seed (0: throughput only)
    reward_preset: str = "small"  # the trained policy's size (PRESETS; its vocabulary is the task's)
    reward_completion_len: int = 8  # longest completion when trained (an answer and its end token)
    task_digits: int = 1  # operand digits of the trained task's sums
    sft_steps: int = 100  # supervised steps on worked sums before GRPO: a policy right about half the time
    sft_lr: float = 1e-3  # AdamW learning rate of those steps
    grpo_lr: float = 1e-4  # learning rate of the GRPO steps (TRL's default, 1e-6, barely moves a small policy)
    seeds: int = 1  # training runs per strategy
    seed: int = 0  # synthetic batch and initialization
    # torch.compile backend of the compile row: "aot_eager_decomp_partition" partitions (and so applies
    # activation_memory_budget) as inductor does, without generating code: a quick check of the row's plumbing
    compile_backend: str = "inductor"

    def __post_init__(self) -> None:
        for name in ("preset", "reward_preset"):
            if getattr(self, name) not in PRESETS:
                raise ConfigError(f"grpo bench: unknown {name} {getattr(self, name)!r}; choose from {list(PRESETS)}")
        bad = [s for s in self.strategies if s not in STRATEGIES]
        if bad or "none" not in self.strategies:
            raise ConfigError(f"grpo bench: strategies must include 'none' and come from {list(STRATEGIES)}; got "
                              f"{list(self.strategies)}")

    @classmethod
    def quick(cls) -> "GRPOBenchConfig":
        """A CPU-sized run for CI: the tiny policy, short completions, two training steps."""
        return cls(preset="tiny", prompts=2, group_size=4, prompt_len=8, completion_len=16, rounds=2, warmup=1,
                   reward_steps=2, reward_preset="tiny", seeds=1, sft_steps=20)


def build_policy(preset: str, max_len: int, seed: int):
    import transformers

    from actzip_bench.data.arithmetic import char_tokenizer

    torch.manual_seed(seed)
    fields = {"vocab_size": len(char_tokenizer()), **PRESETS[preset]}
    cfg = transformers.LlamaConfig(max_position_embeddings=max_len, pad_token_id=0, eos_token_id=1, bos_token_id=1,
                                   hidden_act="relu2", **fields)
    return transformers.LlamaForCausalLM(cfg)


def vocab_size(preset: str) -> int:
    """The vocabulary of ``preset``'s policy (the arithmetic tokenizer's unless the preset names one)."""
    from actzip_bench.data.arithmetic import char_tokenizer

    return PRESETS[preset].get("vocab_size", len(char_tokenizer()))


def synthetic_batch(cfg: GRPOBenchConfig, device: torch.device) -> dict:
    """TRL's actor-update inputs: prompts, completions, masks, and per-group advantages of 0/1 rewards."""
    g = torch.Generator().manual_seed(cfg.seed)
    b = cfg.prompts * cfg.group_size
    lengths = torch.randint(cfg.completion_len // 2, cfg.completion_len + 1, (b,), generator=g)
    mask = (torch.arange(cfg.completion_len)[None, :] < lengths[:, None]).long()
    rewards = (torch.rand(b, generator=g) < 0.4).float().view(cfg.prompts, cfg.group_size)
    rewards[0] = 1.0  # one group solved by every completion: zero advantages, as GRPO batches have
    adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).view(-1)
    vocab = vocab_size(cfg.preset)
    batch = {"prompt_ids": torch.randint(2, vocab, (b, cfg.prompt_len), generator=g),
             "prompt_mask": torch.ones(b, cfg.prompt_len, dtype=torch.long),
             "completion_ids": torch.randint(2, vocab, (b, cfg.completion_len), generator=g), "completion_mask": mask,
             "advantages": adv, "num_items_in_batch": mask.sum().float()}
    return {k: v.to(device) for k, v in batch.items()}


def _trainer(strategy: str, model, cfg: GRPOBenchConfig, device: torch.device, budget: int | None, steps: int = 1,
             seed: int = 0, completion_len: int | None = None):
    import trl

    from actzip.memory.planner import PlannerConfig
    from actzip.rl import PlannedGRPOMixin
    from actzip_bench.data.arithmetic import addition_dataset, char_tokenizer, exact_sum_reward

    class Planned(PlannedGRPOMixin, trl.GRPOTrainer):
        pass

    class Cached(trl.GRPOTrainer):
        def _compute_loss(self, m, inputs):
            import actzip

            with actzip.cache(**CACHE_PRESETS[strategy]) if strategy in CACHE_PRESETS else contextlib.nullcontext():
                return super()._compute_loss(m, inputs)

    args = trl.GRPOConfig(
        output_dir="/tmp/actzip-bench-grpo", max_steps=steps, per_device_train_batch_size=cfg.group_size,
        num_generations=cfg.group_size, max_completion_length=completion_len or cfg.completion_len, report_to=[],
        save_strategy="no",
        loss_type=cfg.loss_type, use_cpu=device.type == "cpu", gradient_checkpointing=strategy == "checkpoint",
        bf16=cfg.dtype == "bfloat16", logging_steps=1, seed=seed, disable_tqdm=True, learning_rate=cfg.grpo_lr)
    kw = {}
    cls = Cached
    if strategy in PLANNED:
        cls, kw = Planned, {"actzip_planner": PlannerConfig(budget_bytes=budget, repeats=2),
                            "drop_zero_advantage": strategy == "planner"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prompts = addition_dataset(64, digits=cfg.task_digits, seed=seed)
        t = cls(model=model, reward_funcs=exact_sum_reward, args=args, train_dataset=prompts,
                processing_class=char_tokenizer(), **kw)
    import transformers

    t.remove_callback(transformers.PrinterCallback)  # the logs go to log_history, not the terminal
    t.current_gradient_accumulation_steps = 1
    return t


def supervised_warm_up(model, steps: int, seed: int, device: torch.device, lr: float = 1e-3, digits: int = 1) -> None:
    """Next-token training on worked sums ``"a+b=c<eos>"`` (AdamW, batch 64): a policy that can earn reward."""
    from actzip_bench.data.arithmetic import addition_dataset, char_tokenizer

    if steps <= 0:
        return
    tok = char_tokenizer()
    data = addition_dataset(64 * steps, digits=digits, seed=seed + 1000)
    texts = [p + a + tok.eos_token for p, a in zip(data["prompt"], data["answer"])]
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    tok.padding_side = "right"
    for i in range(steps):
        enc = tok(texts[i * 64:(i + 1) * 64], return_tensors="pt", padding=True).to(device)
        labels = enc.input_ids.masked_fill(enc.attention_mask == 0, -100)
        model(**enc, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def run_grpo(cfg: GRPOBenchConfig, device: torch.device, progress=None, log=None) -> dict:
    """Run the benchmark; ``progress(name)`` is told of every timed update, ``log(message)`` of every stage."""
    from actzip_bench.harness import machine_record, run_interleaved
    from actzip_bench.one_liner import shared_copy

    skipped = {}
    if device.type != "cuda" and "offload" in cfg.strategies:
        skipped["offload"] = "offload moves stored activations to pinned CPU memory: it needs a CUDA device"
        cfg = dataclasses.replace(cfg, strategies=tuple(s for s in cfg.strategies if s != "offload"))
    dtype = getattr(torch, cfg.dtype)
    model = build_policy(cfg.preset, cfg.prompt_len + cfg.completion_len + 8, cfg.seed).to(device, dtype).train()
    batch = synthetic_batch(cfg, device)
    tokens = int(batch["completion_mask"].sum())
    log = log or (lambda message: None)
    log(f"policy built; measuring checkpointing's peak for the planner's budget ({tokens} completion tokens)")
    budget = _planner_budget(cfg, model, batch, device)
    trainers = {}
    for s in cfg.strategies:
        m = model if s in ("none", *CACHE_PRESETS) else shared_copy(model)
        trainers[s] = _trainer(s, m, cfg, device, budget)
        if s == "checkpoint":
            enable_hf_checkpointing(m)

    def update(s: str) -> None:
        t = trainers[s]
        for p in model.parameters():
            p.grad = None
        t._compute_loss(t.model, dict(batch)).backward()

    import torch._functorch.config as functorch_config

    old_budget = functorch_config.activation_memory_budget
    try:
        compiled = None
        if "compile" in trainers:
            compiled = _compiled(trainers["compile"], cfg, batch, budget, device, log)
        for s in PLANNED:
            if s in trainers:
                log(f"{s}: profiling every option of every unit, then solving")
                try:
                    update(s)  # plans the policy (its probe steps untimed)
                except ConfigError as e:  # no plan fits the budget: the row says why, the others still run
                    skipped[s] = str(e)
                    del trainers[s]
        log(f"timing {', '.join(trainers)}: {cfg.warmup} + {cfg.rounds} interleaved rounds")
        results = run_interleaved({s: (lambda s=s: update(s)) for s in trainers}, device, rounds=cfg.rounds,
                                  warmup=cfg.warmup, progress=progress, above_resident=device.type == "cuda")
    finally:
        functorch_config.activation_memory_budget = old_budget
    runs = []
    for s, r in results.items():
        runs.append({"strategy": s, **r.summary(), "tokens": tokens, "tokens_per_s": tokens / (r.median_ms / 1e3),
                     "time_vs_none": r.median_ms / results["none"].median_ms,
                     **(_plan_fields(trainers[s]) if s in PLANNED else {"plan": None, "plan_checks": None}),
                     "compile_budgets": compiled.tried if s == "compile" else None,
                     "compile_budget": compiled.budget if s == "compile" else None})
    if cfg.reward_steps:
        _rewards(cfg, device, runs, log)
    return {"config": asdict(cfg), "runs": runs, "skipped": skipped, "planner_budget_bytes": budget,
            "zero_advantage_rows": int((batch["advantages"] == 0).sum()), "rows": int(batch["advantages"].numel()),
            "planner_timing": planner_timing(), "machine": machine_record(device)}


def _compiled(trainer, cfg, batch, limit: int | None, device: torch.device, log):
    """Compile the trainer's policy at the largest budget within ``limit`` (checkpointing's peak, CUDA)."""
    from actzip_bench.grpo_compile import compile_within

    def step(m) -> None:
        for p in m.parameters():
            p.grad = None
        trainer._compute_loss(m, dict(batch)).backward()

    kept = compile_within(trainer.model, step, limit if device.type == "cuda" else None, device, log=log,
                          backend=cfg.compile_backend)
    trainer.model = kept.model
    return kept


def planner_timing(units: int = 300, lookups: int = 1000) -> dict:
    """Seconds to solve a fresh plan for ``units`` units (synthetic costs of five options, two of them lossy) and
    milliseconds of a cached lookup (median of ``lookups``)."""
    import statistics
    import time

    from actzip.memory.planner import Plan, UnitCosts

    costs = [UnitCosts(f"u{i}", ("keep", "checkpoint", "lossless", "conservative", "balanced"),
                       (100.0 + i % 7, 10.0, 60.0, 40.0, 30.0), (0.0, 5.0, 1.0, 0.8, 0.5), (0.0, 0.0, 0.0, 0.01, 0.1),
                       (0.0, 100.0 + i % 7, 0.0, 0.0, 0.0))
             for i in range(units)]
    plan = Plan("synthetic", 1024, budget_bytes=units * 50.0, base_bytes=0.0, max_risk=0.5, units=costs)
    start = time.perf_counter()
    plan.options_for(1024)
    solve_s = time.perf_counter() - start
    times = []
    for _ in range(lookups):
        t0 = time.perf_counter()
        plan.options_for(1024)
        times.append(time.perf_counter() - t0)
    return {"units": units, "solve_s": solve_s, "lookup_ms": statistics.median(times) * 1e3}


def _planner_budget(cfg, model, batch, device) -> int:
    """Checkpointing's measured peak (CUDA), else half of what plain autograd keeps (CPU: bytes only)."""
    from actzip.memory.cache import CacheContext
    from actzip_bench.one_liner import shared_copy

    if device.type == "cuda":
        twin = shared_copy(model)
        enable_hf_checkpointing(twin)
        t = _trainer("checkpoint", twin, cfg, device, None)
        for _ in range(2):  # the second update's: the first also allocates the libraries' workspaces
            for p in model.parameters():
                p.grad = None
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            t._compute_loss(twin, dict(batch)).backward()
            torch.cuda.synchronize(device)
        for p in model.parameters():
            p.grad = None
        return int(torch.cuda.max_memory_allocated(device) - before)
    t = _trainer("none", model, cfg, device, None)
    counter = CacheContext.count_only()
    with counter:
        loss = t._compute_loss(model, dict(batch))
    del loss
    return max(int(counter.last.bytes_before) // 2, 1)


def _plan_fields(trainer) -> dict:
    """The plan's table and its peak checks ([predicted, measured] per probe step that checked it, CUDA)."""
    from actzip.memory.planner import plan_of

    try:
        plan = plan_of(trainer.model)
    except ConfigError:
        return {"plan": None, "plan_checks": None}
    return {"plan": plan.table(), "plan_checks": plan.checks}


def _rewards(cfg, device, runs, log) -> None:
    """Train ``reward_steps`` GRPO steps per strategy and seed; record the mean reward of the last half."""
    rcfg = dataclasses.replace(cfg, preset=cfg.reward_preset, completion_len=cfg.reward_completion_len)
    reward_budget = None
    if any(row["strategy"] in PLANNED for row in runs):  # the trained policy's own checkpointing peak
        probe = build_policy(rcfg.preset, rcfg.prompt_len + rcfg.completion_len + 8, cfg.seed).to(device).train()
        reward_budget = _planner_budget(rcfg, probe, synthetic_batch(rcfg, device), device)
        del probe
    trained = []
    for row in runs:
        if row["strategy"] == "compile":  # generation under compile recompiles per length; its gradients are none's
            row["reward_skipped"] = "not trained: compiled recomputation computes plain autograd's update"
        else:
            row["reward_per_seed"], row["reward_curves"] = [], []
            trained.append(row)
    for seed in range(cfg.seeds):
        # one supervised warm-up per seed, copied for every strategy: each starts GRPO from the same policy
        log(f"seed {seed + 1} of {cfg.seeds}: {cfg.sft_steps} supervised steps")
        warmed = build_policy(cfg.reward_preset, cfg.prompt_len + cfg.reward_completion_len + 8,
                              cfg.seed + seed).to(device)
        supervised_warm_up(warmed.train(), cfg.sft_steps, cfg.seed + seed, device, cfg.sft_lr, cfg.task_digits)
        for row in trained:
            s = row["strategy"]
            log(f"seed {seed + 1} of {cfg.seeds}: {s}, {cfg.reward_steps} GRPO steps")
            model = copy.deepcopy(warmed)
            if s == "checkpoint":
                enable_hf_checkpointing(model)
            t = _trainer(s, model, cfg, device, reward_budget, steps=cfg.reward_steps, seed=seed,
                         completion_len=cfg.reward_completion_len)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t.train()
            rewards = [h["reward"] for h in t.state.log_history if "reward" in h]
            row["reward_curves"].append(rewards)
            tail = rewards[len(rewards) // 2:] or rewards
            row["reward_per_seed"].append(sum(tail) / len(tail) if tail else float("nan"))
    for row in trained:
        row["reward"] = sum(row["reward_per_seed"]) / len(row["reward_per_seed"])
