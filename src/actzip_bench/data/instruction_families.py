"""The task families of the instruction suite: what an instruction asks, in many wordings.

A :class:`Family` is one kind of instruction (reverse the word, add k, ...) with its paraphrases, a query sampler
and an answer function, all deterministic given a ``random.Random``. Paraphrases are format strings: ``{k}`` and
``{m}`` stand for numeric parameters, ``{a}``, ``{b}``, ``{c}`` for the label words of classes 0, 1, 2. Each is
composed from parts (:mod:`actzip_bench.data.instruction_wordings`: a lead-in, a verb phrase, an object phrase, a
closer), kept as :attr:`Family.paraphrase_parts`, so that a held-out wording can be a new combination of seen
parts. Queries are pseudo-words (``"bolet"``), numbers 0-99, 3 to 5 digits (``"3 1 4"``), months, weekdays,
letters and country names; the country families read names and ISO codes from pycountry (the ``bench`` extra).
"""

from __future__ import annotations

import functools
import random
import string
from dataclasses import dataclass
from typing import Callable, Mapping

from actzip.errors import ConfigError, MissingDependencyError
from actzip_bench.data.instruction_wordings import render, wordings

__all__ = ["COMPOSED", "FAMILIES", "KINDS", "LABEL_NAMES", "MAX_ANSWER", "MAX_INSTRUCTION", "MAX_LABEL", "MAX_QUERY",
           "MONTHS", "QUERY_TYPES", "WEEKDAYS", "Family", "countries", "digit_list", "get_family", "pseudo_word"]

KINDS = ("string", "arithmetic", "list", "lookup", "bijection", "composed")
QUERY_TYPES = ("word", "number", "digits", "month", "weekday", "letter", "country")
LABEL_NAMES = ("a", "b", "c")  # the placeholders of the label words of classes 0, 1, 2
MAX_QUERY = 16  # bytes
MAX_ANSWER = 12  # bytes, without the newline that ends it
MAX_INSTRUCTION = 64  # bytes, filled in, without its newline
MAX_LABEL = 4  # bytes of a label word at most
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
VOWELS = "aeiou"
_ONSETS = "bcdfghjklmnprstvwz"
_CODAS = "lmnrst"
_NUMBERS = tuple(str(i) for i in range(100))

Params = Mapping[str, "int | str"]


# -- queries ---------------------------------------------------------------------------------------------------


def pseudo_word(rng: random.Random) -> str:
    """A lowercase pseudo-word of 3 to 7 letters, built from syllables (about one in four starts on a vowel)."""
    n = rng.randint(3, 7)
    out = "" if rng.random() < 0.25 else rng.choice(_ONSETS)
    while len(out) < n:
        out += rng.choice(VOWELS) + (rng.choice(_CODAS) if rng.random() < 0.3 else "") + rng.choice(_ONSETS)
    return out[:n]


def digit_list(rng: random.Random) -> str:
    """3 to 5 digits, space-separated: ``"3 1 4 1"``."""
    return " ".join(str(rng.randrange(10)) for _ in range(rng.randint(3, 5)))


@functools.lru_cache(maxsize=1)
def countries() -> tuple[tuple[str, str, str], ...]:
    """``(name, alpha-2, alpha-3)`` of every country whose short name is ASCII letters and spaces of at most
    :data:`MAX_QUERY` bytes, sorted by name."""
    try:
        import pycountry
    except ImportError as e:
        raise MissingDependencyError("the country families of the instruction suite need pycountry, from the "
                                     "bench extra (pip install 'actzip[bench]')") from e
    rows: dict[str, tuple[str, str, str]] = {}
    for c in pycountry.countries:
        name = getattr(c, "common_name", None) or c.name
        if len(name) <= MAX_QUERY and all(ch.isascii() and (ch.isalpha() or ch == " ") for ch in name):
            rows.setdefault(name, (name, c.alpha_2, c.alpha_3))
    return tuple(sorted(rows.values()))


@functools.lru_cache(maxsize=1)
def _country_index() -> dict[str, tuple[str, str]]:
    return {name: (a2, a3) for name, a2, a3 in countries()}


_SAMPLERS: dict[str, Callable[[random.Random], str]] = {
    "word": pseudo_word,
    "number": lambda rng: str(rng.randrange(100)),
    "digits": digit_list,
    "month": lambda rng: rng.choice(MONTHS),
    "weekday": lambda rng: rng.choice(WEEKDAYS),
    "letter": lambda rng: rng.choice(string.ascii_lowercase),
    "country": lambda rng: rng.choice(countries())[0],
}
_SPACES: dict[str, Callable[[], tuple[str, ...]] | None] = {
    "word": None, "digits": None,  # too many to list
    "number": lambda: _NUMBERS,
    "month": lambda: MONTHS,
    "weekday": lambda: WEEKDAYS,
    "letter": lambda: tuple(string.ascii_lowercase),
    "country": lambda: tuple(row[0] for row in countries()),
}


