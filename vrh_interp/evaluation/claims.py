"""The claims: each of the paper's claims and each check of the method, declared once, judged by one rule.

Every claim is a ``ClaimSpec``: the hypothesis in words, its statistic ``theta``, the value ``null`` that means
"no effect" and the smallest effect ``minimum`` the claim is meant to detect. Evidence for a claim (``Evidence``)
carries its estimate and two valid p-values: ``p_holds`` of "the claim does not hold" and ``p_fails`` of "theta
>= minimum". The verdict has three outcomes that mean what they say:

* **holds**: ``p_holds`` (Bonferroni-adjusted over the claim's table) is at most ``ALPHA``. For a causal claim
  ``p_holds`` is the largest of three tests, each of which must reject (an intersection-union test, valid without
  adjustment): (a) the target set is *special*, more harmful than the control-set distribution including its own
  draw (``inference.sequential_rank_p``, per control kind); (b) masking it lowers accuracy against the unmasked
  model (exact one-sided McNemar, ``inference.drop_p``); (c) ``theta`` is at least ``minimum``, tested with a
  lower confidence bound whose error has an item and a set part (``inference.set_effect``). For the other
  claims ``p_holds`` tests ``theta <= minimum`` (a lower bound, never a point estimate), and a structure claim
  also against its distribution under no structure;
* **does not hold**: ``p_fails`` (Bonferroni-adjusted) is at most ``ALPHA``: the data bound ``theta`` below
  ``minimum`` (an equivalence-style test, so a small sample can never produce it);
* **inconclusive**: anything else, with what would likely decide it: items and control sets apart
  (``inference.Effect.needed``, a variance decomposition), or the sets a rank test needs to reach its level.

Family-wise error. The paper's claims form one family, the checks of the method another and the claims beyond the
paper (``EXTENSION``: sufficiency by redirection, ``experiments.steer``) a third, each FIXED: every
declared claim of the table counts, whether its step ran, was skipped by a time cap or is categorical. Within each
family Bonferroni (each claim at ``ALPHA / m``) controls the family-wise error at ``ALPHA``, separately for
"holds" and for "does not hold". Not Holm: its step-down makes one claim's level depend on the others' p-values,
so a cap that skips a step would move the verdicts of steps that ran; here a claim's verdict depends on its own
data alone.

``docs/results/calibration.md`` (``experiments.calibration``) measures every rule on simulated tables of known
truth: the rate of "holds" under each null, the family-wise rate, and the power under planted and paper-size
effects.
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
# a percentile bootstrap over fewer units than this is not trusted for a decision (it is liberal: 4 detection
# samples resample to a handful of distinct tables); the exact tests of the causal rule need no such floor
BOOTSTRAP_UNITS = 20
POWER = 0.8
VERDICTS = ("holds", "does not hold", "inconclusive", "not measured")
PAPER, METHOD, EXTENSION = "paper", "method", "extension"
# the tables, each its own fixed family (module doc), with their headings, in the order they are shown
TABLES: tuple[tuple[str, str], ...] = ((PAPER, "The paper's claims"), (METHOD, "Checks of the method"),
                                       (EXTENSION, "Beyond the paper"))


@dataclass(frozen=True)
class ClaimSpec:
    """One claim: ``table`` ("paper", "method" or "extension"), its words, the statistic and the decision's two
    values."""

    id: str
    table: str
    claim: str
    statistic: str
    null: float
    minimum: float
    unit: str = "items"  # what more of would decide an inconclusive claim
    # the declared experiment whose run measures it (``experiments.declared``): the demo, the report and the grid
    # find a claim's step from here, so a claim is named in this one place
    experiment: str = ""
    causal: bool = False  # judged by the three-part causal test (module doc)
    # the causal test's words for a claim that is not about masking (redirection: moves, not drops)
    causal_words: str = ("the target more harmful than the control sets including its own draw (rank test) and a "
                         "drop against the unmasked model (exact McNemar)")

    def rule(self) -> str:
        if self.statistic == "categorical":
            return ("categorical: holds / does not hold / inconclusive as read from the tests it stands for (given "
                    "with it); it counts in the table's fixed family as p = 1")
        return (f"holds: {self.statistic} bounded above {self.minimum:g}"
                + (f" with {self.causal_words}" if self.causal else "")
                + f" (Bonferroni over the table's fixed family, alpha {ALPHA}); does not hold: bounded below "
                  f"{self.minimum:g}; otherwise inconclusive")


def _specs(*specs: ClaimSpec) -> dict[str, ClaimSpec]:
    return {spec.id: spec for spec in specs}


CLAIMS: dict[str, ClaimSpec] = _specs(
    ClaimSpec("causal", PAPER, "causal: masking the top-k VRHs hurts grounding more than k random heads, against "
              "every control (uniform, layer-matched, live heads)",
              "accuracy of the control sets minus the top-k's (smallest over the controls)", 0.0, 0.05, causal=True,
              experiment="sweep"),
    ClaimSpec("causal_curve", PAPER, "causal along the k-curve: averaged over the k grid, masking the top-k hurts "
              "more than every control",
              "mean over k of (control-set accuracy minus top-k accuracy), smallest over the controls", 0.0, 0.05,
              causal=True, experiment="sweep"),
    ClaimSpec("sparse", PAPER, "sparse: a few heads carry the score",
              "share of the total score carried by the top 10 % of heads, beyond its distribution under no "
              "structure (each sample's head scores permuted)", 0.10, 0.30, unit="detection samples",
              experiment="sparsity"),
    ClaimSpec("design_space", PAPER, "design space: the default design (output, sum, mean) is within 5 points of "
              "the most causal variant", "5 points minus the shortfall of the default's accuracy drop behind the "
              "best variant's", 0.0, 0.0, experiment="design_space"),
    ClaimSpec("specific", PAPER, "functionally specific: masking causes mislocation, not parse failure",
              "increase in mislocation minus increase in parse failure (top-k vs unmasked)", 0.0, 0.05,
              experiment="sweep"),
    ClaimSpec("stable", PAPER, "stable: 20 detection samples recover the top-k",
              "expected top-k overlap of a 20-sample ranking with the all-sample ranking (detection set "
              "resampled)", 0.0, 0.8,
              unit="detection samples", experiment="sparsity"),
    ClaimSpec("shared", PAPER, "shared: heads transfer between models sharing the backbone (cross-masking, both "
              "directions)", "accuracy of random sets minus accuracy with the other model's top-k "
              "(smallest over the directions)", 0.0, 0.05, causal=True, experiment="transfer"),
    ClaimSpec("vqa", PAPER, "generalises to VQA: masking the top-k VRHs hurts VQA more than k random heads "
              "(answered kinds)", "accuracy of the control sets minus the top-k's, VQA items (smallest over "
              "the controls)", 0.0, 0.05, causal=True, experiment="vqa_sweep"),
    ClaimSpec("positive_control", METHOD, "positive control recovered: the pipeline finds toy:planted's planted "
              "heads and masking them collapses grounding", "categorical", 0.0, 0.0, unit="control scenes",
              experiment="positive_control"),
    ClaimSpec("transfer_control", METHOD, "transfer test calibrated: on the planted pairs it reports transfer where "
              "the backbone is shared (toy:planted-b) and never where no head index is shared (toy:planted-x)",
              "categorical", 0.0, 0.0, unit="control scenes", experiment="positive_control"),
    ClaimSpec("ablation_kinds", METHOD, "ablation kinds agree: the causal claim at k* holds under zero, mean and "
              "resample ablation alike", "accuracy of the control sets minus the top-k's (smallest over the "
              "ablation kinds and controls)", 0.0, 0.05, causal=True, experiment="ablation_kinds"),
    ClaimSpec("score_damage", METHOD, "score predicts causal importance: Spearman(score, single-head accuracy "
              "drop) > 0", "Spearman correlation over the scanned heads", 0.0, 0.2, unit="items", experiment="scan"),
    ClaimSpec("sufficient", EXTENSION, "sufficient: redirecting the top-k (a pre-softmax bias onto another object) "
              "moves answers to that object more than any control set redirected the same way",
              "move rate of the top-k minus the control sets' at the declared alpha (smallest over the controls)",
              0.0, 0.10, causal=True,
              causal_words="the top-k moving more answers than the control sets including its own draw (rank test) "
                           "and than alpha = 0, the unsteered run (exact McNemar)", experiment="steer"),
)

# the claims about toy:planted (the demo's positive-control step), whatever model the run studies
POSITIVE_CONTROL_CLAIMS = frozenset(c for c, spec in CLAIMS.items() if spec.experiment == "positive_control")


def claims_of(experiment: str) -> tuple[str, ...]:
    """The claims the declared experiment ``experiment`` measures (their ``experiment``), in table order."""
    return tuple(c for c, spec in CLAIMS.items() if spec.experiment == experiment)


@dataclass
class Evidence:
    """What the data say about one claim: the estimate of its statistic, the number of units ``n`` it rests on, a
    line of numbers for people, and the two p-values of the rule (module doc). ``p_holds`` / ``p_fails`` None:
    from the bootstrap ``replicates`` (``theta <= minimum`` / ``theta >= minimum``). ``verdict`` set: a categorical
    claim (decided from other verdicts, no test of its own). ``parts``: the components' p-values (named, shown
    in the reason); ``needed``: what would likely decide an undecided claim (``{"items": .., "sets": ..}``)."""

    estimate: float
    replicates: np.ndarray | None = None
    n: int = 0
    numbers: str = ""
    verdict: str | None = None
    reason: str = ""
    extra: dict = field(default_factory=dict)
    informative: int | None = None  # units whose outcome differs between the conditions (None: all n)
    p_holds: float | None = None
    p_fails: float | None = None
    bounds: tuple[float, float] | None = None  # the 90 % interval where it does not come from replicates
    parts: dict = field(default_factory=dict)
    needed: dict = field(default_factory=dict)

    @classmethod
    def categorical(cls, verdict: str, numbers: str, reason: str = "") -> "Evidence":
        if verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {verdict!r}")
        return cls(float("nan"), None, 0, numbers, verdict, reason)

    def interval(self, level: float = 1 - 2 * ALPHA) -> tuple[float, float]:
        """The 90 % interval (the two one-sided 5 % tests): ``bounds`` if given, else the central percentile
        interval of the replicates."""
        if self.bounds is not None:
            return (float(self.bounds[0]), float(self.bounds[1]))
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

    def holds_p(self, spec: ClaimSpec) -> float:
        """The p-value of "the claim does not hold" (NaN: no test)."""
        return self._rule_p(self.p_holds, self.p_above, spec.minimum)

    def fails_p(self, spec: ClaimSpec) -> float:
        """The p-value of "theta >= minimum" (NaN: no test)."""
        return self._rule_p(self.p_fails, self.p_below, spec.minimum)

    def _rule_p(self, given: float | None, bootstrap: Callable[[float], float], minimum: float) -> float:
        """``given`` where the rule computed it, else the bootstrap's at ``minimum`` (on enough units)."""
        if self.verdict is not None:
            return float("nan")
        if given is not None:
            return float(given)
        return bootstrap(minimum) if self.n >= BOOTSTRAP_UNITS else float("nan")


