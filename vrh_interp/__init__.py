"""vrh-interp: find, test and transfer Visual Retrieval Heads in vision-language models."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vrh_interp.core.description import published  # the paper's published head sets (appendix D)
    from vrh_interp.core.description.boxes import Box, BoxParseFailure, InvalidBoxError
    from vrh_interp.experiments.sweep import sweep
    from vrh_interp.core.description.heads import Head, HeadGeometry, HeadOutOfRangeError, HeadSet
    from vrh_interp.core.description.model import VLM, Placement, wrap
    from vrh_interp.specs import load, load_spec
    from vrh_interp.scoring.design import PRESETS, ScoringDesign
    from vrh_interp.scoring.detect import score_heads
    from vrh_interp.scoring.scores import HeadScores

__version__ = "0.2.0"

# imported on first use (PEP 562), so that `vrh --help` and `import vrh_interp.core.description.heads` do not load torch
_EXPORTS = {name: module for module, names in {
    "vrh_interp.core.description.published": ("published",),
    "vrh_interp.core.description.boxes": ("Box", "BoxParseFailure", "InvalidBoxError"),
    "vrh_interp.experiments.sweep": ("sweep",),
    "vrh_interp.core.description.heads": ("Head", "HeadGeometry", "HeadOutOfRangeError", "HeadSet"),
    "vrh_interp.core.description.model": ("VLM", "Placement", "wrap"),
    "vrh_interp.specs": ("load", "load_spec"),
    "vrh_interp.scoring.design": ("PRESETS", "ScoringDesign"),
    "vrh_interp.scoring.detect": ("score_heads",),
    "vrh_interp.scoring.scores": ("HeadScores",),
}.items() for name in names}

_MODULE_EXPORTS = {"published"}  # exported as the module itself


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'vrh_interp' has no attribute {name!r}")
    module = importlib.import_module(_EXPORTS[name])
    value = module if name in _MODULE_EXPORTS else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "Box", "BoxParseFailure", "InvalidBoxError", "Head", "HeadGeometry", "HeadOutOfRangeError", "HeadSet",
    "HeadScores", "PRESETS", "published", "Placement", "ScoringDesign", "VLM", "load", "load_spec", "wrap",
    "score_heads",
    "sweep", "__version__",
]
