"""Single-head causal scan: does a head's score predict how much masking it ALONE hurts grounding?

The paper ranks heads by an attention score and masks the top k together; it never checks that the score
orders heads by causal importance. Here every head (default: all of them) is ablated alone on one FIXED set
of evaluation samples, and its accuracy is compared with the unmasked baseline on the same samples (cost:
(1 + heads) x samples greedy answers, 100,000 for 1,000 heads and 100 samples; size the subset to the
model): ``drop = baseline accuracy - accuracy``
(positive: masking hurts). The table ranks heads by score (1 = the ranking's first head, ties broken by
(layer, head) as in ``HeadScores.ranking``) and by damage (1 = largest drop; tied drops share the best
rank), and ``spearman()`` is the rank correlation of score and drop over the scanned heads (ties averaged):
positive when the high-scored heads are the damaging ones.

Execution goes through ``experiments.sweep.run_conditions`` (condition batching: many heads per generation):
the baseline plus one condition per head, kind ``"single"``, k = 1, with the head's flat index
``layer * num_heads + head`` in the ``seed`` slot so keys are unique (``single:k=1:seed=37``). A ``run_dir``
therefore resumes after interruption exactly like a sweep, and ``head_scan_from_run`` reads a finished folder
without the model. The evaluation samples must not have been used for detection (checked when ``scores``
carries its sample ids).
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pandas as pd

from vrh_interp.experiments.conditions import Condition
from vrh_interp.experiments.builtin_specs import ScanSpec
from vrh_interp.experiments.sweep import SweepResult, reference_values, run_conditions, sweep_from_run
from vrh_interp.core.description.heads import Head, HeadSet
from vrh_interp.core.description.model import VLM
from vrh_interp.core.bookkeeping.provenance import model_provenance
from vrh_interp.core.bookkeeping.runs import write_atomic
from vrh_interp.data.checks import GroundingSampleLike
from vrh_interp.scoring.scores import HeadScores, ScoresTransferWarning
from vrh_interp.core.execution.templates.ablation import ZERO_ABLATION, Ablation
from vrh_interp.evaluation.statistics import spearman

if TYPE_CHECKING:
    from vrh_interp.experiments.demo_plan import DemoRun

SCAN_KIND = "single"


def flat_index(head: Head, num_heads: int) -> int:
    """The ``seed`` slot of a head's scan condition: ``layer * num_heads + head``."""
    return head.layer * num_heads + head.head


def scan_conditions(heads: HeadSet, num_heads: int, ablation_kind: str = "zero") -> list[Condition]:
    """The unmasked baseline, then one single-head condition per head of ``heads`` (in order)."""
    return [Condition("baseline", 0, None, HeadSet())] + [
        Condition(SCAN_KIND, 1, flat_index(head, num_heads), HeadSet([head]), ablation_kind) for head in heads]


@dataclass
class HeadScanResult:
    """The scan's records (``sweep``: one per sample x condition) and, optionally, the scores it is compared with."""

    sweep: SweepResult
    scores: HeadScores | None = None

    def _correct(self) -> pd.DataFrame:
        records = self.sweep.records
        return records.assign(correct=records["iou"] >= self.sweep.iou_threshold)

    @property
    def baseline_accuracy(self) -> float:
        correct = self._correct()
        return float(correct[correct["condition"] == "baseline:k=0"]["correct"].mean())

    def table(self) -> pd.DataFrame:
        """One row per scanned head: ``head``, ``layer``, ``head_index``, ``n``, ``accuracy``, ``drop`` (baseline -
        accuracy), ``score`` / ``score_rank`` (NaN without scores) and ``damage_rank``; sorted by score rank if
        scored, else by (layer, head)."""
        correct = self._correct()
        accuracy = correct.groupby("condition")["correct"].agg(["mean", "size"])
        base = self.baseline_accuracy
        ranks = {h: r for r, h in enumerate(self.scores.ranking(), start=1)} if self.scores is not None else {}
        rows = []
        for cond in self.sweep.conditions:
            if cond.kind != SCAN_KIND:
                continue
            head = cond.heads[0]
            mean, size = accuracy.loc[cond.key] if cond.key in accuracy.index else (float("nan"), 0)
            rows.append({"head": str(head), "layer": head.layer, "head_index": head.head, "n": int(size),
                         "accuracy": float(mean), "drop": base - float(mean),
                         "score": self.scores.score_of(head) if self.scores is not None else float("nan"),
                         "score_rank": ranks.get(head, float("nan"))})
        if not rows:
            raise ValueError("no single-head conditions in this result: is it a head scan (head_scan)?")
        table = pd.DataFrame(rows)
        table["damage_rank"] = table["drop"].rank(method="min", ascending=False).astype(int)
        order = ["score_rank", "layer", "head_index"] if self.scores is not None else ["layer", "head_index"]
        return table.sort_values(order).reset_index(drop=True)

    def spearman(self) -> float:
        """Spearman rank correlation of score and drop over the scanned heads (NaN without scores or variation)."""
        if self.scores is None:
            return float("nan")
        table = self.table()
        return spearman(table["score"].to_numpy(dtype=float), table["drop"].to_numpy(dtype=float))

    def scatter(self, *, label_top: int = 5, title: str | None = None, ax: Any = None) -> Any:
        """Score vs accuracy drop, one dot per head, the ``label_top`` best-scored heads named
        (``plots.score_damage_scatter``)."""
        if self.scores is None:
            raise ValueError("the scatter plots scores against damage: pass scores= to head_scan / head_scan_from_run")
        from vrh_interp.viz.plots import score_damage_scatter

        return score_damage_scatter(self.table(), label_top=label_top, title=title, ax=ax)


