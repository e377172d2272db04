"""``PromptVector``: an instruction prompt folded into one residual-stream vector of a frozen causal LM.

The prompt runs through the model once; the vector is a learned weighted sum of its hidden states at
``extract_layer`` (a softmax over the prompt's positions, optionally also one over nearby layers, times a
learned gain), written at one slot position in front of each query at ``inject_layer`` instead of the prompt's
tokens. Only the weights' logits and the gain are fitted, on a handful of (query, answer) examples, so a fixed
prompt then costs each query one position. ``compress_(model, PromptVectorConfig(..., vector_path=...))``
installs a saved vector on every forward; ``restore_`` removes it.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from actzip.api import CompressReport, FilterFn, add_undo, register_handler
from actzip.errors import ConfigError, MissingDependencyError, PromptVectorMismatchError
from actzip.prompt.config import PromptVectorConfig
from actzip.prompt.hooks import capture, inject, inject_hook
from actzip.prompt.layers import check_layer, decoder_blocks, embedding, forward_logits, hidden_size

__all__ = ["PromptVector", "VectorWeights", "install_prompt_vector"]

META_KEY = "actzip.prompt_vector"  # the safetensors metadata entry holding the JSON record
FORMAT = 1  # the file layout's version
IGNORE = -100  # target of positions the loss leaves out


@dataclass(frozen=True)
class VectorWeights:
    """How a fitted vector mixes the prompt's states."""

    positions: torch.Tensor  # (prompt length,) softmax weights over the prompt's positions, summing to 1
    layers: torch.Tensor | None  # softmax weights over layer_indices; None when over_layers is 0
    layer_indices: tuple[int, ...]  # the residual-stream indices mixed (extract_layer alone when over_layers is 0)
    scale: float  # the gain on the weighted sum (1.0 without learn_scale)


def _device(model: nn.Module) -> torch.device:
    for t in (*model.parameters(), *model.buffers()):
        return t.device
    return torch.device("cpu")


def _ids(x, what: str, *, empty_ok: bool = False) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() != 1 or x.is_floating_point() or x.is_complex():
        raise ConfigError(f"{what} must be a 1-D tensor of token ids, got "
                          f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if not empty_ok and x.numel() == 0:
        raise ConfigError(f"{what} is empty")
    return x.long()


def _tokens(model: nn.Module, name: str) -> list[int]:
    """The token ids the model's generation config (else its config) gives as ``name``, those in its vocabulary."""
    emb = embedding(model)
    vocab = emb.num_embeddings if emb is not None else getattr(getattr(model, "config", None), "vocab_size", None)
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        value = getattr(source, name, None)
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        found = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0
                 and (vocab is None or v < vocab)]
        if found:
            return found
    return []


def _token(model: nn.Module, *names: str) -> int | None:
    """The first token id of ``names`` (in order) the model names."""
    return next((found[0] for name in names if (found := _tokens(model, name))), None)


@contextmanager
def _held(model: nn.Module, *, freeze: bool) -> Iterator[None]:
    """The model in eval mode (and with ``freeze`` its parameters frozen), each module's mode and each
    parameter's requires_grad put back after."""
    modes = [(m, m.training) for m in model.modules()]
    grads = [(p, p.requires_grad) for p in model.parameters()]
    model.eval()
    if freeze:
        for p, _ in grads:
            p.requires_grad_(False)
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training
        for p, wanted in grads:
            p.requires_grad_(wanted)


def _safetensors():
    try:
        import safetensors.torch  # optional: only saving and loading vectors need it
    except ImportError as e:
        raise MissingDependencyError("saving and loading prompt vectors needs safetensors: pip install safetensors "
                                     "(transformers, of 'actzip[hf]', brings it)") from e
    return safetensors


