"""``actzip bench decentralized``: two-circuit training of S stages x R replicas (processes under torchrun, or
each in a network namespace with a shaped uplink; gloo) after a brief dense pretraining, every method on the
same batches; speeds from the link model (and, on a shaped link, measured).

Protocol: per seed, the reference GPT is pretrained dense in this process on ``code_early`` (standard-library
code without its prose); then each task trains every method from those weights for ``steps`` steps, R replicas
each on its own batches: ``domain`` on the prose (comments and docstrings, another domain), ``continual`` on
``code_late`` (code of other modules). Each rank records its actions (measured compute), boundary bytes and
per-step data-parallel payload; a step's time on a link is the recorded schedule replayed by
:func:`actzip.wire.simulate` with every stage's data-parallel sync (:func:`actzip.wire.dp_sync`: its bytes and
hops, and its host work as measured) before its update. Final loss: the replicas' mean training loss over the
last ``smooth`` of the steps; time to target: the simulated time at which a method's smoothed loss first reaches
dense's final loss (same seed and task), once a whole smoothing window has run (:func:`set_targets`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import statistics
import tempfile
from collections.abc import Callable

import torch

from actzip.errors import ActzipError
from actzip.kernels.runtime import record_fallback
from actzip.wire import Action, LinkSpec, Pipeline, PipelineConfig, dp_sync, simulate
from actzip.wire.link import shaping_qdisc
from actzip_bench.data.domains import domain_corpora
from actzip_bench.decentralized_config import TRIVIAL, DecentralizedBenchConfig
from actzip_bench.decentralized_launch import launch_ranks
from actzip_bench.harness import machine_record
from actzip_bench.models.gpt_stages import build_gpt_stages
from actzip_bench.wire_config import Batches

__all__ = ["DecentralizedRunError", "calibration_fields", "calibration_source", "merge_records", "pretrain", "replay_times",
           "run_decentralized", "set_targets", "summarize", "with_calibration", "with_speed"]


def pretrain(cfg: DecentralizedBenchConfig, seed: int, corpus, device: torch.device | None = None) -> list[dict]:
    """The stages' state dicts (on the CPU) after ``pretrain_steps`` dense steps on ``corpus`` (all stages in
    this process, on ``device``)."""
    stages = [s.to(device or "cpu") for s in build_gpt_stages(cfg.gpt_config(), cfg.stages, "dense", seed=seed)]
    pipe = Pipeline(stages, PipelineConfig(microbatches=cfg.microbatches, lr=cfg.lr, seed=seed))
    batches = Batches(corpus, cfg.batch_size * cfg.replicas, cfg.block_size, seed, None)
    for step in range(cfg.pretrain_steps):
        x, y, _ = batches(step)
        pipe.train_step(x, y)
    return [{k: v.detach().cpu().clone() for k, v in s.state_dict().items()} for s in stages]


def _smoothed(losses: list[float], window: int) -> list[float]:
    return [statistics.fmean(losses[max(0, i + 1 - window): i + 1]) for i in range(len(losses))]


def replay_times(ranks: list[dict], cfg: DecentralizedBenchConfig, link: LinkSpec,
                 with_dp: bool = True) -> list[float]:
    """Per step: the simulated step time of replica 0's pipeline on ``link``, with its data-parallel syncs
    (``with_dp``: their wire time, and their host work as measured) or without (the pipeline axis alone)."""
    mine = [r for r in ranks if r["replica"] == 0]
    actions = [Action.from_tuple(a) for r in mine for a in r["actions"]]
    # records made before the host work was measured have none: their syncs are wire time alone
    sync = {(r["stage"], step): dp_sync(b, cfg.replicas, host) for r in mine
            for step, (b, host) in enumerate(zip(r["dp_bytes"], r.get("dp_host_seconds") or
                                                 [0.0] * len(r["dp_bytes"])))} if with_dp else None
    return simulate(actions, link, sync).step_times_s


def summarize(cfg: DecentralizedBenchConfig, runs: list[dict]) -> list[dict]:
    """One row per (seed, task, method): bytes per axis and step, losses, throughput and time to dense's final
    loss on every link."""
    window = cfg.window
    tokens_per_step = cfg.batch_size * cfg.block_size * cfg.replicas
    rows = []
    for run in runs:
        ranks = run["ranks"]
        last = [r for r in ranks if r["stage"] == cfg.stages - 1]
        mean_loss = [statistics.fmean(v) for v in zip(*(r["losses"] for r in last))]
        n = len(mean_loss)  # steps run: more than cfg.steps where a method trained on to reach dense's loss
        sent = {c: sum(r["pp_meter"]["sent"][c]["total"] for r in ranks if r["replica"] == 0) for c in ("fwd", "bwd")}
        pp = sent["fwd"] + sent["bwd"]
        dp = sum(sum(b.values()) for r in ranks if r["replica"] == 0 for b in r["dp_bytes"])
        anchors = [r["anchors"] for r in ranks if r["anchors"] is not None]
        row = {"seed": run["seed"], "task": run["task"], "method": run["method"],
               "pp_bytes_per_step": pp / n, "dp_bytes_per_step": dp / n,
               "pp_fwd_bytes_per_step": sent["fwd"] / n, "pp_bwd_bytes_per_step": sent["bwd"] / n,
               "final_loss": statistics.fmean(mean_loss[:cfg.steps][-window:]), "val_loss": last[0]["val_loss"],
               "model_val_loss": last[0].get("model_val_loss"),  # codecs off; None in records made before it
               # replica 0's data-parallel sync as it ran, per step the slowest stage's (its own work, the
               # collectives' waits and transfers): the median over the steps
               "dp_sync_s": statistics.median(max(v) for v in zip(*(r["dp_seconds"] for r in ranks
                                                                     if r["replica"] == 0))),
               # the part of it outside the collectives: the host's own work, measured the same way
               "dp_host_s": statistics.median(max(v) for v in zip(*(r.get("dp_host_seconds") or [0.0] * n
                                                                     for r in ranks if r["replica"] == 0))),
               "steps_run": n,
               "tokens": tokens_per_step * cfg.steps, "losses": mean_loss,
               "anchors": {k: sum(a[k] for a in anchors) for k in anchors[0]} if anchors else None,
               # replica 0's anchor passes, both ways, per step (0 without anchors)
               "anchor_bytes_per_step": sum(r["anchor_meter"]["sent"][c]["total"] for r in ranks
                                            if r["replica"] == 0 and r.get("anchor_meter")
                                            for c in ("fwd", "bwd")) / n,
               "wall_s": max(r["wall_s"] for r in ranks), "links": {}}
        if cfg.keep_replay:  # what replay_times replays, to replay it again later
            row["replay"] = [{k: r.get(k) for k in ("stage", "replica", "actions", "dp_bytes", "dp_host_seconds")}
                             for r in ranks if r["replica"] == 0]
        for name, spec in cfg.modelled_links().items():
            row["links"][name] = _modelled(ranks, cfg, spec)
        if cfg.shaped_link is not None and cfg.dense_off_link and run["method"] == "dense":
            # trained off the link: its time there is the model's of the same link
            modelled = f"{cfg.shaped_link[0]:g}mbps-{cfg.shaped_link[1]:g}ms"
            row["links"][cfg.link_names[-1]] = {**row["links"][modelled], "pp_step_s": None, "modelled": True}
        elif cfg.shaped_link is not None:
            row["links"][cfg.link_names[-1]] = _measured(ranks)
        rows.append(row)
    set_targets(rows, window)
    return rows


def _modelled(ranks: list[dict], cfg: DecentralizedBenchConfig, spec: LinkSpec) -> dict:
    """The link model's step times of a run on ``spec``: with the syncs, and the pipeline axis alone."""
    times = replay_times(ranks, cfg, spec)
    pp = replay_times(ranks, cfg, spec, with_dp=False)
    return {"step_s": statistics.median(times[1:] or times), "pp_step_s": statistics.median(pp[1:] or pp),
            "cumulative_s": list(_cumsum(times))}


