"""Peak memory of loading and iterating a 10,000-row RefCOCO parquet with embedded images: eager vs ours.

The fixture is written in the lmms-lab RefCOCO schema (question_id, image {bytes, path}, answer, bbox xywh, ...)
in row groups of 100 rows, as the Hub writes image datasets; each image is a W x H JPEG (default 160 x 120).
Each mode runs in a fresh subprocess so its peak RSS is its own:

* ``eager``: ``pandas.read_parquet`` of the whole file, then every image decoded into a list (what a naive loader,
  or ``datasets`` with decoded images kept in memory, does);
* ``ours-load``: ``load_lmms_refcoco`` only (one streaming pass that reads image headers);
* ``ours-iterate``: ``load_lmms_refcoco`` and then every sample's ``.image`` decoded, one at a time, in order.

    python benchmarks/dataset_memory.py [--rows 10000] [--size 320x240] [--folder DIR]

Prints peak RSS above the interpreter-with-imports baseline, and seconds, per mode.
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROW_GROUP = 100
MODES = ("eager", "ours-load", "ours-iterate")


def write_fixture(path: Path, rows: int, width: int, height: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image, ImageDraw

    xs = np.linspace(0, 255, width, dtype=np.uint8)[None, :, None]
    ys = np.linspace(0, 255, height, dtype=np.uint8)[:, None, None]
    writer = None
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    for start in range(0, rows, ROW_GROUP):
        ids, images, boxes = [], [], []
        for i in range(start, min(rows, start + ROW_GROUP)):
            pixels = np.concatenate([np.broadcast_to(xs, (height, width, 1)), np.broadcast_to(ys, (height, width, 1)),
                                     np.full((height, width, 1), i % 256, dtype=np.uint8)], axis=2)
            image = Image.fromarray(np.ascontiguousarray(pixels))
            x, y = i % (width // 2), i % (height // 2)
            ImageDraw.Draw(image).rectangle([x, y, x + width // 4, y + height // 4], fill=(255, 255, 255))
            buffer = io.BytesIO()
            image.save(buffer, format="JPEG", quality=85)
            ids.append(f"q{i}")
            images.append({"bytes": buffer.getvalue(), "path": f"{i}.jpg"})
            boxes.append([float(x), float(y), float(width // 4), float(height // 4)])
        table = pa.table({"question_id": ids, "image": pa.array(images, type=image_type),
                          "answer": [[f"object {i}"] for i in range(start, start + len(ids))],
                          "bbox": pa.array(boxes, type=pa.list_(pa.float32()))})
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema)
        writer.write_table(table, row_group_size=ROW_GROUP)
    assert writer is not None
    writer.close()


def run_mode(mode: str, path: str) -> dict[str, float]:
    import pandas as pd
    from PIL import Image

    from vrh_interp.data.datasets.lmms_refcoco import load_lmms_refcoco

    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    if mode == "eager":
        frame = pd.read_parquet(path)
        images = [Image.open(io.BytesIO(cell["bytes"])).convert("RGB") for cell in frame["image"]]
        count = sum(1 for image in images if image.size)
    else:
        samples = load_lmms_refcoco(path)
        count = len(samples) if mode == "ours-load" else sum(1 for s in samples if s.image.size)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"rows": count, "seconds": seconds, "peak_mib_above_baseline": (peak - baseline) / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--size", default="160x120", help="image WIDTHxHEIGHT")
    parser.add_argument("--folder", default=None, help="where to write the fixture (default: a temporary folder)")
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args.mode, args.path)))
        return
    width, height = (int(v) for v in args.size.split("x"))
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.folder or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"val-{args.rows}-{width}x{height}.parquet"
        if not path.exists():
            started = time.perf_counter()
            write_fixture(path, args.rows, width, height)
            print(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB, {time.perf_counter() - started:.0f} s)")
        decoded = args.rows * width * height * 3 / 2**20
        print(f"{args.rows} rows of {width}x{height} JPEGs; all decoded RGB pixels: {decoded:.0f} MiB\n")
        print(f"{'mode':<14}{'rows':>8}{'seconds':>10}{'peak RSS above baseline (MiB)':>32}")
        for mode in MODES:
            output = subprocess.run([sys.executable, __file__, "--mode", mode, "--path", str(path)],
                                    check=True, capture_output=True, text=True).stdout
            result = json.loads(output.strip().splitlines()[-1])
            print(f"{mode:<14}{result['rows']:>8}{result['seconds']:>10.1f}{result['peak_mib_above_baseline']:>32.0f}")


if __name__ == "__main__":
    main()