# -- parsing (a query of the wrong type raises ValueError) -----------------------------------------------------


def _word(q: str) -> str:
    if not (q.isascii() and q.isalpha() and q.islower()):
        raise ValueError(f"{q!r} is not a lowercase word")
    return q


def _int(q: str) -> int:
    if not (q.isascii() and q.isdigit()):
        raise ValueError(f"{q!r} is not a non-negative integer")
    return int(q)


def _digits(q: str) -> list[int]:
    parts = q.split(" ")
    if not all(len(p) == 1 and p.isascii() and p.isdigit() for p in parts):
        raise ValueError(f"{q!r} is not a list of space-separated digits")
    return [int(p) for p in parts]


def _letter(q: str) -> int:
    if len(q) != 1 or q not in string.ascii_lowercase:
        raise ValueError(f"{q!r} is not a lowercase letter")
    return string.ascii_lowercase.index(q)


def _month_of(q: str) -> str:
    n = _int(q)
    if not 1 <= n <= 12:
        raise ValueError(f"{q!r} is not a month number")
    return MONTHS[n - 1]


def _join(digits) -> str:
    return " ".join(str(d) for d in digits)


def _order(d: list[int]) -> int:
    """0: strictly rising, 1: strictly falling, 2: neither."""
    if all(x < y for x, y in zip(d, d[1:])):
        return 0
    return 1 if all(x > y for x, y in zip(d, d[1:])) else 2


# -- families --------------------------------------------------------------------------------------------------


def _fields(template: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}


@dataclass(frozen=True)
class Family:
    """One kind of instruction: its wordings, its queries and how its answers follow from them."""

    name: str  # unique, snake_case
    kind: str  # one of KINDS
    query_type: str  # one of QUERY_TYPES: what a query is
    paraphrases: tuple[str, ...]  # instruction templates, each naming every parameter and label word
    solve: Callable[[str, Params], str]  # the answer to a query under a task's parameters
    sampler: Callable[[random.Random, Params], str]  # one query under a task's parameters
    space: Callable[[Params], tuple[str, ...]] | None = None  # every query under a task's parameters, if few
    numbers: tuple[tuple[str, tuple[int, ...]], ...] = ()  # numeric parameters and the values they are drawn from
    labels: int = 0  # label words the instruction names, one per class (bijection families)
    parts: tuple[str, ...] = ()  # the families a composed family chains, in order
    # each paraphrase as the parts it is composed of, all of one length (by default each paraphrase is one part)
    paraphrase_parts: tuple[tuple[str, ...], ...] = ()

    def __post_init__(self) -> None:
        where = f"Family {self.name!r}"
        if self.kind not in KINDS:
            raise ConfigError(f"{where}.kind must be one of {KINDS}, got {self.kind!r}")
        if self.query_type not in QUERY_TYPES:
            raise ConfigError(f"{where}.query_type must be one of {QUERY_TYPES}, got {self.query_type!r}")
        if len(self.paraphrases) < 5 or len(set(self.paraphrases)) != len(self.paraphrases):
            raise ConfigError(f"{where}.paraphrases: at least 5 distinct templates, got "
                              f"{len(set(self.paraphrases))} distinct of {len(self.paraphrases)}")
        if self.labels not in (0, 2, 3) or (self.kind == "bijection") > (self.labels > 0) or (
                self.kind not in ("bijection", "composed") and self.labels):
            raise ConfigError(f"{where}.labels: a bijection family names 2 or 3 label words, a composed one 0, 2 "
                              f"or 3, any other none; got {self.labels}")
        if (self.kind == "composed") != bool(self.parts):
            raise ConfigError(f"{where}.parts: a composed family names the families it chains, no other does")
        wanted = {n for n, _ in self.numbers} | set(LABEL_NAMES[:self.labels])
        for t in self.paraphrases:
            if _fields(t) != wanted:
                raise ConfigError(f"{where}.paraphrases: {t!r} must name exactly {sorted(wanted)}")
            if not t.isascii() or "\n" in t or "=" in t:
                raise ConfigError(f"{where}.paraphrases: {t!r} must be ASCII without newlines or '='")
        widest = {n: max((str(v) for v in values), key=len) for n, values in self.numbers}
        widest.update((n, "x" * MAX_LABEL) for n in LABEL_NAMES[:self.labels])
        for t in self.paraphrases:
            if len(t.format(**widest)) > MAX_INSTRUCTION:
                raise ConfigError(f"{where}.paraphrases: {t!r} fills to {len(t.format(**widest))} bytes, more than "
                                  f"MAX_INSTRUCTION = {MAX_INSTRUCTION}")
        self._check_parts(where)

    def _check_parts(self, where: str) -> None:
        if not self.paraphrase_parts:
            object.__setattr__(self, "paraphrase_parts", tuple((t,) for t in self.paraphrases))
            return
        parts = tuple(tuple(w) for w in self.paraphrase_parts)
        object.__setattr__(self, "paraphrase_parts", parts)
        if len(parts) != len(self.paraphrases) or len({len(w) for w in parts}) != 1 or any(
                not all(isinstance(p, str) for p in w) or render(w) != t for w, t in zip(parts, self.paraphrases)):
            raise ConfigError(f"{where}.paraphrase_parts: one tuple of strings a paraphrase, all of one length, "
                              "each joining (first letter capitalised) into its paraphrase")

    def query_space(self, params: Params) -> tuple[str, ...] | None:
        """Every possible query under ``params``, or None where there are too many to list."""
        return None if self.space is None else self.space(params)