def with_calibration(record: dict, probe: dict) -> dict:
    """``record`` with ``probe``'s (an ``actzip bench link`` record's) all-gathers as its config's exchange
    times, and every row's runs replayed again on the calibrated links; its rows must keep their schedule
    (``--keep-replay``)."""
    bare = [i for i, r in enumerate(record["rows"]) if not r.get("replay")]
    if bare:
        raise ActzipError(f"bench decentralized --link-calibration: {len(bare)} rows keep no schedule to replay (run "
                          "with --keep-replay)")
    cfg = DecentralizedBenchConfig(**_config_fields({**record["config"], **calibration_fields(probe)}))
    rows = []
    for before in record["rows"]:
        row = {**before, "links": _uncalibrated(before["links"])}  # an earlier probe's links give way
        for name, spec in cfg.modelled_links().items():
            if name not in row["links"]:
                row["links"][name] = _modelled(before["replay"], cfg, spec)
        rows.append(row)
    set_targets(rows, cfg.window)
    return {**record, "config": dataclasses.asdict(cfg), "rows": rows, "aggregate": aggregate(cfg, rows),
            "link_calibration": calibration_source(probe)}


def calibration_fields(probe: dict) -> dict:
    """The config fields an ``actzip bench link`` record calibrates: its all-gathers' (bytes, seconds) and rate."""
    return {"exchange": tuple((g["bytes"], g["measured_s"]) for g in probe["gathers"]),
            "exchange_mbps": float(probe["config"]["mbps"])}


