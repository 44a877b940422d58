"""The demo's fixed plan (``apps.demo``): its sizes, the k grid and k*, the evaluation and check items, the sweep's
conditions, the scanned heads, and the step progress with the optional time cap. No model is loaded here."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from vrh_interp.experiments.conditions import Condition
from vrh_interp.experiments.sweep import SweepResult

ANSWER_TOKENS = 24
TERMINAL_WIDTH = 100
STEPS = 10
PLAN_FILE = "plan.json"
SEED_STRIDE = 1000  # --seed s draws control sets with seeds s*1000 .. s*1000 + sets - 1
ANSWERS_VQA_MARGIN = 0.1  # a VQA kind counts as answered when the unmasked model beats the majority answer by this
SCAN_ALL_HEADS, SCAN_SAMPLED_HEADS = 48, 32


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What the demo runs on (``DEFAULT_SIZES`` unless given)."""

    detect_scenes: int = 200
    eval_scenes: int = 40
    check_items: int = 40
    vqa_scenes: int = 20
    control_scenes: int = 30
    census_items: int = 6
    random_sets: int = 20  # sets of each kind where every set is answered on every item (design space, transfer, VQA)
    rank_sets: int = 199  # the rank test's sets of each kind at k*: 1 / (199 + 1) is under 0.05 / 8 (the paper family)
    rank_items: int = 12


DEFAULT_SIZES = Sizes()


def evaluation_items(scenes: int) -> list[Any]:
    """Every referent of the first ``scenes`` evaluation scenes (level 1; disjoint from the ``detect-`` scenes)."""
    from vrh_interp.data import grounding_samples

    return [sample for index in range(scenes) for sample in grounding_samples("eval", index, 1)]


def restrict(result: SweepResult, sample_ids: Sequence[str], keep: Callable[[Condition], bool]) -> SweepResult:
    """The records of ``result`` on ``sample_ids`` under the conditions ``keep`` accepts (the baseline always); a
    condition with no records there (a scene's own set, ``designs.scene_design``) is left out."""
    records = result.records
    records = records[records["sample_id"].isin(set(sample_ids))]
    present = set(records["condition"])
    conditions = [c for c in result.conditions if c.kind == "baseline" or (keep(c) and c.key in present)]
    records = records[records["condition"].isin({c.key for c in conditions})]
    return SweepResult(records.reset_index(drop=True), conditions, result.iou_threshold, result.total_heads)


def scan_heads(ranking: Any, geometry: Any, k_star: int) -> Any:
    """All heads, or on models over ``SCAN_ALL_HEADS`` the top ``k_star`` and the rest sampled at evenly spaced
    score ranks (``SCAN_SAMPLED_HEADS`` in all), in (layer, head) order. Rank-stratified, not a seeded uniform
    draw: "score predicts damage" is a correlation over the score range, which a uniform draw covers unevenly
    (mostly low scores), and a draw that moves with ``--seed`` made the claim's verdict move with it."""
    from vrh_interp.core.description.heads import HeadSet

    everything = geometry.all_heads()
    if len(everything) <= SCAN_ALL_HEADS:
        return everything
    ranked = list(ranking)
    top, rest = ranked[:k_star], ranked[k_star:]
    picked = np.unique(np.linspace(0, len(rest) - 1, SCAN_SAMPLED_HEADS - len(top)).round().astype(int))
    return HeadSet(sorted(top + [rest[i] for i in picked], key=lambda h: (h.layer, h.head)))


class Steps:
    """Step progress (elapsed time per step) and the optional cap: ``open(n, text)`` is False, and the step is
    skipped, once ``budget`` seconds have passed."""

    def __init__(self, started: float, budget: float | None) -> None:
        self.started, self.budget, self.rows, self.skipped = started, budget, [], []
        self._current: dict | None = None

    def open(self, number: int, text: str) -> bool:
        self.close()
        elapsed = time.perf_counter() - self.started
        if self.budget is not None and elapsed >= self.budget:
            print(f"[{number}/{STEPS}] skipped: --budget-seconds {self.budget:.0f} reached ({text})", flush=True)
            self.skipped.append(number)
            return False
        print(f"[{number}/{STEPS}] {text}  ({elapsed:.0f} s elapsed)", flush=True)
        self._current = {"step": number, "name": text, "began": time.perf_counter()}
        return True

    def close(self) -> None:
        if self._current is not None:  # its seconds go to the timing table (report, demo.json), not the terminal
            seconds = time.perf_counter() - self._current.pop("began")
            self.rows.append({**self._current, "seconds": round(seconds, 1)})
            self._current = None

    def table(self) -> pd.DataFrame:
        self.close()
        total = {"step": "total", "name": "all steps", "seconds": round(time.perf_counter() - self.started, 1)}
        return pd.DataFrame([*self.rows, total]).astype({"step": str})


def vqa_answered(summary: pd.DataFrame) -> list[str]:
    """The VQA kinds whose unmasked accuracy beats the majority answer by ``ANSWERS_VQA_MARGIN``."""
    base = summary[summary["condition"] == "baseline"]
    return [r.benchmark for r in base.itertuples() if r.accuracy >= r.majority_baseline + ANSWERS_VQA_MARGIN]
