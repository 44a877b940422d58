"""CountBenchQA (vikhyatk/CountBenchQA): 491 counting questions (2 to 10 objects) from PaliGemma's CountBench.

On disk: ``DIR/data/test-*.parquet`` with columns image (embedded), text (the LAION caption, which states the
count), question, number (int). Only the question is shown: the caption would leak the answer. Scored by the
last integer or number word in the response, compared numerically (``vqa.score_count``).
"""

from __future__ import annotations

from pathlib import Path

from vrh_interp.data.datasets.errors import OnError, RowErrors
from vrh_interp.data.datasets.parquet import open_tables, split_files
from vrh_interp.data.datasets.samples import SampleSet, VQASample, finish

COUNTBENCH_COLUMNS: tuple[str, ...] = ("image", "question", "number")
COUNT_INSTRUCTION = "Answer with a single number."


def load_countbench(path: str | Path, split: str = "test", *, on_error: OnError = "raise",
                    verify_images: bool = False) -> SampleSet[VQASample]:
    errors = RowErrors(on_error)
    samples: list[VQASample] = []
    for table in open_tables(split_files(path, split, what="CountBenchQA parquet"), COUNTBENCH_COLUMNS,
                             layout="CountBenchQA (image, question, number)"):
        for row in table.rows(["question", "number"]):
            with errors.row(row.where):
                image = table.image("image", row)
                image.size(full_decode=verify_images)
                samples.append(VQASample(
                    sample_id=f"countbench-{table.path.stem}-{row.number}", benchmark="countbench",
                    question=str(row.values["question"]), answer=str(int(row.values["number"])), scorer="count",
                    image_source=image, instruction=COUNT_INSTRUCTION, meta={"row": row.where}))
    return finish(samples, errors, source=f"countbench:{path}", selection={"split": split, "caption_shown": False})
