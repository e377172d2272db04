"""docs/split.md figures (see :mod:`actzip_bench.figures`): ModalShare's keep-ratios against equal ones (one
``actzip bench split`` record per compression), and the grid of policies and compressors (one record per
compressor and compression in ``results/cpu/split-grid/``)."""

from __future__ import annotations

from pathlib import Path

from actzip.errors import ConfigError
from actzip_bench.figure_helpers import cite, load

RUNS = ("results/cpu/split-grid/random-5.json", "results/cpu/split-grid/random-10.json")


def _sizes(rec: dict) -> list[int]:
    """Features each modality sends (rows carry them; older records only their config's widths)."""
    return rec["rows"][0].get("sizes") or rec["config"]["widths"]


def _floor_note(c: dict) -> str:
    return (f"every modality keeping at least {c['explore']:g} of its equal keep-ratio and the compressor's smallest "
            "sendable payload")


def modalshare(root: Path) -> str:
    recs = [load(root, rel) for rel in RUNS]
    lines = ["| uplink compression | equal keep-ratios | ModalShare | gain | ModalShare's ratios (image, sensor, "
             "distractor; seed 0) |", "|---:|---:|---:|---:|---|"]
    for rec in recs:
        c, m = rec["config"], rec["mean_accuracy"]
        span = {p: (min(r["accuracy"] for r in rec["rows"] if r["policy"] == p),
                    max(r["accuracy"] for r in rec["rows"] if r["policy"] == p)) for p in m}
        ratios = next(r["ratios"] for r in rec["rows"] if r["policy"] == "modalshare")
        cell = {p: f"{m[p]:.1%} ({span[p][0]:.1%} to {span[p][1]:.1%})" for p in m}
        lines.append(f"| {c['compression']:g}x | {cell['equal']} | {cell['modalshare']} | "
                     f"{(m['modalshare'] - m['equal']) * 100:+.1f} points | "
                     f"{', '.join(f'{v:.2f}' for v in ratios)} |")
    c = recs[0]["config"]
    lines += ["", f"Test accuracy, mean of {len(c['seeds'])} seeds (their range in brackets), {c['steps']} steps, "
              f"client widths {', '.join(map(str, _sizes(recs[0])))} features, random-mask uplink, ModalShare "
              f"refreshed every {c['refresh']} steps, {_floor_note(c)} {cite(*RUNS)}."]
    return "\n".join(lines)


GRID = "results/cpu/split-grid"  # one `actzip bench split` record per compressor and compression
POLICY_LABELS = {"equal": "equal", "equal-payload": "equal payload", "gradient-norm": "gradient norm",
                 "std": "SplitFC-style std", "modalshare": "ModalShare"}


def _grid(root: Path, grid: str = GRID) -> dict[tuple[str, float], dict]:
    recs = {}
    for path in sorted((root / grid).glob("*.json")):
        rec = load(root, f"{grid}/{path.name}")
        recs[(rec["config"]["compressor"], rec["config"]["compression"])] = rec
    if not recs:
        raise ConfigError(f"figure: no records in {grid}")
    return recs


def _about(rec: dict) -> str:
    """The data set, the client and the modalities' sizes of a grid's records."""
    c, suite = rec["config"], rec.get("suite", {})
    names = list(suite.get("modalities", {})) or ["image", "sensor", "distractor"]
    client = c.get("client", "linear")
    what = f"{c.get('dataset', 'synthetic')} data, {client} client"
    return f"{what}, {', '.join(f'{n} {s}' for n, s in zip(names, _sizes(rec)))} features sent"


def _acc(rec: dict, policy: str) -> str:
    accs = [r["accuracy"] for r in rec["rows"] if r["policy"] == policy]
    return f"{sum(accs) / len(accs):.1%} ({min(accs):.1%}–{max(accs):.1%})"


