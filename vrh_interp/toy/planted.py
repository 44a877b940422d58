"""The positive control ``toy:planted``: which heads were planted, as shipped beside its checkpoint.

A user who sees "masking the top-k heads does not hurt more than random heads" on their own model cannot
tell "this model has no VRHs" from "the pipeline cannot find them" unless the same pipeline demonstrably
finds planted heads (InterpBench, arXiv 2407.14494, grades circuit discovery the same way). ``toy:planted`` is
that organism: a plain ``LlavaForConditionalGeneration`` (standard attention, no custom code) whose retrieval
heads ``P`` and decoys ``D`` were declared before training. How they were planted, and the measurements of
their properties on the shipped weights, are the trainer's (``toy_training.planted``, not shipped); the
shipped ``planted.json`` holds the declaration and those measurements.
"""

from __future__ import annotations

import json
from pathlib import Path

from vrh_interp.core.description.heads import HeadSet

# declared before training (middle/late layers, spread over both, all among the NEW head slots of
# ``embed_donor``, so every planted query and output weight is made by the planting), never chosen after
# looking at a score
PLANTED_HEADS = ("L2H3", "L3H2", "L3H11")
DECOY_HEADS = ("L2H10", "L3H7")
PLANTED_FILE = "planted.json"


def declared_heads(folder: Path) -> tuple[HeadSet, HeadSet]:
    """The planted and decoy heads declared in ``folder/planted.json`` (a positive-control checkpoint)."""
    data = json.loads((folder / PLANTED_FILE).read_text())
    return HeadSet(data["planted"]), HeadSet(data["decoys"])
