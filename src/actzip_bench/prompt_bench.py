"""``actzip bench prompt``: does one activation vector stand in for a whole instruction prompt?

Protocol, per seed: train (or load) the reference model with that seed; draw tasks of each evaluation split of
the instruction suite; for each task, ``n_fit`` fit examples and ``n_test`` disjoint test queries; run every
method of :mod:`actzip_bench.prompt_methods` on them. The vector's layers are fixed before any result is seen
(``extract_layer = n_layer // 2``, ``inject_layer = 1`` unless set); the (L_e, L_i) sweep runs on the first seed's
``sweep_tasks`` tasks of each split and is reported beside the main rows, not used to pick them. The probes read
the first seed's fitted vectors: task identity by leave-one-out nearest centroid over families, and whether the
vector's answers are the prompt's own label words on the bijection tasks.
"""

from __future__ import annotations

import pathlib
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import torch
import torch.nn.functional as F

from actzip.errors import ConfigError, DataError
from actzip_bench.data.instructions import InstructionSuite, InstructionSuiteConfig, prompt_ids
from actzip.prompt import PromptVector, PromptVectorConfig
from actzip_bench.data.instructions import answer_ids, query_ids
from actzip_bench.prompt_methods import METHODS, SLOT_BYTE, FitSettings, evaluate_tasks
from actzip_bench.prompt_model import (QUICK_MODEL, PromptModelConfig, load_reference_model, save_reference_model,
                                       train_reference_model)

__all__ = ["EVAL_SPLITS", "PromptBenchConfig", "costs", "prefill_cost", "quick_config", "run_prompt_bench",
           "summarize"]

EVAL_SPLITS = ("train", "heldout_paraphrase", "heldout_labels", "heldout_family")
HELD_OUT = EVAL_SPLITS[1:]


@dataclass
class PromptBenchConfig:
    """One benchmark run."""

    model: PromptModelConfig = field(default_factory=PromptModelConfig)  # the reference model
    fit: FitSettings = field(default_factory=FitSettings)  # layers of the vector; steps and lr of every fit
    seeds: tuple[int, ...] = (0, 1, 2)  # a model, its tasks and its fits per seed
    per_family: int = 1  # tasks drawn per family and split, at least
    min_tasks: int = 20  # per split: more tasks per family where a split has few families
    n_fit: int = 16  # fit examples per task
    n_test: int = 24  # test queries per task
    methods: tuple[str, ...] = METHODS
    splits: tuple[str, ...] = EVAL_SPLITS
    sweep_extract: tuple[int, ...] = ()  # L_e values of the sweep (empty: quarters of the depth)
    sweep_inject: tuple[int, ...] = (0, 1, 2)  # L_i values of the sweep
    sweep_tasks: int = 8  # tasks per held-out split in the sweep (first seed only; 0: no sweep)
    # only the sweep, on the first seed's model in model_dir (waited for while another process trains it), so
    # that the sweep can run beside the main protocol
    sweep_only: bool = False
    model_dir: str | None = None  # where reference models are saved / loaded (one file per seed)
    device: str = "auto"

    def __post_init__(self) -> None:
        unknown = set(self.methods) - set(METHODS)
        if unknown:
            raise ConfigError(f"bench prompt: unknown methods {sorted(unknown)}; known: {list(METHODS)}")
        bad = set(self.splits) - set(EVAL_SPLITS)
        if bad:
            raise ConfigError(f"bench prompt: unknown splits {sorted(bad)}; known: {list(EVAL_SPLITS)}")
        if not self.seeds:
            raise ConfigError("bench prompt: seeds is empty")
        if self.sweep_only and not self.model_dir:
            raise ConfigError("bench prompt: sweep_only reads the first seed's model from model_dir; set model_dir")
        if self.n_fit < 1 or self.n_test < 1 or self.per_family < 1:
            raise ConfigError("bench prompt: n_fit, n_test and per_family must be >= 1")
        n = self.model.n_layer
        for name, value, top in (("extract_layer", self.fit.extract_layer, n),
                                 ("inject_layer", self.fit.inject_layer, n - 1)):
            if not 0 <= value <= top:
                raise ConfigError(f"bench prompt: {name} {value} is outside [0, {top}] for a {n}-block model")