def bonferroni(pvalues: Sequence[float], *, family: int | None = None) -> list[float]:
    """Bonferroni over a FIXED family (``inference.bonferroni``): what ``judge`` adjusts with."""
    from vrh_interp.evaluation.inference import bonferroni as single_step

    return single_step(pvalues, family=family)


def holm(pvalues: Sequence[float], *, family: int | None = None) -> list[float]:
    """Holm step-down adjusted p-values over a FIXED family of ``family`` hypotheses (default: the values given);
    NaN (not tested) counts as p = 1 and stays NaN (``inference.holm``)."""
    from vrh_interp.evaluation.inference import holm as step_down

    return step_down(pvalues, family=family)


def items_needed(spec: ClaimSpec, evidence: Evidence, alpha: float) -> int | None:
    """Units that would likely decide an undecided claim: ``evidence.needed["items"]`` where the rule computed it
    (a variance decomposition: items and sets apart), else the replicate spread scaled as 1/sqrt(n) to the
    boundary the estimate is nearer to deciding (``minimum``), one-sided level ``alpha``, power ``POWER``. None
    where the estimate sits on the boundary, nothing is known, or more units alone cannot decide."""
    if "items" in evidence.needed:
        return evidence.needed["items"]
    if "effect" in evidence.extra:
        return evidence.extra["effect"].needed(spec.minimum, alpha, POWER)["items"]
    if evidence.replicates is None or evidence.n <= 0 or not np.isfinite(evidence.estimate):
        return None
    spread = float(np.std(evidence.replicates))
    distance = abs(evidence.estimate - spec.minimum)
    if distance <= 1e-12 or spread <= 0:
        return None
    z = NormalDist().inv_cdf(1 - alpha) + NormalDist().inv_cdf(POWER)
    return int(math.ceil(evidence.n * (z * spread / distance) ** 2))


