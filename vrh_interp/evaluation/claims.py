"""The claims: each of the paper's claims and each check of the method, declared once, judged by one rule.

Every claim is a ``ClaimSpec``: the hypothesis in words, its statistic ``theta``, the value ``null`` that means
"no effect" and the smallest effect ``minimum`` the claim is meant to detect. Evidence for a claim is its
estimate and bootstrap replicates (``Evidence``); the verdict has three outcomes that mean what they say:

* **holds**: ``theta > null`` is significant (one-sided bootstrap p, Holm-adjusted over the claims of its table)
  AND the estimate is at least ``minimum``;
* **does not hold**: the data bound ``theta`` below ``minimum`` (one-sided bootstrap test of ``theta >=
  minimum``, Holm-adjusted: an equivalence-style test, so a small sample can never produce it);
* **inconclusive**: anything else, with the number of items that would likely decide it (from the observed
  spread of the replicates, 80 % power at the adjusted level): ``items_needed``.

Family-wise error. The paper's claims form one family and the checks of the method another; within each, Holm's
step-down procedure controls the family-wise error at ``ALPHA`` separately for "holds" and for "does not hold"
decisions (no independence assumed). Bootstrap p-values are ``(1 + #replicates on the null side) / (1 + B)``
with ``B = RESAMPLES`` (floor 1/2001 = 0.0005, well under the smallest Holm threshold 0.05 / 8).

Causal statistics (``set_effect``): the effect of masking the top-k is the mean accuracy of the control sets
minus the top-k's accuracy, on the SAME items (paired). Its replicates resample items (once per replicate, shared
by the top-k and every set, and by every k and control kind of one claim) and control sets (the unit of a control
is the head set: ``evaluation.statistics``), so both sources of variance enter the interval. "Hurts more than
each control" takes the smallest effect over the control kinds (uniform, layer-matched, live heads): an
intersection-union test, valid without adjustment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

ALPHA = 0.05
RESAMPLES = 2000
# a decisive verdict needs at least this many informative units (items whose outcome differs between the
# conditions compared: the discordant items of a paired design; samples or heads for the other statistics).
# Below it the bootstrap has too little to resample (a table of 12 items all wrong everywhere has replicates
# that never move), so the verdict is "inconclusive" whatever the estimate.
MIN_INFORMATIVE = 20
POWER = 0.8
VERDICTS = ("holds", "does not hold", "inconclusive", "not measured")
PAPER, METHOD = "paper", "method"


@dataclass(frozen=True)
class ClaimSpec:
    """One claim: ``table`` ("paper" or "method"), its words, the statistic and the decision's two values."""

    id: str
    table: str
    claim: str
    statistic: str
    null: float
    minimum: float
    unit: str = "items"  # what more of would decide an inconclusive claim

    def rule(self) -> str:
        return (f"holds: {self.statistic} > {self.null:g} significant (Holm, alpha {ALPHA}) and >= {self.minimum:g}; "
                f"does not hold: bounded below {self.minimum:g}; otherwise inconclusive")


def _specs(*specs: ClaimSpec) -> dict[str, ClaimSpec]:
    return {spec.id: spec for spec in specs}


CLAIMS: dict[str, ClaimSpec] = _specs(
    ClaimSpec("causal", PAPER, "causal: masking the top-k VRHs hurts grounding more than k random heads, against "
              "every control (uniform, layer-matched, live heads)",
              "accuracy of the control sets minus the top-k's (smallest over the controls)", 0.0, 0.05),
    ClaimSpec("causal_curve", PAPER, "causal along the k-curve: averaged over the k grid, masking the top-k hurts "
              "more than every control",
              "mean over k of (control-set accuracy minus top-k accuracy), smallest over the controls", 0.0, 0.05),
    ClaimSpec("sparse", PAPER, "sparse: a few heads carry the score",
              "share of the total score carried by the top 10 % of heads", 0.10, 0.30, unit="detection samples"),
    ClaimSpec("design_space", PAPER, "design space: the default design (output, sum, mean) is within 5 points of "
              "the most causal variant", "5 points minus the shortfall of the default's accuracy drop behind the "
              "best variant's", 0.0, 0.0),
    ClaimSpec("specific", PAPER, "functionally specific: masking causes mislocation, not parse failure",
              "increase in mislocation minus increase in parse failure (top-k vs unmasked)", 0.0, 0.05),
    ClaimSpec("stable", PAPER, "stable: 20 detection samples recover the top-k",
              "mean top-k overlap of 20-sample rankings with the all-sample ranking", 0.0, 0.8,
              unit="detection samples"),
    ClaimSpec("shared", PAPER, "shared: heads transfer between models sharing the backbone (cross-masking, both "
              "directions)", "accuracy of random sets minus accuracy with the other model's top-k "
              "(smallest over the directions)", 0.0, 0.05),
    ClaimSpec("vqa", PAPER, "generalises to VQA: masking the top-k VRHs hurts VQA more than k random heads "
              "(answered kinds)", "accuracy of the control sets minus the top-k's, VQA items (smallest over "
              "the controls)", 0.0, 0.05),
    ClaimSpec("positive_control", METHOD, "positive control recovered: the pipeline finds toy:planted's planted "
              "heads and masking them collapses grounding", "categorical", 0.0, 0.0, unit="control scenes"),
    ClaimSpec("transfer_control", METHOD, "transfer test calibrated: on the planted pairs it reports transfer where "
              "the backbone is shared (toy:planted-b) and never where no head index is shared (toy:planted-x)",
              "categorical", 0.0, 0.0, unit="control scenes"),
    ClaimSpec("ablation_kinds", METHOD, "ablation kinds agree: the causal claim at k* holds under zero, mean and "
              "resample ablation alike", "categorical", 0.0, 0.0),
    ClaimSpec("score_damage", METHOD, "score predicts causal importance: Spearman(score, single-head accuracy "
              "drop) > 0", "Spearman correlation over the scanned heads", 0.0, 0.2, unit="items"),
)

