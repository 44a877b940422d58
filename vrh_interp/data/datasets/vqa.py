"""Deterministic, offline answer extraction and scoring for the cross-task VQA benchmarks.

Each ``VQASample`` names its scorer (``SCORERS``); ``score_response(sample, response)`` returns what was read
from the response and whether it is correct. The rules avoid the common harness bugs:

* letters (CV-Bench, MMStar, VAW, MathVista options): an explicit "answer is X" / "Answer: (X)" wins, then a
  leading "X." / "(X)", then a single standalone option letter, then a single option whose TEXT appears; a
  letter must be one of the sample's options and is never taken from inside a word ("The answer is B" reads
  B, not T; the article "A" in "A red car" is not an option letter);
* counts (CountBenchQA): the LAST integer or number word (zero..twenty), compared as numbers ("1" never
  matches "10"); the question is asked without the caption, which states the count;
* MathVista (its official normalisation, offline): option letter -> option text, else the option closest
  in edit distance; integers truncated with ``int(float(x))``; floats rounded to the item's ``precision``;
  the last number in the response is the extraction (for lists, the last as many numbers as the answer has,
  compared element-wise);
* Spatial457: the ``'Answer': '...'`` field of the requested JSON template (VLMEvalKit's three patterns),
  else the whole response; case-insensitive, number words = digits, yes = true = any positive count,
  no = false = none = 0;
* SpatialRGPT-Bench lengths: the first number+unit in the response and in the gold answer, in metres
  (m, cm, mm, km, in, ft, yd; "5 feet 6 inches" adds up); correct iff 0.75 gold <= prediction <= 1.25 gold,
  the official success rule, with the number read by regex instead of the official GPT-4 judge.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping, Sequence

from vrh_interp.data.datasets.samples import VQASample

NUMBER_WORDS: Mapping[str, int] = MappingProxyType({
    w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                               "fourteen fifteen sixteen seventeen eighteen nineteen twenty".split())})
METRES_PER_UNIT: Mapping[str, float] = MappingProxyType({
    "m": 1.0, "meter": 1.0, "meters": 1.0, "metre": 1.0, "metres": 1.0,
    "cm": 0.01, "centimeter": 0.01, "centimeters": 0.01, "centimetre": 0.01, "centimetres": 0.01,
    "mm": 0.001, "millimeter": 0.001, "millimeters": 0.001, "millimetre": 0.001, "millimetres": 0.001,
    "km": 1000.0, "kilometer": 1000.0, "kilometers": 1000.0, "kilometre": 1000.0, "kilometres": 1000.0,
    "in": 0.0254, "inch": 0.0254, "inches": 0.0254,
    "ft": 0.3048, "foot": 0.3048, "feet": 0.3048,
    "yd": 0.9144, "yard": 0.9144, "yards": 0.9144,
})
LENGTH_TOLERANCE = 0.25

_ANSWER_LETTER = re.compile(
    r"(?i:\banswer\b)(?:\s*(?i:is|:|=|-))*\s*(?i:option|choice)?\s*[(\[]?([A-Z])[)\]]?(?![A-Za-z0-9])")
_OPTION_LETTER = re.compile(r"(?i:\b(?:option|choice)\b)\s*(?i:is)?\s*:?\s*[(\[]?([A-Z])[)\]]?(?![A-Za-z0-9])")
_LEADING_LETTER = re.compile(r"^[(\[]?([A-Z])(?:[)\].:,]|\s*$|\s*\n)")
_STANDALONE_LETTER = re.compile(r"(?<![A-Za-z0-9'])[(\[]?([A-Z])[)\]]?(?![A-Za-z0-9'])")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?![\w])(?!\.\d)")
_COUNT_TOKEN = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?![\w])(?!\.\d)|\b(" + "|".join(NUMBER_WORDS) + r")\b",
                          re.IGNORECASE)
_UNIT_NAMES = "|".join(sorted(METRES_PER_UNIT, key=len, reverse=True))
_LENGTH = re.compile(r"(?<![\w.\[])(\d+(?:\.\d+)?)\s*(" + _UNIT_NAMES + r")\b", re.IGNORECASE)
_SPATIAL457_ANSWER = (re.compile(r"Answer': '(.*?)'"), re.compile(r'Answer": "(.*?)"'),
                      re.compile(r"Answer': (\d+)"))


@dataclass(frozen=True)
class VQAScore:
    prediction: str | None  # what was read from the response (None: nothing usable)
    correct: bool


def _clean(response: str) -> str:
    return response.replace("**", "").replace("`", "").strip()


def extract_choice_letter(response: str, letters: Sequence[str], choices: Sequence[str] = ()) -> str | None:
    """The option letter a response gives, or None; only letters in ``letters`` count."""
    text = _clean(response)
    valid = set(letters)
    bare = text.strip("()[]{}.:*'\" \n").upper()
    if len(bare) == 1 and bare in valid:
        return bare
    stated = [m for m in _ANSWER_LETTER.findall(text) if m in valid]
    if stated:
        return stated[-1]
    named = {m for m in _OPTION_LETTER.findall(text) if m in valid}
    if len(named) == 1:
        return named.pop()
    leading = _LEADING_LETTER.match(text)
    if leading and leading.group(1) in valid:
        return leading.group(1)
    standalone = {m.group(1) for m in _STANDALONE_LETTER.finditer(text) if m.group(1) in valid
                  and not (m.group(1) in ("A", "I") and re.match(r"\s+[a-z]", text[m.end():]))}
    if len(standalone) == 1:
        return standalone.pop()
    return _letter_of_choice_text(text, letters, choices)


def _letter_of_choice_text(text: str, letters: Sequence[str], choices: Sequence[str]) -> str | None:
    lowered = text.lower()
    found = [i for i, c in enumerate(choices)
             if c.strip() and re.search(r"(?<!\w)" + re.escape(c.strip().lower()) + r"(?!\w)", lowered)]
    maximal = [i for i in found if not any(j != i and choices[i].strip().lower() in choices[j].strip().lower()
                                           for j in found)]
    return letters[maximal[0]] if len(maximal) == 1 else None


def extract_count(response: str) -> int | None:
    """The last integer (digits or a number word up to twenty) in the response, or None."""
    tokens = list(_COUNT_TOKEN.finditer(response))
    if not tokens:
        return None
    digits, word = tokens[-1].groups()
    if word is not None:
        return NUMBER_WORDS[word.lower()]
    value = float(digits)
    return int(value) if value.is_integer() else None


def extract_last_number(response: str) -> float | None:
    numbers = _NUMBER.findall(response)
    return float(numbers[-1].replace(",", "")) if numbers else None


def extract_metres(text: str) -> float | None:
    """The first length with a unit in ``text``, in metres ("5 feet 6 inches" = 1.6764), or None."""
    matches = list(_LENGTH.finditer(text))
    if not matches:
        return None
    first = matches[0]
    metres = float(first.group(1)) * METRES_PER_UNIT[first.group(2).lower()]
    if len(matches) > 1 and first.group(2).lower() in ("ft", "foot", "feet"):
        following = matches[1]
        between = text[first.end():following.start()].strip(" ,").lower()
        if following.group(2).lower() in ("in", "inch", "inches") and between in ("", "and"):
            metres += float(following.group(1)) * METRES_PER_UNIT["inch"]
    return metres


def levenshtein(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, start=1):
        current = [i]
        for j, char_b in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1]


def closest_choice(response: str, choices: Sequence[str]) -> str:
    """The option with the smallest edit distance to the response (first on ties), MathVista's fallback."""
    distances = [levenshtein(response.strip(), c) for c in choices]
    return choices[distances.index(min(distances))]