def _parts_text(evidence: Evidence) -> str:
    return ", ".join(f"{name} p={value:.2g}" for name, value in evidence.parts.items())


def decide(spec: ClaimSpec, evidence: Evidence, *, alpha_holds: float = ALPHA, p_holds: float | None = None,
           p_fails: float | None = None) -> tuple[str, str]:
    """``(verdict, reason)`` of one claim (module doc). ``p_holds`` / ``p_fails``: adjusted p-values (the
    evidence's own, unadjusted, when None); ``alpha_holds``: the level of both decisions."""
    if evidence.verdict is not None:
        return evidence.verdict, evidence.reason
    p_h = evidence.holds_p(spec) if p_holds is None else p_holds
    p_f = evidence.fails_p(spec) if p_fails is None else p_fails
    if not np.isfinite(evidence.estimate) or not (np.isfinite(p_h) or np.isfinite(p_f)):
        return "inconclusive", "no estimate"
    parts = f" ({_parts_text(evidence)})" if evidence.parts else ""
    if np.isfinite(p_h) and p_h <= alpha_holds:
        if evidence.parts:
            return "holds", f"every test rejects (p={p_h:.2g}){parts}: {evidence.estimate:.3g} >= {spec.minimum:g}"
        return "holds", f"bounded above {spec.minimum:g} (p={p_h:.2g}): {evidence.estimate:.3g}"
    if np.isfinite(p_f) and p_f <= alpha_holds:
        return "does not hold", f"bounded below {spec.minimum:g} (p={p_f:.2g})"
    return "inconclusive", (f"not shown to hold (p={p_h:.2g}{'; ' + _parts_text(evidence) if parts else ''}) nor "
                            f"bounded below {spec.minimum:g} (p={p_f:.2g})")