# the claims about toy:planted (the demo's positive-control step), whatever model the run studies
POSITIVE_CONTROL_CLAIMS = frozenset({"positive_control", "transfer_control"})


@dataclass
class Evidence:
    """What the data say about one claim: the estimate of its statistic, bootstrap replicates of it, the number
    of items ``n`` it rests on and a line of numbers for people. ``verdict`` set: a categorical claim (decided
    from other verdicts, no test of its own)."""

    estimate: float
    replicates: np.ndarray | None = None
    n: int = 0
    numbers: str = ""
    verdict: str | None = None
    reason: str = ""
    extra: dict = field(default_factory=dict)
    informative: int | None = None  # units whose outcome differs between the conditions (None: all n)

    @classmethod
    def categorical(cls, verdict: str, numbers: str, reason: str = "") -> "Evidence":
        if verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {verdict!r}")
        return cls(float("nan"), None, 0, numbers, verdict, reason)

    def interval(self, level: float = 1 - 2 * ALPHA) -> tuple[float, float]:
        """The central percentile interval of the replicates (90 %: the two one-sided 5 % tests)."""
        if self.replicates is None or not len(self.replicates):
            return (float("nan"), float("nan"))
        tail = (1 - level) / 2
        return (float(np.quantile(self.replicates, tail)), float(np.quantile(self.replicates, 1 - tail)))

    def p_above(self, value: float) -> float:
        """One-sided bootstrap p of "theta <= value" (small: theta is above ``value``)."""
        if self.replicates is None or not len(self.replicates) or not np.isfinite(self.estimate):
            return float("nan")
        return float((1 + np.sum(self.replicates <= value)) / (1 + len(self.replicates)))

    def p_below(self, value: float) -> float:
        """One-sided bootstrap p of "theta >= value" (small: theta is below ``value``)."""
        if self.replicates is None or not len(self.replicates) or not np.isfinite(self.estimate):
            return float("nan")
        return float((1 + np.sum(self.replicates >= value)) / (1 + len(self.replicates)))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values (NaN stays NaN and does not count towards m)."""
    values = np.asarray(pvalues, dtype=float)
    finite = np.flatnonzero(np.isfinite(values))
    adjusted = np.full(values.shape, np.nan)
    m = len(finite)
    running = 0.0
    for rank, index in enumerate(finite[np.argsort(values[finite], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * values[index]))
        adjusted[index] = running
    return adjusted.tolist()


def items_needed(spec: ClaimSpec, evidence: Evidence, alpha: float) -> int | None:
    """Items that would likely decide an undecided claim: the observed replicate spread scaled as 1/sqrt(n), the
    distance from the estimate to the boundary it is nearer to deciding (``null`` when the estimate is at least
    ``minimum``, else ``minimum``), one-sided level ``alpha``, power ``POWER``. None where the estimate sits on
    the boundary or nothing is known. Never fewer than the items that would hold ``MIN_INFORMATIVE`` informative
    ones at the observed informative share (``decide`` refuses a verdict below that floor whatever the spread); none
    where no item was informative."""
    if evidence.replicates is None or evidence.n <= 0 or not np.isfinite(evidence.estimate):
        return None
    informative = evidence.n if evidence.informative is None else min(evidence.n, evidence.informative)
    if informative <= 0:
        return None
    floor = math.ceil(evidence.n * MIN_INFORMATIVE / informative)
    spread = float(np.std(evidence.replicates))
    boundary = spec.null if evidence.estimate >= spec.minimum else spec.minimum
    distance = abs(evidence.estimate - boundary)
    if distance <= 1e-12 or spread <= 0:
        return None
    z = NormalDist().inv_cdf(1 - alpha) + NormalDist().inv_cdf(POWER)
    return max(floor, int(math.ceil(evidence.n * (z * spread / distance) ** 2)))


def decide(spec: ClaimSpec, evidence: Evidence, *, alpha_holds: float = ALPHA, p_holds: float | None = None,
           p_fails: float | None = None) -> tuple[str, str]:
    """``(verdict, reason)`` of one claim (module doc). ``p_holds`` / ``p_fails``: Holm-adjusted p-values (the raw
    bootstrap ones when None); ``alpha_holds``: the level at which "holds" is decided."""
    if evidence.verdict is not None:
        return evidence.verdict, evidence.reason
    if not np.isfinite(evidence.estimate) or evidence.replicates is None:
        return "inconclusive", "no estimate"
    informative = evidence.n if evidence.informative is None else min(evidence.n, evidence.informative)
    if informative < MIN_INFORMATIVE:
        return "inconclusive", (f"only {informative} informative {spec.unit} (outcomes that differ between the "
                                f"conditions): a decisive verdict needs {MIN_INFORMATIVE}")
    p_holds = evidence.p_above(spec.null) if p_holds is None else p_holds
    p_fails = evidence.p_below(spec.minimum) if p_fails is None else p_fails
    if p_holds < alpha_holds and evidence.estimate >= spec.minimum:
        return "holds", f"significant (p={p_holds:.2g}) and {evidence.estimate:.3g} >= {spec.minimum:g}"
    if p_fails < alpha_holds:
        return "does not hold", f"bounded below {spec.minimum:g} (p={p_fails:.2g})"
    if p_holds < alpha_holds:
        return "inconclusive", (f"significant (p={p_holds:.2g}) but {evidence.estimate:.3g} < {spec.minimum:g} and "
                                f"not bounded below it (p={p_fails:.2g})")
    return "inconclusive", f"neither significant (p={p_holds:.2g}) nor bounded below {spec.minimum:g} " \
                           f"(p={p_fails:.2g})"


def judge(evidence: Mapping[str, Evidence | None], *, alpha: float = ALPHA,
          specs: Mapping[str, ClaimSpec] = CLAIMS) -> pd.DataFrame:
    """The claims table: one row per declared claim with evidence (``None``: "not measured"), Holm-adjusted per
    table. Columns: ``table``, ``id``, ``claim``, ``verdict``, ``estimate``, ``ci_low``/``ci_high`` (90 %),
    ``null``, ``minimum``, ``p``, ``p_adjusted``, ``n``, ``items_needed``, ``reason``, ``numbers``, ``rule``."""
    rows = []
    for table in (PAPER, METHOD):
        ids = [i for i, spec in specs.items() if spec.table == table and i in evidence]
        tested = [i for i in ids if evidence[i] is not None and evidence[i].verdict is None]
        raw_holds = [evidence[i].p_above(specs[i].null) for i in tested]
        raw_fails = [evidence[i].p_below(specs[i].minimum) for i in tested]
        adjusted_holds = dict(zip(tested, holm(raw_holds)))
        adjusted_fails = dict(zip(tested, holm(raw_fails)))
        for i in ids:
            spec, ev = specs[i], evidence[i]
            row = {"table": table, "id": i, "claim": spec.claim, "null": spec.null, "minimum": spec.minimum,
                   "rule": spec.rule(), "estimate": float("nan"), "ci_low": float("nan"), "ci_high": float("nan"),
                   "p": float("nan"), "p_adjusted": float("nan"), "n": 0, "items_needed": None}
            if ev is None:
                rows.append({**row, "verdict": "not measured", "reason": "not measured", "numbers": ""})
                continue
            low, high = ev.interval()
            row.update(estimate=ev.estimate, ci_low=low, ci_high=high, n=ev.n, numbers=ev.numbers)
            if ev.verdict is not None:
                rows.append({**row, "verdict": ev.verdict, "reason": ev.reason})
                continue
            p_h, p_f = adjusted_holds[i], adjusted_fails[i]
            verdict, reason = decide(spec, ev, alpha_holds=alpha, p_holds=p_h, p_fails=p_f)
            needed = items_needed(spec, ev, alpha / max(1, len(tested))) if verdict == "inconclusive" else None
            if verdict == "inconclusive" and needed:
                reason += f"; about {needed:,} {spec.unit} would likely decide it"
            elif verdict == "inconclusive" and np.isfinite(ev.estimate) and ev.replicates is not None \
                    and len(ev.replicates) and abs(ev.estimate - spec.minimum) < 1e-9:
                reason += "; the estimate sits at its threshold"
            rows.append({**row, "verdict": verdict, "reason": reason, "p": ev.p_above(spec.null), "p_adjusted": p_h,
                         "items_needed": needed})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------- statistics


def item_weights(n: int, resamples: int = RESAMPLES, seed: int = 0) -> np.ndarray:
    """(resamples x n) bootstrap weights of n items (multinomial counts / n), one row per replicate."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(resamples, n))
    counts = np.zeros((resamples, n))
    np.add.at(counts, (np.arange(resamples)[:, None], draws), 1.0)
    return counts / n


