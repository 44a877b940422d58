"""The synthetic scenes' VQA items as benchmark samples: answers right by construction, prompts in the toy vocabulary."""  # noqa: E501

from __future__ import annotations

import pytest

from vrh_interp.data.scenes import make_scene
from vrh_interp.data.datasets.synthetic_vqa import answer_text, synthetic_vqa
from vrh_interp.data.datasets.vqa import score_response
from vrh_interp.data.datasets.vqa_prompt import vqa_user_text
from vrh_interp.data.sources import DataSpecError, load_vqa
from toy_training.tokenizer import build_tokenizer


def test_answers_follow_from_the_drawn_scene() -> None:
    items = synthetic_vqa("eval", 40)
    kinds = {s.benchmark for s in items}
    assert kinds == {"synthetic-attribute", "synthetic-counting", "synthetic-spatial"}
    for item in items:
        scene = make_scene("eval", item.meta["index"], item.meta["difficulty"])
        assert item.image.tobytes() == scene.image.tobytes()
        if item.benchmark == "synthetic-counting":
            shape = item.question.split()[2][:-1]  # "how many circles are there ?"
            assert int(item.answer) == sum(o.shape == shape for o in scene.objects)
        elif item.benchmark == "synthetic-attribute":
            (box,) = item.meta["evidence_boxes"]
            (named,) = [o for o in scene.objects if list(o.box) == box]
            assert answer_text(item) == named.colour
            assert item.question.endswith(" / ".join(item.choices))
        else:
            first, second = (next(o for o in scene.objects if list(o.box) == b) for b in item.meta["evidence_boxes"])
            relation = next(r for r in ("left of", "right of", "above", "below") if f" {r} " in item.question)
            centre = {"left of": first.centre[0] < second.centre[0], "right of": first.centre[0] > second.centre[0],
                      "above": first.centre[1] < second.centre[1], "below": first.centre[1] > second.centre[1]}
            assert answer_text(item) == ("yes" if centre[relation] else "no")


def test_the_answer_words_score_right_and_the_other_options_wrong() -> None:
    for item in synthetic_vqa("detect", 30):
        assert score_response(item, answer_text(item)).correct
        assert score_response(item, f"{answer_text(item)}<|im_end|>").correct
        for option in item.choices:
            if option != answer_text(item):
                assert not score_response(item, option).correct
        if item.scorer == "count":
            assert not score_response(item, str(int(item.answer) + 1)).correct


def test_every_prompt_and_answer_word_is_in_the_toy_vocabulary() -> None:
    tokenizer = build_tokenizer()
    for item in synthetic_vqa("train", 60, difficulty=2):
        ids = tokenizer(vqa_user_text(item) + " " + answer_text(item))["input_ids"]
        assert tokenizer.unk_token_id not in ids, vqa_user_text(item)


def test_vqa_spec_loads_and_rejects_bad_specs() -> None:
    items = load_vqa("synthetic:eval:6:2")
    assert items.source == "synthetic:eval:6:2"
    assert [s.sample_id for s in items] == [s.sample_id for s in synthetic_vqa("eval", 6, 2)]
    for bad in ("synthetic:eval", "synthetic:holdout:5", "synthetic:eval:0", "synthetic:eval:x"):
        with pytest.raises(DataSpecError, match="synthetic:SPLIT:N"):
            load_vqa(bad)


def test_majority_answer_rate_is_the_most_common_answers_share() -> None:
    from collections import Counter

    from vrh_interp.data.datasets.synthetic_vqa import majority_answer_rate

    counting = [s for s in synthetic_vqa("eval", 50) if s.benchmark == "synthetic-counting"]
    top = Counter(s.answer for s in counting).most_common(1)[0][1]
    assert majority_answer_rate(counting) == top / len(counting)
    assert majority_answer_rate(counting[:1]) == 1.0
