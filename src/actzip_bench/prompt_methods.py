"""What the prompt benchmark compares, on one task at a time: the full prompt, no prompt, the prompt vector
(``actzip.prompt.PromptVector``) and three baselines fitted on the same examples.

- ``full``: the prompt's tokens, then the query.
- ``none``: the query alone.
- ``vector``: one slot before the query, the vector (softmax-weighted sum of the prompt's states entering
  block ``extract_layer``) written there entering block ``inject_layer``.
- ``task_vector`` (Hendel et al.): the state of the prompt's last token entering block L, written at the slot
  entering the same block; L chosen by accuracy on the fit examples.
- ``soft_prompt``: one free vector at the slot, entering block 0 (prompt tuning with one token), started from the
  mean of the prompt's embeddings.
- ``i2cl`` (I2CL-style context vectors): the mean of the prompt's states entering each block, added to every
  query position there with one learned coefficient per block; no slot.

Answers are greedy, up to the answer's end byte; a query counts as right when the bytes before that end are the
answer exactly.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F

from actzip.prompt import PromptVector, PromptVectorConfig
from actzip.prompt.hooks import capture, inject
from actzip.prompt.layers import decoder_blocks, forward_logits
from actzip_bench.data.instructions import ANSWER_END, answer_ids, prompt_ids, query_ids

__all__ = ["FitSettings", "METHODS", "MethodResult", "SLOT_BYTE", "evaluate_task", "greedy_answers"]

METHODS = ("full", "none", "vector", "task_vector", "soft_prompt", "i2cl")
SLOT_BYTE = ord("\n")  # the token at the slot before anything is written there (what precedes a query in a prompt)
_END = ord(ANSWER_END)


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
    fit_seconds: float  # 0 for the unfitted methods
    answers: list[str]  # what came out, per test query (for the probes)
    detail: dict  # method-specific facts (chosen layer, weights' entropy, ...)


def _device(model) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def greedy_answers(model, rows: Sequence[torch.Tensor], max_new: int) -> list[str]:
    """Greedy continuations of each row until the answer's end byte (or ``max_new`` bytes), batched.

    Rows are right-padded: the model is causal with absolute positions, so what follows a row's end does not
    change its logits.
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
        t = int(lengths.max())
        logits = forward_logits(model, buf[:, :t].to(device))
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


def _accuracy(answers: list[str], test: Sequence[tuple[str, str]]) -> float:
    return sum(a == want for a, (_, want) in zip(answers, test)) / len(test)


def _max_new(test: Sequence[tuple[str, str]]) -> int:
    return max(len(a) for _, a in test) + 2


def _teacher_batch(prefixes: Sequence[torch.Tensor], answers: Sequence[torch.Tensor], device
                   ) -> tuple[torch.Tensor, torch.Tensor]:
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
         prefixes, answers, steps: int, lrs: list[float]) -> float:
    """Adam on ``params`` with the model frozen; returns the seconds taken."""
    x, y = _teacher_batch(prefixes, answers, _device(model))
    frozen = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in frozen:
        p.requires_grad_(False)
    opt = torch.optim.Adam([{"params": [p], "lr": lr} for p, lr in zip(params, lrs)])
    start = time.perf_counter()
    try:
        for _ in range(steps):
            with context():
                logits = forward_logits(model, x)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if x.is_cuda:
            torch.cuda.synchronize()
    finally:
        for p, flag in frozen:
            p.requires_grad_(flag)
    return time.perf_counter() - start


def _slot_rows(queries: Sequence[str]) -> list[torch.Tensor]:
    return [torch.cat([torch.tensor([SLOT_BYTE]), query_ids(q)]) for q in queries]


def _prompt_states(model, prompt: torch.Tensor, layers) -> dict[int, torch.Tensor]:
    with torch.no_grad(), capture(model, layers) as cap:
        forward_logits(model, prompt.unsqueeze(0).to(_device(model)))
    return {layer: cap.states[layer][0].detach() for layer in layers}


def _run_full(model, task, fit, test, settings):
    p = prompt_ids(task)
    answers = greedy_answers(model, [torch.cat([p, query_ids(q)]) for q, _ in test], _max_new(test))
    return MethodResult("full", _accuracy(answers, test), len(p), 0.0, answers, {})


def _run_none(model, task, fit, test, settings):
    answers = greedy_answers(model, [query_ids(q) for q, _ in test], _max_new(test))
    return MethodResult("none", _accuracy(answers, test), 0, 0.0, answers, {})


