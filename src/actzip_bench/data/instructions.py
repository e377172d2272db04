"""An instruction-following suite for a byte-level language model, generated from a seed.

Every example reads ``instruction + "\\n" + query + " = " + answer + "\\n"``: the prompt (the instruction and its
newline), the query part and the answer part, whose newline ends generation. One byte is one token, all ASCII.
The same query has different answers under different instructions (the families of
:mod:`actzip_bench.data.instruction_families`), and bijection tasks name their label words in the instruction,
so the answer has to come from the prompt.

Splits: ``"train"`` (train families, train paraphrases, train label words), ``"heldout_paraphrase"`` (train
families, the held-out wordings), ``"heldout_labels"`` (bijection families with at least one label word never
used in training) and ``"heldout_family"`` (the composed families, any wording, train label words).

A family's wordings are composed from parts (:attr:`Family.paraphrase_parts`), and the held-out ones are new
combinations of seen parts: about ``heldout_paraphrase_fraction`` of each family's wordings, whole cores (the
parts but the lead-in, under every lead-in) taken in a seeded order where every part of them (its text in its
slot) is still in some wording left for training.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from dataclasses import dataclass

import torch

from actzip.errors import ConfigError, DataError
from actzip_bench.data.corpus import decode
from actzip_bench.data.instruction_families import COMPOSED, FAMILIES, LABEL_NAMES, MAX_LABEL, Family, get_family

__all__ = ["ANSWER_END", "IGNORE", "LABEL_WORDS", "PAD", "PROMPT_END", "QUERY_END", "SPLITS",
           "InstructionSuite", "InstructionSuiteConfig", "Task", "answer_ids", "as_rng", "decode", "example_text",
           "instruction_batch", "instruction_rows", "prompt_ids", "query_ids", "split_examples"]

PROMPT_END = "\n"  # ends the instruction
QUERY_END = " = "  # ends the query
ANSWER_END = "\n"  # ends the answer, and generation
PAD = 0  # padding byte (never in the text)
IGNORE = -100  # target of every position that is not scored
SPLITS = ("train", "heldout_paraphrase", "heldout_labels", "heldout_family")
LABEL_WORDS = ("cat", "dog", "red", "sun", "tree", "fish", "blue", "moon", "lamp", "rock", "bird", "cup", "star",
               "leaf", "rain", "bell", "king", "milk", "ship", "wolf", "gold", "snow", "frog", "pen", "rose", "box",
               "hat", "key", "salt", "wind", "owl", "ink")
_MAX_LABELS = max(f.labels for f in FAMILIES)
_MAX_HELDOUT_FRACTION = 0.5


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class InstructionSuiteConfig:
    """What is held out for evaluation; everything else follows from ``seed``."""

    seed: int = 0  # fixes which paraphrases and label words are held out
    heldout_paraphrase_fraction: float = 0.2  # of each family's wordings, new combinations of seen parts, eval only
    heldout_labels: int = 8  # label words only used at evaluation (the last of a seeded shuffle of label_words)
    heldout_families: tuple[str, ...] = COMPOSED  # families never sampled for training
    label_words: tuple[str, ...] = LABEL_WORDS  # the pool bijection tasks draw their label words from

    def __post_init__(self) -> None:
        if not _is_int(self.seed):
            raise ConfigError(f"InstructionSuiteConfig.seed must be an int, got {self.seed!r}")
        v = self.heldout_paraphrase_fraction
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= _MAX_HELDOUT_FRACTION):
            raise ConfigError(f"InstructionSuiteConfig.heldout_paraphrase_fraction must be a number in [0, "
                              f"{_MAX_HELDOUT_FRACTION}] (training keeps at least half of each family's wordings), "
                              f"got {v!r}")
        self.label_words = tuple(self.label_words)
        for w in self.label_words:
            if not (isinstance(w, str) and w.isascii() and w.isalpha() and w.islower()
                    and 2 <= len(w) <= MAX_LABEL):
                raise ConfigError(f"InstructionSuiteConfig.label_words: {w!r} is not a lowercase ASCII word of 2 "
                                  f"to {MAX_LABEL} letters")
        if len(set(self.label_words)) != len(self.label_words):
            raise ConfigError("InstructionSuiteConfig.label_words has duplicates")
        most = len(self.label_words) - _MAX_LABELS
        if not _is_int(self.heldout_labels) or not 0 <= self.heldout_labels <= most:
            raise ConfigError(f"InstructionSuiteConfig.heldout_labels must be an int in [0, {most}] (training keeps "
                              f"{_MAX_LABELS} of the {len(self.label_words)} label words), got {self.heldout_labels!r}")
        self.heldout_families = tuple(self.heldout_families)
        for name in self.heldout_families:
            if not isinstance(name, str) or name not in {f.name for f in FAMILIES}:
                raise ConfigError(f"InstructionSuiteConfig.heldout_families: unknown family {name!r}")
        if len(set(self.heldout_families)) != len(self.heldout_families):
            raise ConfigError("InstructionSuiteConfig.heldout_families has duplicates")
        if len(self.heldout_families) == len(FAMILIES):
            raise ConfigError("InstructionSuiteConfig.heldout_families holds out every family; none is left to train")


@dataclass(frozen=True)
class Task:
    """One filled-in instruction: its family, the split it was drawn for, its parameters."""

    family: str  # the family's name
    kind: str  # the family's kind
    split: str  # the split it was drawn for
    instruction: str  # the filled text, without its newline
    params: tuple[tuple[str, int | str], ...] = ()  # numeric parameters and label words, by placeholder name
    template: str = ""  # the paraphrase the instruction was filled from

    @functools.cached_property
    def _params(self) -> dict[str, int | str]:
        return dict(self.params)

    @property
    def query_type(self) -> str:
        return get_family(self.family).query_type

    @property
    def labels(self) -> tuple[str, ...]:
        """The label words, in class order (empty unless the family has labels)."""
        return tuple(str(self._params[n]) for n in LABEL_NAMES if n in self._params)

    @property
    def n_queries(self) -> int | None:
        """How many distinct queries there are, or None where there are too many to list."""
        space = get_family(self.family).query_space(self._params)
        return None if space is None else len(space)

    def answer(self, query: str) -> str:
        """The answer to ``query`` under this instruction."""
        try:
            return get_family(self.family).solve(query, self._params)
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise DataError(f"Task {self.family!r}: query {query!r} is not a {self.query_type} it can answer "
                            f"({e})") from None

    def sample_queries(self, n: int, rng: random.Random) -> list[str]:
        """``n`` queries, distinct where the query space allows (then every query, then repeats)."""
        if not _is_int(n) or n < 0:
            raise ConfigError(f"Task.sample_queries: n must be an int >= 0, got {n!r}")
        fam = get_family(self.family)
        space = fam.query_space(self._params)
        if space is not None and n >= len(space):
            return rng.sample(space, len(space)) + [rng.choice(space) for _ in range(n - len(space))]
        seen: set[str] = set()
        out: list[str] = []
        for _ in range(50 * n + 50):
            if len(out) == n:
                break
            q = fam.sampler(rng, self._params)
            if q not in seen:
                seen.add(q)
                out.append(q)
        while len(out) < n:  # a sampler with few distinct queries and no listed space
            out.append(fam.sampler(rng, self._params))
        return out

    def examples(self, n: int, rng: random.Random) -> list[tuple[str, str]]:
        """``n`` ``(query, answer)`` pairs, queries distinct where the space allows."""
        return [(q, self.answer(q)) for q in self.sample_queries(n, rng)]


def _heldout_count(n: int, fraction: float) -> int:
    """How many of ``n`` wordings ``fraction`` asks to hold out: ``fraction * n`` rounded half up, at least 1
    unless ``fraction`` is 0."""
    return 0 if fraction == 0 else max(1, int(fraction * n + 0.5))


def _core(parts: tuple[str, ...]) -> tuple[str, ...]:
    """A wording's parts but its lead-in (the first), which alone would make a trivially new wording."""
    return parts[1:] if len(parts) > 1 else parts


