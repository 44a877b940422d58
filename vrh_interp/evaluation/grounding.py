"""Greedy grounding evaluation with optional head masking, batched (left-padded) and deterministic.

Outcome categories follow the paper's functional-specificity split: ``correct`` (IoU >= threshold),
``mislocation`` (a box was parsed but IoU < threshold), ``parse_failure`` (no box in the native format).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

from vrh_interp import interventions as iv
from vrh_interp.boxes import BoxParseFailure
from vrh_interp.heads import HeadSet
from vrh_interp.model import VLM
from vrh_interp.samples import GroundingSampleLike, as_box


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
                 max_new_tokens: int = 24, remote: bool | str = False) -> list[GroundingOutcome]:
    """Greedy answers for one batch with ``heads`` zero-ablated at every generation step."""
    batch = vlm.encode_grounding([s.image for s in samples], [s.expression for s in samples])
    templates = [iv.head_ablation(vlm, heads)] if heads is not None and len(heads) else []
    result = iv.run_generate(vlm, batch.encoding, templates, max_new_tokens=max_new_tokens, remote=remote)
    answers = vlm.decode_answers(result.ids, batch.prompt_length)
    outcomes = []
    for sample, answer, frame in zip(samples, answers, batch.frames):
        parsed = vlm.adapter.parse_box(answer, frame)
        if isinstance(parsed, BoxParseFailure):
            outcomes.append(GroundingOutcome(sample.sample_id, answer, False, None, 0.0))
        else:
            outcomes.append(GroundingOutcome(sample.sample_id, answer, True, parsed.as_tuple(),
                                             parsed.iou(as_box(sample.box))))
    return outcomes
