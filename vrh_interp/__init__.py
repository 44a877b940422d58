"""vrh-interp: find, test and transfer Visual Retrieval Heads in vision-language models."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vrh_interp import published  # the paper's published head sets (appendix D)
    from vrh_interp.boxes import Box, BoxParseFailure, InvalidBoxError
    from vrh_interp.evaluation.sweep import sweep
    from vrh_interp.heads import Head, HeadGeometry, HeadOutOfRangeError, HeadSet
    from vrh_interp.model import VLM, load, load_spec, wrap
    from vrh_interp.scoring.design import PRESETS, ScoringDesign
    from vrh_interp.scoring.detect import score_heads
    from vrh_interp.scoring.scores import HeadScores

__version__ = "0.1.0"

# imported on first use (PEP 562), so that `vrh --help` and `import vrh_interp.heads` do not load torch
_EXPORTS = {
    "published": "vrh_interp.published", "Box": "vrh_interp.boxes", "BoxParseFailure": "vrh_interp.boxes",
    "InvalidBoxError": "vrh_interp.boxes", "sweep": "vrh_interp.evaluation.sweep", "Head": "vrh_interp.heads",
    "HeadGeometry": "vrh_interp.heads", "HeadOutOfRangeError": "vrh_interp.heads", "HeadSet": "vrh_interp.heads",
    "VLM": "vrh_interp.model", "load": "vrh_interp.model", "load_spec": "vrh_interp.model", "wrap": "vrh_interp.model",
    "PRESETS": "vrh_interp.scoring.design", "ScoringDesign": "vrh_interp.scoring.design",
    "score_heads": "vrh_interp.scoring.detect", "HeadScores": "vrh_interp.scoring.scores",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'vrh_interp' has no attribute {name!r}")
    module = importlib.import_module(_EXPORTS[name])
    value = module if _EXPORTS[name] == f"vrh_interp.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "Box", "BoxParseFailure", "InvalidBoxError", "Head", "HeadGeometry", "HeadOutOfRangeError", "HeadSet",
    "HeadScores", "PRESETS", "published", "ScoringDesign", "VLM", "load", "load_spec", "wrap", "score_heads",
    "sweep", "__version__",
]
