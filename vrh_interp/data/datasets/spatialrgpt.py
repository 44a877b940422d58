"""SpatialRGPT-Bench (a8cheng/SpatialRGPT-Bench): region-based spatial questions; here the metric-length subset.

On disk: ``val_SpatialRGPT-Bench.jsonl`` (or a JSON list), one object per question: id, image_info
({file_path, ...}, the image relative to an image folder), text_q (the question, naming "Region [i]"),
conversations ([human turn, gpt turn]; the gpt turn is the answer sentence, e.g. "The width of Region [0] is
1.02 meters."), bbox (one [x1, y1, x2, y2] pixel box per region), qa_info {type: qualitative / quantitative,
category}. The model sees the image with each region outlined and labelled "Region [i]" (general VLMs take
no region masks; boxes are clipped to the image) and ``text_q``.

``categories`` selects rows by ``qa_info.category``; the default, width_data and height_data, is the
object-size estimation subset the paper uses (it reports 266 samples). The gold length is read from the answer
sentence; the scorer (``vqa.score_metric_length``) reads the response's number and unit, converts to metres
and counts it correct within +/-25% of the gold, the official success rule (which uses a GPT-4 judge to read
the numbers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Sequence

from vrh_interp.core.description.boxes import Box
from vrh_interp.data.datasets.errors import DatasetError, OnError, RowErrors
from vrh_interp.data.datasets.images import ImageFile, MarkedRegions
from vrh_interp.data.datasets.samples import SampleSet, VQASample, finish
from vrh_interp.data.datasets.vqa import extract_metres

SIZE_CATEGORIES: tuple[str, ...] = ("width_data", "height_data")
LENGTH_INSTRUCTION = "The regions are outlined and labelled in the image. Answer with a number and a unit."


def _items(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, raw text or object) per question of a JSONL file or a JSON list."""
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as error:
            raise DatasetError(str(path), f"not valid JSON: {error}") from error
        for index, item in enumerate(items):
            yield f"{path} item {index}", item
        return
    for line_no, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            yield f"{path} line {line_no}", line


def load_spatialrgpt(path: str | Path, *, image_dir: str | Path, categories: Sequence[str] = SIZE_CATEGORIES,
                     on_error: OnError = "raise", verify_images: bool = False) -> SampleSet[VQASample]:
    path, image_dir = Path(path), Path(image_dir)
    if path.is_dir():
        path = path / "val_SpatialRGPT-Bench.jsonl"
    if not path.is_file():
        raise DatasetError(str(path), "SpatialRGPT-Bench question file does not exist")
    errors = RowErrors(on_error)
    samples: list[VQASample] = []
    for where, raw in _items(path):
        with errors.row(where):
            item = json.loads(raw) if isinstance(raw, str) else raw
            category = item["qa_info"]["category"]
            if category not in categories:
                continue
            base = ImageFile(image_dir / item["image_info"]["file_path"], where)
            size = base.size(full_decode=verify_images)
            boxes = tuple(Box(*(float(v) for v in b)).clipped(*size) for b in item["bbox"])
            answer = str(item["conversations"][1]["value"])
            metres = extract_metres(answer)
            if metres is None or metres <= 0:
                raise DatasetError(where, f"no positive length with a unit in the answer {answer!r}")
            samples.append(VQASample(
                sample_id=f"spatialrgpt-{item['id']}", benchmark="spatialrgpt", question=str(item["text_q"]),
                answer=answer, scorer="metric_length",
                image_source=MarkedRegions(base, boxes, tuple(f"Region [{i}]" for i in range(len(boxes)))),
                instruction=LENGTH_INSTRUCTION, max_new_tokens=32,
                meta={"category": category, "answer_metres": metres, "row": where}))
    return finish(samples, errors, source=f"spatialrgpt:{path}", selection={"categories": list(categories)})
