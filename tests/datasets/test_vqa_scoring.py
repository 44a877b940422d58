"""Answer extraction and scoring: the known harness bugs stay fixed."""

from __future__ import annotations

from pathlib import Path

import pytest

from vrh_interp.data.datasets.images import ImageFile
from vrh_interp.data.datasets.samples import VQASample
from vrh_interp.data.datasets.vqa import (
    closest_choice,
    extract_choice_letter,
    extract_count,
    extract_metres,
    extract_spatial457_answer,
    levenshtein,
    score_response,
)

ABCD = ("A", "B", "C", "D")


def sample(scorer: str, answer: str, choices: tuple[str, ...] = (), **meta: object) -> VQASample:
    return VQASample(sample_id="s", benchmark="b", question="q", answer=answer, scorer=scorer,
                     image_source=ImageFile(Path("unused.png"), "unused"), choices=choices, meta=meta)


@pytest.mark.parametrize("response, expected", [
    ("B", "B"), ("b", "B"), ("(C)", "C"), ("C.", "C"), ("**D**", "D"),
    ("The answer is B", "B"), ("The answer is B.", "B"), ("Answer: (C) 3 meters", "C"), ("answer is: D", "D"),
    ("Option A is wrong, so the answer is B.", "B"), ("The correct option is C", "C"),
    ("B. red", "B"), ("(A) 3\nbecause there are three", "A"), ("I think it's D.", "D"),
    ("There are several objects", None), ("The answer is Cat", None), ("E", None), ("", None),
])
def test_choice_letter_extraction(response: str, expected: str | None) -> None:
    assert extract_choice_letter(response, ABCD) == expected


def test_choice_letter_never_reads_a_letter_inside_a_word_or_the_article_a() -> None:
    assert extract_choice_letter("The answer is B", ABCD) != "T"
    assert extract_choice_letter("A red car.", ("A", "B"), ("blue car", "red car")) == "B"
    assert extract_choice_letter("It is the dark red one", ("A", "B"), ("red", "dark red")) == "B"
    assert extract_choice_letter("Both red and blue", ("A", "B"), ("red", "blue")) is None


@pytest.mark.parametrize("response, expected", [
    ("3", 3), ("There are 3 dogs.", 3), ("three", 3), ("I count Seven cats", 7), ("10", 10),
    ("Between 2 and 4, so 3.", 3), ("2.0", 2), ("2.5", None), ("none visible", None), ("one", 1),
])
def test_count_extraction(response: str, expected: int | None) -> None:
    assert extract_count(response) == expected


def test_count_scoring_is_numeric_not_substring() -> None:
    assert not score_response(sample("count", "1"), "10").correct
    assert not score_response(sample("count", "10"), "1").correct
    assert score_response(sample("count", "10"), "There are ten.").correct
    assert score_response(sample("count", "4"), "4 birds").prediction == "4"


def test_letter_scoring() -> None:
    item = sample("letter", "B", ("2", "3", "4"))
    assert score_response(item, "The answer is B").correct
    assert not score_response(item, "The answer is A").correct
    assert score_response(item, "3").correct  # the option text, when unambiguous
    assert score_response(item, "nothing").prediction is None


def test_mathvista_normalisation() -> None:
    mcq = sample("mathvista", "3.5", ("1.5", "3.5", "8"), question_type="multi_choice", answer_type="text")
    assert score_response(mcq, "The answer is B").correct
    assert score_response(mcq, "(B) 3.5").correct
    assert score_response(mcq, "3.4").prediction == "3.5"  # closest option by edit distance
    assert not score_response(mcq, "A").correct
    integer = sample("mathvista", "12", question_type="free_form", answer_type="integer")
    assert score_response(integer, "The total is 12.").correct
    assert score_response(integer, "12.7").prediction == "12"  # official int(float(x)) truncation
    assert not score_response(integer, "The answer is 120").correct
    floating = sample("mathvista", "1.45", question_type="free_form", answer_type="float", precision=2.0)
    assert score_response(floating, "about 1.4512").correct
    assert not score_response(floating, "1.46").correct
    listed = sample("mathvista", "[1, 2, 3]", question_type="free_form", answer_type="list")
    assert score_response(listed, "The values are [1, 2, 3]").correct
    assert not score_response(listed, "[1, 3, 2]").correct


def test_levenshtein_and_closest_choice() -> None:
    assert levenshtein("kitten", "sitting") == 3 and levenshtein("", "abc") == 3
    assert closest_choice("tringle", ["circle", "triangle", "square"]) == "triangle"


def test_spatial457_answer_field_and_equivalences() -> None:
    assert extract_spatial457_answer("{'Reasoning': 'it is red', 'Answer': 'Red'}") == "Red"
    assert extract_spatial457_answer('{"Reasoning": "x", "Answer": "no"}') == "no"
    assert extract_spatial457_answer("{'Reasoning': 'x', 'Answer': 3}") == "3"
    assert extract_spatial457_answer("red") == "red"
    answer = "{{'Reasoning': '...', 'Answer': '{}'}}".format
    assert score_response(sample("spatial457", "red"), answer("Red")).correct
    assert not score_response(sample("spatial457", "red"), answer("blue")).correct
    assert score_response(sample("spatial457", "2"), answer("two")).correct
    assert not score_response(sample("spatial457", "1"), answer("10")).correct
    assert score_response(sample("spatial457", "True"), answer("yes")).correct
    assert score_response(sample("spatial457", "yes"), answer("2")).correct
    assert score_response(sample("spatial457", "No"), answer("0")).correct
    assert score_response(sample("spatial457", "no"), answer("False")).correct
    assert not score_response(sample("spatial457", "no"), answer("yes")).correct


@pytest.mark.parametrize("text, metres", [
    ("The width of Region [0] is 1.02 meters.", 1.02), ("It is 48.47 centimeters.", 0.4847),
    ("22.32 feet.", 22.32 * 0.3048), ("about 10 inches wide", 0.254), ("5 feet 6 inches", 66 * 0.0254),
    ("3 m", 3.0), ("Region [1] is 2 ft", 0.6096), ("no idea", None), ("Region [0] is big", None),
])
def test_length_extraction(text: str, metres: float | None) -> None:
    value = extract_metres(text)
    assert (value is None) if metres is None else value == pytest.approx(metres)


def test_metric_length_within_25_percent_of_the_gold() -> None:
    item = sample("metric_length", "The width is 1 meter.", answer_metres=1.0)
    assert score_response(item, "1.25 m").correct and score_response(item, "75 cm").correct
    assert not score_response(item, "1.26 meters").correct and not score_response(item, "74 cm").correct
    assert score_response(item, "3.5 feet").correct  # 1.0668 m
    assert not score_response(item, "1").correct  # a number without a unit is not a length


def test_unknown_scorer_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown scorer 'judge'"):
        score_response(sample("judge", "x"), "x")
