"""MathVista testmini (AI4Math/MathVista): 1,000 visual math problems, 540 of them multiple choice.

On disk: ``DIR/data/testmini-*.parquet`` with columns pid, question, image (a relative path), decoded_image
(embedded), choices (list or null), unit, precision, answer (for multiple choice: the option TEXT),
question_type (multi_choice / free_form), answer_type (text / integer / float / list), query (the official
prompt: hint, question and, for multiple choice, the lettered options). The model sees ``query``.

``subset="mcq"`` keeps the multiple-choice rows (540); ``"all"`` keeps all 1,000. The paper says "MCQ split,
1,000 samples", which matches neither exactly, so the choice is recorded in ``SampleSet.selection``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from vrh_interp.data.datasets.errors import DatasetError, OnError, RowErrors
from vrh_interp.data.datasets.parquet import open_tables, split_files
from vrh_interp.data.datasets.samples import SampleSet, VQASample, finish

MATHVISTA_COLUMNS: tuple[str, ...] = ("pid", "decoded_image", "choices", "precision", "answer", "question_type",
                                      "answer_type", "query")
Subset = Literal["mcq", "all"]


def load_mathvista(path: str | Path, split: str = "testmini", *, subset: Subset = "mcq", on_error: OnError = "raise",
                   verify_images: bool = False) -> SampleSet[VQASample]:
    if subset not in ("mcq", "all"):
        raise ValueError(f"MathVista subset must be 'mcq' or 'all', got {subset!r}")
    errors = RowErrors(on_error)
    samples: list[VQASample] = []
    text_columns = [c for c in MATHVISTA_COLUMNS if c != "decoded_image"]
    for table in open_tables(split_files(path, split, what="MathVista parquet"), MATHVISTA_COLUMNS,
                             layout="MathVista testmini"):
        for row in table.rows(text_columns):
            values = row.values
            if subset == "mcq" and values.get("question_type") != "multi_choice":
                continue
            with errors.row(row.where):
                image = table.image("decoded_image", row)
                image.size(full_decode=verify_images)
                choices = tuple(str(c) for c in values["choices"] or ())
                answer = str(values["answer"])
                if values["question_type"] == "multi_choice" and answer not in choices:
                    raise DatasetError(row.where, f"multiple-choice answer {answer!r} is not one of {list(choices)}")
                if values["question_type"] != "multi_choice" and values["answer_type"] not in \
                        ("integer", "float", "list", "text"):
                    raise DatasetError(row.where, f"unknown answer_type {values['answer_type']!r}")
                samples.append(VQASample(
                    sample_id=f"mathvista-{values['pid']}", benchmark="mathvista", question=str(values["query"]),
                    answer=answer, scorer="mathvista", image_source=image, choices=choices, choices_in_question=True,
                    max_new_tokens=48, meta={"question_type": values["question_type"],
                                             "answer_type": values["answer_type"],
                                             "precision": values["precision"], "row": row.where}))
    return finish(samples, errors, source=f"mathvista:{path}", selection={"split": split, "subset": subset})
