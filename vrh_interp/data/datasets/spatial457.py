"""Spatial457 (RyanWW/Spatial457), level 1 "single object" questions (L1_single, 670) or any other level.

On disk: ``DIR/questions/<subset>.json`` in the CLEVR layout, ``{"questions": [...]}`` or a bare list, each
{image_filename, question, answer, program, question_index, ...}, and the rendered images in
``DIR/images/`` (or ``image_dir``). Answers are words ("red", "airliner"), integers or yes/no (stored as
"True"/"False" in some files).

The prompt follows VLMEvalKit's Spatial457 task: a task description, the question, the list of allowed
answers and the JSON template ``{'Reasoning': '<your reasons>', 'Answer': '<Your answer>'}``; the scorer
reads the ``Answer`` field (``vqa.score_spatial457``).
"""

from __future__ import annotations

import json
from pathlib import Path

from vrh_interp.data.datasets.errors import DatasetError, OnError, RowErrors
from vrh_interp.data.datasets.images import ImageFile
from vrh_interp.data.datasets.samples import SampleSet, VQASample, finish

SIZES = ("small", "large")
SHAPES = ("airliner", "dirtbike", "road bike", "tandem bike", "suv", "wagon", "scooter", "mountain bike", "minivan",
          "sedan", "school bus", "fighter", "chopper", "double bus", "truck", "articulated bus", "cruiser", "jet",
          "utility bike", "regular bus", "biplane")
COLOURS = ("gray", "blue", "purple", "brown", "green", "cyan", "red", "yellow")
DIRECTIONS = ("left", "right", "front", "back")
ALLOWED_ANSWERS = ", ".join(word.capitalize() for word in (*SIZES, *SHAPES, *COLOURS, *DIRECTIONS))
TASK_DESCRIPTION = ("You are an intelligent chatbot designed to answer questions based on an image. Your task is to "
                    "analyze the images, identify attributes of the objects, and then determine the answer to the "
                    "question.")
ANSWER_FORMAT = (
    "First, identify the related objects referred to in the question, including their shape, color and size; then "
    "add a brief reasoning process. Each object has a shape (e.g., 'airliner'), a size ('small' or 'large') and a "
    "color (one of 'gray', 'blue', 'purple', 'brown', 'green', 'cyan', 'red', 'yellow'); the direction of an "
    "object is one of 'left', 'right', 'front', 'back'.\n"
    f"Second, give the answer: (1) a phrase chosen from: {ALLOWED_ANSWERS}; or (2) an integer [0-10] when asked "
    "'How many' or 'What is the number of'; or (3) 'Yes' or 'No' when asked 'Is there'.\n"
    "Write your response into this json template: {'Reasoning': '<your reasons>', 'Answer': '<Your answer>'}")


def load_spatial457(path: str | Path, subset: str = "L1_single", *, image_dir: str | Path | None = None,
                    on_error: OnError = "raise", verify_images: bool = False) -> SampleSet[VQASample]:
    path = Path(path)
    questions_file = path if path.is_file() else path / "questions" / f"{subset}.json"
    if not questions_file.is_file():
        raise DatasetError(str(questions_file), "Spatial457 question file does not exist")
    images = Path(image_dir) if image_dir is not None else (questions_file.parent.parent / "images")
    try:
        loaded = json.loads(questions_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise DatasetError(str(questions_file), f"not valid JSON: {error}") from error
    items = loaded.get("questions") if isinstance(loaded, dict) else loaded
    if not isinstance(items, list):
        raise DatasetError(str(questions_file), "unknown layout: expected a list of questions or {'questions': [...]}")
    errors = RowErrors(on_error)
    samples: list[VQASample] = []
    for index, item in enumerate(items):
        where = f"{questions_file} item {index}"
        with errors.row(where):
            image = ImageFile(images / str(item["image_filename"]), where)
            image.size(full_decode=verify_images)
            samples.append(VQASample(
                sample_id=f"spatial457-{subset}-{item.get('question_index', index)}", benchmark="spatial457",
                question=f"{TASK_DESCRIPTION}\n{item['question']}", answer=str(item["answer"]), scorer="spatial457",
                image_source=image, instruction=ANSWER_FORMAT, max_new_tokens=128, meta={"row": where}))
    return finish(samples, errors, source=f"spatial457:{questions_file}", selection={"subset": subset})
