"""Greedy grounding evaluation with optional head masking, batched (left-padded) and deterministic.

Outcome categories follow the paper's functional-specificity split: ``correct`` (IoU >= threshold),
``mislocation`` (a box was parsed but IoU < threshold), ``parse_failure`` (no box in the native format).

Masking is zero ablation by default; ``ablation=Ablation("mean" | "resample", ablation_values(vlm,
detection_samples))`` selects the other kinds (``vrh_interp.core.execution.templates.ablation``). Their reference values
are collected with the ground-truth answer teacher-forced (the box in the family's native format appended
to the prompt): one forward per batch, and the answer segment is what a correct answer looks like, the
same whatever the model's accuracy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import torch
from tqdm.auto import tqdm

from vrh_interp.core.execution import interventions as iv
from vrh_interp.core.execution.backends.select import backend_for
from vrh_interp.core.description.boxes import BoxParseFailure
from vrh_interp.core.description.heads import HeadSet
from vrh_interp.core.description.model import VLM, GroundingBatch
from vrh_interp.data.checks import GroundingSampleLike, as_box, check_samples
from vrh_interp.core.execution.templates.ablation import (SEGMENTS, ZERO_ABLATION, Ablation, AblationValues,
                                                          SegmentSumCapture)


@dataclass(frozen=True)
class GroundingOutcome:
    sample_id: str
    answer: str
    parsed: bool
    box: tuple[float, float, float, float] | None
    iou: float

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def ground_batch(vlm: VLM, samples: Sequence[GroundingSampleLike], *, heads: HeadSet | None = None,
                 ablation: Ablation = ZERO_ABLATION, max_new_tokens: int = 24) -> list[GroundingOutcome]:
    """Greedy answers for one batch with ``heads`` ablated (``ablation``, zero by default) at every step."""
    return ground_conditions(vlm, samples, [(heads, ablation)], max_new_tokens=max_new_tokens)[0]


def ground_conditions(vlm: VLM, samples: Sequence[GroundingSampleLike],
                      conditions: Sequence[tuple[HeadSet | None, Ablation]], *, max_new_tokens: int = 24,
                      batch: GroundingBatch | None = None,
                      shared_prefix: bool = True) -> list[list[GroundingOutcome]]:
    """Greedy answers for one batch under each condition ``(heads, ablation)``, all in ONE generation (condition
    batching, ``interventions.generate_conditions``): per condition, the outcomes ``ground_batch`` gives with
    those heads and that ablation (equal exactly). ``batch`` is the samples' encoding when already made;
    ``shared_prefix``: a scene's referents share their image prefix (``interventions.shared_image_prefix``).
    The handle's backend (``backend_for(vlm)``, placed with ``vlm.on``) generates."""
    runner = backend_for(vlm)
    if batch is None:
        batch = encode_samples(vlm, samples)
    needs_segments = any(h is not None and len(h) and a.replaces_by_segment for h, a in conditions)
    ids = runner.generate_conditions(batch.encoding, conditions, max_new_tokens=max_new_tokens,
                                     segments=iv.batch_segments(batch) if needs_segments else None,
                                     sample_ids=[s.sample_id for s in samples], shared_prefix=shared_prefix)
    return [_outcomes(vlm, samples, batch, block) for block in ids]


def encode_samples(vlm: VLM, samples: Sequence[GroundingSampleLike]) -> GroundingBatch:
    """The left-padded grounding encoding of ``samples`` (``VLM.encode_grounding``)."""
    return vlm.encode_grounding([s.image for s in samples], [s.expression for s in samples])


def _outcomes(vlm: VLM, samples: Sequence[GroundingSampleLike], batch: GroundingBatch,
              ids: torch.Tensor) -> list[GroundingOutcome]:
    answers = vlm.decode_answers(ids, batch.prompt_length)
    outcomes = []
    for sample, answer, frame in zip(samples, answers, batch.frames):
        parsed = vlm.adapter.parse_box(answer, frame)
        if isinstance(parsed, BoxParseFailure):
            outcomes.append(GroundingOutcome(sample.sample_id, answer, False, None, 0.0))
        else:
            outcomes.append(GroundingOutcome(sample.sample_id, answer, True, parsed.as_tuple(),
                                             parsed.iou(as_box(sample.box))))
    return outcomes


def ablation_values(vlm: VLM, samples: Sequence[GroundingSampleLike], *, batch_size: int = 8,
                    progress: bool = False) -> AblationValues:
    """Per-segment sums of every head's output on ``samples`` (use the detection samples): the reference of
    ``mean`` and ``resample`` ablation. One forward per batch with the ground-truth answer teacher-forced and a
    ``SegmentSumCapture`` at every layer; only ``[batch, segments, width]`` per layer leaves the trace."""
    check_samples(samples, minimum=1, what="reference samples")
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    sums, counts = [], []
    capture = iv.head_output_capture(vlm)
    for start in tqdm(range(0, len(samples), batch_size), desc="ablation values", disable=not progress):
        chunk = samples[start: start + batch_size]
        batch = vlm.encode_grounding([s.image for s in chunk], [s.expression for s in chunk])
        answers = [vlm.adapter.format_box(as_box(s.box), frame) for s, frame in zip(chunk, batch.frames)]
        encoding = vlm.teacher_forced(batch, [vlm.tokenizer(a, add_special_tokens=False)["input_ids"]
                                              for a in answers])
        segments = iv.batch_segments(batch, encoding)
        result = iv.run_forward(vlm, encoding, [SegmentSumCapture(capture, segments)])
        sums.append(torch.stack([result.values[0][layer].cpu() for layer in capture.layers()], dim=1))
        counts.append(torch.stack([(segments == s).sum(1) for s in range(len(SEGMENTS))], dim=1))
    return AblationValues(tuple(s.sample_id for s in samples), torch.cat(sums), torch.cat(counts))
