"""What the prompt benchmark compares, on a list of tasks at once: the full prompt, no prompt, the prompt vector
(``actzip.prompt.PromptVector``) and three baselines fitted on the same examples.

- ``full``: the prompt's tokens, then the query.
- ``none``: the query alone.
- ``vector``: one slot before the query, the vector (softmax-weighted sum of the prompt's states entering
  block ``extract_layer``, times a gain) written there entering block ``inject_layer``.
- ``task_vector`` (Hendel et al.): the state of the prompt's last token entering block L, written at the slot
  entering the same block; L chosen per task by accuracy on its fit examples.
- ``soft_prompt``: one free vector at the slot, entering block 0 (prompt tuning with one token), started from the
  mean of the prompt's embeddings.
- ``i2cl`` (I2CL-style context vectors): the mean of the prompt's states entering each block, added to every
  query position there with one learned coefficient per block; no slot.

Every task has its own parameters, but the tasks are fitted and answered in one batch (rows carry their task's
vector): each task's loss is its own mean answer loss, the batch loss their sum, so with Adam each task follows
the path it would alone. Answers are greedy, up to the answer's end byte; a query counts as right when the bytes
before that end are the answer exactly.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F

from actzip.errors import ConfigError
from actzip.prompt import PromptVector, PromptVectorConfig
from actzip.prompt.hooks import capture, inject
from actzip.prompt.layers import decoder_blocks, forward_logits
from actzip_bench.data.instruction_families import MAX_ANSWER
from actzip_bench.data.instructions import ANSWER_END, answer_ids, prompt_ids, query_ids

__all__ = ["FitSettings", "METHODS", "MethodResult", "SLOT_BYTE", "evaluate_tasks", "greedy_answers"]

METHODS = ("full", "none", "vector", "task_vector", "soft_prompt", "i2cl")
SLOT_BYTE = ord("\n")  # the token at the slot before anything is written there (what precedes a query in a prompt)
_END = ord(ANSWER_END)

Pairs = Sequence[tuple[str, str]]


@dataclass
class FitSettings:
    """How every fitted method is fitted (the same for all of them)."""

    steps: int = 150  # Adam steps on the fit examples, all in one batch
    lr: float = 0.05  # for logits and coefficients; free vectors take lr times their start's RMS
    extract_layer: int = 3  # the vector's L_e (the reference model's middle)
    inject_layer: int = 1  # the vector's L_i


@dataclass
class MethodResult:
    method: str
    accuracy: float
    prompt_positions: int  # positions the prompt costs a query
    fit_seconds: float  # this task's share of its batch's fit time (0 for the unfitted methods)
    answers: list[str]  # what came out, per test query (for the probes)
    detail: dict  # method-specific facts (chosen layer, weights' entropy, ...)


def _device(model) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def greedy_answers(model, rows: Sequence[torch.Tensor], max_new: int) -> list[str]:
    """Greedy continuations of each row until the answer's end byte (or ``max_new`` bytes), batched.

    Rows are right-padded: the model is causal, so what follows a row's end does not change its logits. Every
    forward runs the whole batch, so hooks holding one vector per row stay aligned with the rows.
    """
    device = _device(model)
    n = len(rows)
    lengths = torch.tensor([len(r) for r in rows])
    buf = torch.zeros(n, int(lengths.max()) + max_new, dtype=torch.long)
    for i, r in enumerate(rows):
        buf[i, :len(r)] = r
    out: list[list[int]] = [[] for _ in range(n)]
    live = torch.ones(n, dtype=torch.bool)
    for _ in range(max_new):
        logits = forward_logits(model, buf[:, :int(lengths.max())].to(device))
        nxt = logits[torch.arange(n, device=device), (lengths - 1).to(device)].argmax(-1).cpu()
        for i in torch.nonzero(live).flatten().tolist():
            tok = int(nxt[i])
            out[i].append(tok)
            buf[i, lengths[i]] = tok
            lengths[i] += 1
            if tok == _END:
                live[i] = False
        if not live.any():
            break
    return [bytes(o[:-1] if o and o[-1] == _END else o + [0]).decode("latin-1") for o in out]


def _owners(pairs: Sequence[Pairs]) -> torch.Tensor:
    return torch.tensor([t for t, p in enumerate(pairs) for _ in p])


def _per_task(answers: list[str], pairs: Sequence[Pairs]) -> tuple[list[float], list[list[str]]]:
    accs, split, i = [], [], 0
    for p in pairs:
        mine = answers[i:i + len(p)]
        i += len(p)
        split.append(mine)
        accs.append(sum(a == want for a, (_, want) in zip(mine, p)) / len(p))
    return accs, split


def _max_new(pairs: Sequence[Pairs]) -> int:
    # the suite's longest answer and its end byte, and one more: the same for every batch, so that a task's
    # answers do not depend on the tasks it shares a batch with
    return max(MAX_ANSWER, *(len(a) for p in pairs for _, a in p)) + 2


def _slot(q: str) -> torch.Tensor:
    return torch.cat([torch.tensor([SLOT_BYTE]), query_ids(q)])


def _answer(model, pairs: Sequence[Pairs], prefix: Callable[[int, str], torch.Tensor]):
    rows = [prefix(t, q) for t, p in enumerate(pairs) for q, _ in p]
    return _per_task(greedy_answers(model, rows, _max_new(pairs)), pairs)


def _teacher_batch(prefixes: Sequence[torch.Tensor], answers: Sequence[torch.Tensor], device):
    """Rows ``prefix + answer[:-1]`` right-padded, targets the answer bytes only."""
    seqs = [torch.cat([p, a[:-1]]) for p, a in zip(prefixes, answers)]
    width = max(len(s) for s in seqs)
    x = torch.zeros(len(seqs), width, dtype=torch.long)
    y = torch.full((len(seqs), width), -100, dtype=torch.long)
    for i, (s, p, a) in enumerate(zip(seqs, prefixes, answers)):
        x[i, :len(s)] = s
        y[i, len(p) - 1:len(p) - 1 + len(a)] = a
    return x.to(device), y.to(device)


def _fit(model, params: list[torch.Tensor], context: Callable[[], contextlib.AbstractContextManager],
         fits: Sequence[Pairs], prefix: Callable[[str], torch.Tensor], steps: int, lr: float) -> float:
    """Adam on ``params`` with the model frozen, loss the sum over tasks of each task's mean answer loss;
    returns the seconds taken."""
    device = _device(model)
    x, y = _teacher_batch([prefix(q) for p in fits for q, _ in p], [answer_ids(a) for p in fits for _, a in p],
                          device)
    owner = _owners(fits).to(device)
    counts = torch.zeros(len(fits), device=device).index_add_(0, owner, (y != -100).sum(1).float())
    frozen = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in frozen:
        p.requires_grad_(False)
    opt = torch.optim.Adam(params, lr=lr)
    start = time.perf_counter()
    try:
        for _ in range(steps):
            with context():
                logits = forward_logits(model, x)
            tok = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100,
                                  reduction="none").view(y.shape).sum(1)
            loss = (torch.zeros(len(fits), device=device).index_add_(0, owner, tok) / counts).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if x.is_cuda:
            torch.cuda.synchronize()
    finally:
        for p, flag in frozen:
            p.requires_grad_(flag)
    return time.perf_counter() - start


def _prompt_states(model, tasks, layers) -> list[dict[int, torch.Tensor]]:
    out = []
    for task in tasks:
        with torch.no_grad(), capture(model, layers) as cap:
            forward_logits(model, prompt_ids(task).unsqueeze(0).to(_device(model)))
        out.append({layer: cap.states[layer][0].detach().float() for layer in layers})
    return out


def _results(method, accs, answers, positions, seconds, details=None) -> list[MethodResult]:
    details = details or [{} for _ in accs]
    return [MethodResult(method, a, p, seconds / len(accs), ans, d)
            for a, ans, p, d in zip(accs, answers, positions, details)]


def _run_full(model, tasks, fits, tests, settings):
    accs, answers = _answer(model, tests, lambda t, q: torch.cat([prompt_ids(tasks[t]), query_ids(q)]))
    return _results("full", accs, answers, [len(prompt_ids(t)) for t in tasks], 0.0)


def _run_none(model, tasks, fits, tests, settings):
    accs, answers = _answer(model, tests, lambda t, q: query_ids(q))
    return _results("none", accs, answers, [0] * len(tasks), 0.0)


def _run_vector(model, tasks, fits, tests, settings):
    cfg = PromptVectorConfig(extract_layer=settings.extract_layer, inject_layer=settings.inject_layer,
                             steps=settings.steps, lr=settings.lr, slot_token_id=SLOT_BYTE)
    start = time.perf_counter()
    pvs = PromptVector.fit_many(model, [prompt_ids(t) for t in tasks],
                                [[(query_ids(q), answer_ids(a)) for q, a in p] for p in fits], cfg)
    seconds = time.perf_counter() - start
    vectors = torch.stack([pv.vector for pv in pvs])
    with inject(model, settings.inject_layer, vectors[_owners(tests).to(vectors.device)], slot=0):
        accs, answers = _answer(model, tests, lambda t, q: _slot(q))
    details = []
    for pv in pvs:
        w = pv.weights.positions
        details.append({"weight_entropy": float(-(w * w.clamp_min(1e-12).log()).sum()), "scale": pv.weights.scale,
                        "fit_loss": pv.loss_history[-1], "vector": pv.vector.float().cpu()})
    return _results("vector", accs, answers, [1] * len(tasks), seconds, details)


def _grouped_answers(model, tasks, pairs, layers: list[int], vectors: list[torch.Tensor]):
    """Answers with task t's vector at the slot entering block ``layers[t]`` (one batch per distinct layer)."""
    accs, answers = [0.0] * len(tasks), [[] for _ in tasks]
    for layer in sorted(set(layers)):
        mine = [t for t in range(len(tasks)) if layers[t] == layer]
        sub = [pairs[t] for t in mine]
        vecs = torch.stack([vectors[t] for t in mine])[_owners(sub).to(vectors[0].device)]
        with inject(model, layer, vecs, slot=0):
            a, ans = _answer(model, sub, lambda t, q: _slot(q))
        for j, t in enumerate(mine):
            accs[t], answers[t] = a[j], ans[j]
    return accs, answers