def _advice(spec: ClaimSpec, evidence: Evidence, level: float) -> str:
    """What would likely decide an undecided claim, items and sets apart, for the parts of its test that did not
    reject: the effect's items and sets (only more than it has), the rank test's sets (only where the target beat
    every set: a target that ordinary sets match gains nothing from more of them). Empty where none would."""
    from vrh_interp.evaluation.inference import sets_for

    failing = {name for name, p in evidence.parts.items() if not p <= level} if evidence.parts else {"effect"}
    bits = []
    if "effect" in failing:
        items = items_needed(spec, evidence, level)
        effect = evidence.extra.get("effect")
        if items and (effect is None or items > effect.items):
            bits.append(f"about {items:,} {spec.unit}")
        sets = effect.needed(spec.minimum, level, POWER)["sets"] if effect is not None else None
        if sets and sets > effect.sets:
            bits.append(f"about {sets:,} {effect.set_unit}")
    rank_sets = evidence.extra.get("rank_sets")
    if "special" in failing and evidence.extra.get("rank_at_floor") and rank_sets is not None \
            and rank_sets < sets_for(level):
        bits.append(f"a rank test at level {level:.2g} needs >= {sets_for(level)} sets of each kind (has "
                    f"{rank_sets})")
    return ("; " + " or ".join(bits) + " would likely decide it") if bits else ""


