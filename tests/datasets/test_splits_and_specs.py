"""The paper's detection / evaluation split, and the ``--data`` / ``--vqa`` spec dispatcher."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pytest

from tests.datasets import fixtures
from vrh_interp.core.description.boxes import Box
from vrh_interp.data.datasets.splits import detection_split, split_rank
from vrh_interp.data.sources import DataSpecError, check_spec, load_data, load_split, load_vqa, parse_spec


@dataclass(frozen=True)
class Item:
    sample_id: str


def test_split_is_seeded_disjoint_and_order_independent() -> None:
    items = [Item(f"s{i}") for i in range(50)]
    split = detection_split(items, 10, seed=3)
    assert len(split.detection) == 10 and len(split.evaluation) == 40
    assert not {i.sample_id for i in split.detection} & {i.sample_id for i in split.evaluation}
    ranked = sorted(items, key=lambda i: split_rank(i.sample_id, 3))
    assert {i.sample_id for i in split.detection} == {i.sample_id for i in ranked[:10]}
    assert list(split.evaluation) == [i for i in items if i not in split.detection]  # dataset order kept
    shuffled = detection_split(list(reversed(items)), 10, seed=3)
    assert set(shuffled.detection) == set(split.detection)
    assert set(detection_split(items, 10, seed=4).detection) != set(split.detection)
    limited = detection_split(items, 10, seed=3, evaluation_count=5)
    assert {i.sample_id for i in limited.evaluation} == {i.sample_id for i in ranked[10:15]}
    assert split.as_dict()["detection_ids"] == [i.sample_id for i in split.detection]


def test_split_refuses_impossible_counts_and_duplicate_ids() -> None:
    items = [Item(f"s{i}") for i in range(5)]
    with pytest.raises(ValueError, match="cannot take 5 detection samples from 5"):
        detection_split(items, 5)
    with pytest.raises(ValueError, match=r"evaluation_count must be in \[1, 3\]"):
        detection_split(items, 2, evaluation_count=4)
    with pytest.raises(ValueError, match="unique"):
        detection_split([Item("a"), Item("a"), Item("b")], 1)


def test_spec_parsing() -> None:
    spec = parse_spec("refcoco:/data/refer:testA:per=expression:on_error=skip")
    assert spec.kind == "refcoco" and spec.positional == ("/data/refer", "testA")
    assert dict(spec.options) == {"per": "expression", "on_error": "skip"}


def test_grounding_specs_reach_the_loaders(tmp_path: Path) -> None:
    fixtures.write_refer(tmp_path / "refer")
    fixtures.write_refer(tmp_path / "refer", "refcoco+")
    fixtures.write_lmms_refcoco(tmp_path / "lmms", fixtures.lmms_rows(3), split="testA")
    fixtures.write_jxu124(tmp_path / "jxu", tmp_path / "coco")
    csv_path, image_dir = fixtures.write_toloka(tmp_path / "toloka", [
        {"name": "1.jpg", "width": 30, "height": 20, "box": (1, 1, 9, 9), "question": "cup"}])
    fixtures.write_refspatial(tmp_path / "refspatial", [(1, 2, 5, 6)], split="placement")
    assert [s.box for s in load_data(f"refcoco:{tmp_path / 'refer'}")] == [Box(10, 20, 40, 35), Box(5, 40, 25, 65)]
    assert len(load_data(f"refcoco+:{tmp_path / 'refer'}:val:per=expression")) == 3
    assert [s.sample_id for s in load_data(f"refcoco:{tmp_path / 'refer'}:testA")] == ["refcoco-testA-ref3"]
    assert len(load_data(f"lmms-refcoco:{tmp_path / 'lmms'}:testA")) == 3
    assert len(load_data(f"jxu124-refcoco:{tmp_path / 'jxu'}:images={tmp_path / 'coco'}")) == 2
    assert load_data(f"toloka:{csv_path}:{image_dir}")[0].expression == "cup"
    assert load_data(f"refspatial:{tmp_path / 'refspatial'}:placement")[0].box == Box(1, 2, 5, 6)
    assert len(load_data("synthetic:eval:2")) == 2


def test_vqa_specs_reach_the_loaders(tmp_path: Path) -> None:
    fixtures.write_cvbench(tmp_path / "cv", [{"idx": 0, "choices": ["2", "3"], "answer": "(B)"}])
    fixtures.write_countbench(tmp_path / "count", [3])
    fixtures.write_mathvista(tmp_path / "mv", [
        {"pid": "1", "question_type": "free_form", "answer_type": "integer", "answer": "7"}])
    fixtures.write_vaw(tmp_path / "vaw", [
        {"image_id": 1, "instance_id": 9, "instance_bbox": [1, 1, 5, 5], "object_name": "cup",
         "positive_attributes": ["red"], "negative_attributes": ["blue"]}], {"color": ["red", "blue"]})
    assert load_vqa(f"cvbench:{tmp_path / 'cv'}:part=2d")[0].answer == "B"
    assert load_vqa(f"countbench:{tmp_path / 'count'}")[0].answer == "3"
    assert len(load_vqa(f"mathvista:{tmp_path / 'mv'}:subset=all")) == 1
    assert load_vqa(f"vaw:{tmp_path / 'vaw' / 'data' / 'test.json'}:images={tmp_path / 'vaw' / 'images'}:seed=2"
                    ).selection["seed"] == 2


@pytest.mark.parametrize("spec, message", [
    ("nonsense:x", "unknown data spec 'nonsense:x'"),
    ("synthetic:detect", "use synthetic:SPLIT:N"),
    ("toloka:only.csv", "use toloka:CSV:IMAGE_DIR"),
    ("refcoco:/x:val:colour=red", r"unknown options \['colour'\]"),
    ("jxu124-refcoco:/x", r"missing options \['images'\]"),
    ("lmms-refcoco:/x:on_error=ignore", "on_error must be raise or skip"),
    ("jsonl:/x:verify_images=maybe", "verify_images must be true or false"),
])
def test_bad_specs_say_how_to_write_them(spec: str, message: str) -> None:
    with pytest.raises(DataSpecError, match=message):
        load_data(spec)


def test_bad_vqa_spec() -> None:
    with pytest.raises(DataSpecError, match="unknown VQA benchmark.*cvbench, mmstar"):
        load_vqa("gqa:/x")
    with pytest.raises(DataSpecError, match=r"missing options \['images'\]"):
        load_vqa("spatialrgpt:/x")


def test_option_text_is_converted_for_the_loader(tmp_path: Path) -> None:
    fixtures.write_spatialrgpt(tmp_path, [
        {"id": "a", "category": "width_data", "answer": "1 meter"},
        {"id": "b", "category": "distance_data", "answer": "3 meters"},
        {"id": "c", "category": "direction", "answer": "2 meters"}])
    loaded = load_vqa(f"spatialrgpt:{tmp_path}:images={tmp_path / 'images'}:categories=distance_data,direction")
    assert [s.sample_id for s in loaded] == ["spatialrgpt-b", "spatialrgpt-c"]
    assert loaded.selection["categories"] == ["distance_data", "direction"]


def test_split_options_give_the_two_disjoint_parts_of_detection_split(tmp_path: Path) -> None:
    """``role=detection|evaluation`` (with ``detect=``, ``eval=``, ``split_seed=``) of any grounding spec is that
    part of ``detection_split`` of the loaded samples: disjoint by construction, the loader's skipped rows kept."""
    rows = fixtures.lmms_rows(20)
    rows[7]["xywh"] = [60, 6, 20, 10]  # outside the 64 x 48 image: skipped with on_error=skip
    fixtures.write_lmms_refcoco(tmp_path / "lmms", rows)
    data = f"lmms-refcoco:{tmp_path / 'lmms'}:on_error=skip"
    whole = load_data(data)
    for options, (detect, seed, count) in (("", (200, 0, None)), (":detect=5", (5, 0, None)),
                                           (":detect=5:split_seed=3:eval=4", (5, 3, 4)),
                                           (":split_seed=-2:detect=6", (6, -2, None))):
        if detect >= len(whole):
            with pytest.raises(ValueError, match=f"cannot take {detect} detection samples from {len(whole)}"):
                load_data(f"{data}:role=detection{options}")
            continue
        expected = detection_split(whole, detect, seed=seed, evaluation_count=count)
        detection, evaluation = (load_data(f"{data}:role={role}{options}") for role in ("detection", "evaluation"))
        assert (_ids(detection), _ids(evaluation)) == (_ids(expected.detection), _ids(expected.evaluation))
        assert not set(_ids(detection)) & set(_ids(evaluation)) and len(detection) == detect
        assert detection.skipped == evaluation.skipped == whole.skipped and len(whole.skipped) == 1
        assert evaluation.selection["role"] == "evaluation" and evaluation.selection["split_seed"] == seed
        split, skipped = load_split(f"{data}:role=evaluation{options}")  # both parts, what split.json records
        assert split.as_dict() == expected.as_dict() and skipped == whole.skipped
    synthetic = detection_split(load_data("synthetic:eval:12"), 4, seed=1)
    part = load_data("synthetic:eval:12:role=evaluation:detect=4:split_seed=1")
    assert isinstance(part, list) and _ids(part) == _ids(synthetic.evaluation)


