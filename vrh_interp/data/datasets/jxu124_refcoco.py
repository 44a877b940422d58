"""RefCOCO / RefCOCO+ / RefCOCOg as jxu124 parquet (``jxu124/refcoco``, ``refcocoplus``, ``refcocog``).

On disk: ``DIR/data/<split>-*.parquet`` without pixels: ref_id, ann_id, image_id, split, sentences
([{raw, sent, sent_id, tokens}]), captions, raw_anns and raw_image_info (JSON strings; the latter has the
image's width and height), image_path (``coco/train2014/COCO_train2014_%012d.jpg``), bbox = [x1, y1, x2, y2]
pixels (already xyxy, unlike the refer and lmms-lab layouts). One row per referred object.
Split files are named train / validation / test / testB; ``split="val"`` reads ``validation``. RefCOCO's
``test`` has 1,975 rows, the size of testA [I].

Images resolve as ``image_root / image_path``, else ``image_root / <file name>`` (a flat train2014 folder);
the file's header size must equal raw_image_info's.
"""

from __future__ import annotations

import json
from pathlib import Path

from vrh_interp.core.description.boxes import Box
from vrh_interp.data.datasets.errors import DatasetError, OnError, RowErrors
from vrh_interp.data.datasets.images import ImageFile, probe_size
from vrh_interp.data.datasets.parquet import open_tables, split_files
from vrh_interp.data.datasets.refer import Unit, check_unit
from vrh_interp.data.datasets.samples import GroundingSample, SampleSet, finish

JXU124_COLUMNS: tuple[str, ...] = ("ref_id", "image_path", "bbox", "sentences", "raw_image_info")
SPLIT_FILE_NAMES: dict[str, str] = {"val": "validation"}


def resolve_image(image_root: Path, image_path: str) -> Path:
    nested = image_root / image_path
    return nested if nested.is_file() else image_root / Path(image_path).name


def load_jxu124_refcoco(path: str | Path, split: str = "val", *, image_root: str | Path, per: Unit = "object",
                        on_error: OnError = "raise", verify_images: bool = False) -> SampleSet[GroundingSample]:
    check_unit(per)
    image_root = Path(image_root)
    if not image_root.is_dir():
        raise DatasetError(str(image_root), "image folder does not exist (jxu124 parquet holds no pixels)")
    file_split = SPLIT_FILE_NAMES.get(split, split)
    errors = RowErrors(on_error)
    samples: list[GroundingSample] = []
    for table in open_tables(split_files(path, file_split, what="jxu124 RefCOCO parquet"), JXU124_COLUMNS,
                             layout="jxu124 RefCOCO (ref_id, image_path, bbox=[x1, y1, x2, y2], sentences, "
                                    "raw_image_info)"):
        for row in table.rows(JXU124_COLUMNS):
            with errors.row(row.where):
                values = row.values
                info = json.loads(values["raw_image_info"])
                size = (int(info["width"]), int(info["height"]))
                image_path = resolve_image(image_root, str(values["image_path"]))
                found = probe_size(image_path, row.where, full_decode=verify_images)
                if found != size:
                    raise DatasetError(row.where, f"image {image_path} is {found[0]}x{found[1]} but raw_image_info "
                                                  f"says {size[0]}x{size[1]}")
                box = Box(*(float(v) for v in values["bbox"])).check_inside(*size)
                sentences = list(values["sentences"] or [])
                if not sentences:
                    raise DatasetError(row.where, "no sentences")
                ref_id = values["ref_id"]
                for sentence in sentences[:1] if per == "object" else sentences:
                    suffix = "" if per == "object" else f"-sent{sentence['sent_id']}"
                    samples.append(GroundingSample(
                        sample_id=f"ref{ref_id}{suffix}", expression=str(sentence["sent"]), box=box,
                        image_size=size, image_source=ImageFile(image_path, row.where),
                        meta={"ref_id": ref_id, "sentences": [s["sent"] for s in sentences], "row": row.where}))
    return finish(samples, errors, source=f"jxu124-refcoco:{path}",
                  selection={"split": split, "file_split": file_split, "per": per})