def policy_grid(root: Path, grid: str = GRID) -> str:
    """Every policy's accuracy under the three compressors of the policy comparison, at each compression."""
    recs = _grid(root, grid)
    policies = [p for p in POLICY_LABELS if all(p in r["mean_accuracy"] for (c, _), r in recs.items() if c != "quant")]
    lines = ["| compressor | compression | " + " | ".join(POLICY_LABELS[p] for p in policies)
             + " | ModalShare − equal | ModalShare − best other |", "|---|---:|" + "---:|" * (len(policies) + 2)]
    gains, margins, shares = [], [], []
    order = ("random", "topk", "dct", "quant")
    for (comp, x), rec in sorted(recs.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1])):
        if comp == "quant":
            continue
        m = rec["mean_accuracy"]
        best_other = max(m[p] for p in policies if p not in ("modalshare",))
        gains.append(m["modalshare"] - m["equal"])
        margins.append(m["modalshare"] - best_other)
        shares += [r["scoring_share"] for r in rec["rows"] if r["policy"] == "modalshare"]
        lines.append(f"| {comp} | {x:g}x | " + " | ".join(_acc(rec, p) for p in policies)
                     + f" | {(m['modalshare'] - m['equal']) * 100:+.1f} | {(m['modalshare'] - best_other) * 100:+.1f} |")
    first = next(iter(recs.values()))
    c = first["config"]
    lines += ["", f"Test accuracy, mean of {len(c['seeds'])} seeds (lowest–highest), {c['steps']} steps, "
              f"{_about(first)}; every score-driven policy refreshed every {c['refresh']} steps, "
              f"{_floor_note(c)}; each spending 1 / compression of the dense bf16 payload. ModalShare against equal "
              f"keep-ratios: {min(gains) * 100:+.1f} to {max(gains) * 100:+.1f} points; against the best other "
              f"policy: {min(margins) * 100:+.1f} to {max(margins) * 100:+.1f} points. Its Shapley scoring took "
              f"{min(shares):.1%} to {max(shares):.1%} of the server's compute (`{grid}/`)."]
    return "\n".join(lines)


def codec_grid(root: Path, grid: str = GRID) -> str:
    """The compressors against each other at equal keep-ratios and equal bytes."""
    recs = _grid(root, grid)
    comps = [c for c in ("random", "topk", "dct", "quant") if any(k[0] == c for k in recs)]
    xs = sorted({x for _, x in recs})
    lines = ["| compression | " + " | ".join(comps) + " |", "|---:|" + "---:|" * len(comps)]
    for x in xs:
        cells = []
        for comp in comps:
            rec = recs.get((comp, x))
            if rec is None:
                cells.append("—")
                continue
            rows = [r for r in rec["rows"] if r["policy"] == "equal"]
            sent = sum(r["uplink_bytes"] / r["dense_bytes"] for r in rows) / len(rows)
            cells.append(f"{_acc(rec, 'equal')}, {sent:.3f} sent")
        lines.append(f"| {x:g}x | " + " | ".join(cells) + " |")
    lines += ["", f"On {_about(next(iter(recs.values())))}; equal keep-ratios; test accuracy, mean of the seeds "
              "(lowest–highest), and the uplink bytes sent as a share of the dense bf16 payload (the payloads' own "
              f"bytes; a compressor that cannot fit a modality's share sends nothing of it) (`{grid}/`)."]
    return "\n".join(lines)


DATASET_GRIDS = {"digits": "results/cpu/split-digits", "spoken-digits": "results/cpu/split-spoken-digits"}
# ModalShare alone again with one setting changed (scripts/split_cells.sh), one record per data set, compressor
# and compression (``{dataset}-{compressor}-{compression}.json``), beside the grids' own runs: each absent
# modality's batch mean standing in for it, or scores from held-out samples
ABSENT_MEAN = "results/cpu/split-absent-mean"
HELDOUT = "results/cpu/split-heldout"
HELDOUT_OTHERS = "results/cpu/split-heldout-others"  # the other policies that read the batch, held out too


def _cells(root: Path, folder: str):
    """Each record of ``folder`` (one grid cell's policies run again) with its grid cell's mean accuracies, and
    the seed counts seen; no record is an error."""
    grids = {"synthetic": GRID, **DATASET_GRIDS}
    cells, seeds = [], set()
    for path in sorted((root / folder).glob("*.json")):
        rec = load(root, f"{folder}/{path.name}")
        c = rec["config"]
        seeds.add(len(c["seeds"]))
        cells.append((path.name, rec, _grid(root, grids[c["dataset"]])[(c["compressor"], c["compression"])]
                      ["mean_accuracy"]))
    if not cells:
        raise ConfigError(f"figure: no records in {folder}")
    return cells, " or ".join(map(str, sorted(seeds)))


