"""Grade head detection against known ground truth (a positive control such as ``toy:planted``).

InterpBench (arXiv 2407.14494) grades circuit-discovery methods by precision and recall against circuits
planted by construction; this does the same for head scoring. Every design (the paper's 2^3 design space and
every published preset) is scored from ONE set of detection statistics, so the designs differ only in how
they aggregate, never in which samples or generations they saw. Per design: precision and recall of its
top-|P| heads against the planted set P (at k = |P| the two coincide: both are |top-|P| & P| / |P|), the
rank of every planted and decoy head, and whether the top-|P| is exactly P.
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from vrh_interp.core.description.heads import HeadSet
from vrh_interp.scoring.collect import SampleStats
from vrh_interp.scoring.design import PRESETS, ScoringDesign, design_space_variants
from vrh_interp.scoring.detect import scores_from_stats


def grading_designs() -> dict[str, ScoringDesign]:
    """The paper's design-space variants and every preset (``preset:NAME``)."""
    designs = dict(design_space_variants())
    designs.update({f"preset:{name}": preset.design for name, preset in PRESETS.items()})
    return designs


def grade_ranking(ranking: HeadSet, planted: HeadSet, decoys: HeadSet) -> dict[str, object]:
    """Precision/recall of ``ranking``'s top-|P| against ``planted``; 1-based ranks of planted and decoy heads."""
    if not len(planted):
        raise ValueError("grading needs at least one planted head")
    rank = {head: position + 1 for position, head in enumerate(ranking)}
    top = set(ranking[: len(planted)])
    hits = len(top & set(planted))
    planted_ranks = [rank.get(h) for h in planted]
    decoy_ranks = [rank.get(h) for h in decoys]
    return {
        "precision_at_p": hits / len(planted),
        "recall_at_p": hits / len(planted),
        "exact": top == set(planted),
        "planted_ranks": planted_ranks,
        "worst_planted_rank": max((r for r in planted_ranks if r is not None), default=None),
        "decoy_ranks": decoy_ranks,
        "best_decoy_rank": min((r for r in decoy_ranks if r is not None), default=None),
        "decoy_above_a_planted_head": any(d is not None and d < max(r for r in planted_ranks if r is not None)
                                          for d in decoy_ranks) if any(r is not None for r in planted_ranks) else None,
        "top": [str(h) for h in ranking[: len(planted)]],
    }


def grade_detection(stats: Sequence[SampleStats], planted: HeadSet, decoys: HeadSet = HeadSet(), *,
                    designs: dict[str, ScoringDesign] | None = None) -> pd.DataFrame:
    """One row per design: ``grade_ranking`` of its ranking on ``stats`` (designs undefined on these
    statistics, e.g. ``correct_only`` with no correct sample, get a row with ``defined=False``)."""
    rows = []
    for name, design in (designs or grading_designs()).items():
        try:
            ranking = scores_from_stats(stats, design).ranking()
        except ValueError as error:
            rows.append({"design": name, "defined": False, "note": str(error)})
            continue
        rows.append({"design": name, "defined": True, **grade_ranking(ranking, planted, decoys)})
    return pd.DataFrame(rows)
