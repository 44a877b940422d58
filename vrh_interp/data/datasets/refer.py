"""RefCOCO / RefCOCO+ / RefCOCOg in the ``refer`` toolkit layout (lichengunc/refer).

On disk: ``ROOT/<dataset>/instances.json`` (a COCO dict: ``images`` with id/width/height, ``annotations``
with id/image_id/``bbox`` = [x, y, w, h] pixels) and ``ROOT/<dataset>/refs(<split_by>).p``, a Python 2
pickle of a list of ref dicts {ref_id, ann_id, image_id, category_id, split, file_name, sentences: [{raw,
sent, sent_id, tokens}], sent_ids}. ``split_by`` is ``unc`` for RefCOCO and RefCOCO+ (splits train / val /
testA / testB) and ``umd`` for RefCOCOg (train / val / test); ``google`` exists for RefCOCO and RefCOCOg.
The pickle is read with ``safe_pickle.load_plain_pickle`` (no globals, so no code can run).

Images are COCO train2014 files named from the image id, ``COCO_train2014_%012d.jpg``. The ref's
``file_name`` carries an extra ``_<ann_id>`` suffix and is NOT the image file. The image folder is
``image_dir`` or the first existing of ``ROOT/images/mscoco/images/train2014``, ``ROOT/images/train2014``,
``ROOT/train2014``, ``ROOT/<dataset>/images``.

Rows: ``per="object"`` gives one sample per ref (the referred object) with its first sentence's ``sent``;
``per="expression"`` one sample per sentence. Boxes are converted from xywh to xyxy and checked against
``instances.json``'s width and height, and the image header must have that same size (a resized copy of
COCO would put every box in the wrong frame).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any, Literal

from vrh_interp.core.description.boxes import Box
from vrh_interp.data.datasets.errors import DatasetError, OnError, RowErrors
from vrh_interp.data.datasets.images import ImageFile, probe_size
from vrh_interp.data.datasets.safe_pickle import load_plain_pickle
from vrh_interp.data.datasets.samples import GroundingSample, SampleSet, finish

ReferDataset = Literal["refcoco", "refcoco+", "refcocog"]
Unit = Literal["object", "expression"]


def check_unit(per: str) -> None:
    """A grounding loader's ``per``: one sample per object (its first expression) or per expression."""
    if per not in ("object", "expression"):
        raise ValueError(f"per must be 'object' or 'expression', got {per!r}")


DEFAULT_SPLIT_BY: dict[str, str] = {"refcoco": "unc", "refcoco+": "unc", "refcocog": "umd"}
COCO_IMAGE_NAME = "COCO_train2014_{:012d}.jpg"


def dataset_folder(root: Path, dataset: str) -> Path:
    """``ROOT/<dataset>`` when it exists, else ROOT itself when it holds ``instances.json``."""
    if (root / dataset / "instances.json").is_file():
        return root / dataset
    if (root / "instances.json").is_file():
        return root
    raise DatasetError(str(root), f"no {dataset}/instances.json or instances.json here (expected the refer "
                                  "layout: ROOT/<dataset>/instances.json and refs(<split_by>).p)")


def image_folder(root: Path, folder: Path, image_dir: str | Path | None) -> Path:
    candidates = [Path(image_dir)] if image_dir is not None else [
        root / "images" / "mscoco" / "images" / "train2014", root / "images" / "train2014", root / "train2014",
        folder / "images"]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise DatasetError(str(root), "no COCO train2014 image folder; looked in " + ", ".join(map(str, candidates))
                       + " (pass images=DIR)")


def read_refs(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        present = sorted(p.name for p in path.parent.glob("refs(*).p"))
        raise DatasetError(str(path), f"refs file does not exist (present: {present or 'none'})")
    try:
        refs = load_plain_pickle(path)
    except pickle.UnpicklingError as error:
        raise DatasetError(str(path), str(error).removeprefix(f"{path}: ")) from error
    if not isinstance(refs, list) or not all(isinstance(r, dict) for r in refs):
        raise DatasetError(str(path), f"expected a list of ref dicts, got {type(refs).__name__}")
    return refs


def read_instances(path: Path) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
    """Images and annotations of a COCO ``instances.json``, by id."""
    try:
        coco = json.loads(path.read_text(encoding="utf-8"))
        images = {int(i["id"]): i for i in coco["images"]}
        annotations = {int(a["id"]): a for a in coco["annotations"]}
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise DatasetError(str(path), f"not a COCO instances file with images and annotations ({error})") from error
    return images, annotations


def load_refer(root: str | Path, dataset: ReferDataset = "refcoco", split: str = "val", *,
               split_by: str | None = None, per: Unit = "object", image_dir: str | Path | None = None,
               on_error: OnError = "raise", verify_images: bool = False) -> SampleSet[GroundingSample]:
    if dataset not in DEFAULT_SPLIT_BY:
        raise ValueError(f"dataset must be one of {sorted(DEFAULT_SPLIT_BY)}, got {dataset!r}")
    check_unit(per)
    root = Path(root)
    folder = dataset_folder(root, dataset)
    split_by = split_by or DEFAULT_SPLIT_BY[dataset]
    refs_path = folder / f"refs({split_by}).p"
    refs = read_refs(refs_path)
    images, annotations = read_instances(folder / "instances.json")
    images_dir = image_folder(root, folder, image_dir)
    errors = RowErrors(on_error)
    checked_sizes: dict[int, tuple[int, int]] = {}
    samples: list[GroundingSample] = []
    for item, ref in enumerate(refs):
        if ref.get("split") != split:
            continue
        where = f"{refs_path} item {item} (ref_id {ref.get('ref_id')})"
        with errors.row(where):
            image_id = int(ref["image_id"])
            ann_id = int(ref["ann_id"])
            if image_id not in images or ann_id not in annotations:
                raise DatasetError(where, f"image {image_id} or annotation {ann_id} is not in instances.json")
            info, annotation = images[image_id], annotations[ann_id]
            size = (int(info["width"]), int(info["height"]))
            path = images_dir / COCO_IMAGE_NAME.format(image_id)
            if image_id not in checked_sizes:
                checked_sizes[image_id] = probe_size(path, where, full_decode=verify_images)
            if checked_sizes[image_id] != size:
                raise DatasetError(where, f"image {path} is {checked_sizes[image_id][0]}x{checked_sizes[image_id][1]} "
                                          f"but instances.json says {size[0]}x{size[1]}")
            box = Box.from_xywh(*(float(v) for v in annotation["bbox"])).check_inside(*size)
            sentences = list(ref["sentences"])
            if not sentences:
                raise DatasetError(where, "ref has no sentences")
            meta = {"ref_id": ref["ref_id"], "ann_id": ref["ann_id"], "image_id": image_id,
                    "category_id": ref.get("category_id"), "split": split, "dataset": dataset, "row": where}
            chosen = sentences[:1] if per == "object" else sentences
            for sentence in chosen:
                suffix = "" if per == "object" else f"-sent{sentence['sent_id']}"
                samples.append(GroundingSample(
                    sample_id=f"{dataset}-{split}-ref{ref['ref_id']}{suffix}", expression=str(sentence["sent"]),
                    box=box, image_size=size, image_source=ImageFile(path, where),
                    meta={**meta, "raw": sentence.get("raw"), "sent_id": sentence.get("sent_id"),
                          "sentences": [s["sent"] for s in sentences]}))
    return finish(samples, errors, source=f"{dataset}:{folder} refs({split_by})",
                  selection={"split": split, "per": per, "split_by": split_by})

