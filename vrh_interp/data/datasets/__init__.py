"""Benchmark data from local files, with deterministic offline scoring (nothing is downloaded).

Grounding loaders return ``SampleSet[GroundingSample]`` (image decoded on access, ``Box`` xyxy in original
pixels): ``refer`` (RefCOCO/+/g refer layout, restricted unpickler), ``lmms_refcoco`` and ``jxu124_refcoco``
(parquet), ``toloka`` (CSV), ``refspatial`` (parquet or raw folders, mask-derived boxes and mask scorers),
``jsonl`` (a user's own data). VQA loaders return ``SampleSet[VQASample]``: ``cvbench``, ``mmstar``,
``countbench``, ``mathvista``, ``spatial457``, ``spatialrgpt``, ``vaw``; ``vqa`` scores responses,
``vqa_prompt`` builds the chat-template prompt and ``vqa_sweep`` runs the masked-vs-random comparison.
``splits`` reproduces the paper's detection / evaluation split. The ``--data`` / ``--vqa`` spec strings are
parsed by ``vrh_interp.data.sources``; the schemas, frames and rules are in docs/datasets.md.
"""

from vrh_interp.data.datasets.errors import DatasetError, SkippedRow
from vrh_interp.data.datasets.samples import GroundingSample, SampleSet, VQASample
from vrh_interp.data.datasets.splits import DetectionSplit, detection_split

__all__ = ["DatasetError", "DetectionSplit", "GroundingSample", "SampleSet", "SkippedRow", "VQASample",
           "detection_split"]