def _plain(f: Callable[[str], str]) -> Callable[[str, Params], str]:
    return lambda q, p: f(q)


def _typed(query_type: str) -> Callable[[random.Random, Params], str]:
    sample = _SAMPLERS[query_type]
    return lambda rng, p: sample(rng)


def _listed(query_type: str) -> Callable[[Params], tuple[str, ...]] | None:
    space = _SPACES[query_type]
    return None if space is None else (lambda p: space())


def _labelled(classify: Callable[[str], int]) -> Callable[[str, Params], str]:
    return lambda q, p: str(p[LABEL_NAMES[classify(q)]])


def _balanced(query_type: str, classify: Callable[[str], int], classes: int):
    """A sampler that picks the class first, then a query of that class."""
    sample = _SAMPLERS[query_type]

    def sampler(rng: random.Random, p: Params) -> str:
        want = rng.randrange(classes)
        for _ in range(200):
            q = sample(rng)
            if classify(q) == want:
                return q
        return q

    return sampler


def _ordered_digits(rng: random.Random, p: Params) -> str:
    n, want = rng.randint(3, 5), rng.randrange(3)
    if want < 2:
        return _join(sorted(rng.sample(range(10), n), reverse=want == 1))
    while True:  # mixed both ways, so that no tie ("1 1 2") makes the class a matter of reading
        d = [rng.randrange(10) for _ in range(n)]
        if any(x < y for x, y in zip(d, d[1:])) and any(x > y for x, y in zip(d, d[1:])):
            return _join(d)


def _family(name, kind, query_type, solve, *, sampler=None, space=None, numbers=(), labels=0) -> Family:
    """A family worded as :mod:`actzip_bench.data.instruction_wordings` words it."""
    parts = wordings(name)
    return Family(name, kind, query_type, tuple(render(w) for w in parts), solve, sampler or _typed(query_type),
                  space if space is not None else _listed(query_type), tuple(numbers), labels,
                  paraphrase_parts=parts)


def _chain(first: Family, second: Family, rename: Mapping[str, str] | None = None):
    """``second`` applied to ``first``'s answer; ``rename`` maps ``second``'s parameters to the composed ones."""
    def solve(q: str, p: Params) -> str:
        mid = first.solve(q, p)
        return second.solve(mid, {k: p[v] for k, v in rename.items()} if rename else p)

    return solve


def _word_classes(classify: Callable[[str], bool]) -> Callable[[str], int]:
    return lambda q: 0 if classify(_word(q)) else 1


_K_ADD = tuple(range(2, 20))
_K_MUL = tuple(range(2, 10))

_STRING = [
    _family("reverse", "string", "word", _plain(lambda q: _word(q)[::-1])),
    _family("uppercase", "string", "word", _plain(lambda q: _word(q).upper())),
    _family("first_letter", "string", "word", _plain(lambda q: _word(q)[0])),
    _family("last_letter", "string", "word", _plain(lambda q: _word(q)[-1])),
    _family("length", "string", "word", _plain(lambda q: str(len(_word(q))))),
]