def set_effect(top: Sequence[float], controls: np.ndarray, weights: np.ndarray, *,
               seed: int = 0) -> tuple[float, np.ndarray]:
    """``(estimate, replicates)`` of mean(control-set accuracy) - top-k accuracy on the same n items.

    ``top``: n outcomes (1 correct); ``controls``: (sets x n); ``weights``: ``item_weights(n)`` (shared with the
    other statistics of one claim, so they resample the same items). Each replicate also resamples the sets."""
    top = np.asarray(top, dtype=float)
    controls = np.asarray(controls, dtype=float)
    if controls.ndim != 2 or controls.shape[1] != top.shape[0] or controls.shape[0] == 0:
        raise ValueError(f"controls must be (sets x {top.shape[0]}), got {controls.shape}")
    sets = controls.shape[0]
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, sets, size=(weights.shape[0], sets))
    set_weights = np.zeros((weights.shape[0], sets))
    np.add.at(set_weights, (np.arange(weights.shape[0])[:, None], draws), 1.0 / sets)
    control_means = set_weights @ controls  # (B x n): each replicate's mean over its drawn sets, per item
    replicates = np.sum(weights * control_means, axis=1) - weights @ top
    return float(controls.mean() - top.mean()), replicates


def mean_evidence(values: Sequence[float], *, numbers: str = "", resamples: int = RESAMPLES,
                  seed: int = 0, informative_changes: bool = False) -> Evidence:
    """Evidence for the mean of per-item values (e.g. per-item differences), items resampled.
    ``informative_changes``: only items whose value differs from the typical (median) one are informative (a
    per-item difference that is 0 for most items)."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return Evidence(float("nan"), None, 0, numbers)
    return Evidence(float(data.mean()), item_weights(data.size, resamples, seed) @ data, int(data.size), numbers,
                    informative=int(np.sum(data != np.median(data))) if informative_changes else None)


def statistic_evidence(statistic: Callable[[np.ndarray], float], n: int, *, numbers: str = "",
                       resamples: int = 500, seed: int = 0) -> Evidence:
    """Evidence for any statistic of n units (``statistic(indices)`` on indices drawn with replacement)."""
    rng = np.random.default_rng(seed)
    estimate = float(statistic(np.arange(n)))
    replicates = np.array([statistic(rng.integers(0, n, size=n)) for _ in range(resamples)], dtype=float)
    replicates = replicates[np.isfinite(replicates)]
    return Evidence(estimate, replicates, n, numbers)


def smallest(parts: Mapping[str, tuple[float, np.ndarray]], n: int, numbers: str = "",
             informative: int | None = None) -> Evidence:
    """The intersection-union combination: the smallest estimate over ``parts`` (control kinds, directions),
    replicate by replicate (the parts share their item resampling)."""
    if not parts:
        return Evidence(float("nan"), None, n, numbers)
    estimates = np.array([estimate for estimate, _ in parts.values()])
    replicates = np.min(np.stack([r for _, r in parts.values()]), axis=0)
    return Evidence(float(estimates.min()), replicates, n, numbers,
                    extra={"parts": {name: estimate for name, (estimate, _) in parts.items()}},
                    informative=informative)


def claims_text(table: pd.DataFrame, width: int = 100) -> str:
    """The claims table for a terminal: per table a heading, per claim its verdict and words, then the reason
    and numbers wrapped and indented."""
    import textwrap

    blocks = []
    for name, heading in ((PAPER, "The paper's claims"), (METHOD, "Checks of the method")):
        part = table[table["table"] == name] if "table" in table else table
        if part.empty:
            continue
        blocks.append(f"{heading}:")
        for row in part.to_dict(orient="records"):
            head = textwrap.fill(f"{str(row['verdict']).upper():>15}  {row['claim']}", width,
                                 subsequent_indent=" " * 17, break_on_hyphens=False)
            detail = "; ".join(str(x) for x in (row.get("reason"), row.get("numbers")) if x)
            body = textwrap.fill(detail, width, initial_indent=" " * 17, subsequent_indent=" " * 17,
                                 break_on_hyphens=False)
            blocks.append(f"{head}\n{body}")
    return "\n".join(blocks)