def score_letter(sample: VQASample, response: str) -> VQAScore:
    letter = extract_choice_letter(response, sample.letters, sample.choices)
    return VQAScore(letter, letter is not None and letter == sample.answer)


def score_count(sample: VQASample, response: str) -> VQAScore:
    count = extract_count(response)
    return VQAScore(None if count is None else str(count), count is not None and count == int(sample.answer))


def score_mathvista(sample: VQASample, response: str) -> VQAScore:
    if sample.meta["question_type"] == "multi_choice":
        letter = extract_choice_letter(response, sample.letters, sample.choices)
        text = sample.choices[sample.letters.index(letter)] if letter else closest_choice(response, sample.choices)
        return VQAScore(text, text == sample.answer)
    answer_type = sample.meta["answer_type"]
    if answer_type == "list":
        predicted = [float(v.replace(",", "")) for v in _NUMBER.findall(response)]
        gold = [float(v.replace(",", "")) for v in _NUMBER.findall(sample.answer)]
        return VQAScore(str(predicted), bool(gold) and predicted[-len(gold):] == gold)
    if answer_type == "text":
        return VQAScore(response.strip(), response.strip().lower() == sample.answer.strip().lower())
    number = extract_last_number(response)
    if number is None:
        return VQAScore(None, False)
    if answer_type == "integer":
        prediction = str(int(number))
        return VQAScore(prediction, prediction == str(int(float(sample.answer))))
    precision = int(sample.meta.get("precision") or 0)
    value = round(number, precision)
    return VQAScore(str(value), math.isclose(value, round(float(sample.answer), precision), abs_tol=1e-9))


def _spatial457_normal(text: str) -> str:
    word = text.strip().strip(".!'\"").strip().lower()
    word = str(NUMBER_WORDS[word]) if word in NUMBER_WORDS else word
    return {"true": "yes", "false": "no", "none": "no", "0": "no"}.get(word, word)


def extract_spatial457_answer(response: str) -> str:
    for pattern in _SPATIAL457_ANSWER:
        match = pattern.search(response)
        if match:
            return match.group(1)
    return response


def score_spatial457(sample: VQASample, response: str) -> VQAScore:
    extracted = extract_spatial457_answer(response)
    predicted, gold = _spatial457_normal(extracted), _spatial457_normal(sample.answer)
    positive_count = predicted.isdigit() and int(predicted) > 0
    return VQAScore(extracted, predicted == gold or (gold == "yes" and positive_count))


def score_metric_length(sample: VQASample, response: str) -> VQAScore:
    predicted, gold = extract_metres(response), float(sample.meta["answer_metres"])
    if predicted is None:
        return VQAScore(None, False)
    return VQAScore(f"{predicted:.4g} m", (1 - LENGTH_TOLERANCE) * gold <= predicted <= (1 + LENGTH_TOLERANCE) * gold)


SCORERS: Mapping[str, Callable[[VQASample, str], VQAScore]] = MappingProxyType({
    "letter": score_letter,
    "count": score_count,
    "mathvista": score_mathvista,
    "spatial457": score_spatial457,
    "metric_length": score_metric_length,
})


def score_response(sample: VQASample, response: str) -> VQAScore:
    if sample.scorer not in SCORERS:
        raise ValueError(f"sample {sample.sample_id}: unknown scorer {sample.scorer!r} (known: {sorted(SCORERS)})")
    return SCORERS[sample.scorer](sample, response)