def _ids(samples: Sequence[Any]) -> list[str]:
    return [s.sample_id for s in samples]


@pytest.mark.parametrize("options, message", [
    (":detect=5", r"detect= set the seeded detection / evaluation split but no part of it: add role=detection"),
    (":split_seed=1:eval=3", r"eval=, split_seed= set the seeded .* add role=detection or role=evaluation"),
    (":role=train", r"role='train' must be detection .* or evaluation"),
    (":role=detection:detect=0", r"detect='0' must be a whole number >= 1"),
    (":role=detection:detect=ten", r"detect='ten' must be a whole number >= 1"),
    (":role=evaluation:eval=-3", r"eval='-3' must be a whole number >= 1"),
    (":role=evaluation:eval=2.5", r"eval='2.5' must be a whole number >= 1"),
    (":role=evaluation:split_seed=x", r"split_seed='x' must be a whole number \(the seed of the split\)"),
    (":role=detection:role=evaluation", "option 'role' given twice"),
])
def test_bad_split_options_are_refused_before_loading(options: str, message: str) -> None:
    for spec in (f"synthetic:eval:20{options}", f"refcoco:/nowhere{options}"):  # checked without reading a file
        with pytest.raises(DataSpecError, match=message):
            check_spec(spec)
    with pytest.raises(DataSpecError, match=r"unknown options \['role'\]"):  # VQA specs have no split
        load_vqa("cvbench:/nowhere:role=detection")


def test_parts_of_one_split_are_checked_disjoint_before_loading() -> None:
    from vrh_interp.experiments.spec_checks import check_disjoint_specs

    data = "refcoco:/nowhere:val"
    check_disjoint_specs(f"{data}:role=detection:detect=50", f"{data}:role=evaluation:detect=50:eval=100", "--a", "--b")
    check_disjoint_specs(f"{data}:role=detection:detect=50", f"{data}:role=evaluation:detect=80", "--a", "--b")
    check_disjoint_specs(f"{data}:role=detection", "refcoco:/elsewhere:val:role=detection", "--a", "--b")
    for detect, evaluate in ((f"{data}:role=detection", f"{data}:role=detection"),  # the same part
                             (f"{data}:role=detection", data),  # the whole holds the part
                             (f"{data}:role=detection:split_seed=1", f"{data}:role=evaluation"),  # another split
                             (f"{data}:role=detection:detect=80", f"{data}:role=evaluation:detect=50")):
        with pytest.raises(ValueError, match="overlaps --a .* give both the same detect= and split_seed="):
            check_disjoint_specs(detect, evaluate, "--a", "--b")