def quick_config(**overrides) -> PromptBenchConfig:
    """What ``--quick`` runs: a small model trained on the CPU, one seed, the held-out splits only, fewer tasks
    and queries, a 2 x 2 sweep."""
    base = PromptBenchConfig(model=QUICK_MODEL, fit=FitSettings(steps=60, extract_layer=2, inject_layer=1),
                             seeds=(0,), splits=HELD_OUT, per_family=1, min_tasks=0, n_fit=8, n_test=8, sweep_extract=(2, 4),
                             sweep_inject=(0, 1), sweep_tasks=2)
    return replace(base, **overrides)


def prefill_cost(cfg: PromptModelConfig, positions: float) -> dict:
    """Per-query prefill FLOPs (matmuls; causal attention counted half) and KV-cache bytes (bf16) at a length."""
    d, n = cfg.n_embd, cfg.n_layer
    dense = 2 * positions * 12 * n * d * d  # q, k, v, out (4 d^2) and a 4x MLP (8 d^2), two FLOPs a MAC
    attention = 2 * n * positions * positions * d  # QK^T and AV, causal half of 2 * T^2 * d each
    return {"flops": dense + attention, "kv_bytes": 2 * n * positions * d * 2}


def _tasks(suite: InstructionSuite, split: str, per_family: int, seed: int, min_tasks: int = 0):
    families = len(suite.families(split))
    return suite.tasks(split, max(per_family, -(-min_tasks // families)), seed)


def _model_for_seed(cfg: PromptBenchConfig, suite_cfg, seed, device, progress):
    path = pathlib.Path(cfg.model_dir, f"reference-seed{seed}.pt") if cfg.model_dir else None
    if path is not None and path.is_file():
        model, mcfg, scfg, log = load_reference_model(path, device)
        if mcfg != cfg.model or scfg != suite_cfg:
            raise ConfigError(f"bench prompt: {path} was trained with another model or suite config; remove it "
                              "or pick another --model-dir")
        return model, {**log, "loaded_from": str(path)}
    model, log = train_reference_model(cfg.model, suite_cfg, seed, device,
                                       progress=lambda s, loss: progress(f"seed {seed}: training step {s}, "
                                                                         f"answer loss {loss:.3f}"))
    if path is not None:
        save_reference_model(path, model, cfg.model, suite_cfg, log)
    return model, log


def _wait_for_model(cfg: PromptBenchConfig, suite_cfg, seed: int, device, progress, timeout_s: float = 900.0):
    path = pathlib.Path(cfg.model_dir, f"reference-seed{seed}.pt")
    start = time.monotonic()
    while not path.is_file():
        if time.monotonic() - start > timeout_s:
            raise DataError(f"bench prompt --sweep-only: {path} did not appear within {timeout_s:.0f} s")
        progress(f"waiting for {path}")
        time.sleep(5)
    return _model_for_seed(cfg, suite_cfg, seed, device, progress)


def _sweep(model, suite, cfg: PromptBenchConfig, seed: int, progress,
           checkpoint: Callable[[list[dict]], None] | None = None) -> list[dict]:
    n = cfg.model.n_layer
    extract = cfg.sweep_extract or tuple(sorted({max(1, n // 4), n // 2, (3 * n) // 4, n}))
    rows = []
    for split in HELD_OUT:
        if split not in cfg.splits:
            continue
        tasks = _tasks(suite, split, 1, seed + 1000)[: cfg.sweep_tasks]
        pairs = [suite.split_examples(t, cfg.n_fit, cfg.n_test, seed) for t in tasks]
        for le in extract:
            for li in cfg.sweep_inject:
                if li >= n:
                    continue
                settings = replace(cfg.fit, extract_layer=le, inject_layer=li)
                results = evaluate_tasks(model, tasks, [f for f, _ in pairs], [t for _, t in pairs], ("vector",),
                                         settings)["vector"]
                rows += [{"split": split, "task": t.family, "extract_layer": le, "inject_layer": li,
                          "accuracy": r.accuracy} for t, r in zip(tasks, results)]
                progress(f"seed {seed}: sweep {split} L_e={le} L_i={li}")
                if checkpoint is not None:
                    checkpoint(rows)
    return rows


def _single_fit_seconds(model, task, fit, settings: FitSettings) -> float:
    """One vector fitted alone (not batched with others): what a user fitting one prompt waits."""
    pv = PromptVector(model, PromptVectorConfig(extract_layer=settings.extract_layer,
                                                inject_layer=settings.inject_layer, steps=settings.steps,
                                                lr=settings.lr, slot_token_id=SLOT_BYTE))
    pv.fit(prompt_ids(task), [(query_ids(q), answer_ids(a)) for q, a in fit])
    return pv.fit_seconds


def _probe(vectors: list[tuple[str, torch.Tensor]], bijection: list[dict]) -> dict:
    """Task identity from the vectors (leave-one-out nearest centroid, cosine) and label words on bijections."""
    fams = [f for f, _ in vectors]
    keep = [i for i, f in enumerate(fams) if fams.count(f) >= 2]
    hits = 0
    for i in keep:
        cents = {}
        for j in keep:
            if j != i:
                cents.setdefault(fams[j], []).append(vectors[j][1])
        names = [k for k, v in cents.items() if v]
        c = torch.stack([F.normalize(torch.stack(cents[k]).mean(0), dim=0) for k in names])
        guess = names[int((c @ F.normalize(vectors[i][1], dim=0)).argmax())]
        hits += guess == fams[i]
    n_fam = len({fams[i] for i in keep})
    out = {"task_identity_accuracy": hits / len(keep) if keep else None, "task_identity_vectors": len(keep),
           "task_identity_chance": 1 / n_fam if n_fam else None}
    if bijection:
        answered = sum(r["answers_in_labels"] for r in bijection) / sum(r["n"] for r in bijection)
        out.update({"bijection_answers_in_prompt_labels": answered,
                    "bijection_accuracy": statistics.mean(r["accuracy"] for r in bijection),
                    "bijection_tasks": len(bijection)})
    return out


def run_prompt_bench(cfg: PromptBenchConfig, progress: Callable[[str], None] = lambda s: None,
                     checkpoint: Callable[[dict], None] | None = None) -> dict:
    """Run the protocol above; returns the record (rows, summary, sweep, probe, costs, training logs).

    ``checkpoint(partial_record)`` is called after every task, so that a run cut short keeps its rows.
    """
    device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if cfg.device == "auto" else cfg.device))
    suite_cfg = InstructionSuiteConfig()
    suite = InstructionSuite(suite_cfg)
    if cfg.sweep_only:
        model, log = _wait_for_model(cfg, suite_cfg, cfg.seeds[0], device, progress)
        head = {"config": _config_dict(cfg), "rows": [], "training": [log], "summary": {}, "cost": {}, "probe": {}}
        keep = None if checkpoint is None else (lambda done: checkpoint({**head, "sweep": done}))
        return {**head, "sweep": _sweep(model, suite, cfg, cfg.seeds[0], progress, keep)}
    rows, training, sweep, probe_vectors, bijection, single = [], [], [], [], [], []
    for seed in cfg.seeds:
        model, log = _model_for_seed(cfg, suite_cfg, seed, device, progress)
        training.append(log)
        for split in cfg.splits:
            tasks = _tasks(suite, split, cfg.per_family, seed, cfg.min_tasks)
            pairs = [suite.split_examples(t, cfg.n_fit, cfg.n_test, seed * 7919 + i) for i, t in enumerate(tasks)]
            fits, tests = [f for f, _ in pairs], [t for _, t in pairs]
            results = evaluate_tasks(model, tasks, fits, tests, cfg.methods, cfg.fit)
            for method, per_task in results.items():
                for t_index, (task, res) in enumerate(zip(tasks, per_task)):
                    rows.append({"seed": seed, "split": split, "task": task.family, "kind": task.kind,
                                 "instance": t_index, "method": method, "accuracy": res.accuracy,
                                 "prompt_positions": res.prompt_positions, "prompt_bytes": len(prompt_ids(task)),
                                 "fit_seconds": res.fit_seconds,
                                 **{k: v for k, v in res.detail.items() if k != "vector"}})
                    if seed == cfg.seeds[0] and method == "vector":
                        probe_vectors.append((task.family, res.detail["vector"]))
                        if task.kind == "bijection":
                            labels = set(task.labels)
                            bijection.append({"n": len(tests[t_index]), "accuracy": res.accuracy,
                                              "answers_in_labels": sum(a in labels for a in res.answers)})
            if "vector" in cfg.methods:
                single.append({"seed": seed, "split": split,
                               "seconds": _single_fit_seconds(model, tasks[0], fits[0], cfg.fit)})
            progress(f"seed {seed}: {split} done ({len(tasks)} tasks)")
            if checkpoint is not None:
                checkpoint({"config": _config_dict(cfg), "rows": rows, "training": training})
        if seed == cfg.seeds[0] and "vector" in cfg.methods and cfg.sweep_tasks:
            sweep = _sweep(model, suite, cfg, seed, progress)
        del model
    record = {"config": _config_dict(cfg), "rows": rows, "training": training, "sweep": sweep,
              "probe": _probe(probe_vectors, bijection), "single_fit_seconds": single}
    record["summary"] = summarize(rows, cfg.seeds)
    record["cost"] = costs(cfg.model, rows)
    return record


def _config_dict(cfg: PromptBenchConfig) -> dict:
    out = asdict(cfg)
    out["suite"] = asdict(InstructionSuiteConfig())
    return out


def costs(model: PromptModelConfig, rows: list[dict]) -> dict:
    """Prefill FLOPs and KV bytes of a typical query with the full prompt (its mean length over the rows) and
    with the vector's one slot."""
    full = [r for r in rows if r["method"] == "full"]
    if not full:
        return {}
    prompt = statistics.mean(r["prompt_positions"] for r in full)
    query = 8.0  # a typical query with its " = " (the same for both: the prompt's share is what changes)
    with_prompt, with_vector = prefill_cost(model, prompt + query), prefill_cost(model, 1 + query)
    return {"mean_prompt_positions": prompt, "query_positions": query, "full": with_prompt, "vector": with_vector,
            "flops_ratio": with_prompt["flops"] / with_vector["flops"],
            "kv_ratio": with_prompt["kv_bytes"] / with_vector["kv_bytes"]}


def summarize(rows: list[dict], seeds) -> dict:
    """Per split and method: the mean accuracy of each seed (over tasks), their mean and spread."""
    out: dict = {}
    for split in sorted({r["split"] for r in rows}):
        out[split] = {}
        for method in sorted({r["method"] for r in rows}):
            per_seed = []
            for s in seeds:
                acc = [r["accuracy"] for r in rows if r["split"] == split and r["method"] == method and r["seed"] == s]
                if acc:
                    per_seed.append(statistics.mean(acc))
            if per_seed:
                out[split][method] = {"mean": statistics.mean(per_seed), "per_seed": per_seed,
                                      "spread": max(per_seed) - min(per_seed)}
    held = [r for r in rows if r["split"] in HELD_OUT]
    if held:
        out["held_out"] = {}
        for method in sorted({r["method"] for r in held}):
            per_seed = [statistics.mean([r["accuracy"] for r in held if r["method"] == method and r["seed"] == s])
                        for s in seeds if any(r["method"] == method and r["seed"] == s for r in held)]
            out["held_out"][method] = {"mean": statistics.mean(per_seed), "per_seed": per_seed,
                                       "spread": max(per_seed) - min(per_seed)}
    return out