def _run_vector(model, task, fit, test, settings):
    cfg = PromptVectorConfig(extract_layer=settings.extract_layer, inject_layer=settings.inject_layer,
                             steps=settings.steps, lr=settings.lr, slot_token_id=SLOT_BYTE)
    pv = PromptVector(model, cfg)
    pv.fit(prompt_ids(task), [(query_ids(q), answer_ids(a)) for q, a in fit])
    with pv.applied():
        answers = greedy_answers(model, _slot_rows([q for q, _ in test]), _max_new(test))
    w = pv.weights.positions
    entropy = float(-(w * w.clamp_min(1e-12).log()).sum())
    return MethodResult("vector", _accuracy(answers, test), 1, pv.fit_seconds, answers,
                        {"weight_entropy": entropy, "vector": pv.vector.float().cpu()})


def _run_task_vector(model, task, fit, test, settings):
    n = len(decoder_blocks(model))
    states = _prompt_states(model, prompt_ids(task), range(1, n))
    best, best_acc = 1, -1.0
    start = time.perf_counter()
    for layer in range(1, n):  # the layer that does best on the fit examples
        with inject(model, layer, states[layer][-1], slot=0, mode="replace"):
            acc = _accuracy(greedy_answers(model, _slot_rows([q for q, _ in fit]), _max_new(fit)), fit)
        if acc > best_acc:
            best, best_acc = layer, acc
    seconds = time.perf_counter() - start
    with inject(model, best, states[best][-1], slot=0, mode="replace"):
        answers = greedy_answers(model, _slot_rows([q for q, _ in test]), _max_new(test))
    return MethodResult("task_vector", _accuracy(answers, test), 1, seconds, answers, {"layer": best})


def _run_soft_prompt(model, task, fit, test, settings):
    start_vec = _prompt_states(model, prompt_ids(task), [0])[0].mean(0).float()
    vec = start_vec.clone().requires_grad_(True)
    rms = float(start_vec.pow(2).mean().sqrt())
    prefixes = _slot_rows([q for q, _ in fit])
    seconds = _fit(model, [vec], lambda: inject(model, 0, vec, slot=0, mode="replace"), prefixes,
                   [answer_ids(a) for _, a in fit], settings.steps, [settings.lr * rms])
    with torch.no_grad(), inject(model, 0, vec.detach(), slot=0, mode="replace"):
        answers = greedy_answers(model, _slot_rows([q for q, _ in test]), _max_new(test))
    return MethodResult("soft_prompt", _accuracy(answers, test), 1, seconds, answers, {})


@contextlib.contextmanager
def _added_everywhere(model, vectors: torch.Tensor, coef: torch.Tensor) -> Iterator[None]:
    """Add ``coef[l] * vectors[l]`` to every position of the stream entering block ``l``."""
    handles = []
    for layer, block in enumerate(decoder_blocks(model)):
        def hook(module, args, kwargs, layer=layer):
            add = lambda h: h + (coef[layer] * vectors[layer]).to(h.dtype)  # noqa: E731
            if args:
                return (add(args[0]), *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": add(kwargs["hidden_states"])}
        handles.append(block.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _run_i2cl(model, task, fit, test, settings):
    n = len(decoder_blocks(model))
    states = _prompt_states(model, prompt_ids(task), range(n))
    vectors = torch.stack([states[layer].mean(0).float() for layer in range(n)])
    coef = torch.zeros(n, device=vectors.device, requires_grad=True)
    prefixes = [query_ids(q) for q, _ in fit]
    seconds = _fit(model, [coef], lambda: _added_everywhere(model, vectors, coef), prefixes,
                   [answer_ids(a) for _, a in fit], settings.steps, [settings.lr])
    with torch.no_grad(), _added_everywhere(model, vectors, coef.detach()):
        answers = greedy_answers(model, [query_ids(q) for q, _ in test], _max_new(test))
    return MethodResult("i2cl", _accuracy(answers, test), 0, seconds, answers,
                        {"coefficients": coef.detach().cpu().tolist()})


_RUNNERS = {"full": _run_full, "none": _run_none, "vector": _run_vector, "task_vector": _run_task_vector,
            "soft_prompt": _run_soft_prompt, "i2cl": _run_i2cl}


def evaluate_task(model, task, fit: Sequence[tuple[str, str]], test: Sequence[tuple[str, str]],
                  methods: Sequence[str], settings: FitSettings) -> list[MethodResult]:
    """Every method in ``methods`` on one task (fit examples for the fitted ones, test examples scored)."""
    return [_RUNNERS[m](model, task, fit, test, settings) for m in methods]
