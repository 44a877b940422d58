"""VQA loaders on fixtures in the real schemas: questions, gold answers, filters, prompts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.datasets import fixtures
from vrh_interp.data.datasets.countbench import load_countbench
from vrh_interp.data.datasets.cvbench import cvbench_overall, load_cvbench
from vrh_interp.data.datasets.errors import DatasetError
from vrh_interp.data.datasets.mathvista import load_mathvista
from vrh_interp.data.datasets.mmstar import load_mmstar, parse_inline_options
from vrh_interp.data.datasets.spatial457 import load_spatial457
from vrh_interp.data.datasets.spatialrgpt import load_spatialrgpt
from vrh_interp.data.datasets.vaw import load_vaw, mcq_for_instance
from vrh_interp.data.datasets.vqa import score_response
from vrh_interp.data.datasets.vqa_prompt import vqa_user_text


def test_cvbench_parquet_and_jsonl(tmp_path: Path) -> None:
    fixtures.write_cvbench(tmp_path, [{"idx": 0, "choices": ["2", "3"], "answer": "(B)", "source": "ADE20K"},
                                      {"idx": 1, "choices": ["4", "5", "6"], "answer": "(A)"}])
    fixtures.write_cvbench(tmp_path, [{"idx": 0, "type": "3D", "task": "Depth", "choices": ["x", "y"],
                                       "answer": "(A)", "source": "Omni3D"}], name="test_3d")
    samples = load_cvbench(tmp_path)
    assert [s.sample_id for s in samples] == ["cvbench-2D-0", "cvbench-2D-1", "cvbench-3D-0"]
    assert [s.answer for s in samples] == ["B", "A", "A"] and samples[1].letters == ("A", "B", "C")
    assert samples[0].choices_in_question and "(B) 3" in samples[0].question
    assert vqa_user_text(samples[0]).count("(B) 3") == 1  # the inline options are not appended again
    assert len(load_cvbench(tmp_path, part="3d")) == 1
    overall = cvbench_overall(samples, {"cvbench-2D-0": True, "cvbench-2D-1": False, "cvbench-3D-0": True})
    assert overall == pytest.approx(((1.0 + 0.0) / 2 + 1.0) / 2)
    fixtures.write_image(tmp_path / "jsonl" / "img" / "2D" / "count" / "ade20k_1.png", 30, 20)
    (tmp_path / "jsonl" / "test_2d.jsonl").write_text(json.dumps({
        "idx": 5, "type": "2D", "task": "Count", "prompt": "How many? (A) 1 (B) 2", "choices": ["1", "2"],
        "answer": "(A)", "source": "ADE20K", "filename": "img/2D/count/ade20k_1.png"}) + "\n")
    from_jsonl = load_cvbench(tmp_path / "jsonl", part="2d")
    assert from_jsonl[0].sample_id == "cvbench-2D-5" and from_jsonl[0].image.size == (30, 20)


def test_cvbench_answer_outside_the_options(tmp_path: Path) -> None:
    fixtures.write_cvbench(tmp_path, [{"idx": 0, "choices": ["2", "3"], "answer": "(C)"}])
    with pytest.raises(DatasetError, match=r"test_2d\.parquet row 0: answer '\(C\)' is not one of the options"):
        load_cvbench(tmp_path)


def test_mmstar_options_are_parsed_from_the_question(tmp_path: Path) -> None:
    question = "Which animal is shown?\nOptions: A: a cat, B: a dog, C: a bird, D: a fish"
    assert parse_inline_options(question) == ("a cat", "a dog", "a bird", "a fish")
    assert parse_inline_options("no options here") == ()
    fixtures.write_mmstar(tmp_path, [{"index": 7, "question": question, "answer": "B"}])
    (item,) = load_mmstar(tmp_path)
    assert item.sample_id == "mmstar-7" and item.letters == ("A", "B", "C", "D") and item.answer == "B"
    assert score_response(item, "a dog").correct and score_response(item, "Answer: B").correct


def test_countbench_asks_the_question_without_the_caption(tmp_path: Path) -> None:
    fixtures.write_countbench(tmp_path, [2, 10, 4])
    samples = load_countbench(tmp_path)
    assert [s.answer for s in samples] == ["2", "10", "4"]
    text = vqa_user_text(samples[1])
    assert text == "How many dogs are in the image?\nAnswer with a single number."
    assert "10" not in text and "photo" not in text
    assert samples.selection["caption_shown"] is False
    assert not score_response(samples[1], "1").correct and score_response(samples[1], "10").correct


def test_mathvista_filters_are_recorded(tmp_path: Path) -> None:
    fixtures.write_mathvista(tmp_path, [
        {"pid": "1", "question_type": "multi_choice", "answer_type": "text", "choices": ["red", "blue"],
         "answer": "blue"},
        {"pid": "2", "question_type": "free_form", "answer_type": "integer", "answer": "7"},
        {"pid": "3", "question_type": "free_form", "answer_type": "float", "answer": "1.5", "precision": 1.0},
    ])
    mcq, everything = load_mathvista(tmp_path), load_mathvista(tmp_path, subset="all")
    assert [s.sample_id for s in mcq] == ["mathvista-1"] and mcq.selection["subset"] == "mcq"
    assert [s.sample_id for s in everything] == ["mathvista-1", "mathvista-2", "mathvista-3"]
    assert everything.selection["subset"] == "all"
    assert mcq[0].choices == ("red", "blue") and mcq[0].question.startswith("Hint:")
    assert score_response(mcq[0], "B").correct and score_response(everything[2], "1.52").correct


def test_spatial457_prompt_and_ids(tmp_path: Path) -> None:
    fixtures.write_spatial457(tmp_path, [
        {"image_filename": "superCLEVR_new_000001.png", "question": "What color is the bus?", "answer": "red",
         "question_index": 100001},
        {"image_filename": "superCLEVR_new_000002.png", "question": "Is there a jet?", "answer": "True",
         "question_index": 100002}])
    samples = load_spatial457(tmp_path)
    assert [s.sample_id for s in samples] == ["spatial457-L1_single-100001", "spatial457-L1_single-100002"]
    text = vqa_user_text(samples[0])
    assert "What color is the bus?" in text and "'Answer': '<Your answer>'" in text and "Airliner" in text
    assert score_response(samples[1], "{'Reasoning': 'a jet', 'Answer': 'Yes'}").correct


def test_spatialrgpt_size_subset_marks_regions(tmp_path: Path) -> None:
    fixtures.write_spatialrgpt(tmp_path, [
        {"id": "a", "category": "width_data", "answer": "The width of Region [0] is 1.02 meters."},
        {"id": "b", "category": "distance_data", "answer": "They are 3 meters apart."},
        {"id": "c", "category": "height_data", "answer": "Region [0] is 40 inches tall.", "bbox": [[0, 0, 90, 70]]},
    ])
    samples = load_spatialrgpt(tmp_path, image_dir=tmp_path / "images")
    assert [s.sample_id for s in samples] == ["spatialrgpt-a", "spatialrgpt-c"]
    assert samples[0].meta["answer_metres"] == pytest.approx(1.02)
    assert samples[1].meta["answer_metres"] == pytest.approx(1.016)
    pixels = np.asarray(samples[0].image)
    assert tuple(pixels[20, 10]) == (255, 0, 0)  # region 0 outlined in red on its left edge
    assert samples[1].image_source.boxes[0].as_tuple() == (0, 0, 80, 60)  # clipped to the 80x60 image
    assert score_response(samples[0], "Region [0] is about 1.2 m wide.").correct
    everything = load_spatialrgpt(tmp_path, image_dir=tmp_path / "images", categories=("distance_data",))
    assert [s.sample_id for s in everything] == ["spatialrgpt-b"]


VAW_TYPES = {"color": ["red", "blue", "green", "white", "black"], "material": ["wooden", "metal"],
             "state": ["open", "closed"]}


def test_vaw_mcq_uses_same_type_negatives_and_is_seeded(tmp_path: Path) -> None:
    instances = [
        {"image_id": 11, "instance_id": 500, "instance_bbox": [5, 5, 20, 10], "object_name": "chair",
         "positive_attributes": ["red", "wooden"], "negative_attributes": ["blue", "green", "black", "white", "open"]},
        {"image_id": 12, "instance_id": 501, "instance_bbox": [0, 0, 10, 10], "object_name": "door",
         "positive_attributes": ["open"], "negative_attributes": ["metal"]},  # no same-type negative
        {"image_id": 13, "instance_id": 502, "instance_bbox": [1, 2, 30, 40], "object_name": "box",
         "positive_attributes": ["metal"], "negative_attributes": ["wooden"]},
    ]
    path = fixtures.write_vaw(tmp_path, instances, VAW_TYPES)
    samples = load_vaw(path, image_dir=tmp_path / "images")
    assert [s.sample_id for s in samples] == ["vaw-500", "vaw-502"] and samples.selection["without_question"] == 1
    chair, box = samples
    assert chair.meta == {**chair.meta, "attribute_type": "color", "attribute": "red"}
    assert set(chair.choices) <= {"red", "blue", "green", "black", "white"} and len(chair.choices) == 4
    assert chair.choices[chair.letters.index(chair.answer)] == "red"
    assert box.choices in (("metal", "wooden"), ("wooden", "metal")) and box.question == \
        "Which material does the box outlined in red have?"
    again = load_vaw(path, image_dir=tmp_path / "images")
    assert [s.choices for s in again] == [s.choices for s in samples]
    reseeded = [mcq_for_instance(instances[0], {a: t for t, v in VAW_TYPES.items() for a in v}, seed)
                for seed in range(8)]
    assert len({r[2] for r in reseeded}) > 1  # the seed changes distractors or order
    marked = np.asarray(chair.image)  # instance_bbox [5, 5, 20, 10] is xywh: right edge at x = 24, not 19
    assert tuple(marked[10, 24]) == (255, 0, 0) and tuple(marked[10, 19]) != (255, 0, 0)
