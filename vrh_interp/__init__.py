"""vrh-interp: find, test and transfer Visual Retrieval Heads in vision-language models."""

from vrh_interp.boxes import Box, BoxParseFailure, InvalidBoxError
from vrh_interp.evaluation.sweep import sweep
from vrh_interp.heads import Head, HeadGeometry, HeadOutOfRangeError, HeadSet
from vrh_interp.model import VLM, load, wrap
from vrh_interp.scoring.design import PRESETS, ScoringDesign
from vrh_interp.scoring.detect import score_heads
from vrh_interp.scoring.scores import HeadScores

__version__ = "0.1.0"

__all__ = [
    "Box", "BoxParseFailure", "InvalidBoxError", "Head", "HeadGeometry", "HeadOutOfRangeError", "HeadSet",
    "HeadScores", "PRESETS", "ScoringDesign", "VLM", "load", "wrap", "score_heads", "sweep", "__version__",
]