def calibration_source(probe: dict) -> dict:
    """Where a record's link calibration came from: the ``bench link`` record's machine, command and shaping."""
    return {"machine": probe.get("machine"), "command": probe.get("command"), "shaping": probe.get("shaping")}


def set_targets(rows: list[dict], window: int) -> None:
    """Each row's time to dense's final loss (same seed and task) on every link: the first step at which the
    mean loss of the last ``window`` steps is at or below it, counted once a whole window has run (a task whose
    first loss is already below its final one, as a fresh optimizer's first steps can make it, is not "reached"
    before any training)."""
    for row in rows:
        target = next(r["final_loss"] for r in rows if r["method"] == "dense" and r["seed"] == row["seed"]
                      and r["task"] == row["task"])
        curve = _smoothed(row["losses"], window)
        reach = next((i for i, v in enumerate(curve) if i >= window - 1 and v <= target), None)
        row["target_loss"] = target
        row["target_step"] = reach
        for link in row["links"].values():
            link["time_to_target_s"] = None if reach is None else link["cumulative_s"][reach]
        first = next(iter(row["links"].values()))
        row["time_to_target_s"] = first["time_to_target_s"]  # on the first link


def _measured(ranks: list[dict]) -> dict:
    """Replica 0's step times as they ran (on a shaped link): step i ends when the last of its stages ends it,
    counted from the first stage's start of step 0; the pipeline axis alone cannot be told apart here."""
    walls = [r["step_walls"] for r in ranks if r["replica"] == 0]
    start = min(w[0][0] for w in walls)
    ends = [max(w[i][1] for w in walls) - start for i in range(min(len(w) for w in walls))]
    times = [b - a for a, b in zip([0.0, *ends[:-1]], ends)]
    return {"step_s": statistics.median(times[1:] or times), "pp_step_s": None, "cumulative_s": ends}


def _cumsum(values):
    total = 0.0
    for v in values:
        total += v
        yield total


def aggregate(cfg: DecentralizedBenchConfig, rows: list[dict]) -> list[dict]:
    """Per (task, method): means and ranges over seeds, ratios against dense bf16 and the best trivial baseline."""
    out = []
    link_names = cfg.link_names
    for task in cfg.tasks:
        by = {m: [r for r in rows if r["task"] == task and r["method"] == m] for m in cfg.methods}
        dense_by_seed = {r["seed"]: r["final_loss"] for r in by["dense"]}
        dense_model = {r["seed"]: r.get("model_val_loss") for r in by["dense"]}
        for m, rs in by.items():
            if not rs:
                continue
            # dense's mean over this method's own seeds: a method short of a seed (a cut-off run) is compared with
            # dense on the seeds it has, not with another seed mix
            dense_loss = statistics.fmean(dense_by_seed[r["seed"]] for r in rs)
            agg = {"task": task, "method": m, "seeds": len(rs),
                   "final_loss": statistics.fmean(r["final_loss"] for r in rs),
                   "final_loss_range": [min(r["final_loss"] for r in rs), max(r["final_loss"] for r in rs)],
                   "dense_reference": dense_loss,
                   "loss_vs_dense": statistics.fmean(r["final_loss"] for r in rs) / dense_loss - 1,
                   "pp_bytes_per_step": statistics.fmean(r["pp_bytes_per_step"] for r in rs),
                   "dp_bytes_per_step": statistics.fmean(r["dp_bytes_per_step"] for r in rs),
                   "reached": sum(r["target_step"] is not None for r in rs), "links": {}}
            model = [(r.get("model_val_loss"), dense_model.get(r["seed"])) for r in rs]
            if all(v is not None and d is not None for v, d in model):  # the trained models, codecs off
                agg["model_val_loss_vs_dense"] = statistics.fmean(v for v, _ in model) / statistics.fmean(
                    d for _, d in model) - 1
                agg["model_val_loss_vs_dense_range"] = [min(v / d - 1 for v, d in model),
                                                        max(v / d - 1 for v, d in model)]
            for name in link_names:
                step = statistics.fmean(r["links"][name]["step_s"] for r in rs)
                pps = [r["links"][name]["pp_step_s"] for r in rs]
                pp_step = None if None in pps else statistics.fmean(pps)  # None: measured, both axes at once
                ttt = [r["links"][name]["time_to_target_s"] for r in rs]
                agg["links"][name] = {"step_s": step, "pp_step_s": pp_step, "time_to_target_s":
                                      statistics.fmean(ttt) if all(t is not None for t in ttt) else None}
            out.append(agg)
        ref = {a["method"]: a for a in out if a["task"] == task}
        for a in ref.values():
            for name in link_names:
                link = a["links"][name]
                if "bf16" in ref:
                    theirs = ref["bf16"]["links"][name]
                    link["throughput_vs_bf16"] = theirs["step_s"] / link["step_s"]
                    link["pp_throughput_vs_bf16"] = (None if link["pp_step_s"] is None or theirs["pp_step_s"] is None
                                                     else theirs["pp_step_s"] / link["pp_step_s"])
                trivial = [ref[t]["links"][name]["time_to_target_s"] for t in TRIVIAL if t in ref]
                trivial = [t for t in trivial if t is not None]
                best = min(trivial) if trivial else None
                mine = link["time_to_target_s"]
                link["ttt_vs_best_trivial"] = None if best is None or mine is None else best / mine
    return out