def _split_wordings(fam: Family, fraction: float, seed: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(train, held)`` templates of ``fam``, each in the family's order.

    A wording's core is its parts but the lead-in; cores are held out whole (the core under every lead-in), in a
    seeded order, until at least ``fraction`` of the wordings are, each core only where every part of its
    wordings (slot and text) stays in some wording left for training. So a held-out wording is a combination of
    trained parts whose core training never shows, under any lead-in."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, w in enumerate(fam.paraphrase_parts):
        groups.setdefault(_core(w), []).append(i)
    cores = list(groups)  # the family's order: deterministic
    random.Random(f"actzip-instructions:{seed}:paraphrases:{fam.name}").shuffle(cores)
    want = _heldout_count(len(fam.paraphrases), fraction)
    left = Counter(part for w in fam.paraphrase_parts for part in enumerate(w))
    held: set[int] = set()
    for core in cores:
        if len(held) >= want:
            break
        parts = Counter(part for i in groups[core] for part in enumerate(fam.paraphrase_parts[i]))
        if all(left[p] > n for p, n in parts.items()):
            held.update(groups[core])
            left.subtract(parts)
    if len(held) < want:
        raise ConfigError(f"InstructionSuiteConfig.heldout_paraphrase_fraction = {fraction}: family {fam.name!r} "
                          f"can hold out only {len(held)} of its {len(fam.paraphrases)} wordings with every part "
                          f"still trained, not {want}")
    return (tuple(t for i, t in enumerate(fam.paraphrases) if i not in held),
            tuple(t for i, t in enumerate(fam.paraphrases) if i in held))


class InstructionSuite:
    """The families, split into train and held-out families, wordings and label words by the config's seed."""

    def __init__(self, config: InstructionSuiteConfig | None = None) -> None:
        self.config = cfg = config or InstructionSuiteConfig()
        held = set(cfg.heldout_families)
        self.train_families = tuple(f.name for f in FAMILIES if f.name not in held)
        self.heldout_families = tuple(cfg.heldout_families)
        words = list(cfg.label_words)
        random.Random(f"actzip-instructions:{cfg.seed}:labels").shuffle(words)
        cut = len(words) - cfg.heldout_labels
        self.train_labels, self.heldout_labels = tuple(words[:cut]), tuple(words[cut:])
        self._wordings = {f.name: _split_wordings(f, cfg.heldout_paraphrase_fraction, cfg.seed) for f in FAMILIES}
        self._split_families = {
            "train": self.train_families,
            "heldout_paraphrase": self.train_families if cfg.heldout_paraphrase_fraction else (),
            "heldout_labels": tuple(n for n in self.train_families if get_family(n).labels)
            if cfg.heldout_labels else (),
            "heldout_family": self.heldout_families,
        }

    def family(self, name: str) -> Family:
        """The family called ``name``."""
        return get_family(name)

    def families(self, split: str = "train") -> tuple[str, ...]:
        """The families ``split`` draws from."""
        return self._split_families[self._check_split(split)]

    def paraphrases(self, name: str, split: str = "train") -> tuple[str, ...]:
        """The templates of family ``name`` that ``split`` draws from."""
        train, held = self._wordings[get_family(name).name]
        split = self._check_split(split)
        if split == "heldout_paraphrase":
            return held
        return get_family(name).paraphrases if split == "heldout_family" else train

    def sample_task(self, rng: random.Random, split: str = "train") -> Task:
        """A task of ``split``: a family, a wording and parameters, drawn with ``rng``."""
        names = self.families(split)
        if not names:
            why = {"heldout_paraphrase": "heldout_paraphrase_fraction is 0",
                   "heldout_labels": "heldout_labels is 0, or no train family has label words",
                   "heldout_family": "heldout_families is empty"}[split]
            raise ConfigError(f"InstructionSuite: split {split!r} is empty (InstructionSuiteConfig.{why})")
        return self._draw(get_family(rng.choice(names)), rng, split)

    def task_for(self, name: str, rng: random.Random, split: str = "train") -> Task:
        """A task of family ``name`` as ``split`` draws it."""
        if name not in self.families(split):
            raise ConfigError(f"InstructionSuite: family {name!r} is not in split {split!r}")
        return self._draw(get_family(name), rng, split)

    def tasks(self, split: str, per_family: int, seed: int = 0) -> list[Task]:
        """``per_family`` tasks of every family of ``split``, family by family, fixed by ``seed``."""
        if not _is_int(per_family) or per_family < 1:
            raise ConfigError(f"InstructionSuite.tasks: per_family must be an int >= 1, got {per_family!r}")
        rng = random.Random(f"actzip-instructions:tasks:{seed}:{split}")
        return [self.task_for(n, rng, split) for n in self.families(split) for _ in range(per_family)]

    def _draw(self, fam: Family, rng: random.Random, split: str) -> Task:
        template = rng.choice(self.paraphrases(fam.name, split))
        params: list[tuple[str, int | str]] = [(n, rng.choice(values)) for n, values in fam.numbers]
        if fam.labels:
            if split == "heldout_labels":
                new = rng.choice(self.heldout_labels)
                rest = rng.sample([w for w in self.train_labels + self.heldout_labels if w != new], fam.labels - 1)
                words = rest[:]
                words.insert(rng.randrange(fam.labels), new)
            else:
                words = rng.sample(self.train_labels, fam.labels)
            params += list(zip(LABEL_NAMES, words))
        return Task(fam.name, fam.kind, split, template.format(**dict(params)), tuple(params), template)

    def split_examples(self, task: Task, n_fit: int, n_test: int, seed: int = 0, strict: bool = False,
                       ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """:func:`split_examples`."""
        return split_examples(task, n_fit, n_test, seed, strict)

    @staticmethod
    def _check_split(split: str) -> str:
        if split not in SPLITS:
            raise ConfigError(f"InstructionSuite: split {split!r} is unknown; choose from {SPLITS}")
        return split


# -- text and bytes ---------------------------------------------------------------------------------------------


def _ids(text: str) -> torch.Tensor:
    try:
        raw = text.encode("ascii")
    except UnicodeEncodeError:
        raise DataError(f"instruction text must be ASCII, got {text!r}") from None
    return torch.tensor(list(raw), dtype=torch.long)


def prompt_ids(task: Task) -> torch.Tensor:
    """The prompt's bytes, ``instruction + "\\n"``, as int64."""
    return _ids(task.instruction + PROMPT_END)


def query_ids(query: str) -> torch.Tensor:
    """The query part's bytes, ``query + " = "``, as int64."""
    return _ids(query + QUERY_END)


def answer_ids(answer: str) -> torch.Tensor:
    """The answer part's bytes, ``answer + "\\n"``, as int64."""
    return _ids(answer + ANSWER_END)


def example_text(task: Task, pairs: list[tuple[str, str]]) -> str:
    """The prompt followed by every ``query = answer`` line of ``pairs``."""
    return task.instruction + PROMPT_END + "".join(q + QUERY_END + a + ANSWER_END for q, a in pairs)


def split_examples(task: Task, n_fit: int, n_test: int, seed: int = 0, strict: bool = False,
                   ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``(fit, test)``: ``n_fit`` and ``n_test`` examples of ``task`` that share no query, fixed by ``seed``.

    A task with fewer distinct queries than ``n_fit + n_test`` (a weekday has 7) shares them out in proportion,
    each side keeping at least one; with ``strict`` that is a :class:`DataError` instead.
    """
    for name, v in (("n_fit", n_fit), ("n_test", n_test)):
        if not _is_int(v) or v < 0:
            raise ConfigError(f"split_examples: {name} must be an int >= 0, got {v!r}")
    rng = random.Random(f"actzip-instructions:examples:{seed}:{task.family}:{task.params}")
    need = n_fit + n_test
    queries = list(dict.fromkeys(task.sample_queries(need, rng)))  # distinct, in order
    fit_n, test_n = n_fit, n_test
    if len(queries) < need:
        if strict or len(queries) < (n_fit > 0) + (n_test > 0):
            raise DataError(f"split_examples: task {task.family!r} has {len(queries)} distinct queries, fewer "
                            f"than n_fit + n_test = {need}")
        fit_n = min(n_fit, max(1 if n_fit else 0, round(len(queries) * n_fit / need)), len(queries) - (n_test > 0))
        test_n = min(n_test, len(queries) - fit_n)
    pairs = [(q, task.answer(q)) for q in queries[:fit_n + test_n]]
    return pairs[:fit_n], pairs[fit_n:]


# -- training batches -----------------------------------------------------------------------------------------


def as_rng(generator_or_rng: random.Random | torch.Generator | int) -> random.Random:
    """A ``random.Random``: the one given, one seeded by an int, or one seeded from a torch generator."""
    if isinstance(generator_or_rng, random.Random):
        return generator_or_rng
    if isinstance(generator_or_rng, torch.Generator):
        return random.Random(int(torch.randint(2 ** 62, (1,), generator=generator_or_rng)))
    if _is_int(generator_or_rng):
        return random.Random(generator_or_rng)
    raise ConfigError(f"generator_or_rng must be a random.Random, a torch.Generator or an int seed, got "
                      f"{type(generator_or_rng).__name__}")


def _check_batch(batch_size: int, seq_len: int, pairs: tuple[int, int]) -> tuple[int, int]:
    if not _is_int(batch_size) or batch_size < 1:
        raise ConfigError(f"instruction batch: batch_size must be an int >= 1, got {batch_size!r}")
    if not _is_int(seq_len) or seq_len < 2:
        raise ConfigError(f"instruction batch: seq_len must be an int >= 2, got {seq_len!r}")
    try:
        lo, hi = pairs
    except (TypeError, ValueError):
        raise ConfigError(f"instruction batch: pairs must be (min, max), got {pairs!r}") from None
    if not (_is_int(lo) and _is_int(hi) and 1 <= lo <= hi):
        raise ConfigError(f"instruction batch: pairs must be ints with 1 <= min <= max, got {pairs!r}")
    return lo, hi


def instruction_rows(suite: InstructionSuite, batch_size: int, seq_len: int,
                     generator_or_rng: random.Random | torch.Generator | int, split: str = "train",
                     pairs: tuple[int, int] = (1, 4)) -> list[tuple[Task, list[tuple[str, str]]]]:
    """The rows :func:`instruction_batch` lays out, as ``(task, pairs)``: each row's task and its
    ``(query, answer)`` pairs (distinct queries, between ``pairs[0]`` and ``pairs[1]`` of them). Pairs after the
    first that would not fit whole in ``seq_len + 1`` bytes are left out; the first is cut if it must be."""
    lo, hi = _check_batch(batch_size, seq_len, pairs)
    rng = as_rng(generator_or_rng)
    rows = []
    for _ in range(batch_size):
        task = suite.sample_task(rng, split)
        used = len(task.instruction) + len(PROMPT_END)
        kept = []
        for q, a in task.examples(rng.randint(lo, hi), rng):
            n = len(q) + len(QUERY_END) + len(a) + len(ANSWER_END)
            if kept and used + n > seq_len + 1:
                break
            kept.append((q, a))
            used += n
        rows.append((task, kept))
    return rows


def instruction_batch(suite: InstructionSuite, batch_size: int, seq_len: int,
                      generator_or_rng: random.Random | torch.Generator | int, split: str = "train",
                      pairs: tuple[int, int] = (1, 4)) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)``: int64 ``[batch_size, seq_len]`` inputs and next-byte targets. Each row is one task's prompt and
    its ``query = answer`` lines (:func:`instruction_rows`), padded with byte 0; ``y`` is -100 except where the
    next byte is an answer byte or the newline that ends it."""
    rows = instruction_rows(suite, batch_size, seq_len, generator_or_rng, split, pairs)
    width = seq_len + 1
    text = bytearray(batch_size * width)
    scored = bytearray(batch_size * width)
    for i, (task, kept) in enumerate(rows):
        seq = bytearray((task.instruction + PROMPT_END).encode("ascii"))
        mark = bytearray(len(seq))
        for q, a in kept:
            qb, ab = (q + QUERY_END).encode("ascii"), (a + ANSWER_END).encode("ascii")
            seq += qb + ab
            mark += bytes(len(qb)) + b"\x01" * len(ab)
        n = min(len(seq), width)
        text[i * width:i * width + n] = seq[:n]
        scored[i * width:i * width + n] = mark[:n]
    ids = torch.frombuffer(text, dtype=torch.uint8).view(batch_size, width).long()
    mask = torch.frombuffer(scored, dtype=torch.uint8).view(batch_size, width)[:, 1:].bool()
    return ids[:, :-1].contiguous(), torch.where(mask, ids[:, 1:], IGNORE)