def _against_grids(root: Path, folder: str, base: str, variant: str, caption: str) -> str:
    """ModalShare of ``folder``'s records (labelled ``variant``) against the grids' own ModalShare (``base``),
    equal keep-ratios and the best other policy of the same grid cell."""
    lines = [f"| data set | compressor | compression | equal | best other | ModalShare, {base} | ModalShare, "
             f"{variant} | {variant} − {base} | {variant} − equal | {variant} − best other |",
             "|---|---|---:|" + "---:|" * 7]
    diffs, gains, margins = [], [], []
    cells, seeds = _cells(root, folder)
    for _, rec, m in cells:
        c = rec["config"]
        best = max(v for p, v in m.items() if p not in ("modalshare", "equal"))
        got = rec["mean_accuracy"]["modalshare"]
        diffs.append(got - m["modalshare"])
        gains.append(got - m["equal"])
        margins.append(got - max(best, m["equal"]))
        lines.append(f"| {c['dataset']} | {c['compressor']} | {c['compression']:g}x | {m['equal']:.1%} | "
                     f"{best:.1%} | {m['modalshare']:.1%} | {got:.1%} | {diffs[-1] * 100:+.1f} | "
                     f"{gains[-1] * 100:+.1f} | {margins[-1] * 100:+.1f} |")
    lines += ["", f"Test accuracy, mean of {seeds} seeds, each grid's protocol; \"best "
              f"other\": the best of the grid's policies other than equal keep-ratios and ModalShare. {caption}: "
              f"{min(diffs) * 100:+.1f} to {max(diffs) * 100:+.1f} points over {len(diffs)} cells; ModalShare "
              f"{variant} against equal keep-ratios {min(gains) * 100:+.1f} to {max(gains) * 100:+.1f}, against "
              f"the best of all other policies {min(margins) * 100:+.1f} to {max(margins) * 100:+.1f} "
              f"(`{folder}/`, the grids' directories)."]
    return "\n".join(lines)


def absent_ablation(root: Path) -> str:
    """ModalShare with zeros and with batch means standing in for a coalition's absent modalities."""
    return _against_grids(root, ABSENT_MEAN, "zeros", "means", "Batch means against zeros")


def heldout_ablation(root: Path) -> str:
    """ModalShare scoring the batch just trained on and scoring held-out samples."""
    return _against_grids(root, HELDOUT, "received", "held out", "Held-out scoring against the batch received")


def heldout_on_equal_terms(root: Path, mine_folder: str = HELDOUT, label: str = "held out",
                           note: str = "") -> str:
    """Every policy with held-out scoring where its scores read the batch (gradient norm, std, ModalShare; the
    grids' equal and equal-payload rows as they are: they read nothing), per cell of :data:`HELDOUT_OTHERS`;
    ModalShare's records from ``mine_folder`` (labelled ``label``)."""
    lines = ["| data set | compressor | compression | equal | equal payload | gradient norm, held out | std, held out "
             f"| ModalShare, {label} | ModalShare − equal | ModalShare − best other |", "|---|---|---:|" + "---:|" * 7]
    gains, margins = [], []
    cells, seeds = _cells(root, HELDOUT_OTHERS)
    for name, others, grid in cells:
        c = others["config"]
        mine = load(root, f"{mine_folder}/{name}")["mean_accuracy"]["modalshare"]
        row = {"equal": grid["equal"], "equal-payload": grid["equal-payload"], **others["mean_accuracy"]}
        best = max(v for p, v in row.items() if p != "equal")
        gains.append(mine - row["equal"])
        margins.append(mine - max(best, row["equal"]))
        lines.append(f"| {c['dataset']} | {c['compressor']} | {c['compression']:g}x | {row['equal']:.1%} | "
                     f"{row['equal-payload']:.1%} | {row['gradient-norm']:.1%} | {row['std']:.1%} | {mine:.1%} | "
                     f"{gains[-1] * 100:+.1f} | {margins[-1] * 100:+.1f} |")
    lines += ["", f"Test accuracy, mean of {seeds} seeds, each grid's protocol, every "
              "policy whose scores read a batch scoring held-out samples; equal keep-ratios and equal payload as in "
              f"the grids. ModalShare against equal keep-ratios {min(gains) * 100:+.1f} to {max(gains) * 100:+.1f} "
              f"points over {len(gains)} cells ({sum(g < 0 for g in gains)} below), against the best other policy "
              f"{min(margins) * 100:+.1f} to {max(margins) * 100:+.1f} ({sum(m >= 0.03 for m in margins)} cells at "
              f"+3 or more){note} (`{HELDOUT_OTHERS}/`, `{mine_folder}/`, the grids' directories)."]
    return "\n".join(lines)