def _run_task_vector(model, tasks, fits, tests, settings):
    n = len(decoder_blocks(model))
    layers = list(range(1, n))
    start = time.perf_counter()
    states = _prompt_states(model, tasks, layers)
    best = [(-1.0, 1)] * len(tasks)
    for layer in layers:  # per task, the layer that does best on its fit examples
        accs, _ = _grouped_answers(model, tasks, fits, [layer] * len(tasks), [s[layer][-1] for s in states])
        best = [max(b, (a, -layer)) for b, a in zip(best, accs)]  # ties: the earlier layer
    chosen = [-b[1] for b in best]
    seconds = time.perf_counter() - start
    accs, answers = _grouped_answers(model, tasks, tests, chosen, [s[c][-1] for s, c in zip(states, chosen)])
    return _results("task_vector", accs, answers, [1] * len(tasks), seconds, [{"layer": c} for c in chosen])


def _run_soft_prompt(model, tasks, fits, tests, settings):
    starts = torch.stack([s[0].mean(0) for s in _prompt_states(model, tasks, [0])])
    rms = starts.pow(2).mean(1, keepdim=True).sqrt()
    # v = start + rms * u with u trained at lr: Adam on v at lr * rms, task by task
    u = torch.zeros_like(starts, requires_grad=True)
    fit_owner = _owners(fits).to(starts.device)
    seconds = _fit(model, [u], lambda: inject(model, 0, (starts + rms * u)[fit_owner], slot=0), fits, _slot,
                   settings.steps, settings.lr)
    vectors = (starts + rms * u).detach()
    with inject(model, 0, vectors[_owners(tests).to(vectors.device)], slot=0):
        accs, answers = _answer(model, tests, lambda t, q: _slot(q))
    return _results("soft_prompt", accs, answers, [1] * len(tasks), seconds)


