"""The wordings of the instruction families, composed from parts.

A wording is a tuple of four parts (a lead-in, a verb phrase, an object phrase and a closer, roughly; a rule or a
step of a chain in some families); the first is always a lead-in (``""``, ``"please "``, ``"task: "``, ...),
which the held-out split treats as incidental. Its text is the parts joined, with the first letter capitalised
(:func:`render`). A family's wordings are the union of a few grids, each every combination of its slots' options
(:func:`grid`), so that a wording held out of training can be a new combination of parts that training wordings
show elsewhere: the part in slot ``i`` is seen when some training wording has the same text in slot ``i``.
Placeholders: ``{k}`` and ``{m}`` for numeric parameters, ``{a}``, ``{b}``, ``{c}`` for label words.
Everything here is plain tuples in a fixed order: no set or hash order reaches a wording.
"""

from __future__ import annotations

import itertools

__all__ = ["SLOTS", "WORDINGS", "grid", "render", "wordings"]

SLOTS = 4  # parts a wording is made of

_DO = ("", "please ", "task: ")  # lead-ins of a request
_ASK = ("", "task: ", "question: ")  # lead-ins of a question
_RULE = ("", "task: ", "rule: ")  # lead-ins of a stated rule
_NOW = ("", "now ", "task: ")  # short lead-ins, for long wordings
_END = (".", " below.")
_WORD = (" the word", " each word")
_NUM = (" the number", " each number")
_NUM3 = _NUM + (" the given number",)


def render(parts: tuple[str, ...]) -> str:
    """The text of a wording: its parts joined, the first letter capitalised."""
    text = "".join(parts)
    return text[:1].upper() + text[1:]