def run_decentralized(cfg: DecentralizedBenchConfig, progress: Callable[[str], None] | None = None,
                      log: Callable[[str], None] | None = None, device: torch.device | None = None) -> dict:
    """Pretrain, train every (seed, task, method) on the mesh, and return the record (rows and aggregates).
    On ``device`` cuda every rank computes on a GPU (ranks beyond the GPUs share them, talking gloo)."""
    say = log or (lambda message: None)
    device = torch.device(device or "cpu")
    corpora = domain_corpora(cfg.corpus_bytes)
    world = cfg.stages * cfg.replicas
    with tempfile.TemporaryDirectory(prefix="actzip-decentralized-") as tmp:
        states = {}
        for seed in cfg.seeds:
            say(f"pretraining seed {seed}: {cfg.pretrain_steps} dense steps on code_early")
            states[seed] = pretrain(cfg, seed, corpora["code_early"], device)
        torch.save(states, os.path.join(tmp, "states.pt"))
        fields = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(cfg).items()}

        def worker_args(out: str, *more: str) -> list[str]:
            return ["--config", json.dumps(fields), "--states", os.path.join(tmp, "states.pt"), "--out", out,
                    "--device", device.type, *more]

        where = "" if cfg.shaped_link is None else ", each in a network namespace, every uplink shaped"
        say(f"training on {cfg.stages} stages x {cfg.replicas} replicas ({world} processes{where})")
        runs, more, exits = [], [], []
        if cfg.dense_off_link:  # dense on this host, then the others on the link with its losses as targets
            say("dense first, every rank on this host (its values are the same on any link)")
            runs = _launch(cfg, world, worker_args(os.path.join(tmp, "dense.jsonl"), "--only", "dense"), tmp,
                           progress, None, device, [], exits)
            reference = dataclasses.replace(cfg, shaped_link=None, dense_off_link=False, methods=("dense",))
            targets = {f"{r['seed']}:{r['task']}": r["final_loss"] for r in summarize(reference, runs)}
            more = ["--only", ",".join(m for m in cfg.methods if m != "dense"), "--targets", json.dumps(targets)]
        runs += _launch(cfg, world, worker_args(os.path.join(tmp, "runs.jsonl"), *more), tmp, progress,
                        cfg.shaped_link, device, runs, exits)
    rows = summarize(cfg, runs)
    record = {"config": dataclasses.asdict(cfg), "rows": rows, "aggregate": aggregate(cfg, rows),
              "machine": machine_record(device),
              "teardown_exit": next((c for c in exits if c), 0)}  # non-zero: a rank failed in teardown only
    if cfg.shaped_link is not None:  # netem (rate and delay in the kernel) or tbf (the latency in the senders)
        record["shaping"] = shaping_qdisc()
    return record