_ARITHMETIC = [
    _family("add", "arithmetic", "number", lambda q, p: str(_int(q) + int(p["k"])), numbers=[("k", _K_ADD)]),
    _family("subtract", "arithmetic", "number", lambda q, p: str(_int(q) - int(p["k"])), numbers=[("k", _K_ADD)],
            sampler=lambda rng, p: str(rng.randrange(int(p["k"]), 100)),  # results never negative
            space=lambda p: _NUMBERS[int(p["k"]):]),
    _family("multiply", "arithmetic", "number", lambda q, p: str(_int(q) * int(p["k"])), numbers=[("k", _K_MUL)]),
    _family("modulo", "arithmetic", "number", lambda q, p: str(_int(q) % int(p["k"])), numbers=[("k", _K_MUL)]),
]

_LIST = [
    _family("sort_digits", "list", "digits", _plain(lambda q: _join(sorted(_digits(q))))),
    _family("reverse_digits", "list", "digits", _plain(lambda q: _join(_digits(q)[::-1]))),
    _family("max_digit", "list", "digits", _plain(lambda q: str(max(_digits(q))))),
    _family("sum_digits", "list", "digits", _plain(lambda q: str(sum(_digits(q))))),
]

_LOOKUP = [
    _family("month_number", "lookup", "month", _plain(lambda q: str(MONTHS.index(q) + 1))),
    _family("next_month", "lookup", "month", _plain(lambda q: MONTHS[(MONTHS.index(q) + 1) % 12])),
    _family("month_name", "lookup", "number", _plain(_month_of), sampler=lambda rng, p: str(rng.randint(1, 12)),
            space=lambda p: _NUMBERS[1:13]),
    _family("weekday_number", "lookup", "weekday", _plain(lambda q: str(WEEKDAYS.index(q) + 1))),
    _family("next_weekday", "lookup", "weekday", _plain(lambda q: WEEKDAYS[(WEEKDAYS.index(q) + 1) % 7])),
    _family("letter_position", "lookup", "letter", _plain(lambda q: str(_letter(q) + 1))),
    _family("next_letter", "lookup", "letter", _plain(lambda q: string.ascii_lowercase[(_letter(q) + 1) % 26])),
    _family("country_code", "lookup", "country", _plain(lambda q: _country_index()[q][0])),
    _family("country_code3", "lookup", "country", _plain(lambda q: _country_index()[q][1])),
]

_vowel_start = _word_classes(lambda w: w[0] in VOWELS)
_long_word = _word_classes(lambda w: len(w) > 4)

_BIJECTION = [
    _family("parity", "bijection", "number", _labelled(lambda q: _int(q) % 2), labels=2),
    _family("at_least_50", "bijection", "number", _labelled(lambda q: 0 if _int(q) >= 50 else 1), labels=2),
    _family("vowel_start", "bijection", "word", _labelled(_vowel_start), sampler=_balanced("word", _vowel_start, 2),
            labels=2),
    _family("long_word", "bijection", "word", _labelled(_long_word), sampler=_balanced("word", _long_word, 2),
            labels=2),
    _family("digit_order", "bijection", "digits", _labelled(lambda q: _order(_digits(q))), sampler=_ordered_digits,
            labels=3),
]

_BY_NAME = {f.name: f for f in _STRING + _ARITHMETIC + _LIST + _LOOKUP + _BIJECTION}


def _composed(name, first, second, *, rename=None, numbers=(), labels=0) -> Family:
    a, b = _BY_NAME[first], _BY_NAME[second]
    parts = wordings(name)
    f = Family(name, "composed", a.query_type, tuple(render(w) for w in parts), _chain(a, b, rename), a.sampler,
               a.space, tuple(numbers), labels, (first, second), paraphrase_parts=parts)
    _BY_NAME[name] = f
    return f


_COMPOSED = [
    _composed("reverse_upper", "reverse", "uppercase"),
    _composed("last_upper", "last_letter", "uppercase"),
    _composed("sort_reverse", "sort_digits", "reverse_digits"),
    _composed("multiply_add", "multiply", "add", rename={"k": "m"},
              numbers=[("k", tuple(range(2, 6))), ("m", tuple(range(1, 10)))]),
    _composed("sum_parity", "sum_digits", "parity", labels=2),
    _composed("next_month_number", "next_month", "month_number"),
]

FAMILIES: tuple[Family, ...] = tuple(_BY_NAME.values())
COMPOSED: tuple[str, ...] = tuple(f.name for f in _COMPOSED)  # the default held-out families


def get_family(name: str) -> Family:
    """The family called ``name``."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ConfigError(f"unknown instruction family {name!r}; choose from {sorted(_BY_NAME)}") from None