HELDOUT_EQUAL_SHARE = "results/cpu/split-heldout-equal-share"  # ModalShare's scoring batch at the equal ratios
HELDOUT_RAISED_SHARE = "results/cpu/split-heldout-raised-share"  # ... at its ratios raised to the equal ones
_OTHERS_AS_BEFORE = "; the other policies' scoring batches at their own ratios, as in the table above"


def heldout_at_equal_shares(root: Path) -> str:
    """:func:`heldout_on_equal_terms` with ModalShare's scoring batches sent at the equal keep-ratios."""
    return heldout_on_equal_terms(root, HELDOUT_EQUAL_SHARE, "held out at equal shares", _OTHERS_AS_BEFORE)


def heldout_at_raised_shares(root: Path) -> str:
    """:func:`heldout_on_equal_terms` with ModalShare's scoring batches at its ratios raised to the equal ones."""
    return heldout_on_equal_terms(root, HELDOUT_RAISED_SHARE, "held out at raised shares", _OTHERS_AS_BEFORE)


UNCOMPRESSED = "results/cpu/split-uncompressed"  # each data set with every modality sent whole (bf16), 3 seeds
_NEAR = 0.03  # the margin the policy targets ask for (points of accuracy over the best other policy)


def against_uncompressed(root: Path) -> str:
    """Each data set's accuracy with nothing compressed, and what it bounds in the raised-share comparison: the
    cells where the best policy other than ModalShare is already within :data:`_NEAR` of it (a lead of that
    margin there needs more than the whole uplink gives), and where ModalShare falls below equal keep-ratios,
    how far equal keep-ratios itself is from it."""
    lines = ["| data set | nothing compressed | cells | best other within 3 points of it or above | ModalShare 3 "
             "points or more above the best other | ModalShare below equal: by (equal − nothing compressed) |",
             "|---|---:|---:|---:|---:|---|"]
    cells, seeds = _cells(root, HELDOUT_OTHERS)
    by_set: dict[str, list] = {}
    for name, others, grid in cells:
        row = {"equal": grid["equal"], "equal-payload": grid["equal-payload"], **others["mean_accuracy"]}
        mine = load(root, f"{HELDOUT_RAISED_SHARE}/{name}")["mean_accuracy"]["modalshare"]
        by_set.setdefault(others["config"]["dataset"], []).append((others["config"], row, mine))
    near_all = lead_all = 0
    below_all, c = [], None
    for dataset, rows in sorted(by_set.items()):
        rec = load(root, f"{UNCOMPRESSED}/{dataset}.json")
        c = rec["config"]
        whole = rec["mean_accuracy"]["equal"]
        near = lead = 0
        below = []
        for cell, row, mine in rows:
            best = max(v for p, v in row.items() if p != "equal")
            near += best >= whole - _NEAR
            lead += mine - max(best, row["equal"]) >= _NEAR
            if mine < row["equal"]:
                below.append(f"{cell['compressor']} {cell['compression']:g}x: {(mine - row['equal']) * 100:+.1f} "
                             f"({(row['equal'] - whole) * 100:+.1f})")
        near_all, lead_all, below_all = near_all + near, lead_all + lead, below_all + below
        accs = [r["accuracy"] for r in rec["rows"]]
        lines.append(f"| {dataset} | {whole:.1%} ({min(accs):.1%}–{max(accs):.1%}) | {len(rows)} | {near} | {lead} | "
                     f"{'; '.join(below) or 'none'} |")
    lines += ["", f"Nothing compressed: equal keep-ratios at compression 1 (every value sent in bf16, `{c['compressor']}` "
              f"at ratio 1), the grids' protocol ({c['steps']} steps), {len(c['seeds'])} seeds, test accuracy (lowest–"
              f"highest). The cells: the raised-share comparison above (mean of {seeds} seeds). In {near_all} of "
              f"{len(cells)} cells the best other policy is within 3 points of the accuracy with nothing compressed "
              f"or above it; ModalShare leads the best other by 3 points or more in {lead_all}; it is below equal "
              f"keep-ratios in {len(below_all)} (`{UNCOMPRESSED}/`, `{HELDOUT_RAISED_SHARE}/`, "
              f"`{HELDOUT_OTHERS}/`, the grids' directories)."]
    return "\n".join(lines)


