"""The paper's detection / evaluation split: a fixed seeded set of detection samples, the disjoint rest for evaluation.

Appendix H: heads are scored on 200 samples of the benchmark's validation split and the masked model is
evaluated on the remaining ones (8,611 of RefCOCO's 8,811); Appendix J uses a 500-sample evaluation set.
Samples are ranked by SHA-256 of ``"<seed>:<sample_id>"``: the split depends only on the seed and the ids, not
on the order of the file or on a random-number library's version. The first ``detection_count`` ranks
detect; the next ``evaluation_count`` (default: all the rest) evaluate. Both keep the dataset's order.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Generic, Sequence, TypeVar

PAPER_DETECTION_COUNT = 200

T = TypeVar("T")


@dataclass(frozen=True)
class DetectionSplit(Generic[T]):
    detection: tuple[T, ...]
    evaluation: tuple[T, ...]
    seed: int

    def as_dict(self) -> dict[str, Any]:
        """Ids of both parts (what a run folder records)."""
        return {"seed": self.seed, "detection_ids": [s.sample_id for s in self.detection],  # type: ignore[attr-defined]
                "evaluation_ids": [s.sample_id for s in self.evaluation]}  # type: ignore[attr-defined]


def split_rank(sample_id: str, seed: int) -> str:
    return hashlib.sha256(f"{seed}:{sample_id}".encode("utf-8")).hexdigest()


def detection_split(samples: Sequence[T], detection_count: int = PAPER_DETECTION_COUNT, *, seed: int = 0,
                    evaluation_count: int | None = None) -> DetectionSplit[T]:
    """Disjoint detection and evaluation samples (``samples`` need a unique ``sample_id``)."""
    ids = [s.sample_id for s in samples]  # type: ignore[attr-defined]
    if len(set(ids)) != len(ids):
        raise ValueError("sample ids must be unique to split detection from evaluation samples")
    if not 1 <= detection_count < len(samples):
        raise ValueError(f"cannot take {detection_count} detection samples from {len(samples)}: need "
                         "1 <= detection_count < number of samples, leaving at least one for evaluation")
    rest = len(samples) - detection_count
    if evaluation_count is not None and not 1 <= evaluation_count <= rest:
        raise ValueError(f"evaluation_count must be in [1, {rest}] (samples left after detection), got "
                         f"{evaluation_count}")
    order = sorted(range(len(samples)), key=lambda i: split_rank(ids[i], seed))
    detect = set(order[:detection_count])
    evaluate = set(order[detection_count: detection_count + (evaluation_count or rest)])
    return DetectionSplit(detection=tuple(s for i, s in enumerate(samples) if i in detect),
                          evaluation=tuple(s for i, s in enumerate(samples) if i in evaluate), seed=seed)