def head_scan(vlm: VLM, samples: Sequence[GroundingSampleLike], scores: HeadScores | None = None, *,
              heads: HeadSet | None = None, ablation: Ablation = ZERO_ABLATION, iou_threshold: float = 0.5,
              batch_size: int = 8, max_new_tokens: int = 24, run_dir: str | Path | None = None,
              progress: bool = True,
              max_batch_rows: int | None = None) -> HeadScanResult:
    """Grounding accuracy on ``samples`` (a fixed subset of evaluation samples) with each of ``heads`` (default:
    every head) ablated alone, against the unmasked baseline; resumable through ``run_dir``. The single-head
    conditions are batched ``max_batch_rows`` rows per generation (``run_conditions``: one batch of samples
    replicated across many heads, each row masking its own head), on the handle's backend."""
    geometry = vlm.geometry
    heads = geometry.validate(heads if heads is not None else geometry.all_heads())
    if not len(heads):
        raise ValueError("head_scan needs at least one head to scan")
    if scores is not None:
        if scores.scores.shape != (geometry.num_layers, geometry.num_heads):
            raise ValueError(f"scores are for a {scores.scores.shape} head grid, the model has "
                             f"{(geometry.num_layers, geometry.num_heads)}")
        overlap = sorted(set(scores.sample_ids) & {s.sample_id for s in samples})
        if overlap:
            raise ValueError(f"{len(overlap)} scan samples were also used for detection (e.g. {overlap[:3]}): scan "
                             "on evaluation samples disjoint from the detection samples")
    transfer = scores.transfer_to(model_provenance(vlm)) if scores is not None else None
    if transfer is not None:  # another model's scores: said, and recorded in the run folder
        warnings.warn(transfer["note"], ScoresTransferWarning, stacklevel=2)
    conditions = scan_conditions(heads, geometry.num_heads, ablation.kind)
    result = run_conditions(vlm, samples, conditions, iou_threshold=iou_threshold, batch_size=batch_size,
                            max_new_tokens=max_new_tokens, run_dir=run_dir, progress=progress,
                            ablation_values=ablation.values, max_batch_rows=max_batch_rows, heads_source=transfer)
    return HeadScanResult(result, scores)


def head_scan_from_run(run_dir: str | Path, scores: HeadScores | None = None, *,
                       iou_threshold: float = 0.5) -> HeadScanResult:
    """A finished (or merged) scan folder, read without the model."""
    result = HeadScanResult(sweep_from_run(run_dir, iou_threshold=iou_threshold), scores)
    if not any(c.kind == SCAN_KIND for c in result.sweep.conditions):
        raise ValueError(f"{run_dir} holds a sweep without single-head conditions, not a head scan")
    return result


SCAN_CSV, SCAN_PNG = "head_scan.csv", "head_scan.png"