def _version() -> str:
    try:
        return importlib.metadata.version("actzip")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class PromptVector:
    """One prompt's vector for one model: fit it, apply it, generate with it, save and load it."""

    def __init__(self, model: nn.Module, config: PromptVectorConfig | None = None, **fields):
        if config is not None and fields:
            raise ConfigError(f"PromptVector: give a config or its fields, not both (got config and "
                              f"{', '.join(sorted(fields))})")
        config = PromptVectorConfig(**fields) if config is None else config
        if not isinstance(config, PromptVectorConfig):
            raise ConfigError(f"PromptVector: config must be a PromptVectorConfig, got {type(config).__name__}")
        self.model, self.config = model, config
        n = len(decoder_blocks(model))
        check_layer(model, config.extract_layer, "PromptVectorConfig.extract_layer", allow_output=True)
        check_layer(model, config.inject_layer, "PromptVectorConfig.inject_layer", allow_output=False)
        e, k = config.extract_layer, config.over_layers
        self.layer_indices = tuple(range(max(0, e - k), min(n, e + k) + 1))
        self.hidden_size = hidden_size(model)
        self.n_blocks = n
        slot = config.slot_token_id if config.slot_token_id is not None else _token(model, "bos_token_id",
                                                                                      "pad_token_id")
        self.slot_token_id = 0 if slot is None else slot
        self.prompt_length: int | None = None
        self.position_logits: torch.Tensor | None = None  # (prompt length,) softmax gives the position weights
        self.layer_logits: torch.Tensor | None = None  # (len(layer_indices),) with over_layers > 0
        self.scale: torch.Tensor | None = None  # () the gain
        self.loss_history: list[float] = []  # the answer loss before each step, then after the last one
        self.fit_seconds: float | None = None
        self._vector: torch.Tensor | None = None

    # -- fitting -----------------------------------------------------------------------------------------------

    def _init_weights(self, prompt_length: int, device: torch.device) -> None:
        # The last prompt position starts with half the weight: a causal LM reads the whole prompt there (its
        # next-token state), while an even mean is dominated by the tokens' own identities and by the first
        # position's outsized state; the other half spread over the rest keeps every position's gradient alive.
        self.position_logits = torch.zeros(prompt_length, device=device)
        if prompt_length > 1:
            self.position_logits[-1] = math.log(prompt_length - 1)
        n = len(self.layer_indices)
        if n > 1:
            self.layer_logits = torch.zeros(n, device=device)
            self.layer_logits[self.layer_indices.index(self.config.extract_layer)] = math.log(n - 1)
        self.scale = torch.ones((), device=device)

    def _mix(self, states: torch.Tensor) -> torch.Tensor:
        per_layer = torch.einsum("p,lpd->ld", torch.softmax(self.position_logits, 0), states)
        mixed = per_layer[0] if self.layer_logits is None else torch.softmax(self.layer_logits, 0) @ per_layer
        return self.scale * mixed

    def _batch(self, examples, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows, targets = [], []
        for i, pair in enumerate(examples):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise ConfigError(f"fit: examples[{i}] must be a (query_ids, answer_ids) pair, got "
                                  f"{type(pair).__name__}")
            q = _ids(pair[0], f"fit: examples[{i}] query_ids", empty_ok=True).to(device)
            a = _ids(pair[1], f"fit: examples[{i}] answer_ids").to(device)
            full = torch.cat([q.new_tensor([self.slot_token_id]), q, a])
            y = full[1:].clone()
            y[: q.numel()] = IGNORE  # the query's own tokens are given, not asked for
            rows.append(full[:-1])
            targets.append(y)
        width = max(r.numel() for r in rows)
        ids = torch.full((len(rows), width), self.slot_token_id, dtype=torch.long, device=device)
        ys = torch.full((len(rows), width), IGNORE, dtype=torch.long, device=device)
        mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
        for i, (r, y) in enumerate(zip(rows, targets)):  # right padding: the slot stays at index 0 of every row
            ids[i, : r.numel()], ys[i, : y.numel()], mask[i, : r.numel()] = r, y, 1
        return ids, ys, mask

    def _loss(self, vector: torch.Tensor, ids: torch.Tensor, ys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        with inject(self.model, self.config.inject_layer, vector, slot=0, mode=self.config.mode):
            logits = forward_logits(self.model, ids, mask)
        return F.cross_entropy(logits.float().flatten(0, 1), ys.flatten(), ignore_index=IGNORE)

    def fit(self, prompt_ids: torch.Tensor, examples: Sequence, *, progress: bool = False) -> "PromptVector":
        """Fit the weights on ``examples`` (``(query_ids, answer_ids)`` pairs of 1-D token tensors) with the model
        frozen: cross-entropy of each answer after ``[slot] + query``, with the vector at the slot, every example
        in every step. ``loss_history`` gets ``steps + 1`` values, the last the fitted vector's. Returns self."""
        prompt_ids = _ids(prompt_ids, "fit: prompt_ids")
        examples = list(examples)
        if not examples:
            raise ConfigError("fit: examples is empty; give at least one (query_ids, answer_ids) pair")
        model, cfg, device = self.model, self.config, _device(self.model)
        start = time.perf_counter()
        forked = [device.index or 0] if device.type == "cuda" else []
        with _held(model, freeze=True), torch.random.fork_rng(devices=forked):
            torch.manual_seed(cfg.seed)
            ids, ys, mask = self._batch(examples, device)
            with torch.no_grad(), capture(model, self.layer_indices) as cap:
                forward_logits(model, prompt_ids.to(device).unsqueeze(0))
            states = torch.stack([cap.states[i][0].float() for i in self.layer_indices])  # (layers, P, d)
            self._init_weights(prompt_ids.numel(), device)
            params = [self.position_logits] + ([self.layer_logits] if self.layer_logits is not None else [])
            params += [self.scale] if cfg.learn_scale else []
            for p in params:
                p.requires_grad_(True)
            opt = torch.optim.Adam(params, lr=cfg.lr)
            self.loss_history = []
            every = max(1, cfg.steps // 10)
            for step in range(cfg.steps):
                loss = self._loss(self._mix(states), ids, ys, mask)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                self.loss_history.append(loss.item())
                if progress and (step % every == 0 or step == cfg.steps - 1):
                    print(f"prompt vector: step {step + 1}/{cfg.steps} answer loss {loss.item():.4f}", file=sys.stderr)
            with torch.no_grad():
                for p in params:
                    p.requires_grad_(False)
                self._vector = self._mix(states).detach()
                self.loss_history.append(self._loss(self._vector, ids, ys, mask).item())
        self.prompt_length = prompt_ids.numel()
        self.fit_seconds = time.perf_counter() - start
        return self

    @classmethod
    def fit_many(cls, model: nn.Module, prompts: Sequence[torch.Tensor], examples: Sequence[Sequence],
                 config: PromptVectorConfig | None = None, **fields) -> list["PromptVector"]:
        """One vector per prompt (``examples[i]`` are prompt i's pairs), all fitted in one batch a step: the
        loss is the sum of each prompt's mean answer loss and every prompt has its own weights, so each follows
        the trajectory of its own :meth:`fit` (Adam acts elementwise), up to floating-point rounding; many
        prompts then cost about as many steps as one. ``loss_history`` of each is its own."""
        if len(prompts) != len(examples) or not prompts:
            raise ConfigError(f"fit_many: need one examples list per prompt and at least one prompt, got "
                              f"{len(prompts)} prompts and {len(examples)} example lists")
        pvs = [cls(model, config, **fields) for _ in prompts]
        cfg, device = pvs[0].config, _device(model)
        start = time.perf_counter()
        forked = [device.index or 0] if device.type == "cuda" else []
        with _held(model, freeze=True), torch.random.fork_rng(devices=forked):
            torch.manual_seed(cfg.seed)
            states, batches = [], []
            for i, (pv, prompt, ex) in enumerate(zip(pvs, prompts, examples)):
                prompt = _ids(prompt, f"fit_many: prompts[{i}]")
                if not list(ex):
                    raise ConfigError(f"fit_many: examples[{i}] is empty")
                with torch.no_grad(), capture(model, pv.layer_indices) as cap:
                    forward_logits(model, prompt.to(device).unsqueeze(0))
                states.append(torch.stack([cap.states[j][0].float() for j in pv.layer_indices]))
                batches.append(pv._batch(list(ex), device))
                pv._init_weights(prompt.numel(), device)
                pv.prompt_length = prompt.numel()
            width = max(b[0].shape[1] for b in batches)
            pad = lambda t, v: F.pad(t, (0, width - t.shape[1]), value=v)  # noqa: E731
            ids = torch.cat([pad(b[0], pvs[0].slot_token_id) for b in batches])
            ys = torch.cat([pad(b[1], IGNORE) for b in batches])
            mask = torch.cat([pad(b[2], 0) for b in batches])
            owner = torch.cat([torch.full((b[0].shape[0],), i, device=device) for i, b in enumerate(batches)])
            counts = torch.zeros(len(pvs), device=device).index_add_(0, owner, (ys != IGNORE).sum(1).float())
            params = [t for pv in pvs for t in (pv.position_logits, pv.layer_logits,
                                                 pv.scale if cfg.learn_scale else None) if t is not None]
            for p in params:
                p.requires_grad_(True)
            opt = torch.optim.Adam(params, lr=cfg.lr)

            def per_prompt(vectors: torch.Tensor) -> torch.Tensor:
                with inject(model, cfg.inject_layer, vectors[owner], slot=0, mode=cfg.mode):
                    logits = forward_logits(model, ids, mask)
                tok = F.cross_entropy(logits.float().flatten(0, 1), ys.flatten(), ignore_index=IGNORE,
                                      reduction="none").view(ys.shape).sum(1)
                return torch.zeros(len(pvs), device=device).index_add_(0, owner, tok) / counts

            history = []
            for _ in range(cfg.steps):
                losses = per_prompt(torch.stack([pv._mix(st) for pv, st in zip(pvs, states)]))
                opt.zero_grad(set_to_none=True)
                losses.sum().backward()
                opt.step()
                history.append(losses.detach())
            with torch.no_grad():
                for p in params:
                    p.requires_grad_(False)
                for pv, st in zip(pvs, states):
                    pv._vector = pv._mix(st).detach()
                history.append(per_prompt(torch.stack([pv._vector for pv in pvs])))
        table = torch.stack(history).cpu().tolist()  # one host copy for the whole fit
        seconds = time.perf_counter() - start
        for i, pv in enumerate(pvs):
            pv.loss_history = [row[i] for row in table]
            pv.fit_seconds = seconds / len(pvs)
        return pvs

    # -- using it ----------------------------------------------------------------------------------------------

    def _fitted(self) -> torch.Tensor:
        if self._vector is None:
            raise ConfigError("PromptVector has no vector yet: fit(prompt_ids, examples) or PromptVector.load(path, "
                              "model) first")
        return self._vector

    @property
    def vector(self) -> torch.Tensor:
        """The (d,) vector written at the slot (float32, detached)."""
        return self._fitted()

    @property
    def weights(self) -> VectorWeights:
        """The softmax weights over the prompt's positions (and layers) and the gain."""
        self._fitted()
        layers = None if self.layer_logits is None else torch.softmax(self.layer_logits, 0)
        return VectorWeights(torch.softmax(self.position_logits, 0), layers, self.layer_indices, float(self.scale))

    def input_ids(self, query_ids: torch.Tensor) -> torch.Tensor:
        """``[slot] + query``: what the model reads in place of ``prompt + query`` (1-D, on the model's device)."""
        q = _ids(query_ids, "input_ids: query_ids", empty_ok=True).to(_device(self.model))
        return torch.cat([q.new_tensor([self.slot_token_id]), q])

    def batch_input_ids(self, queries: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids, attention_mask)`` of several queries, left-padded (the form ``generate`` takes); under
        a HuggingFace ``generate`` each row's slot is its first real token."""
        rows = [self.input_ids(q) for q in queries]
        if not rows:
            raise ConfigError("batch_input_ids: no queries given")
        width = max(r.numel() for r in rows)
        pad = _token(self.model, "pad_token_id", "eos_token_id")
        ids = torch.full((len(rows), width), self.slot_token_id if pad is None else pad, dtype=torch.long,
                         device=rows[0].device)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, width - r.numel():], mask[i, width - r.numel():] = r, 1
        return ids, mask

    @contextmanager
    def applied(self) -> Iterator[None]:
        """Inside the block, every forward of the model has the vector at position 0 (the slot)."""
        with inject(self.model, self.config.inject_layer, self._fitted(), slot=0, mode=self.config.mode):
            yield

    def _eos(self, eos_token_id) -> list[int]:
        if eos_token_id is None:
            return _tokens(self.model, "eos_token_id")
        ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        if any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
            raise ConfigError(f"generate: eos_token_id must be None, an int or a list of ints, got {eos_token_id!r}")
        return ids

    def generate(self, query_ids, max_new_tokens: int = 16, eos_token_id: int | Sequence[int] | None = None
                 ) -> list[torch.Tensor]:
        """Greedy continuations of one query (a 1-D tensor) or a list of them, the vector applied, the model in
        eval mode: the new tokens of each, ending with eos when it came (``eos_token_id`` None: the model's own,
        if it names any). A HuggingFace model runs its own ``generate`` (KV cache, left-padded batch); any other
        re-runs the whole sequence for each token, one query at a time."""
        queries = [query_ids] if isinstance(query_ids, torch.Tensor) else list(query_ids)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ConfigError(f"generate: max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        eos = self._eos(eos_token_id)
        with _held(self.model, freeze=False), torch.no_grad(), self.applied():
            if callable(getattr(self.model, "generate", None)) and hasattr(self.model, "generation_config"):
                return self._hf_generate(queries, max_new_tokens, eos)
            return [self._greedy(q, max_new_tokens, eos) for q in queries]

    def _hf_generate(self, queries, max_new_tokens: int, eos: list[int]) -> list[torch.Tensor]:
        ids, mask = self.batch_input_ids(queries)
        pad = _token(self.model, "pad_token_id", "eos_token_id")
        out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                  do_sample=False, num_beams=1, eos_token_id=eos or None,
                                  pad_token_id=self.slot_token_id if pad is None else pad)
        return [self._until_eos(row, eos) for row in out[:, ids.shape[1]:]]

    def _greedy(self, query: torch.Tensor, max_new_tokens: int, eos: list[int]) -> torch.Tensor:
        ids = self.input_ids(query).unsqueeze(0)
        start = ids.shape[1]
        for _ in range(max_new_tokens):
            nxt = forward_logits(self.model, ids)[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
            if int(nxt) in eos:
                break
        return ids[0, start:]

    @staticmethod
    def _until_eos(row: torch.Tensor, eos: list[int]) -> torch.Tensor:
        if eos:
            hits = torch.isin(row, row.new_tensor(eos)).nonzero()
            if hits.numel():
                return row[: int(hits[0, 0]) + 1]
        return row

    # -- files -------------------------------------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        """Write the vector, its weight logits and gain, and what it was fitted on, as one safetensors file."""
        vector = self._fitted()
        st = _safetensors()
        tensors = {"vector": vector, "position_logits": self.position_logits, "scale": self.scale}
        if self.layer_logits is not None:
            tensors["layer_logits"] = self.layer_logits
        record = {"format": FORMAT, "config": self.config.to_dict(), "model_class": type(self.model).__name__,
                  "hidden_size": self.hidden_size, "n_blocks": self.n_blocks, "prompt_length": self.prompt_length,
                  "slot_token_id": self.slot_token_id, "layer_indices": list(self.layer_indices),
                  "actzip_version": _version()}
        st.torch.save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path),
                           metadata={META_KEY: json.dumps(record)})

    @classmethod
    def load(cls, path: str | Path, model: nn.Module) -> "PromptVector":
        """The vector :meth:`save` wrote, for ``model``; a model of another class, width or block count than the
        one it was fitted on raises :class:`~actzip.errors.PromptVectorMismatchError`."""
        st = _safetensors()
        if not Path(path).is_file():
            raise FileNotFoundError(f"PromptVector.load: no file at {path}")
        with st.safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get(META_KEY)
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        try:
            record = json.loads(raw)
            fitted = (record["model_class"], record["hidden_size"], record["n_blocks"])
            config = PromptVectorConfig.from_dict(record["config"])
        except (TypeError, KeyError, ValueError) as e:
            raise ConfigError(f"PromptVector.load: {path} is not a prompt vector file written by PromptVector.save "
                              f"({e})") from None
        here = (type(model).__name__, hidden_size(model), len(decoder_blocks(model)))
        differs = [f"{what} {a!r} != {b!r}" for what, a, b in zip(("class", "hidden size", "blocks"), fitted, here)
                   if a != b]
        if differs:
            raise PromptVectorMismatchError(
                f"PromptVector.load({path}): the vector was fitted on {fitted[0]} (hidden size {fitted[1]}, "
                f"{fitted[2]} blocks), not on this {here[0]} (hidden size {here[1]}, {here[2]} blocks): "
                + "; ".join(differs))
        pv = cls(model, config)
        device = _device(model)
        pv.position_logits, pv.scale = tensors["position_logits"].to(device), tensors["scale"].to(device)
        pv.layer_logits = tensors["layer_logits"].to(device) if "layer_logits" in tensors else None
        pv._vector = tensors["vector"].to(device)
        pv.prompt_length = record.get("prompt_length")
        pv.slot_token_id = record.get("slot_token_id", pv.slot_token_id)
        return pv


@register_handler(PromptVectorConfig)
def install_prompt_vector(model: nn.Module, config: PromptVectorConfig, filter_fn: FilterFn | None,
                          report: CompressReport) -> None:
    """``compress_`` for :class:`PromptVectorConfig`: the saved vector at ``config.vector_path`` is written at
    position 0 of every forward of ``model`` (the slot) until ``restore_``."""
    if config.vector_path is None:
        raise ConfigError("compress_(PromptVectorConfig): vector_path is None; set PromptVectorConfig.vector_path "
                          "to the file PromptVector.save wrote")
    pv = PromptVector.load(config.vector_path, model)
    differs = [f"{f}={getattr(pv.config, f)!r} in the file, {getattr(config, f)!r} in the config"
               for f in ("extract_layer", "inject_layer", "mode") if getattr(pv.config, f) != getattr(config, f)]
    if differs:
        raise ConfigError(f"compress_(PromptVectorConfig): {config.vector_path} was fitted otherwise: "
                          + "; ".join(differs))
    block = decoder_blocks(model)[config.inject_layer]
    fqn = next(name for name, m in model.named_modules() if m is block)
    if filter_fn is not None and not filter_fn(block, fqn):
        report.skipped.append((fqn, "excluded by filter_fn"))
        return
    handle = inject_hook(model, config.inject_layer, pv.vector, slot=0, mode=config.mode)
    add_undo(model, handle.remove)
    report.swapped.append((fqn, f"prompt vector ({config.mode}) written at position 0 entering this block, fitted "
                                f"on a {pv.prompt_length}-token prompt at layer {config.extract_layer}"))
    report.notes.append(f"prompt vector: position 0 of every input is the slot; start inputs with token "
                        f"{pv.slot_token_id} (PromptVector.input_ids)")