def _launch(cfg: DecentralizedBenchConfig, world: int, worker_args: list[str], tmp: str,
            progress: Callable[[str], None] | None, shaped: tuple[float, float] | None, device: torch.device,
            before: list[dict], exits: list[int]) -> list[dict]:
    """One torchrun (or namespace) launch of the worker: the runs it wrote. A failure raises with the runs
    finished before it, ``before``'s included; a failure in gloo's teardown after every rank finished is said
    and counted, its exit status appended to ``exits``."""
    errors = os.path.join(tmp, "stderr.txt")  # a file, not a pipe: a full pipe would stall the ranks
    with open(errors, "w") as err_file:
        code, finished = launch_ranks(world, worker_args, err_file, progress, shaped)
    with open(errors) as f:
        err = f.read()
    runs = _read_runs(worker_args[worker_args.index("--out") + 1])
    if code and len(finished) == world:
        # every rank passed the final barrier after the record was written: what failed is gloo's teardown
        record_fallback("bench decentralized", f"a rank failed while closing its connections (exit {code}) "
                        "after every rank had finished and the record was written",
                        instead="keeping the record (it is complete)")
    elif code:
        message = "bench decentralized: the training processes failed:\n" + failure_lines(err)
        raise DecentralizedRunError(message, _partial_record(cfg, before + runs, device, message))
    exits.append(code)
    return runs


class DecentralizedRunError(ActzipError):
    """The training processes failed; ``record`` holds the runs that finished before (None if no task's dense run
    did), so that a late failure does not cost the earlier runs."""

    def __init__(self, message: str, record: dict | None) -> None:
        super().__init__(message)
        self.record = record


