"""MMStar (Lin-Chen/MMStar): 1,500 vision-indispensable multiple-choice questions.

On disk: ``DIR/mmstar.parquet`` (or ``DIR/data/<split>-*.parquet``, split ``val``) with columns index, question (the
options inline after "Options:" as "A: ..., B: ..., C: ..., D: ..."), image (embedded), answer (a letter),
category, l2_category, meta_info. The option texts are parsed out of the question for the letter scorer's
text fallback; the question is shown as is.
"""

from __future__ import annotations

import re
from pathlib import Path

from vrh_interp.data.datasets.cvbench import MCQ_INSTRUCTION
from vrh_interp.data.datasets.errors import DatasetError, OnError, RowErrors
from vrh_interp.data.datasets.parquet import open_tables, split_files
from vrh_interp.data.datasets.samples import SampleSet, VQASample, finish

MMSTAR_COLUMNS: tuple[str, ...] = ("index", "question", "image", "answer", "category", "l2_category")
_OPTION = re.compile(r"(?:^|[\s,;])([A-F])[:.]\s*")


def parse_inline_options(question: str) -> tuple[str, ...]:
    """Option texts in letter order from "...Options: A: x, B: y, C: z" (empty if there is no A..)."""
    tail = question[question.rfind("Options:") + len("Options:"):] if "Options:" in question else question
    marks = list(_OPTION.finditer(tail))
    letters = [m.group(1) for m in marks]
    if not letters or letters != [chr(ord("A") + i) for i in range(len(letters))]:
        return ()
    ends = [m.start() for m in marks[1:]] + [len(tail)]
    return tuple(tail[m.end(): end].strip().rstrip(",;").strip() for m, end in zip(marks, ends))


def load_mmstar(path: str | Path, split: str = "val", *, on_error: OnError = "raise",
                verify_images: bool = False) -> SampleSet[VQASample]:
    errors = RowErrors(on_error)
    samples: list[VQASample] = []
    text_columns = [c for c in MMSTAR_COLUMNS if c != "image"]
    single = Path(path) / "mmstar.parquet"
    files = [single] if single.is_file() else split_files(path, split, what="MMStar parquet")
    for table in open_tables(files, MMSTAR_COLUMNS, layout="MMStar"):
        for row in table.rows(text_columns):
            with errors.row(row.where):
                image = table.image("image", row)
                image.size(full_decode=verify_images)
                question = str(row.values["question"])
                choices = parse_inline_options(question)
                answer = str(row.values["answer"]).strip()
                if answer not in [chr(ord("A") + i) for i in range(len(choices))]:
                    raise DatasetError(row.where, f"answer {answer!r} is not among the options parsed from the "
                                                  f"question ({len(choices)} found)")
                samples.append(VQASample(
                    sample_id=f"mmstar-{row.values['index']}", benchmark="mmstar", question=question, answer=answer,
                    scorer="letter", image_source=image, choices=choices, choices_in_question=True,
                    instruction=MCQ_INSTRUCTION, meta={"category": row.values["category"],
                                                       "l2_category": row.values["l2_category"], "row": row.where}))
    return finish(samples, errors, source=f"mmstar:{path}", selection={"split": split})
