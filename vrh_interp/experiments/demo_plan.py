"""The demo's plan (``experiments.demo``): its fixed sizes, the evaluation items, the step progress with the
optional time cap, and ``DemoRun``, what the steps share. Each step lives in its experiment's module (``demo_step``
of ``detect``, ``head_scan``, ...; ``Experiment.demo`` names it), as a plug-in's does; the helpers they share are
here, below every step (no step's module is imported here). No model is loaded here."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pandas as pd

from vrh_interp.core.description.model import Placement
from vrh_interp.evaluation.claims import Evidence
from vrh_interp.experiments.conditions import Condition

ANSWER_TOKENS = 24
TERMINAL_WIDTH = 100
STEPS = 10
PLAN_FILE = "plan.json"
SEED_STRIDE = 1000  # --seed s draws control sets with seeds s*1000 .. s*1000 + sets - 1


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
            print(f"[{number}/{STEPS}] skipped: --budget-seconds {self.budget:g} reached ({text})", flush=True)
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


@dataclasses.dataclass
class DemoRun:
    """What the demo's steps share: the request (``experiments.demo.plan``) and what each step leaves for the later
    ones."""

    out: Path
    model_spec: str
    transfer_model: str | None
    why: str
    sizes: Sizes
    seed: int
    batch_size: int
    device: str | None
    dtype: str | None
    placement: Placement  # where the steps that run on the chosen backend run (``placed``); the others: ``vlm``
    run_control: bool
    transfer_ready: bool
    budget: float | None
    steps: Steps
    evidence: dict[str, Evidence | None] = dataclasses.field(default_factory=dict)
    outcome: dict[str, Any] | None = None
    vlm: Any = None  # the main model on nnsight, for the steps that stay there (BACKEND_STEPS["nnsight"])
    placed: Any = None  # the main model at ``placement``
    detect: list[Any] = dataclasses.field(default_factory=list)
    evals: list[Any] = dataclasses.field(default_factory=list)
    checks: list[Any] = dataclasses.field(default_factory=list)
    ks: list[int] = dataclasses.field(default_factory=list)
    k_star: int = 0
    stats: Any = None
    scores: Any = None
    pool: Any = None
    ranking: Any = None
    conditions: list[Condition] = dataclasses.field(default_factory=list)
    items_of: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # a scene's sets: its referents
    result: Any = None  # the k-sweep's ``sweep.SweepResult``

    @property
    def seeds(self) -> range:
        return range(self.seed * SEED_STRIDE, self.seed * SEED_STRIDE + self.sizes.random_sets)


def load(spec: str, device: str | None, dtype: str | None) -> Any:
    """The model of ``spec`` (``specs.load_spec``), on nnsight."""
    from vrh_interp.specs import load_spec

    return load_spec(spec, device, dtype)


def detect_scores(vlm: Any, samples: list[Any], out: Path, batch_size: int) -> tuple[list[Any], Any]:
    """The detection statistics of ``samples`` (records in ``out``) and the paper's scores of them."""
    from vrh_interp.core.bookkeeping.provenance import library_versions, model_provenance, now_utc
    from vrh_interp.scoring.detect import collect_detection_stats, scores_from_stats

    stats = collect_detection_stats(vlm, samples, batch_size=batch_size, max_new_tokens=ANSWER_TOKENS,
                                    run_dir=out, dataset=f"synthetic:detect:{len(samples)}")
    provenance = {"model": model_provenance(vlm), "dataset": f"synthetic:detect:{len(samples)}",
                  "libraries": library_versions(), "created": now_utc(), "sample_ids": [s.sample_id for s in samples]}
    return stats, scores_from_stats(stats, "vrh", provenance)
