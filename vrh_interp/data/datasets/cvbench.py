"""CV-Bench (nyu-visionx/CV-Bench, apache-2.0): 2,638 vision-centric multiple-choice questions.

On disk: ``test_2d.parquet`` + ``test_3d.parquet`` (or the older single ``test.parquet``) with columns idx,
type (2D / 3D), task, image (embedded), prompt (question with the choices inline), choices, answer ("(A)"),
source (ADE20K / COCO / Omni3D), ...; or the same rows as ``test_2d.jsonl`` / ``test_3d.jsonl`` / ``test.jsonl``
with ``filename`` naming the image under the folder. ``part`` selects "2d", "3d" or "all".
Scored by option letter (``vqa.score_letter``); the official overall score weights sources,
((ADE20K + COCO) / 2 + Omni3D) / 2 (``cvbench_overall``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from vrh_interp.data.datasets.errors import DatasetError, OnError, RowErrors
from vrh_interp.data.datasets.images import ImageFile, ImageSource
from vrh_interp.data.datasets.parquet import open_tables
from vrh_interp.data.datasets.samples import SampleSet, VQASample, finish

MCQ_INSTRUCTION = "Answer with the option's letter from the given choices directly."
CVBENCH_COLUMNS: tuple[str, ...] = ("idx", "type", "task", "image", "prompt", "choices", "answer", "source")
Part = Literal["all", "2d", "3d"]


CVBENCH_PARTS: dict[str, list[str]] = {"all": ["test_2d", "test_3d"], "2d": ["test_2d"], "3d": ["test_3d"]}


def cvbench_files(path: Path, part: Part) -> list[Path]:
    if part not in CVBENCH_PARTS:
        raise DatasetError(str(path), f"unknown CV-Bench part {part!r}: use one of {', '.join(CVBENCH_PARTS)}")
    if path.is_file():
        return [path]
    names = CVBENCH_PARTS[part]
    for suffix in (".parquet", ".jsonl"):
        found = [path / f"{n}{suffix}" for n in names if (path / f"{n}{suffix}").is_file()]
        if found:
            return found
        if part == "all" and (path / f"test{suffix}").is_file():
            return [path / f"test{suffix}"]
    raise DatasetError(str(path), f"no CV-Bench files for part {part!r} (expected test_2d/test_3d .parquet or .jsonl)")


def _sample(where: str, values: dict[str, Any], image: ImageSource, verify_images: bool) -> VQASample:
    image.size(full_decode=verify_images)
    choices = tuple(str(c) for c in values["choices"])
    answer = str(values["answer"]).strip().strip("()")
    letters = [chr(ord("A") + i) for i in range(len(choices))]
    if answer not in letters:
        raise DatasetError(where, f"answer {values['answer']!r} is not one of the options {letters}")
    return VQASample(
        sample_id=f"cvbench-{values['type']}-{values['idx']}", benchmark="cvbench", question=str(values["prompt"]),
        answer=answer, scorer="letter", image_source=image, choices=choices, choices_in_question=True,
        instruction=MCQ_INSTRUCTION, meta={"type": values["type"], "task": values["task"],
                                           "source": values["source"], "row": where})


def load_cvbench(path: str | Path, *, part: Part = "all", on_error: OnError = "raise",
                 verify_images: bool = False) -> SampleSet[VQASample]:
    path = Path(path)
    errors = RowErrors(on_error)
    samples: list[VQASample] = []
    for file in cvbench_files(path, part):
        if file.suffix == ".parquet":
            for table in open_tables([file], CVBENCH_COLUMNS, layout="CV-Bench"):
                for row in table.rows([c for c in CVBENCH_COLUMNS if c != "image"]):
                    with errors.row(row.where):
                        samples.append(_sample(row.where, row.values, table.image("image", row), verify_images))
            continue
        with open(file, encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, start=1):
                where = f"{file} line {line_no}"
                with errors.row(where):
                    if line.strip():
                        values = json.loads(line)
                        image = ImageFile(file.parent / str(values["filename"]), where)
                        samples.append(_sample(where, values, image, verify_images))
    return finish(samples, errors, source=f"cvbench:{path}", selection={"part": part})


def cvbench_overall(samples: Sequence[VQASample], correct: Mapping[str, bool]) -> float:
    """The official CV-Bench score ((ADE20K + COCO) / 2 + Omni3D) / 2 from per-sample correctness."""
    by_source: dict[str, list[bool]] = {}
    for sample in samples:
        by_source.setdefault(str(sample.meta["source"]), []).append(bool(correct[sample.sample_id]))
    missing = [s for s in ("ADE20K", "COCO", "Omni3D") if s not in by_source]
    if missing:
        raise ValueError(f"no samples from {missing}: the official CV-Bench score needs all three sources")
    accuracy = {source: sum(values) / len(values) for source, values in by_source.items()}
    return ((accuracy["ADE20K"] + accuracy["COCO"]) / 2 + accuracy["Omni3D"]) / 2