def write_head_scan(result: Any, out: Path, *, permutations: int = 10000) -> dict[str, Any]:
    """``OUT/head_scan.csv`` (one row per head), ``OUT/head_scan.png`` (score vs damage) and the facts:
    ``spearman``, ``p_value`` (one-sided permutation test of rho > 0, ``statistics.spearman_permutation_p``),
    ``heads``, ``n``, ``baseline_accuracy``, ``top_head`` (best scored) and its ``top_head_damage_rank``."""
    from vrh_interp.evaluation.statistics import spearman_permutation_p

    from vrh_interp.viz.plots import score_damage_scatter

    table = result.table()
    write_atomic(out / SCAN_CSV, table.to_csv(index=False))
    facts = {"spearman": result.spearman(), "heads": len(table), "n": int(table["n"].max()),
             "baseline_accuracy": result.baseline_accuracy,
             "p_value": spearman_permutation_p(table["score"].to_numpy(), table["drop"].to_numpy(),
                                               permutations=permutations),
             "top_head": str(table["head"].iloc[0]), "top_head_damage_rank": int(table["damage_rank"].iloc[0])}
    figure = io.BytesIO()
    score_damage_scatter(table).savefig(figure, format="png")
    write_atomic(out / SCAN_PNG, figure.getvalue())
    return facts


def run(spec: ScanSpec, vlm: VLM, folder: Path) -> dict[str, Any]:
    """``vrh scan`` / a grid's scan cell: the scan into ``folder/scan``, its table and figure into ``folder``;
    returns the facts (``write_head_scan``)."""
    from vrh_interp.core.description.published import parse_heads
    from vrh_interp.data.sources import load_data
    from vrh_interp.experiments.conditions import ablation_for

    scores = HeadScores.load(spec.scores)
    samples = list(load_data(spec.data))[: spec.limit]
    ablation = ablation_for(spec.ablation, reference_values(spec, vlm, scores, folder), vlm.geometry)
    result = head_scan(vlm, samples, scores, heads=parse_heads(spec.heads) if spec.heads else None,
                       ablation=ablation, iou_threshold=spec.iou, batch_size=spec.batch_size,
                       max_new_tokens=spec.max_new_tokens, run_dir=folder / "scan", progress=spec.progress)
    return write_head_scan(result, folder)


# ------------------------------------------------------------------------------------ its step in `vrh demo`

SCAN_ALL_HEADS, SCAN_SAMPLED_HEADS = 48, 32


def scan_heads(ranking: Any, geometry: Any, k_star: int) -> Any:
    """All heads, or on models over ``SCAN_ALL_HEADS`` the top ``k_star`` and the rest sampled at evenly spaced
    score ranks (``SCAN_SAMPLED_HEADS`` in all), in (layer, head) order. Rank-stratified, not a seeded uniform
    draw: "score predicts damage" is a correlation over the score range, which a uniform draw covers unevenly
    (mostly low scores), and a draw that moves with ``--seed`` made the claim's verdict move with it."""
    everything = geometry.all_heads()
    if len(everything) <= SCAN_ALL_HEADS:
        return everything
    ranked = list(ranking)
    top, rest = ranked[:k_star], ranked[k_star:]
    picked = np.unique(np.linspace(0, len(rest) - 1, SCAN_SAMPLED_HEADS - len(top)).round().astype(int))
    return HeadSet(sorted(top + [rest[i] for i in picked], key=lambda h: (h.layer, h.head)))


def demo_step(run: DemoRun) -> None:
    """Step 5: the single-head causal scan; evidence that a head's score predicts its damage."""
    from vrh_interp.experiments import verdicts as ev
    from vrh_interp.experiments.demo_plan import ANSWER_TOKENS

    scanned = scan_heads(run.ranking, run.vlm.geometry, run.k_star)
    if not run.steps.open(5, f"single-head causal scan: {len(scanned)} of {run.vlm.geometry.total_heads} heads on "
                             f"{len(run.checks)} fixed items"):
        return
    write_head_scan(head_scan(run.placed, run.checks, run.scores, heads=scanned, batch_size=run.batch_size,
                              max_new_tokens=ANSWER_TOKENS, run_dir=run.out / "scan"), run.out)
    table = pd.read_csv(run.out / "head_scan.csv")
    run.evidence["score_damage"] = ev.score_damage_evidence(table["score"], table["drop"], seed=run.seed)