DCT_NEAREST = "results/cpu/split-dct-nearest"  # dct with nearest rounding both ways, equal keep-ratios


def _dct_cells(root: Path, folder: str) -> list[dict]:
    """The records of one of the dct runs' folders, by data set and then compression."""
    recs = [load(root, f"{folder}/{path.name}") for path in sorted((root / folder).glob("*.json"))]
    if not recs:
        raise ConfigError(f"figure: no records in {folder}")
    return sorted(recs, key=lambda r: (r["config"]["dataset"], r["config"]["compression"]))


def _moved(moves: list[float], leads: list[tuple]) -> str:
    """The range of a dct run's moves over its cells, and its leads over ``topk`` at the highest compression."""
    high = sorted((d, lead) for x, d, lead in leads if x >= 32)
    return (f"{min(moves) * 100:+.1f} to {max(moves) * 100:+.1f} points over {len(moves)} cells "
            f"({sum(m > 0 for m in moves)} above); at the highest compression against `topk`: "
            + ", ".join(f"{d} {lead * 100:+.1f}" for d, lead in high))


def dct_rounding(root: Path) -> str:
    """SL-FAC's codes rounded stochastically (the grids) and to nearest (:data:`DCT_NEAREST`), against top-k and
    uniform quantization at the same payloads, equal keep-ratios, on each data set and compression."""
    lines = ["| data set | compression | topk | quant | dct, stochastic | dct, nearest | nearest − stochastic | "
             "nearest − topk |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    grids = {"synthetic": GRID, **DATASET_GRIDS}
    moves, leads, n = [], [], 0
    for rec in _dct_cells(root, DCT_NEAREST):
        c = rec["config"]
        grid = _grid(root, grids[c["dataset"]])
        x = c["compression"]
        mean = lambda comp: grid[(comp, x)]["mean_accuracy"]["equal"]  # noqa: E731
        near = rec["mean_accuracy"]["equal"]
        moves.append(near - mean("dct"))
        leads.append((x, c["dataset"], near - mean("topk")))
        n = len(c["seeds"])
        lines.append(f"| {c['dataset']} | {x:g}x | {mean('topk'):.1%} | {mean('quant'):.1%} | {_acc(grid[('dct', x)], 'equal')} "
                     f"| {_acc(rec, 'equal')} | {moves[-1] * 100:+.1f} | {leads[-1][2] * 100:+.1f} |")
    lines += ["", f"Equal keep-ratios, test accuracy, mean of {n} seeds (lowest–highest for the two `dct` columns), "
              "each grid's protocol; `topk`, `quant` and stochastic `dct` are the grids' own records. Nearest "
              f"rounding against stochastic: {_moved(moves, leads)} (`{DCT_NEAREST}/`, the grids' directories)."]
    return "\n".join(lines)


DCT_FITTED = "results/cpu/split-dct-fitted"  # dct on fitted levels, nearest rounding both ways, equal keep-ratios


def dct_levels(root: Path) -> str:
    """SL-FAC's bands on fitted Gaussian levels (:data:`DCT_FITTED`) against its min-max grid with nearest rounding
    (:data:`DCT_NEAREST`) and against top-k, equal keep-ratios, on each data set and compression."""
    lines = ["| data set | compression | topk | dct, nearest | dct, fitted levels | fitted − nearest | fitted − topk |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    grids = {"synthetic": GRID, **DATASET_GRIDS}
    moves, leads, n = [], [], 0
    for rec in _dct_cells(root, DCT_FITTED):
        c = rec["config"]
        if c.get("levels") != "fitted" or c.get("rounding") != "nearest":
            raise ConfigError(f"figure: a record in {DCT_FITTED} is not fitted levels with nearest rounding")
        topk = _grid(root, grids[c["dataset"]])[("topk", c["compression"])]["mean_accuracy"]["equal"]
        nearest = load(root, f"{DCT_NEAREST}/{c['dataset']}-dct-{c['compression']:g}.json")
        fitted = rec["mean_accuracy"]["equal"]
        moves.append(fitted - nearest["mean_accuracy"]["equal"])
        leads.append((c["compression"], c["dataset"], fitted - topk))
        n = len(c["seeds"])
        lines.append(f"| {c['dataset']} | {c['compression']:g}x | {topk:.1%} | {_acc(nearest, 'equal')} | "
                     f"{_acc(rec, 'equal')} | {moves[-1] * 100:+.1f} | {leads[-1][2] * 100:+.1f} |")
    lines += ["", f"Equal keep-ratios, test accuracy, mean of {n} seeds (lowest–highest for the two `dct` columns), "
              "each grid's protocol; `topk` is the grids' own record, `dct, nearest` the rounding run's above. "
              f"Fitted levels against the min-max grid: {_moved(moves, leads)} (`{DCT_FITTED}/`, `{DCT_NEAREST}/`, "
              "the grids' directories)."]
    return "\n".join(lines)


SWITCH = "results/cpu/split-switch"  # the synthetic grid's protocol with a mid-training switch (--switch-step)
_POLICY_NAMES = {"equal": "equal", "equal-payload": "equal payload", "gradient-norm": "gradient norm",
                 "std": "SplitFC-style std", "modalshare": "ModalShare"}


def switch_table(root: Path) -> str:
    """Each policy's test accuracy after a mid-training switch of the informative stream, and where its budget
    went: the image's and the sensor's keep-ratios at the last refresh before the switch and at the end."""
    lines = ["| compression | policy | accuracy after the switch | image, sensor ratio before | image, sensor ratio "
             "at the end |", "|---:|---|---:|---:|---:|"]
    recs = [load(root, f"{SWITCH}/{p.name}") for p in sorted((root / SWITCH).glob("*.json"))]
    if not recs:
        raise ConfigError(f"figure: no records in {SWITCH}")
    for rec in sorted(recs, key=lambda r: r["config"]["compression"]):
        c = rec["config"]
        for policy in c["policies"]:
            rows = [r for r in rec["rows"] if r["policy"] == policy]
            accs = [r["accuracy"] for r in rows]

            def before(row):  # the last refresh's ratios before the switch (equal keep-ratios never change)
                hist = [h for h in row["history"] if h["step"] <= c["switch_step"]]
                return hist[-1]["ratios"] if hist else row["ratios"]

            pre = [before(r) for r in rows]
            end = [r["ratios"] for r in rows]
            mean = lambda ratios, i: sum(r[i] for r in ratios) / len(ratios)  # noqa: E731
            lines.append(f"| {c['compression']:g}x | {_POLICY_NAMES.get(policy, policy)} | "
                         f"{sum(accs) / len(accs):.1%} ({min(accs):.1%}–{max(accs):.1%}) | "
                         f"{mean(pre, 0):.3f}, {mean(pre, 1):.3f} | {mean(end, 0):.3f}, {mean(end, 1):.3f} |")
    c = recs[0]["config"]
    lines += ["", f"Synthetic suite, the grid's protocol ({c['steps']} steps, refreshes every {c['refresh']}, "
              f"`{c['compressor']}`), {len(c['seeds'])} seeds: from step {c['switch_step']} on, training and test "
              "samples have the image's patch clean and the sensor silent (before it, the sensor carries the class "
              "and the patch is noisy). Test accuracy on samples after the switch, mean (lowest–highest); keep-ratios "
              f"are shares of each stream's dense payload, mean of the seeds (`{SWITCH}/`)."]
    return "\n".join(lines)


def _for(render, grid):
    return lambda root: render(root, grid)


RENDERERS = {"split-modalshare": modalshare, "split-policies": policy_grid, "split-codecs": codec_grid,
             "split-absent": absent_ablation, "split-heldout": heldout_ablation,
             "split-heldout-others": heldout_on_equal_terms, "split-switch": switch_table,
             "split-heldout-equal-share": heldout_at_equal_shares,
             "split-heldout-raised-share": heldout_at_raised_shares,
             "split-uncompressed": against_uncompressed,
             "split-dct-rounding": dct_rounding, "split-dct-levels": dct_levels,
             **{f"split-policies-{name}": _for(policy_grid, grid) for name, grid in DATASET_GRIDS.items()},
             **{f"split-codecs-{name}": _for(codec_grid, grid) for name, grid in DATASET_GRIDS.items()}}
