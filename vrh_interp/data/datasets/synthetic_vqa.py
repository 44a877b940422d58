"""The synthetic scenes' VQA items as benchmark samples (``synthetic:SPLIT:N[:LEVEL]`` for ``--vqa``).

``vrh_interp.data.scenes.vqa_samples`` asks three kinds of question about every scene: the colour of an
object named by its shape (and size), how many objects of a shape there are, and whether one uniquely named
object is left of / right of / above / below another, as ``VQASample`` items; this module loads them as a
``SampleSet`` so that the VQA sweep (the paper's cross-task claim) runs on them like on any benchmark, and so
that the toy models are trained on exactly the prompt the sweep will show them.

Choices. The toy tokenizer is word level and has no option letters beyond "a", so the options are written
into the question ("what colour is the big circle ? red / blue / green / yellow") and the model answers with
the option's word; ``score_letter`` maps a response that names exactly one option to its letter (the same
path that reads "the answer is red" from a large model). Spatial questions are yes/no with the options
implicit. Counts are open answers scored by ``score_count``. Every word of every prompt is in the toy
vocabulary (checked by the tests), so no prompt token is ``<unk>``.

Each kind is its own benchmark (``synthetic-attribute``, ``synthetic-counting``, ``synthetic-spatial``), so
the VQA sweep reports them as separate columns, like the paper's per-task benchmarks.

Images are regenerated from ``(split, index, level)`` on every read (``data.scenes.SceneImage``), so a set of
thousands of items holds no pixels.
"""

from __future__ import annotations

from collections.abc import Sequence

from vrh_interp.data.scenes import Split, vqa_samples
from vrh_interp.data.datasets.samples import SampleSet, VQASample


def answer_text(sample: VQASample) -> str:
    """The words a correct response says: the option text for choice questions, the count otherwise."""
    if sample.scorer == "letter":
        return sample.choices[sample.letters.index(sample.answer)]
    return sample.answer


def majority_answer_rate(samples: Sequence[VQASample]) -> float:
    """Accuracy of always giving the most common correct answer: the level a model that ignores the image
    and the question can reach on ``samples`` (for colour questions the options are shuffled per item)."""
    answers = [answer_text(s) for s in samples]
    return max(answers.count(a) for a in set(answers)) / len(answers)


def synthetic_vqa(split: Split, n_scenes: int, difficulty: int = 1) -> SampleSet[VQASample]:
    """Every VQA item of scenes ``0..n_scenes-1`` of ``split``."""
    if n_scenes < 1:
        raise ValueError(f"synthetic VQA needs a positive scene count, got {n_scenes}")
    samples = tuple(s for index in range(n_scenes) for s in vqa_samples(split, index, difficulty))
    return SampleSet(samples, source=f"synthetic:{split}:{n_scenes}:{difficulty}",
                     selection={"split": split, "scenes": n_scenes, "difficulty": difficulty})
