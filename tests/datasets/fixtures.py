"""Small benchmark files in the real on-disk schemas, written into a test's tmp folder.

Images are generated with PIL: a flat background with a filled rectangle exactly where the ground-truth box
is, non-square (so a width/height swap shows). Boxes are chosen so that reading xywh as xyxy (or the reverse)
gives a different or invalid box.
"""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, ImageDraw

IMAGE_FIELD = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def box_image(width: int, height: int, box_xyxy: Sequence[float] | None = None, *, seed: int = 0,
              fmt: str = "PNG") -> bytes:
    """Encoded image: seeded background, the box (if any and not empty) filled white."""
    shade = 40 + seed % 150
    image = Image.new("RGB", (width, height), (shade, shade // 2, 255 - shade))
    if box_xyxy is not None and box_xyxy[2] > box_xyxy[0] and box_xyxy[3] > box_xyxy[1]:
        x1, y1, x2, y2 = box_xyxy
        ImageDraw.Draw(image).rectangle([x1, y1, x2 - 1, y2 - 1], fill=(255, 255, 255))
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def write_image(path: Path, width: int, height: int, box_xyxy: Sequence[float] | None = None, *, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(box_image(width, height, box_xyxy, seed=seed, fmt="JPEG" if path.suffix == ".jpg" else "PNG"))
    return path


def write_parquet(path: Path, columns: dict[str, list[Any]], types: dict[str, pa.DataType] | None = None,
                  row_group_size: int = 100) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    types = types or {}
    table = pa.table({name: pa.array(values, type=types.get(name)) for name, values in columns.items()})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


# ---------------------------------------------------------------- grounding


def lmms_rows(count: int, *, width: int = 64, height: int = 48) -> list[dict[str, Any]]:
    """lmms-lab RefCOCO rows; row i's box is xywh (4 + i % 5, 6, 20, 10) -> xyxy (4 + i % 5, 6, 24 + i % 5, 16)."""
    rows = []
    for i in range(count):
        x = 4 + i % 5
        rows.append({"question_id": f"q{i}", "xywh": [x, 6, 20, 10], "xyxy": [x, 6, x + 20, 16],
                     "answer": [f"object {i}", f"thing number {i}"], "width": width, "height": height})
    return rows


def write_lmms_refcoco(folder: Path, rows: Sequence[dict[str, Any]], split: str = "val",
                       row_group_size: int = 100) -> Path:
    images = [{"bytes": box_image(r["width"], r["height"], r["xyxy"], seed=i), "path": f"{r['question_id']}.png"}
              for i, r in enumerate(rows)]
    return write_parquet(folder / "data" / f"{split}-00000-of-00001.parquet", {
        "question_id": [r["question_id"] for r in rows], "image": images,
        "question": ["Please carefully observe the area circled in the image and come up with a caption"] * len(rows),
        "answer": [r["answer"] for r in rows], "segmentation": [[0.0] * 8 for _ in rows],
        "bbox": [[float(v) for v in r["xywh"]] for r in rows], "iscrowd": [0] * len(rows),
        "file_name": [f"COCO_train2014_{i:012d}_{i}.jpg" for i in range(len(rows))],
    }, {"image": IMAGE_FIELD, "segmentation": pa.list_(pa.float32()), "bbox": pa.list_(pa.float32()),
        "iscrowd": pa.int8()}, row_group_size)


def write_refer(root: Path, dataset: str = "refcoco", *, split_by: str = "unc") -> dict[str, Any]:
    """refer layout: 2 COCO images, 3 refs (2 val, 1 testA), xywh annotation boxes, a Python-2-style pickle."""
    folder = root / dataset
    folder.mkdir(parents=True)
    images = [{"id": 9, "width": 64, "height": 48, "file_name": "COCO_train2014_000000000009.jpg"},
              {"id": 25, "width": 50, "height": 70, "file_name": "COCO_train2014_000000000025.jpg"}]
    annotations = [{"id": 101, "image_id": 9, "bbox": [10, 20, 30, 15], "category_id": 1},
                   {"id": 102, "image_id": 25, "bbox": [5, 40, 20, 25], "category_id": 2},
                   {"id": 103, "image_id": 9, "bbox": [0, 0, 8, 8], "category_id": 3}]
    (folder / "instances.json").write_text(json.dumps({"images": images, "annotations": annotations,
                                                       "categories": []}))

    def ref(ref_id: int, ann_id: int, image_id: int, split: str, sentences: list[str]) -> dict[str, Any]:
        return {"ref_id": ref_id, "ann_id": ann_id, "image_id": image_id, "category_id": 1, "split": split,
                "file_name": f"COCO_train2014_{image_id:012d}_{ann_id}.jpg", "sent_ids": list(range(len(sentences))),
                "sentences": [{"raw": s.upper(), "sent": s, "sent_id": ref_id * 10 + j, "tokens": s.split()}
                              for j, s in enumerate(sentences)]}

    refs = [ref(1, 101, 9, "val", ["left man", "man in red"]), ref(2, 102, 25, "val", ["tall thing"]),
            ref(3, 103, 9, "testA", ["corner"])]
    with open(folder / f"refs({split_by}).p", "wb") as handle:
        pickle.dump(refs, handle, protocol=2)
    image_dir = root / "images" / "mscoco" / "images" / "train2014"
    write_image(image_dir / "COCO_train2014_000000000009.jpg", 64, 48, (10, 20, 40, 35))
    write_image(image_dir / "COCO_train2014_000000000025.jpg", 50, 70, (5, 40, 25, 65))
    return {"refs": refs, "image_dir": image_dir, "folder": folder}


def write_jxu124(folder: Path, image_root: Path, split_file: str = "validation") -> Path:
    """jxu124 parquet: 2 rows, bbox already xyxy, images under coco/train2014/ (the second only by basename)."""
    write_image(image_root / "coco" / "train2014" / "COCO_train2014_000000000009.jpg", 64, 48, (10, 20, 40, 35))
    write_image(image_root / "COCO_train2014_000000000025.jpg", 50, 70, (5, 40, 25, 65))
    sentences = [[{"raw": "Left man", "sent": "left man", "sent_id": 10, "tokens": ["left", "man"]},
                  {"raw": "Man", "sent": "man in red", "sent_id": 11, "tokens": ["man"]}],
                 [{"raw": "Tall", "sent": "tall thing", "sent_id": 20, "tokens": ["tall"]}]]
    return write_parquet(folder / "data" / f"{split_file}-00000-of-00001.parquet", {
        "ref_id": [1, 2], "ann_id": [101, 102], "image_id": [9, 25], "split": ["val", "val"],
        "sentences": sentences, "raw_image_info": [json.dumps({"width": 64, "height": 48}),
                                                   json.dumps({"width": 50, "height": 70})],
        "image_path": ["coco/train2014/COCO_train2014_000000000009.jpg",
                       "coco/train2014/COCO_train2014_000000000025.jpg"],
        "bbox": [[10.0, 20.0, 40.0, 35.0], [5.0, 40.0, 25.0, 65.0]],
        "captions": [["left man", "man in red"], ["tall thing"]],
    })


def write_toloka(folder: Path, rows: Sequence[dict[str, Any]]) -> tuple[Path, Path]:
    """A Toloka CSV (image as URL) and its image folder; each row dict: name, width, height, box, question."""
    image_dir = folder / "images"
    lines = ["image,width,height,left,top,right,bottom,question"]
    for i, row in enumerate(rows):
        write_image(image_dir / row["name"], row.get("file_width", row["width"]), row.get("file_height", row["height"]),
                    row["box"], seed=i)
        left, top, right, bottom = row["box"]
        lines.append(f"https://tlk.s3.yandex.net/wsdm2023/{row['name']},{row['width']},{row['height']},"
                     f"{left},{top},{right},{bottom},\"{row['question']}\"")
    csv_path = folder / "test_public.csv"
    csv_path.write_text("\n".join(lines) + "\n")
    return csv_path, image_dir


def mask_png(width: int, height: int, rect: Sequence[int]) -> bytes:
    mask = np.zeros((height, width), dtype=np.uint8)
    x1, y1, x2, y2 = rect
    mask[y1:y2, x1:x2] = 255
    buffer = io.BytesIO()
    Image.fromarray(mask, mode="L").save(buffer, format="PNG")
    return buffer.getvalue()


def write_refspatial(folder: Path, rects: Sequence[Sequence[int]], split: str = "location", *,
                     raw: bool = False, width: int = 60, height: int = 40) -> Path:
    """RefSpatial-Bench parquet (or raw folder) with one row per mask rectangle (xyxy, exclusive)."""
    if raw:
        base = folder / split.capitalize()
        items = []
        for i, rect in enumerate(rects):
            write_image(base / "image" / f"{i}.png", width, height, rect, seed=i)
            (base / "mask").mkdir(parents=True, exist_ok=True)
            (base / "mask" / f"{i}.png").write_bytes(mask_png(width, height, rect))
            items.append({"id": i, "object": f"the object {i}", "prompt": "Please point", "suffix": "",
                          "rgb_path": f"image/{i}.png", "mask_path": f"mask/{i}.png", "category": split, "step": 2})
        (base / "question.json").write_text(json.dumps(items))
        return base / "question.json"
    return write_parquet(folder / "data" / f"{split}-00000-of-00001.parquet", {
        "id": list(range(len(rects))),
        "image": [{"bytes": box_image(width, height, r, seed=i), "path": None} for i, r in enumerate(rects)],
        "mask": [{"bytes": mask_png(width, height, r), "path": None} for r in rects],
        "object": [f"the object {i}" for i in range(len(rects))], "prompt": ["Please point"] * len(rects),
        "suffix": [""] * len(rects), "step": [2] * len(rects),
    }, {"image": IMAGE_FIELD, "mask": IMAGE_FIELD})


# ---------------------------------------------------------------- VQA


def embedded(count: int, width: int = 40, height: int = 30) -> list[dict[str, Any]]:
    return [{"bytes": box_image(width, height, None, seed=i), "path": None} for i in range(count)]


def write_cvbench(folder: Path, rows: Sequence[dict[str, Any]], name: str = "test_2d") -> Path:
    """rows: idx, type, task, source, choices, answer ('(B)')."""
    return write_parquet(folder / f"{name}.parquet", {
        "idx": [r["idx"] for r in rows], "type": [r.get("type", "2D") for r in rows],
        "task": [r.get("task", "Count") for r in rows], "image": embedded(len(rows)),
        "prompt": ["How many cups? Select from the following choices.\n"
                   + "\n".join(f"({chr(65 + i)}) {c}" for i, c in enumerate(r["choices"])) for r in rows],
        "question": ["How many cups?"] * len(rows), "choices": [list(r["choices"]) for r in rows],
        "answer": [r["answer"] for r in rows], "source": [r.get("source", "COCO") for r in rows],
    }, {"image": IMAGE_FIELD})


def write_countbench(folder: Path, numbers: Sequence[int]) -> Path:
    return write_parquet(folder / "data" / "test-00000-of-00001.parquet", {
        "image": embedded(len(numbers)),
        "text": [f"a photo of {n} dogs on grass" for n in numbers],
        "question": ["How many dogs are in the image?"] * len(numbers), "number": list(numbers),
    }, {"image": IMAGE_FIELD, "number": pa.int32()})


def write_mmstar(folder: Path, rows: Sequence[dict[str, Any]]) -> Path:
    """rows: index, question (with 'Options: A: .., B: ..'), answer letter."""
    return write_parquet(folder / "mmstar.parquet", {
        "index": [r["index"] for r in rows], "question": [r["question"] for r in rows], "image": embedded(len(rows)),
        "answer": [r["answer"] for r in rows], "category": ["coarse perception"] * len(rows),
        "l2_category": ["image scene and topic"] * len(rows), "meta_info": [json.dumps({})] * len(rows),
    }, {"image": IMAGE_FIELD})


def write_mathvista(folder: Path, rows: Sequence[dict[str, Any]]) -> Path:
    """rows: pid, question_type, answer_type, choices (list | None), answer, precision."""
    return write_parquet(folder / "data" / "testmini-00000-of-00001.parquet", {
        "pid": [r["pid"] for r in rows], "question": ["What is it?"] * len(rows),
        "image": [f"images/{r['pid']}.jpg" for r in rows], "decoded_image": embedded(len(rows)),
        "choices": [r.get("choices") for r in rows], "unit": [None] * len(rows),
        "precision": [r.get("precision") for r in rows], "answer": [r["answer"] for r in rows],
        "question_type": [r["question_type"] for r in rows], "answer_type": [r["answer_type"] for r in rows],
        "query": [f"Hint: answer at the end.\nQuestion: item {r['pid']}" for r in rows],
    }, {"image": pa.string(), "decoded_image": IMAGE_FIELD, "choices": pa.list_(pa.string()),
        "precision": pa.float64()})


def write_spatial457(folder: Path, questions: Sequence[dict[str, Any]]) -> Path:
    for q in questions:
        write_image(folder / "images" / q["image_filename"], 48, 32, None)
    path = folder / "questions" / "L1_single.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"info": {}, "questions": list(questions)}))
    return path


def write_spatialrgpt(folder: Path, items: Sequence[dict[str, Any]]) -> Path:
    """items: id, category, answer sentence, bbox list (xyxy); images 80x60 named <id>.jpg."""
    lines = []
    for item in items:
        write_image(folder / "images" / f"{item['id']}.jpg", 80, 60, None)
        lines.append(json.dumps({
            "id": item["id"], "image_info": {"file_path": f"{item['id']}.jpg", "height": 60, "width": 80},
            "text_q": "What is the width of Region [0]?", "bbox": item.get("bbox", [[10, 10, 40, 30]]),
            "conversations": [{"from": "human", "value": "<image>\nWhat is the width of Region [0]?"},
                              {"from": "gpt", "value": item["answer"]}],
            "qa_info": {"type": "quantitative", "category": item["category"]}}))
    path = folder / "val_SpatialRGPT-Bench.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_vaw(folder: Path, instances: Sequence[dict[str, Any]], types: dict[str, list[str]]) -> Path:
    """VAW test.json + attribute_types.json; images 70x50 named <image_id>.jpg under VG_100K/."""
    (folder / "data").mkdir(parents=True, exist_ok=True)
    for inst in instances:
        write_image(folder / "images" / "VG_100K" / f"{inst['image_id']}.jpg", 70, 50, None)
    (folder / "data" / "attribute_types.json").write_text(json.dumps(types))
    path = folder / "data" / "test.json"
    path.write_text(json.dumps(list(instances)))
    return path
