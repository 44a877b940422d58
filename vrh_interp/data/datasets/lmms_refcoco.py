"""RefCOCO / RefCOCO+ / RefCOCOg as lmms-lab parquet (``lmms-lab/RefCOCO``, ``RefCOCOplus``, ``RefCOCOg``).

On disk: ``DIR/data/<split>-0000N-of-0000M.parquet`` with columns question_id (str), image (embedded
``{bytes, path}``), question (a constant captioning prompt, ignored), answer (list of referring
expressions), segmentation, bbox = [x, y, w, h] pixels, iscrowd, file_name. One row per referred object.
Splits: RefCOCO val / test / testA / testB, RefCOCO+ val / testA / testB, RefCOCOg val. The Hub cards give
val 8,811 (RefCOCO) and 7,573 (RefCOCOg) rows, the paper's counts, and the viewer ~3.8k for RefCOCO+; the
refer toolkit's val splits have 3,811 / 3,805 / 2,573 objects, so lmms-lab's RefCOCO and RefCOCOg "val" hold
5,000 rows more than the official val split [V counts, I origin].

Rows: ``per="object"`` gives one sample per row with the first expression, ``per="expression"`` one per
expression (ids ``<question_id>#<i>``). Boxes are xywh -> xyxy and checked against the embedded image's
size, read from its header while streaming; pixels are decoded only when a sample's ``.image`` is read.
"""

from __future__ import annotations

from pathlib import Path

from vrh_interp.core.description.boxes import Box
from vrh_interp.data.datasets.errors import DatasetError, OnError, RowErrors
from vrh_interp.data.datasets.parquet import open_tables, split_files
from vrh_interp.data.datasets.refer import Unit, check_unit
from vrh_interp.data.datasets.samples import GroundingSample, SampleSet, finish

LMMS_COLUMNS: tuple[str, ...] = ("question_id", "image", "answer", "bbox")
TEXT_COLUMNS: tuple[str, ...] = ("question_id", "answer", "bbox")


def load_lmms_refcoco(path: str | Path, split: str = "val", *, per: Unit = "object", on_error: OnError = "raise",
                      verify_images: bool = False) -> SampleSet[GroundingSample]:
    check_unit(per)
    errors = RowErrors(on_error)
    samples: list[GroundingSample] = []
    for table in open_tables(split_files(path, split, what="lmms-lab RefCOCO parquet"), LMMS_COLUMNS,
                             layout="lmms-lab RefCOCO (question_id, image, answer, bbox=[x, y, w, h])"):
        for row in table.rows(TEXT_COLUMNS):
            with errors.row(row.where):
                values, image = row.values, table.image("image", row)
                size = image.size(full_decode=verify_images)
                box = Box.from_xywh(*(float(v) for v in values["bbox"])).check_inside(*size)
                expressions = [str(e) for e in values["answer"] or []]
                if not expressions:
                    raise DatasetError(row.where, "no referring expression in 'answer'")
                question_id = str(values["question_id"])
                chosen = list(enumerate(expressions))[:1] if per == "object" else list(enumerate(expressions))
                for index, expression in chosen:
                    samples.append(GroundingSample(
                        sample_id=question_id if per == "object" else f"{question_id}#{index}",
                        expression=expression, box=box, image_size=size, image_source=image,
                        meta={"question_id": question_id, "expressions": expressions, "row": row.where}))
    return finish(samples, errors, source=f"lmms-refcoco:{path}", selection={"split": split, "per": per})