@contextlib.contextmanager
def _added_everywhere(model, vectors: torch.Tensor, coef: torch.Tensor, owner: torch.Tensor) -> Iterator[None]:
    """Row r gets ``coef[t, l] * vectors[t, l]`` (t its task) added at every position entering block ``l``."""
    handles = []
    for layer, block in enumerate(decoder_blocks(model)):
        def hook(module, args, kwargs, layer=layer):
            add = (coef[owner, layer, None] * vectors[owner, layer])[:, None, :]
            if args:
                return (args[0] + add.to(args[0].dtype), *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": kwargs["hidden_states"] + add.to(kwargs["hidden_states"].dtype)}
        handles.append(block.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _run_i2cl(model, tasks, fits, tests, settings):
    n = len(decoder_blocks(model))
    states = _prompt_states(model, tasks, range(n))
    vectors = torch.stack([torch.stack([s[layer].mean(0) for layer in range(n)]) for s in states])  # (T, n, d)
    coef = torch.zeros(len(tasks), n, device=vectors.device, requires_grad=True)
    fit_owner = _owners(fits).to(vectors.device)
    seconds = _fit(model, [coef], lambda: _added_everywhere(model, vectors, coef, fit_owner), fits, query_ids,
                   settings.steps, settings.lr)
    with _added_everywhere(model, vectors, coef.detach(), _owners(tests).to(vectors.device)):
        accs, answers = _answer(model, tests, lambda t, q: query_ids(q))
    return _results("i2cl", accs, answers, [0] * len(tasks), seconds,
                    [{"coefficients": c} for c in coef.detach().cpu().tolist()])


_RUNNERS = {"full": _run_full, "none": _run_none, "vector": _run_vector, "task_vector": _run_task_vector,
            "soft_prompt": _run_soft_prompt, "i2cl": _run_i2cl}


def evaluate_tasks(model, tasks, fits: Sequence[Pairs], tests: Sequence[Pairs], methods: Sequence[str],
                   settings: FitSettings) -> dict[str, list[MethodResult]]:
    """Every method in ``methods`` on every task (``fits[t]`` fit task t, ``tests[t]`` are scored): per method,
    one result per task, in order."""
    if not (len(tasks) == len(fits) == len(tests)) or not tasks:
        raise ConfigError("evaluate_tasks: one fit and one test list per task, and at least one task")
    return {m: _RUNNERS[m](model, tasks, fits, tests, settings) for m in methods}