def _read_runs(path: str) -> list[dict]:
    """The runs the worker's rank 0 wrote, one JSON line each as it finished them (none if it wrote none)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _partial_record(cfg: DecentralizedBenchConfig, runs: list[dict], device: torch.device,
                    failure: str) -> dict | None:
    """A record of the (seed, task) pairs whose dense run finished (the others' reference), marked ``failed``."""
    done = {(r["seed"], r["task"]) for r in runs if r["method"] == "dense"}
    runs = [r for r in runs if (r["seed"], r["task"]) in done]
    if not runs:
        return None
    seeds = tuple(s for s in cfg.seeds if any(r["seed"] == s for r in runs))
    tasks = tuple(t for t in cfg.tasks if any(r["task"] == t for r in runs))
    part = dataclasses.replace(cfg, seeds=seeds, tasks=tasks)
    rows = summarize(part, runs)
    return {"config": dataclasses.asdict(part), "rows": rows, "aggregate": aggregate(part, rows),
            "machine": machine_record(device), "failed": failure}


# a rank's own error line: an exception's last line of a traceback, or actzip's error (a prefix "[rank3]:" allowed)
_ERROR_LINE = re.compile(r"^\s*(\[rank\d+\]:\s*)?(actzip: error:|[A-Za-z_][\w.]*(Error|Exception)(:|$))")


def failure_lines(stderr: str, keep: int = 30, errors: int = 8) -> str:
    """The end of the ranks' and torchrun's stderr without warnings (a warning and its source line each): the
    ranks' own errors and torchrun's root-cause block (exit code or signal) stay. Error lines above those ``keep``
    lines (torchrun's block of a failure on every rank can fill them) come first, up to ``errors`` of them."""
    lines, skip = [], False
    for line in stderr.splitlines():
        if skip:
            skip = False
            continue
        if "Warning:" in line:
            skip = line.lstrip().startswith("/")  # "path:line: UserWarning: ..." is followed by its source line
            continue
        if line.strip():
            lines.append(line)
    tail = lines[-keep:]
    above = [line for line in lines[:-keep] if _ERROR_LINE.match(line)]
    first = list(dict.fromkeys(above))[:errors]  # one of each (every rank may print the same)
    return "\n".join(first + tail)


# what sets a step's cost: a speed record must share these with the record whose step times it replaces
SPEED_KEYS = ("model", "n_layer", "n_embd", "block_size", "stages", "replicas", "batch_size", "microbatches",
              "schedule", "links", "topk_keep", "mask_keep", "diloco_steps", "anchor_every", "anchor_delay",
              "spectral_rank")


def with_speed(record: dict, speed: dict) -> dict:
    """``record`` with every step time from ``speed``, a run of the same shapes alone on the machine: runs side
    by side share a GPU and its host, so their measured compute is not the compute of one run. A row keeps its own
    losses and the step at which it reached dense's loss; its step times (with and without the data-parallel
    syncs) become the speed record's median for its method, its time to target that step time times the steps to
    the target. Its own times stay under ``shared_step_s``."""
    theirs = json.loads(json.dumps({k: speed["config"][k] for k in SPEED_KEYS}))  # tuples and lists alike
    mine = json.loads(json.dumps({k: record["config"][k] for k in SPEED_KEYS}))
    if theirs != mine:
        diff = sorted(k for k in SPEED_KEYS if theirs[k] != mine[k])
        raise ActzipError(f"bench decentralized --speed: the speed record ran other shapes ({', '.join(diff)})")
    solo = {}
    for a in speed["aggregate"]:
        for name, link in a["links"].items():
            solo.setdefault((a["method"], name), []).append((link["step_s"], link["pp_step_s"]))
    missing = sorted({r["method"] for r in record["rows"]} - {m for m, _ in solo})
    if missing:
        raise ActzipError(f"bench decentralized --speed: the speed record has no run of {missing}")
    rows = []
    for before in record["rows"]:
        row = {**before, "links": {}}
        for name, link in before["links"].items():
            step = statistics.fmean(s for s, _ in solo[(row["method"], name)])
            pp = statistics.fmean(p for _, p in solo[(row["method"], name)])
            n = len(link["cumulative_s"])
            reach = row["target_step"]
            row["links"][name] = {"step_s": step, "pp_step_s": pp, "cumulative_s": [step * (i + 1) for i in range(n)],
                                  "time_to_target_s": None if reach is None else step * (reach + 1),
                                  "shared_step_s": link["step_s"]}
        row["time_to_target_s"] = next(iter(row["links"].values()))["time_to_target_s"]
        rows.append(row)
    cfg = DecentralizedBenchConfig(**_config_fields(record["config"]))
    return {**record, "rows": rows, "aggregate": aggregate(cfg, rows), "speed_from": speed.get("command")}


def _config_fields(config: dict) -> dict:
    """A record's config as DecentralizedBenchConfig's fields (JSON lists back to tuples)."""
    return {k: tuple(tuple(x) for x in v) if k == "links" else tuple(v) if isinstance(v, list) else v
            for k, v in config.items()}


def _uncalibrated(links: dict) -> dict:
    """A row's links without those a link calibration added (named ``... calibrated``)."""
    return {name: link for name, link in links.items() if not name.endswith(" calibrated")}


# config fields that say how a record was kept or replayed, not what ran: records differing in them still merge
_NOT_THE_RUN = ("seeds", "keep_replay", "exchange", "exchange_mbps")


def merge_records(records: list[dict]) -> dict:
    """One record from runs of the same config on other seeds (run side by side), aggregated again. A link
    calibration of any of them is dropped (give the merge ``--link-calibration`` to calibrate all alike); the
    schedules count as kept when every row keeps one."""
    if not records:
        raise ActzipError("bench decentralized --merge: no record given")
    first = records[0]
    same = {k: v for k, v in first["config"].items() if k not in _NOT_THE_RUN}
    seeds = []
    for i, rec in enumerate(records):
        if {k: v for k, v in rec["config"].items() if k not in _NOT_THE_RUN} != same:
            raise ActzipError(f"bench decentralized --merge: record {i} ran another config than the first record")
        seeds += list(rec["config"]["seeds"])
    if len(set(seeds)) != len(seeds):
        raise ActzipError(f"bench decentralized --merge: seeds repeat across the records: {seeds}")
    rows = [{**row, "links": _uncalibrated(row["links"])} for rec in records for row in rec["rows"]]
    cfg = DecentralizedBenchConfig(**_config_fields({**first["config"], "seeds": seeds, "exchange": (),
                                                     "exchange_mbps": None,
                                                     "keep_replay": all(r.get("replay") for r in rows)}))
    set_targets(rows, cfg.window)  # from each row's own losses and times
    shaping = {rec.get("shaping") for rec in records}  # the qdisc of a shaped link, when the records agree
    return {"config": dataclasses.asdict(cfg), "rows": rows, "aggregate": aggregate(cfg, rows),
            "machine": first["machine"], "merged_from": [rec.get("command") for rec in records],
            **({"shaping": shaping.pop()} if len(shaping) == 1 and None not in shaping else {})}