def judge(evidence: Mapping[str, Evidence | None], *, alpha: float = ALPHA,
          specs: Mapping[str, ClaimSpec] = CLAIMS) -> pd.DataFrame:
    """The claims table: one row per claim in ``evidence`` (``None``: "not measured"), Bonferroni-adjusted per table
    over the FIXED family of every claim ``specs`` declares in that table (a claim not measured, skipped or
    categorical counts as p = 1). Columns: ``table``, ``id``, ``claim``, ``verdict``, ``estimate``,
    ``ci_low``/``ci_high`` (90 %), ``null``, ``minimum``, ``p``, ``p_adjusted``, ``n``, ``items_needed``,
    ``reason``, ``numbers``, ``rule``."""
    rows = []
    for table, _ in TABLES:
        family = [i for i, spec in specs.items() if spec.table == table]
        ids = [i for i in family if i in evidence]
        raw_holds = [evidence[i].holds_p(specs[i]) if evidence.get(i) is not None else float("nan") for i in family]
        raw_fails = [evidence[i].fails_p(specs[i]) if evidence.get(i) is not None else float("nan") for i in family]
        adjusted_holds = dict(zip(family, bonferroni(raw_holds, family=len(family))))
        adjusted_fails = dict(zip(family, bonferroni(raw_fails, family=len(family))))
        level = alpha / max(1, len(family))
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
            needed = items_needed(spec, ev, level) if verdict == "inconclusive" else None
            if verdict == "inconclusive":
                reason += _advice(spec, ev, level)
            rows.append({**row, "verdict": verdict, "reason": reason, "p": ev.holds_p(spec), "p_adjusted": p_h,
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


def intersection(parts: Mapping[str, Evidence], numbers: str = "") -> Evidence:
    """The intersection-union combination (control kinds, directions): the claim holds only where every part
    holds (``p_holds`` = the largest, valid without adjustment), fails where some part is bounded below its
    minimum (``p_fails`` = Bonferroni over the parts), estimate and interval the smallest."""
    values = [ev for ev in parts.values() if ev is not None]
    if not values:
        return Evidence(float("nan"), None, 0, numbers)
    binding = min(values, key=lambda ev: ev.estimate)
    lows, highs = zip(*(ev.interval() for ev in values))
    combined = {f"{name}: {label}": p for name, ev in parts.items() for label, p in ev.parts.items()}
    return Evidence(float(binding.estimate), None, min(ev.n for ev in values), numbers,
                    extra={**binding.extra, "parts": {name: ev.estimate for name, ev in parts.items()},
                           "rank_sets": min((ev.extra.get("rank_sets", 10 ** 9) for ev in values)),
                           "rank_at_floor": all(ev.extra.get("rank_at_floor", False) for ev in values)},
                    informative=min((ev.informative for ev in values if ev.informative is not None), default=None),
                    p_holds=max(ev.p_holds for ev in values),
                    p_fails=min(1.0, len(values) * min(ev.p_fails for ev in values)),
                    bounds=(min(lows), min(highs)), parts=_worst_parts(combined))


def _worst_parts(parts: Mapping[str, float]) -> dict[str, float]:
    """Per component (the label after the last ': '), the largest p over the parts (what binds the verdict)."""
    worst: dict[str, float] = {}
    for name, p in parts.items():
        label = name.rsplit(": ", 1)[-1]
        worst[label] = max(worst.get(label, 0.0), p)
    return worst


def causal_test(baseline: Sequence[float], target: Sequence[float], controls: np.ndarray, *, minimum: float,
                rank: tuple[float, Sequence[float]] | None = None, special_p: float | None = None,
                rank_h: int = 5, numbers: str = "") -> Evidence:
    """The causal rule against ONE control kind (module doc): 0/1 outcomes ``baseline`` and ``target`` on n
    items and ``controls`` (sets x n) on the same items. (a) special: ``special_p`` if given (a rank test made
    elsewhere), else the sequential rank p of the target's accuracy among the set accuracies, in their drawn
    order: on ``rank = (target accuracy, set accuracies)`` (sets on a smaller common item subset; exchangeability
    is all the rank test needs) where given, else on the ``controls``; (b) drop: exact McNemar, baseline vs
    target (the sign-flip test where outcomes are per-item means, as on the k-curve); (c) effect >= ``minimum``:
    ``inference.set_effect`` (items and sets). ``p_fails``: the effect bounded below ``minimum``."""
    from vrh_interp.evaluation import inference

    controls = np.asarray(controls, dtype=float)
    effect = inference.set_effect(target, controls)
    base, masked = np.asarray(baseline, dtype=float), np.asarray(target, dtype=float)
    if np.all(np.isin(base, (0.0, 1.0))) and np.all(np.isin(masked, (0.0, 1.0))):
        drop, lost, gained = inference.drop_p(base, masked)
    else:  # per-item means over several conditions (the k-curve): the exact sign-flip test
        drop = inference.sign_flip_p(base - masked)
        lost, gained = int(np.sum(base > masked)), int(np.sum(base < masked))
    if special_p is not None:
        special, rank_sets = float(special_p), None
    elif rank is None and not np.isfinite(controls).all():  # one set per scene: no common items to rank on
        special, rank_sets = 1.0, 0
    else:
        top_acc, set_accs = rank if rank is not None else (float(np.mean(target)), controls.mean(axis=1))
        special, _ = inference.sequential_rank_p(top_acc, set_accs, h=rank_h)
        rank_sets = len(set_accs)
    enough = effect.p_above(minimum)
    low, high = effect.interval()
    return Evidence(effect.estimate, None, effect.items, numbers, informative=lost + gained,
                    p_holds=max(special, drop, enough), p_fails=effect.p_below(minimum), bounds=(low, high),
                    parts={"special": special, "drop": drop, "effect": enough},
                    extra={"effect": effect, "rank_sets": rank_sets if rank_sets is not None else 10 ** 9,
                           "rank_at_floor": rank_sets is not None and special <= 1 / (rank_sets + 1) + 1e-12,
                           "lost": lost, "gained": gained})


def _terminal(table: pd.DataFrame, row_text: Callable[[dict], str]) -> str:
    """Per table (the paper's, the method's, those beyond the paper) a heading, then ``row_text(row)`` for each of
    its claims; a frame without a ``table`` column is listed under the paper's and the method's headings."""
    blocks = []
    for name, heading in TABLES:
        if name == EXTENSION and "table" not in table:
            continue
        part = table[table["table"] == name] if "table" in table else table
        if not part.empty:
            blocks += [f"{heading}:", *(row_text(row) for row in part.to_dict(orient="records"))]
    return "\n".join(blocks)


def claims_lines(table: pd.DataFrame, width: int = 100) -> str:
    """The claims table in one line per claim (a terminal's summary; ``claims_text`` has the reasons): per table a
    heading, per claim its verdict as a badge, its short name and the estimate with its interval."""
    def line(row: dict) -> str:
        estimate = row.get("estimate")
        shown = "" if estimate is None or not np.isfinite(float(estimate)) else (
            f"  {float(estimate):+.3f} [{float(row['ci_low']):+.3f}, {float(row['ci_high']):+.3f}]"
            if np.isfinite(float(row.get("ci_low", np.nan))) else f"  {float(estimate):+.3f}")
        return f"{str(row['verdict']).upper():>15}  {str(row['claim']).split(':')[0]}{shown}"[:width]

    return _terminal(table, line)


def claims_text(table: pd.DataFrame, width: int = 100) -> str:
    """The claims table for a terminal: per table a heading, per claim its verdict and words, then the reason
    and numbers wrapped and indented."""
    import textwrap

    def block(row: dict) -> str:
        head = textwrap.fill(f"{str(row['verdict']).upper():>15}  {row['claim']}", width,
                             subsequent_indent=" " * 17, break_on_hyphens=False)
        detail = "; ".join(str(x) for x in (row.get("reason"), row.get("numbers")) if x)
        body = textwrap.fill(detail, width, initial_indent=" " * 17, subsequent_indent=" " * 17,
                             break_on_hyphens=False)
        return f"{head}\n{body}"

    return _terminal(table, block)