def grid(*slots: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Every combination of one option a slot, in the order the options are given."""
    if len(slots) != SLOTS:
        raise ValueError(f"a wording grid has {SLOTS} slots, got {len(slots)}")
    return list(itertools.product(*slots))


def _sorted(*grids: list[tuple[str, ...]]) -> tuple[tuple[str, ...], ...]:
    """The grids' wordings, each once, sorted by text (then by parts)."""
    return tuple(sorted(dict.fromkeys(w for g in grids for w in g), key=lambda w: (render(w), w)))


WORDINGS: dict[str, tuple[tuple[str, ...], ...]] = {
    # -- string ------------------------------------------------------------------------------------------------
    "reverse": _sorted(
        grid(_DO, ("reverse", "flip", "invert"), _WORD + (" the letters of the word",), _END),
        grid(_DO, ("write", "spell"), _WORD, (" backwards.", " in reverse order.", " from right to left."))),
    "uppercase": _sorted(
        grid(_DO, ("write", "spell"), _WORD, (" in capital letters.", " in upper case.", " in all caps.")),
        grid(_DO, ("capitalize", "uppercase"), _WORD + (" every letter of the word",), _END)),
    "first_letter": _sorted(
        grid(_DO, ("give", "write", "name"), (" the first letter", " the initial letter", " the first character"),
             (" of the word.", " of each word.")),
        grid(_ASK, ("what letter", "which letter"), (" does the word", " does each word"),
             (" start with?", " begin with?"))),
    "last_letter": _sorted(
        grid(_DO, ("give", "write", "name"), (" the last letter", " the final letter", " the last character"),
             (" of the word.", " of each word.")),
        grid(_ASK, ("what letter", "which letter"), (" does the word", " does each word"),
             (" end with?", " end in?"))),
    "length": _sorted(
        grid(_DO, ("count the letters", "count the characters"),
             (" of the word", " in the word", " of each word", " in each word"), _END),
        grid(_DO, ("give", "write"), (" the length", " the number of letters"), (" of the word.", " of each word.")),
        grid(_ASK, ("how many letters", "how many characters"),
             (" are in the word", " are in each word", " does the word have"), ("?",))),
    # -- arithmetic --------------------------------------------------------------------------------------------
    "add": _sorted(
        grid(_DO, ("add {k} to", "add {k} onto"), _NUM3, _END),
        grid(_DO, ("increase", "raise"), _NUM3, (" by {k}.",)),
        grid(_ASK, ("what is", "what do you get for"), _NUM, (" plus {k}?", " with {k} added?"))),
    "subtract": _sorted(
        grid(_DO, ("subtract {k} from", "take {k} away from"), _NUM3, _END),
        grid(_DO, ("decrease", "lower", "reduce"), _NUM3, (" by {k}.",)),
        grid(_ASK, ("what is", "what do you get for"), _NUM, (" minus {k}?", " with {k} taken away?"))),
    "multiply": _sorted(
        grid(_DO, ("multiply", "scale"), _NUM3, (" by {k}.", " by a factor of {k}.")),
        grid(_DO, ("give", "write"), (" {k} times", " the product of {k} and"), (" the number.", " each number.")),
        grid(_ASK, ("what is", "what do you get for"), _NUM, (" times {k}?", " multiplied by {k}?"))),
    "modulo": _sorted(
        grid(_DO, ("give", "write", "find"), (" the remainder of the number", " the remainder of each number"),
             (" divided by {k}.", " after division by {k}.")),
        grid(_DO, ("divide the number by {k}", "divide each number by {k}"), (" and write", " and give"),
             (" the remainder.", " what is left.")),
        grid(_ASK, ("what is", "what do you get for"), _NUM, (" modulo {k}?", " mod {k}?"))),
    # -- list --------------------------------------------------------------------------------------------------
    "sort_digits": _sorted(
        grid(_DO, ("sort", "order", "arrange"), (" the digits", " the list of digits"),
             (" from smallest to largest.", " in increasing order.", " from low to high.")),
        grid(_DO, ("write", "list"), (" the digits", " the list of digits"),
             (" sorted, small to big.", " in ascending order."))),
    "reverse_digits": _sorted(
        grid(_DO, ("reverse", "flip"), (" the digits", " the list of digits", " the order of the digits"), _END),
        grid(_DO, ("write", "list"), (" the digits", " the list of digits"),
             (" backwards.", " in the opposite order.", " from last to first."))),
    "max_digit": _sorted(
        grid(_DO, ("give", "write", "name"), (" the largest", " the biggest", " the highest"),
             (" digit.", " digit of the list.")),
        grid(_ASK, ("what is", "which is"), (" the largest digit", " the biggest digit", " the highest digit"),
             ("?", " in the list?"))),
    "sum_digits": _sorted(
        grid(_DO, ("add up", "sum up", "total"), (" the digits", " all the digits", " the list of digits"), _END),
        grid(_DO, ("give", "write"), (" the sum", " the total"), (" of the digits.", " of all the digits.")),
        grid(_ASK, ("what is",), (" the sum", " the total"), (" of the digits?", " of all the digits?"))),
    # -- lookup ------------------------------------------------------------------------------------------------
    "month_number": _sorted(
        grid(_DO, ("give", "write"), (" the number of the month", " the month as a number"), (".", " from 1 to 12.")),
        grid(_DO, ("convert", "turn"), (" the month", " each month", " the month name"),
             (" to its number.", " into a number.")),
        grid(_ASK, ("which number", "what number"), (" is the month", " is this month"), ("?", " in the year?"))),
    "next_month": _sorted(
        grid(_DO, ("name", "give", "write"), (" the month after", " the month that follows"),
             (" this one.", " the given month.", " each month.")),
        grid(_ASK, ("which month", "what month"), (" comes after", " follows"), (" this one?", " the given month?"))),
    "month_name": _sorted(
        grid(_DO, ("name", "give", "write"), (" the month", " the name of the month"),
             (" with this number.", " for each number.")),
        grid(_DO, ("convert", "turn"), (" the number", " each number", " the month number"),
             (" to a month name.", " into its month.")),
        grid(_ASK, ("which month", "what month"), (" has this number", " is this number"), ("?", " in the year?"))),
    "weekday_number": _sorted(
        grid(_DO, ("give", "write"), (" the day's number", " the weekday as a number", " the number of the day"),
             (", Monday being 1.", ", counting Monday as 1.")),
        grid(_DO, ("convert", "turn"), (" the day", " the weekday", " each day"),
             (" to its number; Monday is 1.", " into a number, Monday as 1.")),
        grid(_ASK, ("which day", "what day"), (" of the week is it?", " of the week is this?"),
             (" Monday is 1.", " Count Monday as 1."))),
    "next_weekday": _sorted(
        grid(_DO, ("name", "give", "write"), (" the day after", " the day that follows", " the weekday after"),
             (" this one.", " the given day.")),
        grid(_ASK, ("which day", "what day"), (" comes after", " follows"), (" this one?", " the given day?"))),
    "letter_position": _sorted(
        grid(_DO, ("give", "write", "name"), (" the letter's position", " the letter's place"),
             (" in the alphabet.", " in the alphabet (a is 1).")),
        grid(_DO, ("convert", "turn"), (" the letter", " each letter"),
             (" to its alphabet number.", " into its place in the alphabet.")),
        grid(_ASK, ("which number", "what number"), (" is the letter", " is this letter"),
             (" in the alphabet?", " among the letters?"))),
    "next_letter": _sorted(
        grid(_DO, ("give", "write", "name"), (" the next letter", " the letter after this one"),
             (" of the alphabet.", " in the alphabet.")),
        grid(_DO, ("move", "step"), (" one letter", " one place"),
             (" forward in the alphabet.", " ahead in the alphabet.")),
        grid(_ASK, ("which letter", "what letter"), (" comes after", " follows"),
             (" this one?", " the given letter?"))),
    "country_code": _sorted(
        grid(_DO, ("give", "write", "name"), (" the two-letter code", " the 2-letter code", " the ISO alpha-2 code"),
             (" of the country.", " of each country.")),
        grid(_DO, ("abbreviate", "shorten"), (" the country", " each country", " the country name"),
             (" to two letters.", " with two letters.")),
        grid(_ASK, ("what is", "what's"), (" the country's", " this country's"),
             (" two-letter code?", " ISO alpha-2 code?"))),
    "country_code3": _sorted(
        grid(_DO, ("give", "write", "name"),
             (" the three-letter code", " the 3-letter code", " the ISO alpha-3 code"),
             (" of the country.", " of each country.")),
        grid(_DO, ("abbreviate", "shorten"), (" the country", " each country", " the country name"),
             (" to three letters.", " with three letters.")),
        grid(_ASK, ("what is", "what's"), (" the country's", " this country's"),
             (" three-letter code?", " ISO alpha-3 code?"))),
    # -- bijection ---------------------------------------------------------------------------------------------
    "parity": _sorted(
        grid(_DO, ("write", "answer"), (" {a} if the number is even", " {a} for an even number"),
             (", {b} if it is odd.", " and {b} if it is odd.", ", else {b}.")),
        grid(_DO, ("write", "answer"), (" {b} if the number is odd", " {b} for an odd number"),
             (", otherwise {a}.", ", else {a}.", " and {a} if even.")),
        grid(_RULE, ("even numbers get {a}", "an even number gets {a}"),
             (", odd numbers get {b}", ", odd ones get {b}", " and odd ones {b}"), (".",))),
    "at_least_50": _sorted(
        grid(_DO, ("write", "answer"), (" {a} if the number is at least 50", " {a} for 50 or more"),
             (", else {b}.", ", {b} if below.", ", {b} for less.")),
        grid(_DO, ("write", "answer"), (" {b} if the number is below 50", " {b} for less than 50"),
             (", else {a}.", ", otherwise {a}.")),
        grid(_RULE, ("numbers below 50 get {b}", "a number under 50 gets {b}"), (", the rest get {a}", ", others {a}"),
             (".",))),
    "vowel_start": _sorted(
        grid(_DO, ("write", "say"), (" {a} if the word starts with a vowel", " {a} for a leading vowel"),
             (", else {b}.", ", {b} if not.")),
        grid(_NOW, ("write", "answer"), (" {b} if it starts with a consonant", " {b} for a leading consonant"),
             (", else {a}.", ", {a} if not.")),
        grid(_RULE, ("words that begin with a vowel get {a}", "a word starting with a vowel gets {a}"),
             (", others get {b}", ", the rest get {b}"), (".",))),
    "long_word": _sorted(
        grid(_NOW, ("write", "answer"), (" {a} if it has more than 4 letters", " {a} for a word of 5+ letters"),
             (", else {b}.", ", {b} if not.")),
        grid(_NOW, ("write", "answer"), (" {b} if it has at most 4 letters", " {b} for a word of 4 or fewer"),
             (", else {a}.", ", {a} if not.")),
        grid(_RULE, ("words of 5+ letters get {a}", "words over 4 letters get {a}"),
             (", shorter ones get {b}", ", others get {b}"), (".",))),
    "digit_order": _sorted(
        grid(("", "now "), ("say", "write"), (" {a} if the digits rise", " {a} for rising digits"),
             (", {b} if they fall, else {c}.", ", {b} if falling, else {c}.")),
        grid(("", "now "), ("say", "write"), (" {a} for increasing", " {a} for rising"),
             (", {b} for decreasing, else {c}.", ", {b} for falling, {c} otherwise.")),
        grid(("", "rule: "), ("rising digits get {a}", "digits going up get {a}"),
             (", falling get {b}", ", falling ones {b}"), (", others {c}.", ", else {c}."))),
    # -- composed: a step of the first family, a connector, a step of the second -------------------------------
    "reverse_upper": _sorted(
        grid(_NOW, ("reverse the word", "write the word backwards", "spell the word in reverse"), (", then ", " and "),
             ("write it in capitals.", "capitalize it.", "put it in upper case.")),
        grid(_DO, ("write", "spell"), (" the word backwards", " the word in reverse"),
             (" in capital letters.", " in upper case.", " in all caps."))),
    "last_upper": _sorted(
        grid(_NOW, ("give the word's last letter", "take the final letter", "take the word's last letter"),
             (", then ", " and "),
             ("capitalize it.", "write it in capitals.", "put it in upper case.")),
        grid(_DO, ("give", "write"), (" the last letter", " the final letter"),
             (" of the word in capitals.", " of the word in upper case.", " of the word as a capital."))),
    "sort_reverse": _sorted(
        grid(_NOW, ("sort the digits", "put the digits in rising order", "order the digits low to high"),
             (", then ", " and "), ("reverse them.", "flip their order.", "list them backwards."))),
    "multiply_add": _sorted(
        grid(_DO, ("multiply the number by {k}", "scale the number by {k}", "take the number times {k}"),
             (", then ", " and "), ("add {m}.", "add {m} to it.", "increase it by {m}."))),
    "sum_parity": _sorted(
        grid(_NOW, ("add up the digits", "sum the digits", "total the digits"), (", then ", " and "),
             ("write {a} if even, {b} if odd.", "say {a} for even sums, else {b}.",
              "answer {a} if even, {b} if odd."))),
    "next_month_number": _sorted(
        grid(_NOW, ("find the next month", "take the month that follows", "take the following month"),
             (", then ", " and "), ("give its number.", "write it as a number.", "convert it to a number."))),
}


def wordings(name: str) -> tuple[tuple[str, ...], ...]:
    """The wordings of family ``name``, as parts, sorted by text."""
    try:
        return WORDINGS[name]
    except KeyError:
        raise KeyError(f"no wordings for instruction family {name!r}") from None
